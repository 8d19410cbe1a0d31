"""The passage BM25 stage of a build or reindex (``--bm25-passages``): wiring only.

After the dense stage has written ``passages/shard-NNNN.parquet``, each shard's passages
become corpus rows (``funnel.pipelines.lexical.passage_bm25.passage_table``) in Parquet files under
the build's work folder, one shard at a time (memory follows a shard, as in the dense
stage); the ordinary build (``build_index.build``: read, analyze, DF reduce, postings)
indexes them into a throwaway root there, and its published version folder moves into the
parent's staging folder as ``bm25-passages/``. The parent's publish then checksums those
files with its own, so ``funnel verify``, the scrubber and a remote root's upload treat them
as any other file of the version; serving opens the folder with the parent's verification.
"""

from __future__ import annotations

import logging
import os
import shutil

log = logging.getLogger("funnel.build")

#: Rows per row group of the passage corpus files: each group is one read chunk of the sub-build.
ROW_GROUP = 16_384


def write_passage_corpus(staging: str, n_shards: int, out_dir: str) -> int:
    """Write ``out_dir/shard-NNNN.parquet`` (``_id``, ``title``, ``text``) for every shard of
    ``staging`` that has passages; the number of passages written."""
    import pyarrow.parquet as pq

    from funnel.pipelines.lexical.passage_bm25 import passage_table
    from funnel.pipelines.dense.passages import read_passages
    from funnel.pipelines.lexical.shard import shard_name

    os.makedirs(out_dir, exist_ok=True)
    total = 0
    for s in range(n_shards):
        path = os.path.join(staging, "passages", f"{shard_name(s)}.parquet")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} is missing: --bm25-passages needs the dense stage's passages")
        spans = read_passages(path)
        if not len(spans["local_id"]):
            continue
        docs = pq.read_table(os.path.join(staging, "docs", f"{shard_name(s)}.parquet"),
                             columns=["local_id", "title", "text"]).to_pydict()
        table = passage_table(s, docs, spans)
        del docs
        pq.write_table(table, os.path.join(out_dir, f"{shard_name(s)}.parquet"), row_group_size=ROW_GROUP)
        total += table.num_rows
    return total


def run_passage_bm25(staging: str, work: str, n_shards: int, *, engine: str = "local", num_cpus: int | None = None,
                     progress_seconds: float | None = None, shard_mib: int | None = None,
                     shared_disk: bool | None = None, limits: dict | None = None) -> dict:
    """Build the passage BM25 index of ``staging`` into ``staging/bm25-passages``; returns the
    manifest's ``bm25_passages`` section.

    ``engine`` is the sub-build's (``build_index.choose_engine``): pass ``local`` where Ray
    workers could not read this process's work folder (workers that ship their files).
    ``limits`` are the parent's row bounds (a passage is never larger than its document).
    """
    from funnel.jobs.build_index import BuildError, build
    from funnel.pipelines.store.artifacts import load_manifest
    from funnel.pipelines.lexical.passage_bm25 import SUBDIR

    corpus = os.path.join(work, "bm25-passages-corpus")
    root = os.path.join(work, "bm25-passages-root")
    n = write_passage_corpus(staging, n_shards, corpus)
    log.info("bm25 passages: indexing %s passages as documents of their own", f"{n:,}")
    kw = {} if progress_seconds is None else {"progress_seconds": progress_seconds}
    try:
        rep = build(corpus, root, strict=True, fmt="parquet", id_field="_id", engine=engine, num_cpus=num_cpus,
                    shard_mib=shard_mib, shared_disk=shared_disk, limits=limits, dense=False, **kw)
    except BuildError as e:
        raise BuildError(f"the passage BM25 index (--bm25-passages) failed: {e}") from e
    dst = os.path.join(staging, SUBDIR)
    os.rename(os.path.join(root, rep.version), dst)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(corpus, ignore_errors=True)
    sub = load_manifest(dst)
    return {"dir": SUBDIR, "n_passages": int(rep.n_docs), "n_shards": int(rep.n_shards),
            "ids": "shard:local:ordinal of each passage's document and its ordinal in passages/",
            "scoring": "a document's score is its best passage's BM25 (MaxP)",
            "collection": sub["collection"], "engine": rep.engine.get("name")}
