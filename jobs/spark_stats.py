"""The corpus-statistics stage on pyspark: the DF table of ``stats.duckdb`` without Ray.

    python jobs/spark_stats.py --corpus PATH --out stats.duckdb [--master local[*]] [--shards N]
    spark-submit jobs/spark_stats.py --corpus s3://lake/corpus/ --out stats.duckdb

For a corpus that already lives next to a Spark cluster. It computes what a funnel build's
lexical stages feed into `funnel.pipelines.lexical.stats.reduce_term_stats`, with the same
pure functions, and writes the file with that same writer, so ``terms(term, df, cf)``,
``collection(n_docs, n_docs_nonempty, total_terms, avgdl, n_shards, n_terms)`` and
``shards(...)`` equal a build's ``stats.duckdb`` row for row (``tests/test_spark_stats.py``):

1. the corpus is planned into chunks (``plan_chunks``: JSONL byte ranges, Parquet row
   groups) and each Spark task reads its chunks with ``read_chunk``, the build's read:
   the same validation, so the same rows are rejected;
2. per partition (``mapPartitions``) every valid row is analyzed by
   ``funnel.pipelines.lexical.analysis.Analyzer`` over ``title + "\\n" + text`` (the build's
   document), leaving (doc_id -> chunk, line, length, term counts);
3. a ``reduceByKey`` on doc_id keeps the first occurrence of an id in corpus order, as the
   build's shards do (later copies count as duplicate rejects);
4. per partition, (shard, term) -> (df, cf) and per-shard sums, where shard is the build's
   ``shard_of(doc_id, n_shards)`` with the build's shard count (``--shards``, default the
   build's auto count), then a ``reduceByKey`` over (shard, term);
5. the driver streams the result (``toLocalIterator``, one partition at a time, never the
   corpus) into Parquet files and ``reduce_term_stats`` sums them in DuckDB.

``--master`` defaults to ``local[*]`` (or what spark-submit set). On a cluster, every
executor needs funnel installed (``pip install funnel`` in its image, or
``--py-files``) and the corpus path must be readable from the executors (s3://, gs://,
hdfs:// or a shared mount); the output file is written by the driver.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field

log = logging.getLogger("funnel.spark_stats")

#: Rows per Parquet file that the driver writes while streaming the (shard, term) table.
TERM_BATCH_ROWS = 200_000
#: Largest read chunk (bytes of JSONL); smaller ones are used so every core gets work.
MAX_CHUNK_BYTES = 4 << 20
MIN_CHUNK_BYTES = 256 << 10


class SparkStatsError(RuntimeError):
    """Nothing was written."""


@dataclass
class SparkStatsReport:
    out: str
    n_docs: int
    n_rejects: int          # invalid rows + duplicate ids, as a build counts them
    n_duplicates: int
    n_terms: int
    n_shards: int
    collection: dict
    master: str
    partitions: int
    chunks: int
    seconds: float
    stage_seconds: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def document_text(title: str, text: str) -> str:
    """The text a build indexes (``build_lexical_shard``): Pyserini's BEIR flat document."""
    return f"{title}\n{text}" if title else text


def _key_partition(key) -> int:
    """A stable partitioner (crc32; Python's str hash differs per worker process)."""
    return zlib.crc32(repr(key).encode("utf-8", "backslashreplace"))


# --- the per-partition functions (run on executors; import funnel there) -----------------

def _read_analyze_fn(spec_dict: dict, analyzer_cfg: dict):
    def run(chunk_dicts):
        from collections import Counter

        from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
        from funnel.pipelines.sources.corpus import Chunk, CorpusSpec, read_chunk

        spec = CorpusSpec(**spec_dict)
        analyzer = Analyzer(AnalyzerConfig(**analyzer_cfg))
        for cd in chunk_dicts:
            chunk = Chunk(**cd)
            res = read_chunk(chunk, spec)
            # One record per chunk with its reject count: a unique key, so never combined.
            yield ("r", chunk.index), (len(res.rejects),)
            for r in res.rows:
                toks = analyzer.analyze(document_text(r["title"], r["text"]))
                yield ("d", r["doc_id"]), (r["chunk"], r["line"], len(toks),
                                           tuple(Counter(toks).items()), 1)
    return run


def _first_in_corpus_order(a: tuple, b: tuple) -> tuple:
    """Reduce for one doc_id: the earliest (chunk, line) wins; the copies are counted."""
    if len(a) == 1:  # a chunk's reject count (keys are unique; kept total for safety)
        return (a[0] + b[0],)
    first = a if (a[0], a[1]) <= (b[0], b[1]) else b
    return first[:4] + (a[4] + b[4],)


