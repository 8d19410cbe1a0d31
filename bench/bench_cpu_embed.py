"""Dense on a CPU: onnxruntime fp32 and int8 against torch, for queries, servers and builds.

    .venv/bin/python bench/bench_cpu_embed.py [--parts query,server,throughput,ndcg]
        [--data DIR] [--out /tmp/cpu-embed] [--before DIR --before-label TEXT] [--write]

Every comparison is measured in one run, baseline and candidate interleaved (the machine is
shared: CPU seconds and peak RSS are reported beside wall time). Parts, each saved to
``OUT/PART.json`` so a long one can run alone and the section be rendered from all of them:

- ``ndcg``: SciFact, NFCorpus and the long-document set of bench_longdocs.py (SciFact abstracts
  packed 20-40 a document), each built with ``--embed-runtime torch`` and ``onnx-int8`` (and
  ``onnx``, fp32, with ``--fp32-builds``) and evaluated in dense and hybrid modes: the torch
  build with torch queries (today), with onnxruntime fp32 queries (what serving now does for a
  torch-built index), the int8 build with int8 queries (and the fp32 build with fp32 queries).
  Also the cosine between onnxruntime fp32 and torch vectors of every test query and of the
  first ``--cosine-passages`` passages of the corpus (the document side of an fp32 build).
- ``throughput``: passages of 256 word pieces (the long-document set split by the embedder's
  splitter) embedded by the build's ``EmbedBatch`` with torch as today's build runs it (the
  in-process engine: torch's default threads; a Ray CPU actor: one thread) and onnxruntime
  fp32 and int8 at the same thread counts, rounds interleaved: passages per CPU second.
- ``query``: ``funnel search IDX "q" --mode hybrid`` against ``--mode bm25`` as one-query
  processes on the SciFact index a CPU build makes by default, interleaved: median wall, CPU
  seconds and peak RSS (``os.wait4`` of each child; run first, while this process is small).
- ``server``: ``funnel serve`` and ``funnel mcp --transport streamable-http`` on that index:
  seconds from start to ready (the warm-up included; its parts from the log), the first
  hybrid request, then the p50 of the next hundred (distinct queries, so the query embedding
  cache never answers). The MCP client's one-off compile of the tool's output-schema
  validator (a client cost) is done before the first timed call and reported apart.

``--before DIR`` adds a before/after table of the issue's targets from the part results of an
earlier run (its ``OUT`` folder). Each run records the 1-minute load average at the start and
end of every part it ran (``OUT/load.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

RUNTIMES = ("torch", "onnx-int8", "onnx")
#: In the order they run: the one-query processes first, while this process is small (a child's
#: peak RSS from os.wait4 counts what it was forked from: after torch loaded here, every child
#: would read ~1.4 GiB).
PARTS = ("query", "server", "throughput", "ndcg")
MODES = ("dense", "hybrid")
#: int8 becomes the CPU default only where its NDCG@10 stays this close to torch's on every dataset.
INT8_BOUND = 0.005


def funnel(*args: str) -> list[str]:
    return [sys.executable, "-m", "funnel.serving.frontends.cli", *args]


def run_child(cmd: list[str], env: dict | None = None, stdout=subprocess.DEVNULL) -> dict:
    """Run ``cmd``; its wall seconds, CPU seconds and peak RSS (MiB) from ``os.wait4``."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(cmd)} failed")
    return {"wall": time.perf_counter() - t, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024}


# -- ndcg -----------------------------------------------------------------------------------


def datasets(a) -> dict[str, str]:
    """name -> BEIR folder: SciFact, NFCorpus and the packed long-document set."""
    from bench_longdocs import write_dataset
    out = {"scifact": dataset_dir(a.data, "scifact"), "nfcorpus": dataset_dir(a.data, "nfcorpus")}
    long_dir = os.path.join(a.out, "scifact-long")
    if not os.path.exists(os.path.join(long_dir, "corpus.jsonl")):
        write_dataset(out["scifact"], long_dir, (20, 40), 0)
    out["longdocs"] = long_dir
    return out


