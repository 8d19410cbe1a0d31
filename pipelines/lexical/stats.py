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

import bisect
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
    from ..store.artifacts import save_arrow_atomic
    save_arrow_atomic(os.path.join(version_dir, VOCAB), pa.table(
        [pa.array(list(terms), pa.string()), pa.array(np.asarray(df, np.int64)), pa.array(np.asarray(cf, np.int64))],
        schema=_vocab_schema()))


def read_vocabulary(version_dir: str, n_terms: int | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(terms in id order, df, cf) of a version (`read_terms`, the terms as a list)."""
    terms, df, cf = read_terms(version_dir, n_terms)
    return terms.to_pylist(), df, cf


def read_terms(version_dir: str, n_terms: int | None = None):
    """(terms in id order as one Arrow string array, df, cf) of a version: from `VOCAB`
    (memory-mapped) where the build wrote it, else from ``stats.duckdb``. df and cf are
    writable copies (numba compiles another version of a kernel for a read-only array).
    Raises ValueError naming the file where it is not the table (or not ``n_terms`` rows,
    when given)."""
    import pyarrow as pa
    path = os.path.join(version_dir, VOCAB)
    if not os.path.exists(path):
        terms, df, cf = load_vocabulary(os.path.join(version_dir, "stats.duckdb"))
        return pa.array(terms.tolist(), pa.string()), df, cf
    from ..store.docorder import int64_column
    try:
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        # The IPC reader checks buffer sizes, not string offsets: a damaged offset would make
        # a read of the strings reach outside the file (a SIGSEGV) instead of raising.
        table.validate(full=True)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path} is not an Arrow file ({e})") from e
    if table.schema != _vocab_schema() or (n_terms is not None and table.num_rows != n_terms):
        raise ValueError(f"{path} holds {table.num_rows} rows of "
                         f"({', '.join(f'{f.name} {f.type}' for f in table.schema)}); expected "
                         f"{'' if n_terms is None else f'{n_terms} rows of '}(term string, df int64, cf int64)")
    if any(table.column(c).null_count for c in ("term", "df", "cf")):
        raise ValueError(f"{path} has empty terms or counts")
    col = table.column("term")
    terms = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return terms, int64_column(table.column("df")), int64_column(table.column("cf"))


class Vocabulary:
    """A version's term → global id lookup (a term's id is its row in `VOCAB`), read-only
    and dict-like (``get``, ``in``, ``[]``, ``len``, iteration in id order), without a
    Python object per term: the terms stay in their Arrow array (memory-mapped from
    `VOCAB`), beside each term's 64-bit ``hash()`` sorted, and the ids in that order. A
    lookup is a binary search of the hashes, then the term's bytes compared. Why: a dict
    of every term held its Python strings, ints and table (31 MiB of bench_workloads'
    300K-term Zipf server; 347 MiB more RSS for 2.7M terms, against 64 with this: 12 bytes
    a term in its arrays, the rest what building them left to the allocator). A lookup
    takes 0.8-1.6 us instead of ~0.15 (``bench/RESULTS.md``, the note after the 3M Zipf
    section): a query's terms are looked up once per distinct chunk of text (``lexical``'s
    chunk cache)."""

    def __init__(self, terms):
        import pyarrow as pa
        if isinstance(terms, pa.ChunkedArray):
            terms = terms.chunk(0) if terms.num_chunks == 1 else terms.combine_chunks()
        if not isinstance(terms, pa.Array):
            terms = pa.array(list(terms), pa.string())
        if not (pa.types.is_string(terms.type) or pa.types.is_large_string(terms.type)) or terms.null_count:
            raise ValueError(f"a vocabulary is an array of strings without nulls, not {terms.type}")
        self._terms = terms
        n = self._n = len(terms)
        kind = np.int64 if pa.types.is_large_string(terms.type) else np.int32
        _, offsets, data = terms.buffers()
        off = np.frombuffer(offsets, dtype=kind)[terms.offset:terms.offset + n + 1] if n else np.zeros(1, kind)
        # Memoryviews: an item read is a Python int, a slice compares to bytes by memcmp.
        self._off = memoryview(np.ascontiguousarray(off)).cast("B").cast("q" if kind is np.int64 else "i")
        self._data = memoryview(data).cast("B") if data is not None else memoryview(b"")
        h = np.empty(n, dtype=np.int64)
        step = 1 << 16  # the terms made Python strings a slice at a time: no peak of them all
        for i in range(0, n, step):
            part = terms.slice(i, step).to_pylist()
            h[i:i + len(part)] = np.fromiter(map(self.key, part), dtype=np.int64, count=len(part))
        order = np.argsort(h, kind="stable")
        h.sort()  # = h[order], without another copy
        self._hash = memoryview(h).cast("B").cast("q")
        wide = n >= (1 << 31)
        self._ids = memoryview(order if wide else order.astype(np.int32)).cast("B").cast("q" if wide else "i")

    #: A term's 64-bit key (Python's string hash: SipHash, seeded per process).
    key = staticmethod(hash)

    def get(self, term, default=None):
        """``term``'s global id, or ``default`` where the vocabulary lacks it."""
        if not isinstance(term, str):
            return default
        h = self.key(term)
        hs = self._hash
        i = bisect.bisect_left(hs, h)
        raw = None
        while i < self._n and hs[i] == h:  # equal hashes: each candidate's bytes compared
            g = self._ids[i]
            if raw is None:
                try:
                    raw = term.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: no stored term holds one
                    return default
            if self._data[self._off[g]:self._off[g + 1]] == raw:
                return g
            i += 1
        return default

    def __getitem__(self, term) -> int:
        g = self.get(term)
        if g is None:
            raise KeyError(term)
        return g

    def __contains__(self, term) -> bool:
        return self.get(term) is not None

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        """The terms in id order."""
        step = 1 << 16
        for i in range(0, self._n, step):
            yield from self._terms.slice(i, step).to_pylist()

    def items(self):
        """(term, global id) in id order."""
        return zip(self, range(self._n))

    def __eq__(self, other) -> bool:
        if isinstance(other, Vocabulary):
            return self._terms.equals(other._terms)
        return NotImplemented

    __hash__ = None  # mutable-looking and compared by contents, as a dict is

