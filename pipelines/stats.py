"""Global term statistics: the DF reduce across shards, written to ``stats.duckdb``.

Every shard writes ``terms.parquet`` (term, df, cf) for its own documents; the reduce is a
DuckDB ``GROUP BY`` over those files, which spills to disk instead of holding the
vocabulary of a large corpus in Python. Tables:

    terms(term, df, cf)                       global document and collection frequency
    collection(n_docs, n_docs_nonempty, total_terms, avgdl, n_shards, n_terms)
    shards(shard, n_docs, total_terms, n_terms)

BM25 uses N = documents with at least one indexed term and avgdl = total_terms / N, as
Lucene's ``CollectionStatistics`` (docCount counts documents that have the field).

The terms table is also written as ``lexical/vocab.arrow`` (`write_vocabulary`), the
copy serving reads: an Arrow file is memory-mapped with pyarrow, which serving imports
anyway, where reading the table needs DuckDB (~0.1 s to import, ~0.03-0.07 s to query: a
third of a one-query `funnel search` process on SciFact). ``stats.duckdb`` stays the table
the build, reindexing, the enrichment audit and SQL users read; an index built before the
Arrow copy existed is read from it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np

#: The terms table as serving reads it: term (sorted: its row is the term's global id), df, cf.
VOCAB = os.path.join("lexical", "vocab.arrow")


@dataclass(frozen=True)
class CollectionStats:
    n_docs: int
    n_docs_nonempty: int
    total_terms: int
    avgdl: float
    n_shards: int
    n_terms: int

    def to_dict(self) -> dict:
        return asdict(self)


def reduce_term_stats(shard_term_files: list[str], shard_rows: list[dict], db_path: str) -> CollectionStats:
    """Sum per-shard (df, cf) into ``db_path`` and record collection statistics.

    ``shard_rows``: one dict per shard with ``shard``, ``n_docs``, ``n_docs_nonempty``,
    ``total_terms``, ``n_terms``.
    """
    import duckdb
    tmp = db_path + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    con = duckdb.connect(tmp)
    try:
        con.execute("CREATE TABLE shards(shard INTEGER, n_docs BIGINT, n_docs_nonempty BIGINT, "
                    "total_terms BIGINT, n_terms BIGINT)")
        con.executemany("INSERT INTO shards VALUES (?, ?, ?, ?, ?)",
                        [(r["shard"], r["n_docs"], r["n_docs_nonempty"], r["total_terms"], r["n_terms"])
                         for r in shard_rows])
        if shard_term_files:
            con.execute(
                "CREATE TABLE terms AS SELECT term, SUM(df)::BIGINT AS df, SUM(cf)::BIGINT AS cf "
                "FROM read_parquet(?) GROUP BY term ORDER BY term", [shard_term_files])
        else:
            con.execute("CREATE TABLE terms(term VARCHAR, df BIGINT, cf BIGINT)")
        n_docs, nonempty, total = con.execute(
            "SELECT COALESCE(SUM(n_docs),0), COALESCE(SUM(n_docs_nonempty),0), "
            "COALESCE(SUM(total_terms),0) FROM shards").fetchone()
        n_terms = con.execute("SELECT COUNT(*) FROM terms").fetchone()[0]
        stats = CollectionStats(int(n_docs), int(nonempty), int(total),
                                float(total) / nonempty if nonempty else 0.0,
                                len(shard_rows), int(n_terms))
        con.execute("CREATE TABLE collection AS SELECT ?::BIGINT AS n_docs, ?::BIGINT AS n_docs_nonempty, "
                    "?::BIGINT AS total_terms, ?::DOUBLE AS avgdl, ?::INTEGER AS n_shards, ?::BIGINT AS n_terms",
                    [stats.n_docs, stats.n_docs_nonempty, stats.total_terms, stats.avgdl,
                     stats.n_shards, stats.n_terms])
        con.execute("CHECKPOINT")
    finally:
        con.close()
    os.replace(tmp, db_path)
    return stats


def load_vocabulary(db_path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(terms sorted as object array, df int64, cf int64) from ``stats.duckdb``. DuckDB's
    errors come out as ValueError (serving need not import duckdb to catch them)."""
    import duckdb
    try:
        con = duckdb.connect(db_path, read_only=True)
        try:
            # fetchnumpy, not Arrow's to_numpy: pyarrow's conversion imports pandas (0.3-0.4 s
            # of every `funnel search` process).
            cols = con.sql("SELECT term, df, cf FROM terms ORDER BY term").fetchnumpy()
        finally:
            con.close()
    except duckdb.Error as e:
        raise ValueError(f"{db_path}: {type(e).__name__}: {e}") from e
    return (np.asarray(cols["term"], dtype=object), np.asarray(cols["df"], dtype=np.int64),
            np.asarray(cols["cf"], dtype=np.int64))


def _vocab_schema():
    import pyarrow as pa
    return pa.schema([("term", pa.string()), ("df", pa.int64()), ("cf", pa.int64())])


def write_vocabulary(version_dir: str, terms, df: np.ndarray, cf: np.ndarray) -> None:
    """Write `VOCAB` (the terms table of ``load_vocabulary``) into ``version_dir`` before
    it is published (``artifacts.save_arrow_atomic``)."""
    import pyarrow as pa
    from .artifacts import save_arrow_atomic
    save_arrow_atomic(os.path.join(version_dir, VOCAB), pa.table(
        [pa.array(list(terms), pa.string()), pa.array(np.asarray(df, np.int64)), pa.array(np.asarray(cf, np.int64))],
        schema=_vocab_schema()))


def read_vocabulary(version_dir: str, n_terms: int | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(terms in id order, df, cf) of a version: from `VOCAB` where the build wrote it,
    else from ``stats.duckdb``. df and cf are writable copies (numba compiles another version
    of a kernel for a read-only array). Raises ValueError naming the file where it is not
    the table (or not ``n_terms`` rows, when given)."""
    path = os.path.join(version_dir, VOCAB)
    if not os.path.exists(path):
        terms, df, cf = load_vocabulary(os.path.join(version_dir, "stats.duckdb"))
        return terms.tolist(), df, cf
    import pyarrow as pa
    from .docorder import int64_column
    try:
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        # The IPC reader checks buffer sizes, not string offsets: a damaged offset would make
        # to_pylist read outside the file (a SIGSEGV) instead of raising.
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path} is not an Arrow file ({e})") from e
    if table.schema != _vocab_schema() or (n_terms is not None and table.num_rows != n_terms):
        raise ValueError(f"{path} holds {table.num_rows} rows of "
                         f"({', '.join(f'{f.name} {f.type}' for f in table.schema)}); expected "
                         f"{'' if n_terms is None else f'{n_terms} rows of '}(term string, df int64, cf int64)")
    if any(table.column(c).null_count for c in ("term", "df", "cf")):
        raise ValueError(f"{path} has empty terms or counts")
    return table.column("term").to_pylist(), int64_column(table.column("df")), int64_column(table.column("cf"))

