"""Query latency at scale for every mode (bm25, dense, hybrid, sira), one query per call, on the
synthetic corpus with a dense index: what issue 17 asks for ("hybrid and SIRA latency at 1M").

    .venv/bin/python bench/bench_hybrid_scale.py [--size 1m] [--queries 200] [--write]

1. The corpus is ``bench/synth.py``'s (seed 0), cached under ``--synth`` as ``bench_scale.py``
   caches it (generated unless it exists).
2. The index is ``funnel build --dense`` of it (default engine and shard count), embedded
   through a real OpenAI-compatible ``/v1/embeddings`` server on 127.0.0.1 whose model is a
   hash (``bench_dense_scale.HashModel``: a unit Gaussian vector per text, dimension 384 like
   MiniLM-L6). MiniLM on this machine's two cores embeds a few hundred documents a second, so
   a million would take hours; FAISS's cost depends on the vectors' number and dimension, not
   on what they say. Built once and reused while its manifest matches (``--rebuild`` forces it).
3. One process opens the index and answers ``--queries`` generated queries one at a time with
   ``Searcher.search(q, mode=M, k=10)`` (explanations and snippets on, as an agent gets them),
   after a warm pass, for each mode in turn; p50/p99 wall time per query and the median of
   each stage the result's trace reports. The query embedder is the bundled MiniLM-L6 run
   in-process as a CPU index runs it by default (onnxruntime int8, one thread): after opening
   (against the hash server, which stays up), the dense index's provider is swapped for it, so
   each query pays MiniLM's real embedding time (the LRU cache of query vectors is emptied
   before every query). Its vectors are compared with hash vectors, so what comes back means
   nothing; only the time is measured. The index's own hash provider is not used at query time.
4. Baseline: BM25 (``mode="bm25"``) through the same call in the same process; each mode's
   ratio is its p50 over BM25's.

``--write`` records the "hybrid-scale" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_dense_scale import MODEL, _serve  # noqa: E402
from bench_scale import _percentiles, _proc_status, label  # noqa: E402
from results import report  # noqa: E402
from synth import ensure, parse_count  # noqa: E402

MODES = (("bm25", {}), ("dense", {}), ("hybrid", {}), ("sira", {}), ("sira", {"proposer": "prf"}))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_count, default=parse_count("1m"),
                   help="documents in the synthetic corpus, e.g. 100k or 1m (default 1m)")
    p.add_argument("--queries", type=int, default=200,
                   help="generated queries answered per mode, one per call (default %(default)s)")
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"),
                   help="corpus cache, shared with bench_scale.py (default %(default)s)")
    p.add_argument("--work", default=os.path.join(".funnel", "hybrid-scale"),
                   help="folder for the index and the build log (default %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="build the index even if one matches (default: reuse)")
    p.add_argument("--write", action="store_true", help="record the section in bench/RESULTS.md (default: print)")
    a = p.parse_args(argv)
    if a.queries < 1:
        p.error(f"--queries must be at least 1, got {a.queries}")
    return a


def _manifest(index: str) -> dict | None:
    try:
        with open(os.path.join(index, "CURRENT")) as f:
            with open(os.path.join(index, f.read().strip(), "manifest.json")) as g:
                return json.load(g)
    except (OSError, ValueError):
        return None


def _matches(man: dict | None, n_docs: int) -> bool:
    fp = ((man or {}).get("dense") or {}).get("fingerprint") or {}
    return bool(man) and man["corpus"]["n_docs"] == n_docs and fp.get("model") == MODEL


def build(corpus: str, index: str, url: str, log: str) -> float:
    """``funnel build --dense`` through the hash server; returns wall seconds."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", corpus, "--out", index,
           "--dense", "--embed-model", f"openai:{MODEL}@{url}", "--progress-seconds", "60"]
    print("building:", " ".join(cmd), flush=True)
    t = time.perf_counter()
    with open(log, "w") as f:
        r = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log) as f:
            tail = f.read()[-2000:]
        sys.exit(f"funnel build failed (exit {r.returncode}); log {log}:\n{tail}")
    return time.perf_counter() - t


