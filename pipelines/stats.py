"""Global term statistics: the DF reduce across shards, written to ``stats.duckdb``.

Every shard writes ``terms.parquet`` (term, df, cf) for its own documents; the reduce is a
DuckDB ``GROUP BY`` over those files, which spills to disk instead of holding the
vocabulary of a large corpus in Python. Tables:

    terms(term, df, cf)                       global document and collection frequency
    collection(n_docs, n_docs_nonempty, total_terms, avgdl, n_shards, n_terms)
    shards(shard, n_docs, total_terms, n_terms)

BM25 uses N = documents with at least one indexed term and avgdl = total_terms / N, as
Lucene's ``CollectionStatistics`` (docCount counts documents that have the field).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import duckdb
import numpy as np


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
    """(terms sorted as object array, df int64, cf int64) from ``stats.duckdb``."""
    con = duckdb.connect(db_path, read_only=True)
    try:
        # fetchnumpy, not Arrow's to_numpy: pyarrow's conversion imports pandas (0.3-0.4 s of
        # every `funnel search` process), and this is the only thing serving needed it for.
        cols = con.sql("SELECT term, df, cf FROM terms ORDER BY term").fetchnumpy()
    finally:
        con.close()
    return (np.asarray(cols["term"], dtype=object), np.asarray(cols["df"], dtype=np.int64),
            np.asarray(cols["cf"], dtype=np.int64))