def part_ndcg(a) -> dict:
    import numpy as np

    from funnel.evaluation.evaluate import eval_dataset, load_beir
    from funnel.pipelines.dense.embed import make_provider
    from funnel.serving.search import open_index
    torch_q = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "torch", "device": "cpu"})
    onnx_q = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx"})
    path = os.path.join(a.out, "ndcg.json")
    out = json.load(open(path)) if os.path.exists(path) else {}  # a rerun adds to what is there
    for name, ddir in datasets(a).items():
        if name not in a.datasets.split(","):
            continue
        res = out.setdefault(name, {})
        docs = passages(a, a.cosine_passages, ddir)
        res["cosine_docs"] = _cosines(torch_q.embed_documents(docs), onnx_q.embed_documents(docs))
        if name != "longdocs":
            queries, _ = load_beir(ddir, "test")
            texts = list(queries.values())
            res["cosine"] = _cosines(np.vstack([torch_q.embed_query(t) for t in texts]),
                                     np.vstack([onnx_q.embed_query(t) for t in texts]))
        for runtime in RUNTIMES[:3 if a.fp32_builds else 2]:
            root = os.path.join(a.out, "indexes", f"{name}-{runtime}")
            if not os.path.exists(os.path.join(root, "CURRENT")):
                b = run_child(funnel("build", "--corpus", ddir, "--out", root, "--dense", "--embed-runtime", runtime))
                print(f"built {name} {runtime}: {b['wall']:.0f}s wall, {b['cpu']:.0f} CPU s", file=sys.stderr)
            served = [(runtime, None)] + ([("torch-built, onnx queries", onnx_q)] if runtime == "torch" else [])
            if runtime == "torch":
                served[0] = ("torch", torch_q)
            for label, embedder in served:
                m = eval_dataset(open_index(root, embedder=embedder), ddir, list(MODES))["metrics"]
                res[label] = {mode: m[mode]["ndcg@10"] for mode in MODES}
                print(name, label, res[label], file=sys.stderr)
            with open(path, "w") as f:  # each result kept as it comes: the builds take long
                json.dump(out, f, indent=1)
    return out


def _cosines(a, b) -> dict:
    import numpy as np
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"n": int(len(cos)), "min": float(cos.min()), "mean": float(cos.mean())}


# -- throughput ------------------------------------------------------------------------------


def passages(a, n: int, ddir: str | None = None) -> list[str]:
    """The first ``n`` passages of a dataset (default: the long-document set) as the build
    splits them (256 word pieces, the title before each)."""
    from funnel.pipelines.dense.embed import make_provider
    from funnel.pipelines.dense.passages import PassageSettings, make_splitter
    ddir = ddir or datasets(a)["longdocs"]
    provider = make_provider({"model": "all-MiniLM-L6-v2", "runtime": "onnx"})
    split = make_splitter(provider, PassageSettings())
    out = []
    for line in open(os.path.join(ddir, "corpus.jsonl")):
        d = json.loads(line)
        title = d.get("title") or ""
        out += [f"{title}\n{d['text'][s:e]}" if title else d["text"][s:e] for s, e in split(title, d["text"])]
        if len(out) >= n:
            break
    return out[:n]


def part_throughput(a) -> dict:
    """Passages per CPU second of the build's EmbedBatch per runtime and thread count."""
    import numpy as np

    from funnel.pipelines.dense.embed import EmbedBatch
    texts = passages(a, a.passages)
    batch = {"title": np.array([""] * len(texts), dtype=object), "text": np.array(texts, dtype=object)}
    cores = os.cpu_count() or 1
    # (label, spec): torch as today's build runs it, onnxruntime at the same thread counts.
    base = {"model": "all-MiniLM-L6-v2", "batch_size": 64, "device": "cpu"}
    int8 = {**base, "runtime": "onnx", "precision": "int8"}
    configs = [("torch, in-process engine (torch's default threads)", {**base, "runtime": "torch"}),
               ("torch, Ray CPU actor (1 thread)", {**base, "runtime": "torch", "num_threads": 1}),
               (f"onnx fp32, default (in-process, {cores} intra-op threads)", {**base, "runtime": "onnx"}),
               ("onnx fp32, 1 thread", {**base, "runtime": "onnx", "num_threads": 1}),
               (f"onnx int8, default (in-process, {cores} intra-op threads)", int8),
               ("onnx int8, 1 thread (a Ray CPU actor)", {**int8, "num_threads": 1})]
    embedders = {}
    for label, spec in configs:
        embedders[label] = EmbedBatch(spec)  # no cache: every passage through the model
        embedders[label]({k: v[:4] for k, v in batch.items()})  # warm: first-call allocations
    import torch
    default_threads = torch.get_num_threads()
    rows = {label: [] for label, _ in configs}
    for r in range(a.rounds):
        for label, spec in configs:
            if spec["runtime"] == "torch":  # num_threads is process-wide in torch: set it per config
                torch.set_num_threads(spec.get("num_threads") or default_threads)
            c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            embedders[label](batch)
            c1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
            rows[label].append({"cpu": cpu, "wall": t1 - t0})
            print(f"round {r} {label}: {len(texts) / cpu:.1f} passages/CPU s, {len(texts) / (t1 - t0):.1f}/s wall",
                  file=sys.stderr)
    words = sum(len(t.split()) for t in texts) / len(texts)
    return {"passages": len(texts), "bytes_per_passage": sum(len(t.encode()) for t in texts) / len(texts),
            "words_per_passage": words, "rounds": a.rounds, "cores": cores, "rows": rows}