def _shard_terms_fn(n_shards: int):
    def run(records):
        from funnel.pipelines.sources.corpus import shard_of

        terms: dict[tuple[int, str], list[int]] = {}
        shards: dict[int, list[int]] = {}
        rejects = dups = 0
        for key, v in records:
            if key[0] == "r":
                rejects += v[0]
                continue
            _chunk, _line, doclen, counts, copies = v
            dups += copies - 1
            s = shard_of(key[1], n_shards)
            acc = shards.setdefault(s, [0, 0, 0])
            acc[0] += 1
            acc[1] += 1 if doclen else 0
            acc[2] += doclen
            for term, tf in counts:
                t = terms.get((s, term))
                if t is None:
                    terms[(s, term)] = [1, tf]
                else:
                    t[0] += 1
                    t[1] += tf
        for (s, term), (df, cf) in terms.items():
            yield ("t", s, term), (df, cf)
        for s, acc in shards.items():
            yield ("s", s), tuple(acc)
        yield ("c",), (rejects, dups)
    return run


def _add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


# --- driver -------------------------------------------------------------------------------

def _session(master: str | None, app_name: str = "funnel-spark-stats"):
    """(SparkSession, created_here). An active session (a test's, a notebook's) is reused."""
    import warnings
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")  # unused here
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    b = SparkSession.builder.appName(app_name)
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # not under spark-submit (which sets the master and the gateway)
    if master:
        b = b.master(master)
    if master and master.startswith("local"):
        # One machine: bind loopback only, no UI, executors run this interpreter (with funnel).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        for k, v in (("spark.ui.enabled", "false"), ("spark.ui.showConsoleProgress", "false"),
                     ("spark.driver.bindAddress", "127.0.0.1"), ("spark.driver.host", "127.0.0.1")):
            b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark, True


def _auto_chunk_bytes(nbytes: int, parallelism: int) -> int:
    """About two chunks per core, between 256 KiB and 4 MiB (the build's default)."""
    want = -(-nbytes // max(1, 2 * parallelism))
    return int(min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, want)))


def compute_stats(corpus: str, out: str, master: str | None = None, shards: int | None = None,
                  fmt: str = "auto", id_field: str | None = None, title_field: str = "title",
                  text_field: str = "text", partitions: int | None = None,
                  chunk_bytes: int | None = None, spark=None) -> SparkStatsReport:
    """Compute the corpus statistics on Spark and write ``out`` (a DuckDB file) as a build does.

    ``shards`` None takes the build's auto count (`choose_shards`), so the ``shards``
    table and ``collection.n_shards`` match a build with the same ``--shards``. ``spark``:
    a SparkSession to use (else the active one, else a new one on ``master``, stopped at
    the end). Raises `SparkStatsError` when no row is valid (nothing written).
    """
    from funnel.jobs.build_index import choose_shards, corpus_bytes
    from funnel.pipelines.lexical.analysis import Analyzer
    from funnel.pipelines.sources.corpus import CorpusSpec, plan_chunks
    from funnel.pipelines.lexical.stats import reduce_term_stats

    t0 = time.time()
    timings: dict[str, float] = {}
    spec = CorpusSpec(path=corpus, format=fmt, id_field=id_field, title_field=title_field,
                      text_field=text_field)
    nbytes = corpus_bytes(spec)
    n_shards, _why = choose_shards(shards, nbytes)
    analyzer_cfg = {k: v for k, v in Analyzer().config.to_dict().items() if k in ("stopwords", "stemmer")}

    t = time.time()
    created = False
    if spark is None:
        spark, created = _session(master)
    sc = spark.sparkContext
    timings["spark_start"] = round(time.time() - t, 2)
    try:
        t = time.time()
        par = sc.defaultParallelism
        chunks = plan_chunks(spec, target_bytes=chunk_bytes or _auto_chunk_bytes(nbytes, par))
        n_part = partitions or max(1, 2 * par)
        log.info("corpus %s: %d chunks, %d bytes; %d shard(s); Spark %s, %d partitions", corpus, len(chunks),
                 nbytes, n_shards, sc.master, n_part)
        docs = (sc.parallelize([c.to_dict() for c in chunks], max(1, len(chunks)))
                .mapPartitions(_read_analyze_fn(spec.to_dict(), analyzer_cfg))
                .reduceByKey(_first_in_corpus_order, n_part, _key_partition))
        stats = (docs.mapPartitions(_shard_terms_fn(n_shards))
                 .reduceByKey(_add, n_part, _key_partition))

        import pyarrow as pa
        import pyarrow.parquet as pq
        tmp = tempfile.mkdtemp(prefix=".spark-stats-", dir=os.path.dirname(os.path.abspath(out)) or ".")
        try:
            files: list[str] = []
            batch_s: list[int] = []
            batch_t: list[str] = []
            batch_df: list[int] = []
            batch_cf: list[int] = []
            shard_sums: dict[int, tuple] = {}
            rejects = dups = 0

            def flush() -> None:
                if not batch_t:
                    return
                path = os.path.join(tmp, f"terms-{len(files):06d}.parquet")
                pq.write_table(pa.table({"shard": pa.array(batch_s, pa.int32()),
                                         "term": pa.array(batch_t, pa.string()),
                                         "df": pa.array(batch_df, pa.int64()),
                                         "cf": pa.array(batch_cf, pa.int64())}), path)
                files.append(path)
                for b in (batch_s, batch_t, batch_df, batch_cf):
                    b.clear()

            for key, v in stats.toLocalIterator():
                if key[0] == "t":
                    batch_s.append(key[1])
                    batch_t.append(key[2])
                    batch_df.append(v[0])
                    batch_cf.append(v[1])
                    if len(batch_t) >= TERM_BATCH_ROWS:
                        flush()
                elif key[0] == "s":
                    shard_sums[key[1]] = v
                else:
                    rejects, dups = rejects + v[0], dups + v[1]
            flush()
            timings["read_analyze_df"] = round(time.time() - t, 2)

            t = time.time()
            n_docs = sum(v[0] for v in shard_sums.values())
            if n_docs == 0:
                raise SparkStatsError(f"no valid documents in {corpus}: all {rejects + dups} rows were "
                                      f"rejected; nothing written (funnel build --strict lists the reasons)")
            n_terms_by_shard: dict[int, int] = {}
            if files:
                import duckdb
                con = duckdb.connect()
                try:
                    for s, n in con.execute("SELECT shard, COUNT(*) FROM read_parquet(?) GROUP BY shard",
                                            [files]).fetchall():
                        n_terms_by_shard[int(s)] = int(n)
                finally:
                    con.close()
            shard_rows = []
            for s in range(n_shards):
                nd, ne, tt = shard_sums.get(s, (0, 0, 0))
                shard_rows.append({"shard": s, "n_docs": nd, "n_docs_nonempty": ne, "total_terms": tt,
                                   "n_terms": n_terms_by_shard.get(s, 0)})
            coll = reduce_term_stats(files, shard_rows, out)
            timings["duckdb_write"] = round(time.time() - t, 2)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        master_used = sc.master
    finally:
        if created:
            spark.stop()
    secs = round(time.time() - t0, 2)
    log.info("wrote %s: %d documents, %d terms, %d rejected (%d duplicate ids), %.1fs", out, coll.n_docs,
             coll.n_terms, rejects + dups, dups, secs)
    return SparkStatsReport(out=out, n_docs=coll.n_docs, n_rejects=rejects + dups, n_duplicates=dups,
                            n_terms=coll.n_terms, n_shards=n_shards, collection=coll.to_dict(),
                            master=master_used, partitions=n_part, chunks=len(chunks), seconds=secs,
                            stage_seconds=timings)


