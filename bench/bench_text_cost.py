"""What the agent's answer costs beside the ranking, on a large index (issue 47's latency target).

    .venv/bin/python bench/bench_text_cost.py --index INDEX_ROOT [--queries FILE ...] [--n 200]
        [--modes bm25,hybrid] [--budget 1000] [--write]

One process opens ``INDEX_ROOT`` (any built index: e.g. the 1M-document one that
``bench/bench_workloads.py --size 1m`` builds under its ``--work`` folder) and answers each
query twice, interleaved query by query (which goes first alternates), in every mode asked for that the index supports:

* **ranking alone**: ``search(q, mode=M, k=10, explain=False)``: ids and scores; no
  explanations, passages, citations or evidence text;
* **default answer**: ``search(q, mode=M, k=10, budget=B)``: what every front end returns:
  explanations, each hit's passages ranked and cited, and the budgeted evidence text.

Besides the two, it reports what the text alone adds to the answer without it: per default
answer, its text stage over the rest of its own total (both from its trace), the median.

It prints p50 wall and CPU (thread) time of both, their ratio, and the medians of the
default answer's trace stages: ``hits`` (explanations, passage ranking, citations) and
``summary`` (writing the budgeted text from the ranked passages: the text's own cost).
Query vectors are cached by the dense index: each query's vector is dropped before each of
its two searches, so both pay the embedding.

Queries: the test queries of ``--queries`` files (BEIR ``queries.jsonl``; default SciFact's
and NFCorpus's in ``../shared/data/beir``), the first ``--n`` after ``--warm`` warm-up ones.
``--write`` records the "text-cost" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results import report  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "data", "beir")
DEFAULT_QUERIES = [os.path.join(DATA, n, "queries.jsonl") for n in ("scifact", "nfcorpus")]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True, help="an index root (CURRENT and versions)")
    p.add_argument("--queries", nargs="+", default=DEFAULT_QUERIES, help="BEIR queries.jsonl files")
    p.add_argument("--n", type=int, default=200, help="timed queries per mode (default %(default)s)")
    p.add_argument("--warm", type=int, default=20, help="warm-up queries per mode (default %(default)s)")
    p.add_argument("--modes", default="bm25,dense,hybrid,sira", help="comma-separated; unavailable ones skipped")
    p.add_argument("--budget", type=int, default=None, help="the text's token budget (default: the search's)")
    p.add_argument("--write", action="store_true", help="record the section in bench/RESULTS.md")
    a = p.parse_args(argv)
    if a.n < 1 or a.warm < 0:
        p.error("--n must be at least 1 and --warm at least 0")
    return a


def load_queries(paths: list[str], n: int) -> list[str]:
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            out += [json.loads(line)["text"] for line in f if line.strip()]
    if len(out) < n:
        sys.exit(f"{len(out)} queries in {paths}, fewer than the {n} asked for")
    return out[:n]


def measure(ix, mode: str, queries: list[str], warm: int, budget: int | None) -> dict:
    dense = ix.dense_mode.dense() if ix.dense_mode.available else None

    def fresh() -> None:
        if dense is not None:
            dense._cache.clear()  # every search embeds its query, as a new query would

    kw = {} if budget is None else {"budget": budget}
    for q in queries[:warm]:
        ix.search(q, mode=mode, k=10, explain=False)
        ix.search(q, mode=mode, k=10, **kw)
    plain_w, plain_c, full_w, full_c, stages, added = [], [], [], [], {}, []

    def timed(q: str, explain: bool):
        fresh()
        w, c = time.perf_counter(), time.thread_time()
        res = ix.search(q, mode=mode, k=10, explain=explain, **(kw if explain else {}))
        return res, time.perf_counter() - w, time.thread_time() - c

    for i, q in enumerate(queries[warm:]):
        # Which of the two goes first alternates: the second reads what the first paged in.
        for explain in ((False, True) if i % 2 == 0 else (True, False)):
            res, w, c = timed(q, explain)
            (full_w if explain else plain_w).append(w)
            (full_c if explain else plain_c).append(c)
            if explain:
                tm = res.trace.get("timings_ms") or {}
                for st, ms in tm.items():
                    if isinstance(ms, (int, float)):
                        stages.setdefault(st, []).append(ms)
                if tm.get("total", 0) > tm.get("summary", 0) > 0:  # this answer's text beside the rest of it
                    added.append(tm["summary"] / (tm["total"] - tm["summary"]))
    med = statistics.median
    return {"plain_wall": med(plain_w) * 1e3, "plain_cpu": med(plain_c) * 1e3, "full_wall": med(full_w) * 1e3,
            "full_cpu": med(full_c) * 1e3, "stages": {st: med(v) for st, v in stages.items()},
            "text_added": med(added) if added else float("nan"),
            "n": len(full_w)}


def render(a, facts: dict, rows: dict, command: str) -> str:
    lines = [f"Command: `{command}`. Machine: {os.cpu_count()} cores, load average at the start "
             f"{facts['load_start']:.1f}, at the end {os.getloadavg()[0]:.1f} (shared with other jobs). Index: "
             f"{facts['n_docs']:,} documents, {facts['shards']} BM25 shard(s), vectors: {facts['dense']}; "
             f"queries: {facts['queries']}, {a.warm} warm-up then {a.n} timed per mode, each as both searches.", "",
             "| mode | ranking alone p50 ms (wall / CPU) | default answer p50 ms (wall / CPU) | "
             "default / ranking alone (CPU) | hits stage ms | text stage ms | text / default answer | "
             "text added to the answer without it |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, r in rows.items():
        text = r["stages"].get("summary", 0.0)
        lines.append(f"| {mode} | {r['plain_wall']:.2f} / {r['plain_cpu']:.2f} | {r['full_wall']:.2f} / "
                     f"{r['full_cpu']:.2f} | {r['full_cpu'] / r['plain_cpu']:.2f}× | "
                     f"{r['stages'].get('hits', 0.0):.2f} | {text:.2f} | {text / r['full_wall']:.1%} | "
                     f"{r['text_added']:.1%} |")
    lines += ["", "The text stage is the budgeted evidence text written from the ranked passages "
              "(`trace.timings_ms.summary`); the hits stage is the explanations, the passage ranking and "
              "the citations every hit carries (`trace.timings_ms.hits`). Medians over the timed queries; "
              "the last column is the median over queries of each answer's text stage divided by the rest of "
              "its own total (`timings_ms.total - summary`: the structured answer without the text)."]
    return "\n".join(lines)


def main(argv=None) -> None:
    a = parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from funnel.serving.search import open_index
    load_start = os.getloadavg()[0]
    queries = load_queries(a.queries, a.n + a.warm)
    rows = {}
    with open_index(a.index) as s:
        ix = s._current
        man = ix.index.manifest
        facts = {"load_start": load_start, "n_docs": man["corpus"]["n_docs"], "shards": ix.index.n_shards,
                 "dense": (man.get("dense") or {}).get("factory", "none"),
                 "queries": " + ".join(os.path.basename(os.path.dirname(p)) for p in a.queries)}
        for mode in a.modes.split(","):
            if mode != "bm25" and not ix.dense_mode.available:
                print(f"{mode}: skipped (the index has no vectors)", flush=True)
                continue
            rows[mode] = measure(ix, mode, queries, a.warm, a.budget)
            print(mode, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in rows[mode].items()}, flush=True)
    command = ".venv/bin/python bench/bench_text_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report("text-cost", f"What the agent's answer costs beside the ranking at {facts['n_docs']:,} documents "
           "(bench/bench_text_cost.py)", render(a, facts, rows, command), a.write)


if __name__ == "__main__":
    main()