# -- one-query processes -----------------------------------------------------------------------

QUERIES = ["vitamin D deficiency and bone fractures", "statins reduce cardiovascular mortality",
           "microRNA regulation of cancer cell proliferation", "obesity increases risk of type 2 diabetes",
           "antibiotic resistance in hospital infections"]


def scifact_index(a) -> str:
    """The dense SciFact index a CPU build makes by default (``CPU_RUNTIME``), built here unless
    the ndcg part did."""
    from funnel.pipelines.dense.embed import CPU_RUNTIME
    root = os.path.join(a.out, "indexes", f"scifact-{CPU_RUNTIME}")
    if not os.path.exists(os.path.join(root, "CURRENT")):
        run_child(funnel("build", "--corpus", dataset_dir(a.data, "scifact"), "--out", root, "--dense"))
    return root


def part_query(a) -> dict:
    root = scifact_index(a)
    rows = {"bm25": [], "hybrid": []}
    for r in range(a.query_runs):
        for mode in ("bm25", "hybrid"):
            rows[mode].append(run_child(funnel("search", root, QUERIES[r % len(QUERIES)], "--mode", mode)))
    from funnel.pipelines.dense.embed import CPU_RUNTIME
    return {"runs": a.query_runs, "rows": rows, "runtime": CPU_RUNTIME}


# -- servers ------------------------------------------------------------------------------------


def _post(url: str, body: dict, headers: dict | None = None, timeout: float = 60) -> tuple[dict, str]:
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.headers, r.read().decode()


def _wait_ready(proc, url_check, timeout: float = 300) -> float:
    t = time.perf_counter()
    while time.perf_counter() - t < timeout:
        if proc.poll() is not None:
            sys.exit("error: the server exited during start-up")
        try:
            url_check()
            return time.perf_counter() - t
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.05)
    sys.exit("error: the server did not start")


def _serve_http(root: str, port: int, queries: list[str]) -> dict:
    import urllib.request
    log_path = os.path.join(os.path.dirname(root), f"serve-{port}.log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(funnel("serve", root, "--port", str(port)), stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "w"))
    try:
        _wait_ready(proc, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read())
        start = time.perf_counter() - t0
        times = []
        for q in queries:
            t = time.perf_counter()
            _post(f"http://127.0.0.1:{port}/search", {"query": q, "mode": "hybrid", "k": 10})
            times.append(time.perf_counter() - t)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"start": start, "times": times, "warm": _warm_seconds(log_path)}


def _serve_mcp(root: str, port: int, queries: list[str]) -> dict:
    import asyncio

    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    log_path = os.path.join(os.path.dirname(root), f"mcp-{port}.log")
    t0 = time.perf_counter()
    proc = subprocess.Popen(funnel("mcp", root, "--transport", "streamable-http", "--port", str(port)),
                            stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))

    def listening():
        import socket
        socket.create_connection(("127.0.0.1", port), timeout=1).close()

    async def calls() -> list[float]:
        out = []
        async with httpx2.AsyncClient(timeout=180) as client, \
                streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=180) as s:
                await s.initialize()
                await s.list_tools()  # what a client does on connecting (and its tool schemas, once)
                # The client's own first-call cost, which no server can warm: it compiles a
                # validator for the tool's output schema (jsonschema) on its first call. Done
                # here, before the first timed call, and reported apart.
                t = time.perf_counter()
                s._output_schema_validator("search", s._tool_output_schemas["search"])
                compile_s.append(time.perf_counter() - t)
                for q in queries:
                    t = time.perf_counter()
                    await s.call_tool("search", {"query": q, "mode": "hybrid", "k": 10})
                    out.append(time.perf_counter() - t)
        return out

    compile_s: list[float] = []
    try:
        _wait_ready(proc, listening)
        start = time.perf_counter() - t0
        times = asyncio.run(calls())
    finally:
        proc.terminate()
        proc.wait(30)
    return {"start": start, "times": times, "warm": _warm_seconds(log_path), "client_compile": compile_s[0]}


