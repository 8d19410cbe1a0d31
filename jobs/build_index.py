"""Build a funnel index with Ray Data: read -> validate -> hash-partition -> shards -> publish.

    python jobs/build_index.py --corpus PATH --out INDEX_ROOT [--shards N]
    ray job submit --working-dir . -- python jobs/build_index.py --corpus ... --out ...

Local Ray unless RAY_ADDRESS names a cluster. Ray appears only here: the stages are the
pure functions of ``funnel.pipelines``. The driver holds chunk descriptions and one
summary row per shard, never the corpus.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger("funnel.build")


@dataclass
class BuildReport:
    version: str
    index_root: str
    n_docs: int
    n_rejects: int
    n_shards: int
    seconds: float
    stage_seconds: dict = field(default_factory=dict)
    rejects_path: str = ""

    def to_dict(self) -> dict:
        return self.__dict__.copy()


class BuildError(RuntimeError):
    """The build stopped; nothing was published."""


def _init_ray(num_cpus: int | None = None) -> None:
    import ray
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 configure_logging=True, logging_level=logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = sys.stderr.isatty()  # Ray Data's per-stage bars on a terminal
    if not log.isEnabledFor(logging.DEBUG):
        logging.getLogger("ray.data").setLevel(logging.WARNING)


def _parse_chunk_fn(spec_dict: dict, n_shards: int, work_dir: str):
    from funnel.pipelines.corpus import Chunk, CorpusSpec, read_chunk, shard_of

    spec = CorpusSpec(**spec_dict)

    def parse(row: dict) -> list[dict]:
        chunk = Chunk(**{k: row[k] for k in ("index", "path", "kind", "start", "end", "row_group")})
        res = read_chunk(chunk, spec)
        os.makedirs(os.path.join(work_dir, "rejects"), exist_ok=True)
        with open(os.path.join(work_dir, "rejects", f"chunk-{chunk.index:06d}.json"), "w") as f:
            json.dump({"chunk": chunk.index, "path": chunk.path, "lines": res.lines,
                       "rows": len(res.rows), "rejects": res.rejects}, f)
        for r in res.rows:
            r["shard"] = shard_of(r["doc_id"], n_shards)
        return res.rows

    return parse


def _shard_fn(out_dir: str, work_dir: str, analyzer_cfg: dict):
    from funnel.pipelines.analysis import AnalyzerConfig
    from funnel.pipelines.shard import build_lexical_shard

    cfg = AnalyzerConfig(stopwords=analyzer_cfg["stopwords"], stemmer=analyzer_cfg["stemmer"])

    def build(batch: dict) -> dict:
        shard = int(batch["shard"][0])
        s = build_lexical_shard(batch, shard, out_dir, work_dir, cfg)
        return {k: [v] for k, v in s.items()}

    return build


def _valid_rows(work_dir: str) -> int:
    rdir = os.path.join(work_dir, "rejects")
    n = 0
    for name in os.listdir(rdir) if os.path.isdir(rdir) else []:
        if name.startswith("chunk-"):
            with open(os.path.join(rdir, name)) as f:
                n += json.load(f).get("rows", 0)
    return n


def _collect_rejects(work_dir: str, out_path: str) -> int:
    """Merge per-chunk and per-shard reject files into one rejects.jsonl, in corpus order,
    with absolute 1-based line numbers per file."""
    rdir = os.path.join(work_dir, "rejects")
    chunks = {}
    shard_rejects = []
    for name in sorted(os.listdir(rdir)) if os.path.isdir(rdir) else []:
        with open(os.path.join(rdir, name)) as f:
            data = json.load(f)
        if name.startswith("chunk-"):
            chunks[data["chunk"]] = data
        else:
            shard_rejects.extend(data)
    # Line offset of each chunk inside its file.
    offset, prev_path, base = {}, None, 0
    for idx in sorted(chunks):
        c = chunks[idx]
        if c["path"] != prev_path:
            base, prev_path = 0, c["path"]
        offset[idx] = base
        base += c["lines"]
    rows = []
    for c in chunks.values():
        for r in c["rejects"]:
            rows.append({**r, "line": offset[r["chunk"]] + r["line"]})
    for r in shard_rejects:
        first_chunk, first_line = r.pop("first")
        rows.append({**r, "path": chunks.get(r["chunk"], {}).get("path"),
                     "line": offset.get(r["chunk"], 0) + r["line"],
                     "reason": f"duplicate id {r['doc_id']!r} (first seen at line "
                               f"{offset.get(first_chunk, 0) + first_line})"})
    rows.sort(key=lambda r: (r["chunk"], r["line"]))
    with open(out_path, "w") as f:
        for r in rows:
            r.pop("chunk", None)
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


def build(corpus: str, out: str, shards: int = 4, strict: bool = False, fmt: str = "auto",
          id_field: str | None = None, title_field: str = "title", text_field: str = "text",
          keep_versions: int | None = None, dense: bool = False, embed_model: str | None = None,
          embed_batch_size: int = 64, chunk_bytes: int = 4 << 20, num_cpus: int | None = None) -> BuildReport:
    """Build and publish a new index version under ``out``; see the module docstring."""
    from funnel.pipelines.analysis import Analyzer
    from funnel.pipelines.artifacts import new_staging_dir, publish
    from funnel.pipelines.corpus import CorpusSpec, plan_chunks
    from funnel.pipelines.postings import finalize_shard
    from funnel.pipelines.shard import build_lexical_shard, combine_fingerprints, shard_name
    from funnel.pipelines.stats import load_vocabulary, reduce_term_stats

    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    t0 = time.time()
    timings = {}
    spec = CorpusSpec(path=corpus, format=fmt, id_field=id_field, title_field=title_field,
                      text_field=text_field)
    chunks = plan_chunks(spec, target_bytes=chunk_bytes)
    log.info("corpus %s: %d chunks", corpus, len(chunks))
    analyzer = Analyzer()
    staging = new_staging_dir(out)
    work = os.path.join(out, ".work-" + os.path.basename(staging).split("-", 1)[1])
    os.makedirs(work)
    try:
        _init_ray(num_cpus)
        import ray

        t = time.time()
        ds = ray.data.from_items([c.to_dict() for c in chunks], override_num_blocks=max(1, len(chunks)))
        ds = ds.flat_map(_parse_chunk_fn(spec.to_dict(), shards, work))
        try:
            summaries = (ds.groupby("shard", num_partitions=shards)
                         .map_groups(_shard_fn(staging, work, analyzer.config.to_dict()), batch_format="numpy")
                         .take_all())
        except Exception as e:
            # Ray Data's shuffle fails on a dataset with no rows at all: say what happened.
            if _valid_rows(work) == 0:
                raise BuildError(f"no valid documents in {corpus}; nothing published "
                                 f"(see the reasons with --strict or in the rejects)") from e
            raise
        timings["read_analyze_shard"] = round(time.time() - t, 2)
        by_shard = {int(s["shard"]): s for s in summaries}
        empty = {"doc_id": [], "title": [], "text": [], "content_hash": [], "chunk": [], "line": []}
        for s in range(shards):  # a shard that received no documents still exists, empty
            if s not in by_shard:
                by_shard[s] = build_lexical_shard(empty, s, staging, work)
        shard_rows = [by_shard[s] for s in range(shards)]

        n_rejects = _collect_rejects(work, os.path.join(staging, "rejects.jsonl"))
        n_docs = sum(int(r["n_docs"]) for r in shard_rows)
        if n_rejects:
            log.warning("%d rows rejected; see %s", n_rejects, "rejects.jsonl in the new version")
        if strict and n_rejects:
            with open(os.path.join(staging, "rejects.jsonl")) as f:
                first = [json.loads(line) for _, line in zip(range(3), f)]
            raise BuildError(f"--strict: {n_rejects} rows rejected (first: {first}); nothing published")
        if n_docs == 0:
            raise BuildError(f"no valid documents in {corpus}; nothing published")

        t = time.time()
        term_files = [os.path.join(staging, "lexical", shard_name(s), "terms.parquet") for s in range(shards)]
        stats = reduce_term_stats(term_files, shard_rows, os.path.join(staging, "stats.duckdb"))
        global_terms, _, _ = load_vocabulary(os.path.join(staging, "stats.duckdb"))
        for s in range(shards):
            finalize_shard(os.path.join(staging, "lexical", shard_name(s)), global_terms)
        del global_terms
        timings["df_reduce"] = round(time.time() - t, 2)

        manifest = {
            "kind": "funnel-index",
            "corpus": {"source": corpus, "spec": spec.to_dict(),
                       "fingerprint": combine_fingerprints([r["fingerprint_sum"] for r in shard_rows]),
                       "n_docs": n_docs, "n_rejects": n_rejects},
            "analyzer": analyzer.describe(),
            "bm25": {"k1": 0.9, "b": 0.4, "length_norm": "lucene-byte4",
                     "document": "title + '\\n' + text (Pyserini BEIR flat)"},
            "collection": stats.to_dict(),
            "shards": [{"shard": s, "n_docs": int(r["n_docs"]), "total_terms": int(r["total_terms"]),
                        "n_terms": int(r["n_terms"])} for s, r in enumerate(shard_rows)],
            "dense": None,
            "build": {"seconds": None, "stages": timings, "ray_address": os.environ.get("RAY_ADDRESS")},
        }
        if dense:
            t = time.time()
            from funnel.jobs.embed_stage import run_dense_stage
            manifest["dense"] = run_dense_stage(staging, shards, embed_model, embed_batch_size, n_docs=n_docs)
            timings["dense"] = round(time.time() - t, 2)
        manifest["build"]["seconds"] = round(time.time() - t0, 2)
        version = publish(out, staging, manifest, keep=keep_versions)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    secs = round(time.time() - t0, 2)
    log.info("published %s/%s: %d docs, %d rejects, %.1fs", out, version, n_docs, n_rejects, secs)
    return BuildReport(version, out, n_docs, n_rejects, shards, secs, timings,
                       os.path.join(out, version, "rejects.jsonl"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", required=True, help="BEIR dir, .jsonl, .parquet (local path or URI)")
    p.add_argument("--out", required=True, help="INDEX_ROOT: versions and CURRENT live here")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--strict", action="store_true", help="fail (publish nothing) on any rejected row")
    p.add_argument("--format", dest="fmt", default="auto", choices=["auto", "beir", "jsonl", "parquet"])
    p.add_argument("--id-field", default=None)
    p.add_argument("--title-field", default="title")
    p.add_argument("--text-field", default="text")
    p.add_argument("--keep-versions", type=int, default=None)
    p.add_argument("--dense", dest="dense", action="store_true", help="also embed into FAISS shards")
    p.add_argument("--no-dense", dest="dense", action="store_false")
    p.set_defaults(dense=False)
    p.add_argument("--embed-model", default=None)
    p.add_argument("--embed-batch-size", type=int, default=64)
    p.add_argument("--num-cpus", type=int, default=None, help="local Ray only")


def run_from_args(a: argparse.Namespace) -> BuildReport:
    rep = build(a.corpus, a.out, shards=a.shards, strict=a.strict, fmt=a.fmt, id_field=a.id_field,
                title_field=a.title_field, text_field=a.text_field, keep_versions=a.keep_versions,
                dense=a.dense, embed_model=a.embed_model, embed_batch_size=a.embed_batch_size,
                num_cpus=a.num_cpus)
    print(f"published {rep.index_root}/{rep.version}: {rep.n_docs} documents in {rep.n_shards} shards, "
          f"{rep.n_rejects} rejected ({rep.rejects_path}), {rep.seconds:.1f}s")
    return rep


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(prog="build_index", description=__doc__.split("\n")[0])
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        run_from_args(a)
    except (BuildError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
