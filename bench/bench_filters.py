"""Filters and ACLs: filtered against unfiltered BM25 (and hybrid), measured side by side.

    .venv/bin/python bench/bench_filters.py [--docs 100k] [--queries 300] [--repeats 5] [--dense] [--write]

The corpus is ``bench/synth.py``'s (generated at ``.funnel/synth/<docs>`` unless there),
copied with two fields per document: ``sel``, a number uniform in [0, 1) (so the filter
``{"sel": {"lt": p}}`` allows a fraction p of the documents), and ``acl``: half the documents
readable by group ``team`` only, the others public. It is built once (local engine) under
``.funnel/bench-filters/<docs>``. Timed, one thread, the same queries in every
configuration, each query timed alone, configurations interleaved pass by pass, each query's
best of ``--repeats`` kept:

- ``unfiltered``: ``BM25Retriever.search_arrays`` (the pruned compiled kernel);
- ``p%``: the same call under the mask of ``{"sel": {"lt": p}}`` (``serving/lexical/masked.py``);
- ``ACL 50%``: under the mask of a principal that may read half the documents;
- each mask's evaluation from the columns, once (masks are cached per filter and principal,
  so a repeated filter pays it once), reported separately;
- with ``--dense``, hybrid through ``search(mode="hybrid", explain=False)`` in the same
  configurations. The index (``.funnel/bench-filters/<docs>-dense``) is then built with
  vectors from a hash embedder behind a real OpenAI-compatible server on 127.0.0.1
  (``bench_dense_scale.HashModel``: a unit Gaussian vector per text, dimension 384), started
  by this script: a real model on two CPU cores embeds a few hundred documents a second, and
  FAISS's cost depends on the vectors' number and dimension, not on what they mean. The
  warm pass leaves every query's vector in the dense retriever's query cache, so the hybrid
  row times retrieval (BM25 and FAISS, each under the mask) and fusion, not embedding.

Beside the per-selectivity table, the BM25 ratios by query size (the quartiles of the
queries' postings, summed over their terms) and which masked strategy each shard took
(``masked.STATS``). Prints its section of bench/RESULTS.md (``filters-<docs>``); ``--write``
records it there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

sys.path.insert(0, os.path.dirname(__file__))
import synth  # noqa: E402
from results import report  # noqa: E402

SELECTIVITIES = (0.001, 0.01, 0.1, 0.5)
K = 10


def with_fields(src: str, dst: str) -> int:
    """Copy ``src``'s corpus.jsonl to ``dst`` with the ``sel`` and ``acl`` fields; the count."""
    import numpy as np
    rng = np.random.default_rng(1)
    n = 0
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src) as f, open(dst + ".tmp", "w") as out:
        for line in f:
            row = json.loads(line)
            row["sel"] = float(rng.random())
            if n % 2:
                row["acl"] = ["team"]
            out.write(json.dumps(row) + "\n")
            n += 1
    os.replace(dst + ".tmp", dst)
    return n


def timed(configs: dict, items: list, call, repeats: int):
    """Seconds of each (configuration, item): ``call(mask, item)`` timed alone, the
    configurations interleaved pass by pass after two warm passes; each item's best of
    ``repeats``, and the ``masked.STATS`` each configuration added in one pass."""
    import numpy as np
    from funnel.serving.lexical import masked
    for _ in range(2):  # warm: compiled kernels, block maxima, caches (and hybrid's query vectors)
        for mask in configs.values():
            for x in items:
                call(mask, x)
    best = {name: np.full(len(items), np.inf) for name in configs}
    stats = {}
    for r in range(repeats):
        for name, mask in configs.items():
            before = masked.STATS.copy()
            b = best[name]
            for i, x in enumerate(items):
                t = time.perf_counter()
                call(mask, x)
                b[i] = min(b[i], time.perf_counter() - t)
            if r == 0:
                stats[name] = masked.STATS - before
    return best, stats