def _warm_seconds(log_path: str) -> dict:
    """The warm-up's seconds from the server's log (total, and the embedder's part)."""
    text = open(log_path).read()
    total = re.findall(r"warm-up query answered in ([0-9.]+)s", text)
    embed = re.findall(r"query embedder ready in ([0-9.]+)s", text)
    whole = re.findall(r"([0-9.]+)s in all\)", text)  # with the requests through the front end
    more = re.findall(r"more queries in ([0-9.]+)s; \d+ [A-Za-z ]+ in ([0-9.]+)s", text)
    return {"total": float((whole or total)[-1]) if whole or total else None,
            "embedder": float(embed[-1]) if embed else None,
            "version": float(total[-1]) if total else None,  # VersionSearcher.warm, what the warm-up was before
            "added": sum(map(float, more[-1])) if more else None}  # serving.frontends.warmup's queries and requests


def part_server(a) -> dict:
    """Each server started ``--starts`` times, alternately; each start answers 1 + 100 // starts
    distinct queries (a first request per start, the rest pooled for the p50)."""
    from funnel.evaluation.evaluate import load_beir
    root = scifact_index(a)
    queries, _ = load_beir(dataset_dir(a.data, "scifact"), "test")
    qs = list(queries.values())
    per = 1 + 100 // a.starts
    port = 18700 + os.getpid() % 500
    out = {"http": [], "mcp": []}
    for i in range(a.starts):
        batch = qs[i * per:(i + 1) * per]
        out["http"].append(_serve_http(root, port + 2 * i, batch))
        out["mcp"].append(_serve_mcp(root, port + 2 * i + 1, batch))
    return out


# -- report -------------------------------------------------------------------------------------


def key_figures(res: dict) -> dict:
    """The issue's targets as measured by the parts in ``res`` (what is missing is left out)."""
    out = {}
    if "query" in res:
        q = res["query"]["rows"]
        med = {m: {k: statistics.median(x[k] for x in v) for k in ("wall", "cpu", "rss")} for m, v in q.items()}
        out.update(hybrid_wall=med["hybrid"]["wall"], bm25_wall=med["bm25"]["wall"], hybrid_cpu=med["hybrid"]["cpu"],
                   bm25_cpu=med["bm25"]["cpu"], hybrid_rss=med["hybrid"]["rss"])
    if "throughput" in res:
        t = res["throughput"]
        rate = {k: statistics.median(t["passages"] / x["cpu"] for x in v) for k, v in t["rows"].items()}
        today = next(k for k in rate if k.startswith("torch, in-process"))
        default = next((k for k in rate if k.startswith(("onnx int8, default", "onnx int8, in-process"))), None)
        if default:
            out["int8_vs_torch"] = rate[default] / rate[today]
    for name, starts in res.get("server", {}).items():
        first = statistics.median(s["times"][0] for s in starts)
        p50 = statistics.median(t for s in starts for t in s["times"][1:])
        out[f"{name}_first_p50"] = first / p50
        out[f"{name}_start"] = statistics.median(s["start"] for s in starts)
    return out


