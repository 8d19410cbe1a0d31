"""Hybrid quality table and per-stage latency on SciFact and NFCorpus.

    .venv/bin/python bench/bench_hybrid.py [--datasets scifact,nfcorpus] [--data DIR] [--write]

Builds (or reuses, at `funnel eval`'s index location .funnel/indexes/NAME) dense indexes,
then evaluates bm25, dense and each fusion / second-stage option on the test split, and
times single hybrid queries (p50/p95 per stage) on SciFact. Baselines named in the table:
the bm25 and dense rows of the same run. Prints its section of bench/RESULTS.md; --write
records it there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

CONFIGS = [  # (label, mode, options): every option explicit, so a row measures what it says
    ("bm25", "bm25", {}),
    ("dense (MiniLM-L6)", "dense", {}),
    ("RRF k=60", "hybrid", {"fusion": "rrf", "top_rank_bonus": None}),
    ("RRF k=60 + top-rank bonus", "hybrid", {"fusion": "rrf"}),
    ("RRF, BM25 list weight 2", "hybrid", {"fusion": "rrf", "top_rank_bonus": None, "bm25_weight": 2.0}),
    ("convex α=0.55 (min-max)", "hybrid", {"fusion": "convex", "alpha": 0.55}),
]


def _thread_pinning(ix, texts: list[str]) -> list[str]:
    """Hybrid latency with the query embedder on 1 torch thread (the default,
    ``FUNNEL_QUERY_THREADS``) against every core (torch's own default), interleaved in
    rounds so that both see the same machine load."""
    dense = ix.dense_mode.dense()
    threads = sorted({1, os.cpu_count() or 1})
    lat: dict[int, list[float]] = {n: [] for n in threads}
    loads = []
    saved = dense.provider.query_threads
    for rnd in range(3):
        for n in threads:
            dense.provider.query_threads = n
            for q in texts[rnd::3]:
                dense._cache.clear()
                t = time.perf_counter()
                ix.search(q, mode="hybrid", k=10)
                lat[n].append((time.perf_counter() - t) * 1000)
            loads.append(os.getloadavg()[0])
    dense.provider.query_threads = saved
    out = [f"Query-embedder threads (issue 17), same {len(texts)} queries, interleaved; load average "
           f"{min(loads):.1f}-{max(loads):.1f} during the run:", "",
           "| torch threads per query embedding | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|"]
    for n in threads:
        v = sorted(lat[n])
        out.append(f"| {n}{' (default)' if n == 1 else ' (torch default)'} | {statistics.median(v):.1f} | "
                   f"{v[int(0.95 * (len(v) - 1))]:.1f} | {v[int(0.99 * (len(v) - 1))]:.1f} |")
    return out + [""]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[4:]))
    p.add_argument("--datasets", default="scifact,nfcorpus", help="comma-separated (default %(default)s)")
    p.add_argument("--indexes", default=os.path.join(".funnel", "indexes"),
                   help="where the dense indexes are built or reused, one folder per dataset "
                        "(default %(default)s, as `funnel eval`)")
    add_common_arguments(p)
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    dirs = {ds: dataset_dir(a.data, ds) for ds in a.datasets.split(",")}
    from funnel.serving.frontends.cli import ensure_index
    from funnel.evaluation.evaluate import load_beir
    from funnel.evaluation.metrics import evaluate
    from funnel.evaluation.trec import run_as_written
    from funnel.serving.hybrid import HybridConfig
    from funnel.serving.search import open_index
    default = HybridConfig()

    def is_default(mode, opts):
        return mode == "hybrid" and HybridConfig.from_options(default, dict(opts)) == default
    lines = ["Command: `.venv/bin/python bench/bench_hybrid.py`. Test split, k=100 per list, "
             "MiniLM-L6 (all-MiniLM-L6-v2) for dense, real Lucene-parity BM25. No reranker row: no "
             "pretrained cross-encoder is available offline here, and a bi-encoder second stage "
             "with the only offline embedder (the same MiniLM) would re-score with the dense "
             "list's own similarity. q/s is batch throughput including query embedding.", ""]
    lat_lines = []
    for ds, ddir in dirs.items():
        root = ensure_index(ddir, os.path.join(a.indexes, ds), True, 4)
        ix = open_index(root)
        queries, qrels = load_beir(ddir)
        rows = []
        configs = list(CONFIGS)
        for label, mode, opts in configs:
            ix.search_batch(dict(list(queries.items())[:5]), mode=mode, k=100, **opts)  # warm up (JIT, caches)
            t = time.perf_counter()
            run = ix.search_batch(queries, mode=mode, k=100, **opts)
            secs = time.perf_counter() - t
            # Evaluated as funnel writes the run (Anserini's tie-break for BM25), i.e. as trec_eval
            # scores the run file: the published convention.
            m, _ = evaluate(run_as_written({q: dict(h) for q, h in run.items()}, mode), qrels,
                            ["ndcg@10", "recall@10", "recall@100"])
            label += " (default)" if is_default(mode, opts) else ""
            rows.append((label, m, len(queries) / secs))
            print(ds, label, {k: round(v, 4) for k, v in m.items()}, flush=True)
        best_single = max(rows[0][1]["ndcg@10"], rows[1][1]["ndcg@10"])
        lines += [f"**{ds}** ({len(queries)} queries)", "",
                  "| configuration | NDCG@10 | R@10 | R@100 | Δ NDCG@10 vs best single list | q/s (batch) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, m, qps in rows:
            lines.append(f"| {label} | {m['ndcg@10']:.4f} | {m['recall@10']:.4f} | {m['recall@100']:.4f} | "
                         f"{m['ndcg@10'] - best_single:+.4f} | {qps:.1f} |")
        lines.append("")
        if ds == "scifact":
            stages: dict[str, list[float]] = {}
            texts = list(queries.values())[:200]
            ix.search(texts[0], mode="hybrid")
            dense = ix.dense_mode.dense()
            for q in texts:
                dense._cache.clear()  # measure the query embedding too, not a cache hit
                res = ix.search(q, mode="hybrid", k=10)
                for st, ms in res.trace["timings_ms"].items():
                    stages.setdefault(st, []).append(ms)
            lat_lines += ["Per-stage latency of one hybrid query (SciFact, 200 test queries, k=10, "
                          "explanations and snippets on, query embedding computed each time; `total` includes "
                          "building the hits: snippets and per-term explanations), milliseconds:", "",
                          "| stage | p50 | p95 |", "|---|---:|---:|"]
            for st, v in stages.items():
                v = sorted(v)
                lat_lines.append(f"| {st} | {statistics.median(v):.2f} | {v[int(0.95 * (len(v) - 1))]:.2f} |")
            lat_lines.append("")
            lat_lines += _thread_pinning(ix, texts)
    report("hybrid", "Hybrid retrieval: quality per configuration and latency per stage",
           "\n".join(lines + lat_lines), a.write)


if __name__ == "__main__":
    main()