def _hash_server():
    """(process, url) of the hash embedder's OpenAI-compatible server on 127.0.0.1."""
    from bench_dense_scale import _serve
    q = mp.Queue()
    proc = mp.Process(target=_serve, args=(q,), daemon=True)
    proc.start()
    return proc, q.get(timeout=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=synth.parse_count, default=100_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dense", action="store_true", help="also build vectors (hash embedder) and time hybrid")
    p.add_argument("--write", action="store_true", help="record the section in bench/RESULTS.md")
    a = p.parse_args(argv)
    if a.queries < 1 or a.repeats < 1:
        p.error("--queries and --repeats must be at least 1")

    import numpy as np

    from funnel.jobs.build_index import build
    from funnel.serving import filters
    from funnel.serving.principals import principal
    from funnel.serving.search import open_index

    label = f"{a.docs // 1000}k" if a.docs < 1_000_000 else f"{a.docs // 1_000_000}m"
    data = os.path.join(".funnel", "synth", label)
    synth.ensure(a.docs, data)
    root = os.path.join(".funnel", "bench-filters", label + ("-dense" if a.dense else ""))
    server = None
    if a.dense:
        from bench_dense_scale import MODEL
        server, url = _hash_server()
        os.environ["FUNNEL_EMBED_BASE_URL"] = url  # the index's provider opens against this run's server
    try:
        if not os.path.exists(os.path.join(root, "CURRENT")):
            corpus = os.path.join(".funnel", "bench-filters", f"{label}.jsonl")
            if not os.path.exists(corpus):
                with_fields(os.path.join(data, "corpus.jsonl"), corpus)
            t = time.time()
            build(corpus, root, engine="local", dense=a.dense,
                  embed_model=f"openai:{MODEL}@{url}" if a.dense else None)
            print(f"built {root} in {time.time() - t:.0f}s", file=sys.stderr)
        ix = open_index(root)
        body = measure(a, ix, data, label, filters, principal, np)
        ix.close()
    finally:
        if server is not None:
            server.terminate()
            server.join(10)
    report(f"filters-{label}", f"Filters and ACLs at {label} documents: filtered against unfiltered, one run",
           body, a.write)
    return 0


def measure(a, ix, data: str, label: str, filters, principal, np) -> str:
    """Time every configuration; the section's markdown."""
    vs = ix._current
    queries = [json.loads(line)["text"] for line in open(os.path.join(data, "queries.jsonl"))][:a.queries]
    terms = [dict(vs.bm25.query_terms(q)) for q in queries]
    df = np.asarray(vs.index.df)
    postings = np.array([int(df[vs.bm25._canonical(t)[0]].sum()) for t in terms])

    configs = {"unfiltered": None}
    eval_ms = {}
    for s in SELECTIVITIES:
        t = time.perf_counter()
        configs[f"{s * 100:g}%"] = vs.mask({"sel": {"lt": s}})
        eval_ms[f"{s * 100:g}%"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    configs["ACL 50%"] = vs.mask(None, principal("bob"))  # not in group team: the public half
    eval_ms["ACL 50%"] = (time.perf_counter() - t) * 1000

    def bm25_call(mask, tm):
        with filters.scope(mask):
            vs.bm25.search_arrays(tm, K)

    def hybrid_call(mask, q):
        with filters.scope(mask):
            vs.search(q, mode="hybrid", k=K, explain=False)

    load = [os.getloadavg()[0]]
    best, stats = timed(configs, terms, bm25_call, a.repeats)
    results = {"bm25": best}
    load.append(os.getloadavg()[0])
    if a.dense:
        results["hybrid"], _ = timed(configs, queries, hybrid_call, a.repeats)
        load.append(os.getloadavg()[0])

    n_shards = len(vs.index.shards)
    when = "before, after bm25" + (", after hybrid" if a.dense else "")
    lines = [f"`.venv/bin/python bench/bench_filters.py --docs {label}{' --dense' if a.dense else ''} "
             f"--queries {a.queries} --repeats {a.repeats}`: {vs.index.n_docs:,} synthetic documents "
             f"(bench/synth.py) in {n_shards} shard(s), {len(queries)} of its queries, k={K}, one thread, each "
             f"query's best of {a.repeats} passes, configurations interleaved; "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, shared: 1-minute load "
             f"average {', '.join(f'{x:.1f}' for x in load)} ({when}).",
             "", "Mean per query (µs), and its ratio to the unfiltered query of the same run:", "",
             "| mode | " + " | ".join(configs) + " |", "|---|" + "---:|" * len(configs)]
    for mode, row in results.items():
        base = row["unfiltered"].mean()
        lines.append(f"| {mode} | " + " | ".join(
            f"{v.mean() * 1e6:,.0f}" + ("" if n == "unfiltered" else f" ({v.mean() / base:.2f}×)")
            for n, v in row.items()) + " |")
    lines.append("| mask evaluation, once (ms) | — | " + " | ".join(f"{v:.1f}" for v in eval_ms.values()) + " |")
    lines += ["", "Allowed documents: " + ", ".join(f"{n} {m.count:,}" for n, m in configs.items() if m), ""]

    # Where the time goes: BM25 ratios by query size, and the strategy each shard took.
    edges = np.quantile(postings, [0, 0.25, 0.5, 0.75, 1.0])
    lines += ["BM25 by query size (quartiles of the queries' postings, summed over their terms): mean µs of "
              "the unfiltered query, the filtered ones' ratio to it:", "",
              "| postings | queries | unfiltered µs | " + " | ".join(list(configs)[1:]) + " |",
              "|---|---:|---:|" + "---:|" * (len(configs) - 1)]
    row = results["bm25"]
    for q in range(4):
        sel = (postings >= edges[q]) & ((postings < edges[q + 1]) if q < 3 else (postings <= edges[q + 1]))
        if not sel.any():
            continue
        base = row["unfiltered"][sel].sum()
        lines.append(f"| {int(edges[q]):,}–{int(edges[q + 1]):,} | {int(sel.sum())} | "
                     f"{row['unfiltered'][sel].mean() * 1e6:,.0f} | "
                     + " | ".join(f"{row[n][sel].sum() / base:.2f}×" for n in list(configs)[1:]) + " |")
    lines += ["", "Masked strategy per shard-query (one pass; `serving/lexical/masked.py`): by candidates / by "
              "block-max term-at-a-time (of which went to sorted candidates) / unpruned: " + "; ".join(
                  f"{n} {int(s[0]):,} / {int(s[1]):,} ({int(s[2]):,}) / {int(s[3]):,}"
                  for n, s in stats.items() if n != "unfiltered") + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