def render_before_after(before: dict, after: dict, label: str) -> list[str]:
    rows = [("one-query hybrid process, wall s (bm25's)", "hybrid_wall", "bm25_wall", "{:.2f}", "<= 1 s, <= 2x bm25"),
            ("one-query hybrid process, CPU s (bm25's)", "hybrid_cpu", "bm25_cpu", "{:.2f}", ""),
            ("one-query hybrid process, peak RSS MiB", "hybrid_rss", None, "{:.0f}", "<= 300"),
            ("build embedding at the CPU default, passages per CPU s vs torch", "int8_vs_torch", None, "{:.2f}x",
             ">= 2.5x"),
            ("HTTP: first request / p50 of the next 100", "http_first_p50", None, "{:.2f}x", "<= 2x"),
            ("MCP: first request / p50 of the next 100", "mcp_first_p50", None, "{:.2f}x", "<= 2x"),
            ("HTTP: seconds from start to ready", "http_start", None, "{:.1f}", ""),
            ("MCP: seconds from start to ready", "mcp_start", None, "{:.1f}", "")]

    def cell(fig: dict, key: str, base: str | None, fmt: str) -> str:
        if key not in fig:
            return "-"
        return fmt.format(fig[key]) + (f" ({fig[base]:.2f})" if base and base in fig else "")

    lines = [f"Before and after ({label}; each measured under its own run's load, see the tables below):", "",
             "| figure | before | after | target |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {cell(before, k, b, f)} | {cell(after, k, b, f)} | {target} |" for name, k, b, f, target in rows]
    return lines + [""]