def main(argv: list[str] | None = None) -> int:
    from funnel.jobs.build_index import add_corpus_arguments
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    p = argparse.ArgumentParser(prog="spark_stats", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--corpus", required=True,
                   help="a BEIR folder (corpus.jsonl), a .jsonl or .parquet file or a folder of them; a local "
                        "path or a pyarrow filesystem URI the executors can read (s3://, gs://, hdfs://)")
    p.add_argument("--out", required=True, help="the DuckDB file to write (stats.duckdb), replaced atomically")
    p.add_argument("--master", default=None,
                   help="Spark master URL (default: what spark-submit set, else local[*])")
    p.add_argument("--shards", type=int, default=None,
                   help="the build's shard count, for the shards table (default: the build's auto count)")
    add_corpus_arguments(p)
    p.add_argument("--partitions", type=int, default=None,
                   help="shuffle partitions (default: twice Spark's default parallelism)")
    p.add_argument("--chunk-bytes", type=int, default=None,
                   help="bytes of JSONL per read task (default: about two per core, at most 4 MiB)")
    p.add_argument("--json", action="store_true", help="also print the report as one line of JSON")
    a = p.parse_args(argv)
    try:
        rep = compute_stats(a.corpus, a.out, master=a.master, shards=a.shards, fmt=a.fmt, id_field=a.id_field,
                            title_field=a.title_field, text_field=a.text_field, partitions=a.partitions,
                            chunk_bytes=a.chunk_bytes)
    except (SparkStatsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c = rep.collection
    print(f"wrote {rep.out}: {rep.n_docs} documents ({c['n_docs_nonempty']} with terms), {rep.n_terms} terms, "
          f"avgdl {c['avgdl']:.4f}, {rep.n_shards} shard(s); {rep.n_rejects} rejected "
          f"({rep.n_duplicates} duplicate ids); {rep.seconds:.1f}s on Spark {rep.master} "
          f"({', '.join(f'{k} {v:.1f}s' for k, v in rep.stage_seconds.items())})")
    if a.json:
        print(json.dumps(rep.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
