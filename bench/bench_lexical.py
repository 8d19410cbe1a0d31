"""Lexical benchmark: build throughput and single-thread query throughput vs bm25s.

    .venv/bin/python bench/bench_lexical.py [--datasets scifact,nfcorpus] [--shards 1,4] [--data DIR] [--write]

Baseline, measured in the same run on the same machine: bm25s (NumPy backend, one thread,
Porter stemmer + English stopwords, k1=0.9, b=0.4, method="lucene"). Both sides answer every
query in the dataset's queries.jsonl with k=100. funnel's time includes query analysis;
bm25s is shown both with and without its tokenization. Prints its section of bench/RESULTS.md;
``--write`` records it there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

REPEATS = 3  # query timings are the best of 3 passes over all queries, both sides


def _queries(ddir):
    return {o["_id"]: o["text"] for o in map(json.loads, open(os.path.join(ddir, "queries.jsonl")))}


def bench_funnel(ddir, shards, tmp):
    from funnel.jobs.build_index import build
    from funnel.evaluation.evaluate import eval_dataset
    from funnel.serving.search import open_index
    root = os.path.join(tmp, f"{os.path.basename(ddir)}-{shards}")
    t = time.perf_counter()
    rep = build(ddir, root, shards=shards)
    build_s = time.perf_counter() - t
    ix = open_index(root)
    qs = _queries(ddir)
    ix.search_batch(dict(list(qs.items())[:50]), k=100)  # warm caches (impacts, pages)
    q_s = float("inf")
    for _ in range(REPEATS):  # best of REPEATS, as for the baseline
        t = time.perf_counter()
        ix.search_batch(qs, k=100)
        q_s = min(q_s, time.perf_counter() - t)
    # Where the time goes: query analysis alone, and scoring + top-k alone (best of REPEATS).
    texts = list(qs.values())
    an_s = sc_s = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        analyzed = [dict(ix.bm25.query_terms(q)) for q in texts]
        an_s = min(an_s, time.perf_counter() - t)
        t = time.perf_counter()
        for terms in analyzed:
            ix.bm25.search_arrays(terms, 100)
        sc_s = min(sc_s, time.perf_counter() - t)
    ndcg = eval_dataset(ix, ddir, ["bm25"])["metrics"]["bm25"]["ndcg@10"]
    return {"docs": rep.n_docs, "build_s": build_s, "build_stages": rep.stage_seconds,
            "qps": len(qs) / q_s, "n_queries": len(qs), "ndcg": ndcg,
            "us_analyze": 1e6 * an_s / len(qs), "us_score": 1e6 * sc_s / len(qs),
            "us_total": 1e6 * q_s / len(qs)}


def bench_bm25s(ddir):
    import bm25s
    import Stemmer
    from funnel.evaluation.metrics import evaluate
    from funnel.evaluation.trec import read_qrels
    stem = Stemmer.Stemmer("porter")
    docs = [json.loads(l) for l in open(os.path.join(ddir, "corpus.jsonl"))]
    t = time.perf_counter()
    toks = bm25s.tokenize([d["title"] + " " + d["text"] for d in docs], stopwords="en", stemmer=stem,
                          show_progress=False)
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    model.index(toks, show_progress=False)
    build_s = time.perf_counter() - t
    qs = _queries(ddir)
    texts = list(qs.values())
    tok_s = ret_s = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        qt = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)
        tok_s = min(tok_s, time.perf_counter() - t)
        t = time.perf_counter()
        res, scores = model.retrieve(qt, k=100, n_threads=1, backend_selection="numpy", show_progress=False)
        ret_s = min(ret_s, time.perf_counter() - t)
    ids = [d["_id"] for d in docs]
    run = {qid: {ids[j]: float(s) for j, s in zip(res[i], scores[i]) if s > 0 and ids[j] != qid}
           for i, qid in enumerate(qs)}
    qrels = read_qrels(os.path.join(ddir, "qrels", "test.tsv"))
    ndcg = evaluate(run, qrels, ["ndcg@10"])[0]["ndcg@10"]
    return {"docs": len(docs), "build_s": build_s, "qps_retrieve": len(texts) / ret_s,
            "qps_with_tokenize": len(texts) / (ret_s + tok_s), "ndcg": ndcg}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[3:]))
    p.add_argument("--datasets", default="scifact,nfcorpus", help="comma-separated (default %(default)s)")
    p.add_argument("--shards", default="1,4", help="shard counts to build, comma-separated (default %(default)s)")
    add_common_arguments(p)
    a = p.parse_args(argv)
    dirs = {ds: dataset_dir(a.data, ds) for ds in a.datasets.split(",")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ds, ddir in dirs.items():
            base = bench_bm25s(ddir)
            for shards in [int(s) for s in a.shards.split(",")]:
                f = bench_funnel(ddir, shards, tmp)
                rows.append((ds, shards, f, base))
                print(f"{ds} shards={shards}: funnel {f['qps']:.0f} q/s vs bm25s {base['qps_retrieve']:.0f} q/s "
                      f"(ratio {f['qps'] / base['qps_retrieve']:.2f}); build {f['docs'] / f['build_s']:.0f} docs/s "
                      f"vs bm25s {base['docs'] / base['build_s']:.0f} docs/s; NDCG@10 {f['ndcg']:.4f} vs {base['ndcg']:.4f}",
                      flush=True)
    lines = [
        f"Machine: {os.cpu_count()} cores, {platform.python_version()}, one query thread. "
        "Command: `.venv/bin/python bench/bench_lexical.py`. Baseline: bm25s (NumPy backend, "
        "n_threads=1, Porter + English stopwords, k1=0.9 b=0.4, method=lucene), same run. k=100, "
        "every query in queries.jsonl, best of 3 passes for each side.",
        "",
        "| dataset | shards | funnel q/s | bm25s q/s (retrieve) | bm25s q/s (+tokenize) | ratio funnel/bm25s (retrieve) "
        "| funnel build docs/s | bm25s index docs/s | funnel NDCG@10 | bm25s NDCG@10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ds, shards, f, b in rows:
        lines.append(f"| {ds} | {shards} | {f['qps']:.0f} | {b['qps_retrieve']:.0f} | {b['qps_with_tokenize']:.0f} | "
                     f"{f['qps'] / b['qps_retrieve']:.2f} | {f['docs'] / f['build_s']:.0f} | "
                     f"{b['docs'] / b['build_s']:.0f} | {f['ndcg']:.4f} | {b['ndcg']:.4f} |")
    lines += ["", "Where funnel's query time goes (µs per query, best of 3): " + "; ".join(
        f"{ds}/{sh} shards: analyze {f['us_analyze']:.0f}, score+top-k {f['us_score']:.0f}, "
        f"rest (doc ids, run assembly) {f['us_total'] - f['us_analyze'] - f['us_score']:.0f} of {f['us_total']:.0f}"
        for ds, sh, f, _ in rows),
        "Scoring costs a fixed ~20-30 µs per shard per query (term lookup, one numba kernel call, "
        "candidate cut); at this corpus size that overhead, not the postings, is why 4 shards "
        "are slower than 1. Shards exist for parallel builds and bounded memory at scale.",
        "", "funnel build time per stage (s): " + "; ".join(
        f"{ds}/{sh}: {f['build_stages']}" for ds, sh, f, _ in rows),
        "", "funnel's build includes starting a local Ray session (once per process) and the "
        "Ray Data shuffle; bm25s indexes in-process from a list already in memory."]
    report("lexical", "BM25: build and query throughput vs bm25s", "\n".join(lines), a.write)


if __name__ == "__main__":
    main()