def render(res: dict, before: dict | None = None, before_label: str = "", note: str = "") -> str:
    lines = []
    if before:
        lines += render_before_after(key_figures(before), key_figures(res), before_label)
    if note:
        lines += [note, ""]
    if "ndcg" in res:
        lines += ["NDCG@10 per build runtime and query runtime (every index built with `funnel build --dense "
                  "--embed-runtime R`, passages on; hybrid at its defaults):", "",
                  "| dataset | index / queries | dense | hybrid | dense - torch | hybrid - torch |",
                  "|---|---|---:|---:|---:|---:|"]
        for name, r in res["ndcg"].items():
            base = r.get("torch")
            for label in ("torch", "torch-built, onnx queries", "onnx", "onnx-int8"):
                x = r.get(label)
                if x is None or base is None:
                    continue
                shown = {"torch": "torch / torch (today)", "onnx": "onnx fp32 / onnx fp32",
                         "onnx-int8": "onnx int8 / onnx int8"}.get(label, "torch / onnx fp32")
                lines.append(f"| {name} | {shown} | {x['dense']:.4f} | {x['hybrid']:.4f} | "
                             f"{x['dense'] - base['dense']:+.4f} | {x['hybrid'] - base['hybrid']:+.4f} |")
        cos = [f"{n}: {r['cosine']['n']} test queries min {r['cosine']['min']:.7f}"
               for n, r in res["ndcg"].items() if "cosine" in r]
        docs = [f"{n}: {r['cosine_docs']['n']} passages min {r['cosine_docs']['min']:.7f}"
                for n, r in res["ndcg"].items() if "cosine_docs" in r]
        int8 = {n: max(abs(r["onnx-int8"][m] - r["torch"][m]) for m in MODES)
                for n, r in res["ndcg"].items() if "onnx-int8" in r and "torch" in r}
        if int8:
            ok = len(int8) == 3 and max(int8.values()) <= INT8_BOUND
            worst = max(int8, key=int8.get)
            lines += ["", f"int8 against torch, largest |ΔNDCG@10| over dense and hybrid: "
                      + ", ".join(f"{n} {d:.4f}" for n, d in int8.items())
                      + f" (bound {INT8_BOUND} on SciFact, NFCorpus and the long-document set): "
                      + ("within it on all three, so int8 is the CPU default (CPU_RUNTIME = 'onnx-int8')." if ok else
                         f"{'not measured on all three' if len(int8) < 3 else f'outside it on {worst}'}, so fp32 "
                         "onnxruntime stays the CPU default.")]
        lines += ["", "Cosine of onnxruntime fp32 vectors to torch's, queries: " + "; ".join(cos)
                  + ". Documents (the corpus's first passages, as the build embeds them): " + "; ".join(docs) + ".", ""]
    if "throughput" in res:
        t = res["throughput"]
        rows = t["rows"]
        rate = {k: statistics.median(t["passages"] / x["cpu"] for x in v) for k, v in rows.items()}
        wall = {k: statistics.median(t["passages"] / x["wall"] for x in v) for k, v in rows.items()}
        today = next(k for k in rows if k.startswith("torch, in-process"))
        actor = next(k for k in rows if k.startswith("torch, Ray"))
        lines += [f"Build embedding throughput: {t['passages']} passages of the long-document set as the build "
                  f"splits them ({t['words_per_passage']:.0f} words, {t['bytes_per_passage']:.0f} bytes each), "
                  f"through the build's EmbedBatch, {t['rounds']} interleaved rounds, medians; {t['cores']} cores.", "",
                  "| runtime | passages / CPU s | passages / s wall | per CPU s vs torch in-process "
                  "| vs torch Ray actor |", "|---|---:|---:|---:|---:|"]
        for k in rows:
            lines.append(f"| {k} | {rate[k]:.1f} | {wall[k]:.1f} | {rate[k] / rate[today]:.2f}x "
                         f"| {rate[k] / rate[actor]:.2f}x |")
        default = next((k for k in rows if k.startswith("onnx int8, default")), None)
        if default:
            ray = next((k for k in rows if k.startswith("onnx int8, 1 thread")), None)
            lines += ["", f"The build's CPU default (onnx int8 in-process, one text at a time on {t['cores']} "
                      f"intra-op threads): {rate[default] / rate[today]:.2f}x torch's passages per CPU second "
                      f"(target >= 2.5x), {wall[default] / wall[today]:.2f}x its passages per second of wall"
                      + (f"; on one thread (a Ray CPU actor) {rate[ray] / rate[today]:.2f}x per CPU second and "
                         f"{wall[ray] / wall[today]:.2f}x per second of wall" if ray else "")
                      + ". Every onnxruntime row gives the same vectors bit for bit (the thread count does not "
                      "change a text's arithmetic; tests/test_onnx_embed.py)."]
        lines.append("")
    if "query" in res:
        q = res["query"]["rows"]
        med = {m: {k: statistics.median(x[k] for x in v) for k in ("wall", "cpu", "rss")} for m, v in q.items()}
        h, b = med["hybrid"], med["bm25"]
        lines += [f"One-query process, `funnel search IDX \"q\" --mode M` on SciFact (built with the CPU default, "
                  f"{res['query'].get('runtime', '?')}), "
                  f"{res['query']['runs']} runs per mode interleaved, medians:", "",
                  "| mode | wall s | CPU s | peak RSS MiB |", "|---|---:|---:|---:|",
                  f"| bm25 | {b['wall']:.2f} | {b['cpu']:.2f} | {b['rss']:.0f} |",
                  f"| hybrid | {h['wall']:.2f} | {h['cpu']:.2f} | {h['rss']:.0f} |",
                  "", f"hybrid / bm25: wall {h['wall'] / b['wall']:.2f}x, CPU {h['cpu'] / b['cpu']:.2f}x "
                  f"(targets: wall <= 2x and <= 1 s; peak RSS <= 300 MiB).", ""]
    if "server" in res:
        n = len(next(iter(res["server"].values())))
        lines += [f"Servers on the same index, each started {n} times: seconds to ready (the warm-up included, and "
                  "of it the query embedder's load and first embedding), the first hybrid request after start "
                  "(median over starts), and the p50 of the hundred after them (distinct SciFact queries; "
                  "the MCP client lists tools on connecting, as clients do):", "",
                  "| server | start s | warm-up s (embedder) | of it added by serving.frontends.warmup s "
                  "| first request ms | p50 of next 100 ms | first / p50 |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        compile_ms = [s["client_compile"] * 1000 for s in res["server"].get("mcp", []) if "client_compile" in s]
        for name, starts in res["server"].items():
            first = statistics.median(s["times"][0] for s in starts)
            p50 = statistics.median(t for s in starts for t in s["times"][1:])
            start = statistics.median(s["start"] for s in starts)
            total = [s["warm"]["total"] for s in starts if s["warm"]["total"] is not None]
            embed = [s["warm"]["embedder"] for s in starts if s["warm"]["embedder"] is not None]
            warm = f"{statistics.median(total):.2f} ({statistics.median(embed):.2f})" if total and embed else "?"
            added = [s["warm"]["added"] for s in starts if s["warm"].get("added") is not None]
            added = f"{statistics.median(added):.2f}" if added else "-"
            lines.append(f"| {name} | {start:.1f} | {warm} | {added} | {first * 1000:.0f} | {p50 * 1000:.0f} "
                         f"| {first / p50:.2f}x |")
        lines += ["", "The warm-up (serving/frontends/warmup.py) answers a BM25 and a hybrid query on the version "
                  "(VersionSearcher.warm, all of the warm-up before), then 3 "
                  "queries from documents spread over the corpus, first on the version and then as requests through "
                  "the server's own front end in-process (the HTTP app; the MCP server through an in-memory client "
                  "session); a newly published version is warmed the same way before it serves."]
        if compile_ms:
            lines.append(f"The MCP client compiles a validator for the search tool's output schema on its first call "
                         f"({statistics.median(compile_ms):.0f} ms here, median over starts), a cost of the client that "
                         "no server can warm: the bench has it done before the first timed call.")
        lines.append("")
    load = res.get("load") or {}
    shown = "; ".join(f"{p} {load[p][0]:.1f} to {load[p][1]:.1f}" if p in load else f"{p} not recorded (its "
                      "results come from an earlier run of this script)" for p in PARTS if p in res)
    lines += ["Each part interleaves its own baseline and candidates; the parts ran at different times of a "
              f"shared 2-core machine (1-minute load average at each part's start and end: {shown}), so compare "
              "within a table, not across tables. An fp32 "
              "index's NDCG is read from the torch index queried through onnxruntime fp32 (the serving path) "
              "plus the cosine of the document side above, not from a separate fp32 build (--fp32-builds "
              "makes one). int8 runs one text per onnxruntime call (its dynamic quantization would otherwise "
              "tie a vector to its batch), as do fp32 runs (faster on this CPU than batches of 64)."]
    return "\n".join(lines).rstrip() + "\n\nCommand: `.venv/bin/python bench/bench_cpu_embed.py --write` (parts may " \
                                       "run apart, `--parts P`, and the section be rendered with `--render`; " \
                                       "`--before DIR` for the before/after table; 2-core shared machine, load varying)."


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common_arguments(p)
    p.add_argument("--out", default=os.path.join(".funnel", "cpu-embed"), help="indexes and part results")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--passages", type=int, default=256, help="passages per throughput round")
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds")
    p.add_argument("--query-runs", type=int, default=9, help="one-query processes per mode")
    p.add_argument("--starts", type=int, default=3, help="server starts per server")
    p.add_argument("--render", action="store_true", help="only render the saved parts")
    p.add_argument("--fp32-builds", action="store_true",
                   help="ndcg: also build every dataset with --embed-runtime onnx (fp32); without it the fp32 "
                        "document side is checked by the cosine of --cosine-passages passages")
    p.add_argument("--cosine-passages", type=int, default=256, help="ndcg: passages per dataset compared")
    p.add_argument("--datasets", default="scifact,nfcorpus,longdocs", help="ndcg: which datasets")
    p.add_argument("--before", help="a folder of part results (PART.json) of an earlier run, shown beside this "
                                    "run's in a before/after table")
    p.add_argument("--before-label", default="before: an earlier run of this script",
                   help="what the --before run measured (a commit, a date)")
    p.add_argument("--note", default="", help="a paragraph shown under the before/after table (what to read it with)")
    a = p.parse_args(argv)
    parts = [x for x in a.parts.split(",") if x]
    unknown = set(parts) - set(PARTS)
    if unknown:
        sys.exit(f"error: unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
    os.makedirs(a.out, exist_ok=True)
    res = {}
    load_path = os.path.join(a.out, "load.json")
    loads = json.load(open(load_path)) if os.path.exists(load_path) else {}
    for part in PARTS:
        path = os.path.join(a.out, f"{part}.json")
        if part in parts and not a.render:
            before = os.getloadavg()[0]
            res[part] = globals()[f"part_{part}"](a)
            with open(path, "w") as f:
                json.dump(res[part], f, indent=1)
            loads[part] = [before, os.getloadavg()[0]]  # 1-minute load average at its start and end
            with open(load_path, "w") as f:
                json.dump(loads, f)
        elif os.path.exists(path):
            res[part] = json.load(open(path))
    res["load"] = {p: v for p, v in loads.items() if p in res}
    before = {}
    if a.before:
        before = {part: json.load(open(os.path.join(a.before, f"{part}.json"))) for part in PARTS
                  if os.path.exists(os.path.join(a.before, f"{part}.json"))}
        if not before:
            sys.exit(f"error: --before {a.before} holds no part results ({', '.join(f'{x}.json' for x in PARTS)})")
    report("cpu-embed", "Dense on a CPU: onnxruntime against torch (bench_cpu_embed.py)",
           render(res, before, a.before_label, a.note), a.write)


if __name__ == "__main__":
    main()
