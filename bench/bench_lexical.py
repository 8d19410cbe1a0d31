"""Lexical benchmark: single-thread BM25 query throughput vs bm25s at its best, and build throughput.

    .venv/bin/python bench/bench_lexical.py [--datasets scifact,nfcorpus] [--shards 1,4] [--repeats 7] [--data DIR] [--write]

Baselines, measured in the same run on the same machine and the same queries: bm25s
(Porter stemmer + English stopwords, k1=0.9, b=0.4, method="lucene") with its NumPy backend
and with its numba backend (``backend="numba"``, warmed up before timing), both with
``n_threads=0`` (serial, in the calling thread: its fastest single-thread setting; n_threads=1
hands each query to a worker thread). Every query in the dataset's queries.jsonl is answered
at k=10 and at k=100. funnel is timed through ``Searcher.search_batch`` (query analysis,
scoring, doc ids), the same with its chunk-analysis cache emptied before each pass ("cold
cache", first shard count only), through the CLI's batch path into a run file ("CLI run":
``search_batch_rows`` + ``write_run_rows``, first shard count only), and separately on
pre-analyzed terms (``search_arrays``, one call per query) to compare with bm25s retrieval
on pre-tokenized queries. Every system's
passes are interleaved and the best of ``--repeats`` is kept. Prints its section of
bench/RESULTS.md; ``--write`` records it there.
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

from funnel.serving.lexical.retriever import IMPACT_POSTINGS, PRUNE_MIN_POSTINGS  # noqa: E402

KS = (10, 100)


def _queries(ddir):
    return {o["_id"]: o["text"] for o in map(json.loads, open(os.path.join(ddir, "queries.jsonl")))}


def _best(fn, timings: dict, key) -> None:
    t = time.perf_counter()
    fn()
    timings[key] = min(timings.get(key, float("inf")), time.perf_counter() - t)


def funnel_systems(ddir, shards, tmp, cold_cache=False):
    """Build the index, open it, and return {name: callable(k)} plus build/open facts."""
    from funnel.jobs.build_index import build
    from funnel.evaluation.evaluate import eval_dataset
    from funnel.evaluation.trec import write_run_rows
    from funnel.serving.search import open_index
    root = os.path.join(tmp, f"{os.path.basename(ddir)}-{shards}")
    t = time.perf_counter()
    rep = build(ddir, root, shards=shards)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    ix = open_index(root)
    open_s = time.perf_counter() - t
    qs = _queries(ddir)
    first = next(iter(qs.items()))
    t = time.perf_counter()
    ix.search_batch(dict([first]), k=100)  # first query after opening (includes numba's cached-code load)
    first_s = time.perf_counter() - t
    analyzed = [dict(ix.bm25.query_terms(q)) for q in qs.values()]
    for k in KS:
        ix.search_batch(qs, k=k)  # warm
    ndcg = eval_dataset(ix, ddir, ["bm25"])["metrics"]["bm25"]["ndcg@10"]

    def score_only(k):
        for terms in analyzed:
            ix.bm25.search_arrays(terms, k)
    def cold(k):  # the analysis cache of whitespace chunks emptied first: every chunk analyzed
        ix.bm25._chunk_gids.clear()
        ix.search_batch(qs, k=k)
    def cli(k):  # what `funnel search IDX --queries Q --run R` does once the queries are read
        write_run_rows(os.path.join(tmp, f"run-k{k}.trec"), ix.search_batch_rows(qs, k=k), tag="funnel-bm25",
                       tiebreak=True)
    systems = {f"funnel {shards} shard{'s' if shards > 1 else ''}": lambda k: ix.search_batch(qs, k=k),
               f"funnel {shards} score-only": score_only}
    if cold_cache:
        systems[f"funnel {shards} cold cache"] = cold
        systems[f"funnel {shards} CLI run"] = cli
    return (systems,
            {"docs": rep.n_docs, "build_s": build_s, "build_stages": rep.stage_seconds,
             "engine": (rep.engine or {}).get("name", "?"), "open_s": open_s,
             "first_s": first_s, "ndcg": ndcg, "pruned_shards": ix.bm25.prune_stats})


def bm25s_systems(ddir):
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
    fast = bm25s.BM25(method="lucene", k1=0.9, b=0.4, backend="numba")
    fast.index(toks, show_progress=False)
    texts = list(_queries(ddir).values())
    qt = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)

    def run(m, backend, k):
        return m.retrieve(qt, k=k, n_threads=0, backend_selection=backend, show_progress=False)

    def with_tokenize(m, backend, k):
        q = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)
        return m.retrieve(q, k=k, n_threads=0, backend_selection=backend, show_progress=False)
    for k in KS:
        run(fast, "numba", k)  # compile and warm the numba backend
    res, scores = run(model, "numpy", 100)
    ids = [d["_id"] for d in docs]
    qids = list(_queries(ddir))
    run_ = {qid: {ids[j]: float(s) for j, s in zip(res[i], scores[i]) if s > 0 and ids[j] != qid}
            for i, qid in enumerate(qids)}
    ndcg = evaluate(run_, read_qrels(os.path.join(ddir, "qrels", "test.tsv")), ["ndcg@10"])[0]["ndcg@10"]
    return ({"bm25s numpy": lambda k: run(model, "numpy", k),
             "bm25s numba": lambda k: run(fast, "numba", k),
             "bm25s numba +tokenize": lambda k: with_tokenize(fast, "numba", k)},
            {"docs": len(docs), "build_s": build_s, "ndcg": ndcg})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[3:]))
    p.add_argument("--datasets", default="scifact,nfcorpus", help="comma-separated (default %(default)s)")
    p.add_argument("--shards", default="1,4", help="shard counts to build, comma-separated (default %(default)s)")
    p.add_argument("--repeats", type=int, default=7, help="timed passes per system, best kept (default %(default)s)")
    add_common_arguments(p)
    a = p.parse_args(argv)
    dirs = {ds: dataset_dir(a.data, ds) for ds in a.datasets.split(",")}
    shard_counts = [int(x) for x in a.shards.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ds, ddir in dirs.items():
            systems, base = bm25s_systems(ddir)
            facts = {}
            for sh in shard_counts:
                f_sys, facts[sh] = funnel_systems(ddir, sh, tmp, cold_cache=sh == shard_counts[0])
                systems.update(f_sys)
            n_q = len(_queries(ddir))
            timings: dict = {}
            for _ in range(a.repeats):  # interleaved: every system sees the same machine state
                for name, fn in systems.items():
                    for k in KS:
                        _best(lambda: fn(k), timings, (name, k))
            qps = {key: n_q / s for key, s in timings.items()}
            results[ds] = (qps, facts, base, n_q)
            for k in KS:
                print(f"{ds} k={k}: " + ", ".join(f"{n} {qps[(n, k)]:,.0f}" for n in systems), flush=True)
    first_f = f"funnel {shard_counts[0]} shard{'s' if shard_counts[0] > 1 else ''}"
    lines = [
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, one query thread, "
        f"load average at the end {os.getloadavg()[0]:.1f}. Command: `.venv/bin/python bench/bench_lexical.py "
        f"--datasets {a.datasets} --shards {a.shards} --repeats {a.repeats}`. Queries/s over every query in "
        f"queries.jsonl, best of {a.repeats} interleaved passes per system, same run. bm25s: method=lucene, "
        "k1=0.9 b=0.4, Porter + English stopwords, `n_threads=0` (serial), NumPy backend and numba backend "
        "(warm). funnel: `Searcher.search_batch` (analysis + scoring + doc ids, results as Python "
        "dicts; every query of the batch in one compiled call); 'score-only' is `search_arrays` per query on "
        "pre-analyzed terms (one call per query); 'cold cache' is `search_batch` with its cache of "
        "analyzed whitespace chunks emptied before each pass, so every chunk is analyzed again (the "
        "timed passes otherwise reuse what earlier passes analyzed); 'CLI run' is what `funnel search IDX "
        "--queries Q --run R` does once the queries are read: `search_batch_rows` and `write_run_rows` "
        "(Anserini tie-break, TREC lines) into a file that each pass overwrites.",
        "",
    ]
    names = [n for n, k in next(iter(results.values()))[0] if k == KS[0]]
    lines.append("| dataset | k | " + " | ".join(f"{n} q/s" for n in names) +
                 f" | {first_f} / bm25s numpy | {first_f} / bm25s numba | score-only / bm25s numba"
                 " | CLI run / bm25s numba | CLI run / bm25s numba +tokenize |")
    lines.append("|---|---:|" + "---:|" * (len(names) + 5))
    for ds, (qps, facts, base, n_q) in results.items():
        for k in KS:
            so = f"funnel {shard_counts[0]} score-only"
            cl = f"funnel {shard_counts[0]} CLI run"
            lines.append(f"| {ds} | {k} | " + " | ".join(f"{qps[(n, k)]:,.0f}" for n in names) +
                         f" | {qps[(first_f, k)] / qps[('bm25s numpy', k)]:.2f}"
                         f" | {qps[(first_f, k)] / qps[('bm25s numba', k)]:.2f}"
                         f" | {qps[(so, k)] / qps[('bm25s numba', k)]:.2f}"
                         f" | {qps[(cl, k)] / qps[('bm25s numba', k)]:.2f}"
                         f" | {qps[(cl, k)] / qps[('bm25s numba +tokenize', k)]:.2f} |")
    lines += ["", "Ratios against every baseline (funnel search_batch q/s ÷ baseline q/s):", ""]
    for ds, (qps, facts, base, n_q) in results.items():
        for sh in shard_counts:
            fn = f"funnel {sh} shard{'s' if sh > 1 else ''}"
            lines.append(f"- {ds}, {sh} shard(s): " + "; ".join(
                f"k={k}: {qps[(fn, k)] / qps[('bm25s numpy', k)]:.2f}x numpy, "
                f"{qps[(fn, k)] / qps[('bm25s numba', k)]:.2f}x numba, "
                f"{qps[(fn, k)] / qps[('bm25s numba +tokenize', k)]:.2f}x numba+tokenize" for k in KS))
    lines += ["", "| dataset | shards | funnel build docs/s | bm25s index docs/s | open s | first query ms "
              "| funnel NDCG@10 | bm25s NDCG@10 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for ds, (qps, facts, base, n_q) in results.items():
        for sh, f in facts.items():
            lines.append(f"| {ds} | {sh} | {f['docs'] / f['build_s']:.0f} | {base['docs'] / base['build_s']:.0f} | "
                         f"{f['open_s']:.2f} | {1000 * f['first_s']:.1f} | {f['ndcg']:.4f} | {base['ndcg']:.4f} |")
    lines += ["", "funnel build time per stage (s): " + "; ".join(
        f"{ds}/{sh}: {f['build_stages']}" for ds, (_, facts, _, _) in results.items() for sh, f in facts.items()),
        "", "funnel build engine: " + "; ".join(
            f"{ds}/{sh}: {f['engine']}" for ds, (_, facts, _, _) in results.items() for sh, f in facts.items()) +
        " (the ray engine's time includes starting a local Ray session and a Ray Data shuffle); bm25s "
        "indexes in-process from a list already in memory. funnel's batch path scores every query and "
        "every shard in one compiled call (an index of at most "
        f"{IMPACT_POSTINGS:,} postings, as these, keeps each posting's impact for the (k1, b) in use; larger ones "
        "read impacts of tf < 32 from a per-(k1, b) grid over Lucene's 256 norm bytes; top k > 32 is kept in a "
        "buffer cut back by quickselect, smaller k in a heap); pruning (MaxScore over exact block maxima) engages "
        f"only where a query has "
        f">= {PRUNE_MIN_POSTINGS:,} postings in a shard (shard-queries that pruned, over all passes: " +
        "; ".join(f"{ds}/{sh}: {int(f['pruned_shards'][0])}" for ds, (_, facts, _, _) in results.items()
                  for sh, f in facts.items()) + ")."]
    report("lexical", "BM25: single-thread query throughput vs bm25s (NumPy and numba), and build",
           "\n".join(lines), a.write)


if __name__ == "__main__":
    main()
