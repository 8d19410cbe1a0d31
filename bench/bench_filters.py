"""Filters and ACLs: filtered against unfiltered BM25 (and hybrid), measured side by side.

    .venv/bin/python bench/bench_filters.py [--docs 100k] [--queries 300] [--repeats 5] [--dense] [--write]

The corpus is ``bench/synth.py``'s (generated at ``.funnel/synth/<docs>`` unless there),
copied with two fields per document: ``sel``, a number uniform in [0, 1) (so the filter
``{"sel": {"lt": p}}`` allows a fraction p of the documents), and ``acl``: half the documents
readable by group ``team`` only, the others public. It is built once (local engine) under
``.funnel/bench-filters/<docs>``. Timed, one thread, the same queries, passes of every
configuration interleaved and the best of ``--repeats`` kept:

- ``unfiltered``: ``BM25Retriever.search_arrays`` (the pruned compiled kernel);
- ``p%``: the same call under the mask of ``{"sel": {"lt": p}}`` (``serving/masked.py``);
- ``ACL 50%``: under the mask of a principal that may read half the documents;
- each mask's evaluation from the columns, once (masks are cached per filter and principal,
  so a repeated filter pays it once), reported separately;
- with ``--dense`` (the build embeds every document: slow on a CPU) the same for hybrid,
  through ``search(mode="hybrid", explain=False)``.

Prints its section of bench/RESULTS.md; ``--write`` records it there.
"""

from __future__ import annotations

import argparse
import json
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


def best_pass(fn, items, repeats: int) -> list[float]:
    """Seconds of each pass of ``fn`` over ``items``."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for x in items:
            fn(x)
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=synth.parse_count, default=100_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dense", action="store_true", help="also build vectors and time hybrid")
    p.add_argument("--write", action="store_true", help="record the section in bench/RESULTS.md")
    a = p.parse_args(argv)

    from funnel.jobs.build_index import build
    from funnel.serving import filters
    from funnel.serving.principals import principal
    from funnel.serving.search import open_index

    label = f"{a.docs // 1000}k" if a.docs < 1_000_000 else f"{a.docs // 1_000_000}m"
    data = os.path.join(".funnel", "synth", label)
    synth.ensure(a.docs, data)
    root = os.path.join(".funnel", "bench-filters", label + ("-dense" if a.dense else ""))
    if not os.path.exists(os.path.join(root, "CURRENT")):
        corpus = os.path.join(".funnel", "bench-filters", f"{label}.jsonl")
        if not os.path.exists(corpus):
            with_fields(os.path.join(data, "corpus.jsonl"), corpus)
        t = time.time()
        build(corpus, root, engine="local", dense=a.dense)
        print(f"built {root} in {time.time() - t:.0f}s", file=sys.stderr)
    ix = open_index(root)
    vs = ix._current
    queries = [json.loads(line)["text"] for line in open(os.path.join(data, "queries.jsonl"))][:a.queries]
    terms = [dict(vs.bm25.query_terms(q)) for q in queries]

    configs = {"unfiltered": None}
    eval_ms = {}
    for s in SELECTIVITIES:
        t = time.perf_counter()
        configs[f"{s * 100:g}%"] = vs.mask({"sel": {"lt": s}})
        eval_ms[f"{s * 100:g}%"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    configs["ACL 50%"] = vs.mask(None, principal("bob"))  # not in group team: the public half
    eval_ms["ACL 50%"] = (time.perf_counter() - t) * 1000

    def bm25_call(mask):
        def run(tm):
            with filters.scope(mask):
                vs.bm25.search_arrays(tm, K)
        return run

    def hybrid_call(mask):
        def run(q):
            with filters.scope(mask):
                vs.search(q, mode="hybrid", k=K, explain=False)
        return run

    results = {}
    for _ in range(2):  # warm: compiled kernels, block maxima, caches
        for name, mask in configs.items():
            best_pass(bm25_call(mask), terms, 1)
    times = {name: [] for name in configs}
    for _ in range(a.repeats):  # interleaved
        for name, mask in configs.items():
            times[name] += best_pass(bm25_call(mask), terms, 1)
    results["bm25"] = {name: min(v) / len(terms) * 1e6 for name, v in times.items()}
    if a.dense:
        for name, mask in configs.items():
            best_pass(hybrid_call(mask), queries, 1)
        times = {name: [] for name in configs}
        for _ in range(a.repeats):
            for name, mask in configs.items():
                times[name] += best_pass(hybrid_call(mask), queries, 1)
        results["hybrid"] = {name: min(v) / len(queries) * 1e6 for name, v in times.items()}

    lines = [f"`.venv/bin/python bench/bench_filters.py --docs {label}{' --dense' if a.dense else ''} "
             f"--queries {a.queries} --repeats {a.repeats}`: {a.docs:,} synthetic documents "
             f"(bench/synth.py), {len(queries)} of its queries, k={K}, one thread, best of {a.repeats} "
             f"interleaved passes; {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs.", "",
             "| per query (µs) | " + " | ".join(configs) + " |",
             "|---|" + "---:|" * len(configs)]
    for mode, row in results.items():
        base = row["unfiltered"]
        lines.append(f"| {mode} | " + " | ".join(
            f"{v:,.0f}" + ("" if n == "unfiltered" else f" ({v / base:.2f}×)") for n, v in row.items()) + " |")
    lines.append("| mask evaluation, once (ms) | — | " + " | ".join(f"{v:.1f}" for v in eval_ms.values()) + " |")
    lines += ["", "Allowed documents: " + ", ".join(f"{n} {m.count:,}" for n, m in configs.items() if m)]
    report("filters", "Filters and ACLs: filtered against unfiltered, one run", "\n".join(lines), a.write)
    ix.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