def measure(index: str, queries: list[str]) -> dict:
    """Per mode: p50/p99 wall ms per query and the median of each trace stage; plus facts."""
    from funnel.pipelines.dense.embed import CPU_RUNTIME, RUNTIME_CHOICES, make_provider
    from funnel.serving.search import open_index
    t = time.perf_counter()
    ix = open_index(index)
    open_s = time.perf_counter() - t
    dense = ix.dense_mode.dense()
    runtime, precision = RUNTIME_CHOICES[CPU_RUNTIME]  # what a CPU build and its queries use by default
    minilm = make_provider({"model": "sentence-transformers/all-MiniLM-L6-v2", "runtime": runtime,
                            "precision": precision})
    if minilm.dim != dense.provider.dim:
        sys.exit(f"MiniLM has dim {minilm.dim}, the index's vectors {dense.provider.dim}")
    dense.provider = minilm  # the query embedder's real cost; see the docstring
    facts = {"open_s": open_s, "shards": ix.index.n_shards, "dense": {
        k: ix.index.manifest["dense"].get(k) for k in ("factory", "nlist", "nprobe", "ntotal")}}
    out = {}
    for mode, opts in MODES:
        name = mode + "".join(f" {k}={v}" for k, v in opts.items())
        ix.search(queries[0], mode=mode, k=10, **opts)  # first call: numba, FAISS pages, models
        for q in queries:  # warm pass
            dense._cache.clear()
            ix.search(q, mode=mode, k=10, **opts)
        times, plain, stages = [], [], {}
        for q in queries:
            # The ranking alone (explain=False: no citations, passages or evidence text), then
            # the default answer, interleaved query by query; every query embedded each time,
            # as a new query would be.
            dense._cache.clear()
            t = time.perf_counter()
            ix.search(q, mode=mode, k=10, explain=False, **opts)
            plain.append(time.perf_counter() - t)
            dense._cache.clear()
            t = time.perf_counter()
            res = ix.search(q, mode=mode, k=10, **opts)
            times.append(time.perf_counter() - t)
            for st, ms in (res.trace.get("timings_ms") or {}).items():
                if isinstance(ms, (int, float)):
                    stages.setdefault(st, []).append(ms)
        out[name] = {**_percentiles(times), "plain_p50_ms": statistics.median(plain) * 1000,
                     "text_p50_ms": statistics.median(stages.get("summary", [0.0])),
                     "stages": {st: statistics.median(v) for st, v in stages.items()},
                     "proposer": (res.trace.get("sira") or {}).get("proposer")}
        print(name, {k: round(v, 2) for k, v in out[name].items() if k.endswith("_ms")}, flush=True)
    times = []
    for q in queries:
        t = time.perf_counter()
        minilm.embed_query(q)
        times.append(time.perf_counter() - t)
    facts["embed"] = _percentiles(times)
    facts["status_end"] = _proc_status()
    return {"modes": out, "facts": facts}


def render(res: dict, a, n_docs: int, build_s: float | None, command: str) -> str:
    f, modes = res["facts"], res["modes"]
    base = modes["bm25"]["p50_ms"]
    st = f["status_end"]
    lines = [f"Command: `{command}`. Machine: 2 cores, load average at the end "
             f"{os.getloadavg()[0]:.1f}. Corpus: `bench/synth.py` seed 0, {n_docs:,} documents. "
             f"Index: `funnel build --dense` ({f['shards']} BM25 shard(s); FAISS {f['dense']['factory']}, "
             f"nlist {f['dense']['nlist']}, nprobe {f['dense']['nprobe']}, {f['dense']['ntotal']:,} vectors of "
             f"dimension 384 from a hash embedder, see the script's docstring)"
             + (f", built in {build_s:.0f} s in this run" if build_s is not None else ", reused from an earlier run")
             + f"; opened in {f['open_s']:.2f} s. {a.queries} generated queries, one `Searcher.search(q, mode=M, "
             "k=10)` call each (explanations and snippets on), after a warm pass; the query embedder is the "
             "bundled MiniLM-L6 as a CPU index queries it by default (onnxruntime int8, one thread), its "
             "cache emptied before every query. Baseline: BM25 "
             "through the same call in the same process.", "",
             "| mode | p50 ms | p99 ms | mean ms | p50 / BM25 p50 | median per stage (ms, from the trace) |",
             "|---|---:|---:|---:|---:|---|"]
    for name, m in modes.items():
        label_ = name + (f" (proposer {m['proposer']})" if name == "sira" and m.get("proposer") else "")
        stages = ", ".join(f"{k} {v:.2f}" for k, v in m["stages"].items())
        lines.append(f"| {label_} | {m['p50_ms']:.2f} | {m['p99_ms']:.2f} | {m['mean_ms']:.2f} | "
                     f"{m['p50_ms'] / base:.1f}× | {stages} |")
    lines += ["", "What an agent's answer costs beside the ranking, same queries, interleaved query by query: "
              "the ranking alone (`explain=False`: ids and scores, no citations, passages or text) and the "
              "default answer (explanations, every hit's passages ranked by both signals and cited, the "
              "evidence text at the default budget). `text` is the trace's `summary` stage: writing the "
              "budgeted evidence text from the ranked passages; `hits` is explanations, passage ranking "
              "and citations.", "",
              "| mode | ranking alone p50 ms | default answer p50 ms | default / ranking alone | "
              "hits stage ms | text stage ms | text / default p50 |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, m in modes.items():
        lines.append(f"| {name} | {m['plain_p50_ms']:.2f} | {m['p50_ms']:.2f} | "
                     f"{m['p50_ms'] / m['plain_p50_ms']:.2f}× | {m['stages'].get('hits', 0):.2f} | "
                     f"{m['text_p50_ms']:.2f} | {m['text_p50_ms'] / m['p50_ms']:.1%} |")
    e = f["embed"]
    lines += ["", f"The MiniLM query embedding alone (`embed_query`, same queries, same process): p50 {e['p50_ms']:.2f} ms, "
              f"p99 {e['p99_ms']:.2f} ms; it is inside the dense, hybrid and sira (dense) rows' `dense` stage."]
    mib = {k: v / 2 ** 20 for k, v in st.items()}
    lines += ["", f"Serving process at the end: RSS {mib.get('VmRSS', 0):,.0f} MiB (anon {mib.get('RssAnon', 0):,.0f}, "
              f"file {mib.get('RssFile', 0):,.0f}), peak {mib.get('VmHWM', 0):,.0f} MiB; MiniLM included."]
    return "\n".join(lines)


def main(argv=None) -> None:
    a = parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.makedirs(a.work, exist_ok=True)
    name = label(a.size)
    corpus = os.path.join(a.synth, name)
    index = os.path.join(a.work, f"index-{name}")
    meta = ensure(a.size, corpus)
    build_s = None
    q: mp.Queue = mp.Queue()
    server = mp.Process(target=_serve, args=(q,), daemon=True)
    server.start()
    try:
        url = q.get(timeout=120)
        if a.rebuild or not _matches(_manifest(index), meta["n_docs"]):
            build_s = build(corpus, index, url, os.path.join(a.work, f"build-{name}.log"))
        with open(os.path.join(corpus, "queries.jsonl")) as f:
            queries = [json.loads(line)["text"] for _, line in zip(range(a.queries), f)]
        os.environ["FUNNEL_EMBED_BASE_URL"] = url  # the index's provider opens against it, then is swapped
        res = measure(index, queries)
    finally:
        server.terminate()
    command = ".venv/bin/python bench/bench_hybrid_scale.py" + " ".join(
        [""] + [x for x in (sys.argv[1:] if argv is None else argv)])
    report("hybrid-scale", f"Query latency per mode at {name} documents (bench/bench_hybrid_scale.py)",
           render(res, a, meta["n_docs"], build_s, command), a.write)


if __name__ == "__main__":
    main()
