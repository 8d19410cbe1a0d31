"""Scale benchmark: build and query BM25 on synthetic corpora of 100K to 3M documents, funnel vs bm25s vs PISA.

    .venv/bin/python bench/bench_scale.py [--sizes 100k,1m[,3m]] [--shards N | --shard-mib M] [--queries 1000] [--repeats 5] [--write]

Per size, in one run: the corpus from ``bench/synth.py`` (seeded, cached under
``.funnel/synth/SIZE``), then three builds, each a fresh child process measured from
outside: ``funnel build`` (the CLI, default engine and shard choice unless ``--shards`` or
``--shard-mib``),
bm25s (read corpus.jsonl, ``bm25s.tokenize`` with English stopwords + PyStemmer Porter,
``method="lucene"`` k1=0.9 b=0.4, ``save()``) and PISA through pyterrier-pisa (index, then
the BM25 block-max index PISA compresses on first use; no stemmer and no stopwords, since
every synthetic word is already a Porter stem and no stopword). Measured: wall time, CPU
time of the whole process tree, peak RSS of the tree (every 0.2 s from /proc, summed over
the child and all its descendants: Ray's GCS, raylet and workers), peak PSS of the tree (the
same with shared pages, e.g. Ray's object store, divided among the processes that map
them), the driver's and the largest other process's peak RSS, and the index size on disk.
A build is killed if the machine's available memory falls below ``--min-avail-gib``.

Then queries, again in fresh children: per system, open time, first-query time, latency
p50/p99 of one query at a time and the serving process's RSS after answering every query
twice; then one child holding all systems times batch throughput, best of ``--repeats``
interleaved passes (single thread: funnel ``Searcher.search_batch``; bm25s numba backend,
warm, ``n_threads=0``, on pre-tokenized queries and with tokenization; PISA
``threads=1`` block-max WAND, raw query strings into the compiled retrieval that
pyterrier-pisa's transformer wraps, and through the transformer itself).

Prints the tables with ratios and the build-time exponent log(t2/t1)/log(n2/n1) between
sizes, writes PNG plots to bench/plots/ and ``--write`` records the "scale" section of
bench/RESULTS.md. Indexes, results.json and per-child logs go under ``.funnel/scale/``
(git-ignored); beside each log, ``.mem.tsv`` is the memory timeline (tree RSS/PSS, driver,
MemAvailable every 0.2 s) and ``.procs.tsv`` each process's peak, to find which stage and
which process peaked. ``--from-results results.json [--supplement other.json]`` re-renders
a saved run without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from results import recorded_section, report  # noqa: E402
from synth import ensure, parse_count  # noqa: E402

KS = (10, 100)
SYSTEMS = ("funnel", "bm25s", "pisa")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
GIB = 1 << 30
MIB = 1 << 20


# -- measuring a process tree from outside ------------------------------------------------------

def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _scan() -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """({pid: ppid}, {pid: (cpu ticks utime+stime, rss bytes)}) of every process, from /proc."""
    parent, stat = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(fields[1])
        stat[pid] = (int(fields[11]) + int(fields[12]), int(fields[21]) * _PAGE)
    return parent, stat


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(200).replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return ""


def _tree(root: int, parent: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measure(cmd: list[str], log_path: str, min_avail: int, interval: float = 0.2,
            env: dict | None = None) -> dict:
    """Run ``cmd`` to completion; its wall/CPU seconds and peak memory, the tree's, sampled every ``interval``.

    CPU is the larger of the tree's sampled utime+stime (each process's last sample; at most
    ``interval`` of a process's last moments escapes) and the root's own rusage (itself and
    the descendants it waited for). Kills the tree and returns ``aborted`` when the machine's
    MemAvailable falls below ``min_avail`` bytes.
    """
    cpu: dict[int, int] = {}
    peak_rss: dict[int, int] = {}
    timeline, loads = [], []
    names: dict[int, str] = {}
    tree_rss = tree_pss = 0
    aborted = None
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        started_at = time.time()  # the timeline's t=0 as an epoch, to place the command's log lines on it
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        status = rusage = None
        while True:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, rusage = st, ru
                break
            parent, stat = _scan()
            members = [p for p in _tree(proc.pid, parent) if p in stat]
            rss = pss = 0
            for p in members:
                c, r = stat[p]
                cpu[p] = max(cpu.get(p, 0), c)
                if r > peak_rss.get(p, 0):
                    peak_rss[p] = r
                    names[p] = _cmdline(p)
                rss += r
                pss += _pss(p)
            tree_rss, tree_pss = max(tree_rss, rss), max(tree_pss, pss)
            avail = _mem_available()
            if len(timeline) % 25 == 0:
                loads.append(os.getloadavg()[0])
            timeline.append((round(time.perf_counter() - t0, 2), rss, pss, stat.get(proc.pid, (0, 0))[1], avail))
            if avail < min_avail and aborted is None:
                aborted = f"killed: MemAvailable {avail / GIB:.1f} GiB < {min_avail / GIB:.1f} GiB"
                for p in reversed(members):  # the processes this run started, and nothing else
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
            time.sleep(interval)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampled = sum(cpu.values()) / _TICK
    own = rusage.ru_utime + rusage.ru_stime
    others = [v for p, v in peak_rss.items() if p != proc.pid]
    with open(log_path + ".mem.tsv", "w") as f:  # for finding which stage peaks
        f.write("t_s\ttree_rss_mib\ttree_pss_mib\tdriver_rss_mib\tavailable_mib\n")
        f.writelines(f"{t}\t{r / MIB:.0f}\t{p / MIB:.0f}\t{d / MIB:.0f}\t{a / MIB:.0f}\n" for t, r, p, d, a in timeline)
    with open(log_path + ".procs.tsv", "w") as f:  # which process peaked: driver, raylet, workers
        f.write("pid\tpeak_rss_mib\tcpu_s\tcommand_at_peak\n")
        f.writelines(f"{p}\t{r / MIB:.0f}\t{cpu.get(p, 0) / _TICK:.1f}\t{names.get(p, '')}\n"
                     for p, r in sorted(peak_rss.items(), key=lambda kv: -kv[1]))
    return {"wall_s": wall, "cpu_s": max(sampled, own), "load_avg": sum(loads) / max(1, len(loads)),
            "cpu_sampled_s": sampled, "cpu_rusage_s": own,
            "peak_tree_rss": tree_rss, "peak_tree_pss": tree_pss,
            # ru_maxrss is exact for the root, but it is the largest of the descendants it waited for too
            "peak_driver_rss": peak_rss.get(proc.pid, 0) if others else max(peak_rss.get(proc.pid, 0),
                                                                             rusage.ru_maxrss * 1024),
            "peak_other_rss": max(others, default=0), "n_processes": len(peak_rss),
            "returncode": proc.returncode, "aborted": aborted, "log": log_path, "started_at": started_at,
            "last_available": timeline[-1][4] if timeline else None}


def du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _tail(path: str, n: int = 3000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def _failure(m: dict) -> str:
    if m["aborted"]:
        return m["aborted"]
    if m["returncode"] == -signal.SIGKILL and m.get("last_available"):
        return (f"SIGKILL, not from this benchmark (MemAvailable {m['last_available'] / GIB:.1f} GiB at the last "
                f"sample)")
    return f"exit {m['returncode']}"


def run_child(kind: str, args: dict, work: str, min_avail: int) -> dict:
    """Run ``bench_scale.py --child kind`` measured; its JSON answer merged with the measures."""
    result = os.path.join(work, f"{kind}.result.json")
    if os.path.exists(result):
        os.remove(result)
    args = {**args, "result": result}
    m = measure([sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(args)],
                os.path.join(work, f"{kind}.log"), min_avail)
    if m["returncode"] != 0 or not os.path.exists(result):
        why = _failure(m)
        print(f"  {kind} failed ({why}); log {m['log']}:\n{_tail(m['log'], 1500)}", file=sys.stderr)
        return {**m, "failed": why}
    with open(result) as f:
        return {**m, **json.load(f)}


# -- the children: builds ----------------------------------------------------------------------

def _done(args: dict, out: dict) -> None:
    with open(args["result"] + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(args["result"] + ".tmp", args["result"])


def _corpus_texts(corpus: str):
    with open(os.path.join(corpus, "corpus.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            yield d["_id"], d.get("title", "") + " " + d["text"]


def funnel_build(corpus: str, out: str, engine: str, shards: int | None, work: str, min_avail: int,
                 shard_mib: int | None = None, postings: str = "plain") -> dict:
    """``funnel build`` as a user runs it (the CLI, a fresh process), measured; plus its manifest's facts."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", corpus, "--out", out,
           "--engine", engine, "--progress-seconds", "20"] + (["--shards", str(shards)] if shards else []) \
        + (["--shard-mib", str(shard_mib)] if shard_mib else []) \
        + (["--postings", postings] if postings != "plain" else [])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log_name = "funnel-build.log" if postings == "plain" else f"funnel-{postings}-build.log"
    m, vdir, man = measure_build(cmd, os.path.join(work, log_name), min_avail, env, out)
    if vdir is None:
        return m
    return {**m, "build": man["build"], "stages": man["build"]["stages"], "n_docs": man["corpus"]["n_docs"],
            "index_bytes": du(vdir), "lexical_bytes": du(os.path.join(vdir, "lexical")),
            "docs_bytes": du(os.path.join(vdir, "docs"))}


def measure_build(cmd: list[str], log_path: str, min_avail: int, env: dict, out: str,
                  what: str = "funnel build") -> tuple[dict, str | None, dict | None]:
    """Run a build command measured from outside (``measure``): (measurements, the published
    version's folder, its manifest); on failure (measurements with "failed", None, None), the
    log's tail printed."""
    m = measure(cmd, log_path, min_avail, env=env)
    if m["returncode"] != 0:
        why = _failure(m)
        print(f"  {what} failed ({why}); log {m['log']}:\n{_tail(m['log'], 1500)}", file=sys.stderr)
        return {**m, "failed": why}, None, None
    with open(os.path.join(out, "CURRENT")) as f:
        vdir = os.path.join(out, f.read().strip())
    with open(os.path.join(vdir, "manifest.json")) as f:
        return m, vdir, json.load(f)


def child_bm25s_build(args: dict) -> None:
    import bm25s
    import Stemmer
    out = args["out"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    texts = [t for _, t in _corpus_texts(args["corpus"])]
    t1 = time.perf_counter()
    toks = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("porter"), show_progress=False)
    del texts
    t2 = time.perf_counter()
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4, backend="numba")
    model.index(toks, show_progress=False)
    t3 = time.perf_counter()
    model.save(out)
    t4 = time.perf_counter()
    _done(args, {"stages": {"read": round(t1 - t0, 2), "tokenize": round(t2 - t1, 2), "index": round(t3 - t2, 2),
                            "save": round(t4 - t3, 2)}, "index_bytes": du(out), "n_docs": len(toks.ids)})


def _pisa_frame(queries: dict):
    import pandas as pd
    return pd.DataFrame({"qid": list(queries), "query": list(queries.values())})


def child_pisa_build(args: dict) -> None:
    import pyterrier_pisa as pp
    out = args["out"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    ix = pp.PisaIndex(out, stemmer="none", stops="none", threads=args["threads"])
    ix.index({"docno": i, "text": t} for i, t in _corpus_texts(args["corpus"]))
    t1 = time.perf_counter()
    for k in KS:  # PISA writes its compressed block-max BM25 index on first use: part of the build
        ix.bm25(k1=0.9, b=0.4, num_results=k, threads=1).transform(_pisa_frame({"q": "x"}))
    t2 = time.perf_counter()
    _done(args, {"stages": {"index": round(t1 - t0, 2), "compress": round(t2 - t1, 2)}, "index_bytes": du(out),
                 "n_docs": len(ix), "threads": args["threads"]})


# -- the children: queries ---------------------------------------------------------------------

def _proc_status() -> dict:
    want = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in want:
                out[key] = int(line.split()[1]) * 1024
    return out


def _queries(corpus: str, n: int) -> dict:
    with open(os.path.join(corpus, "queries.jsonl")) as f:
        qs = [json.loads(line) for line in f]
    return {q["_id"]: q["text"] for q in qs[:n]}


class Funnel:
    name = "funnel"

    def __init__(self, path: str, qs: dict):
        from funnel.serving.search import open_index
        self.ix = open_index(path)
        self.qs = qs

    def batch(self, k: int):
        return self.ix.search_batch(self.qs, k=k)

    def batch_sira(self, k: int):
        return self.ix.search_batch(self.qs, k=k, mode="sira", proposer="prf")

    def one(self, qid: str, q: str, k: int):
        return self.ix.search_batch({qid: q}, k=k)

    def info(self) -> dict:
        b = self.ix.bm25
        return {"shards": self.ix.index.n_shards, "pruned_shard_queries": int(b.prune_stats[0])}


class BM25S:
    name = "bm25s"

    def __init__(self, path: str, qs: dict):
        import bm25s
        import Stemmer
        self.bm25s = bm25s
        self.stem = Stemmer.Stemmer("porter")
        self.model = bm25s.BM25.load(path, show_progress=False)
        self.texts = list(qs.values())
        self.qt = None

    def _tok(self, texts):
        return self.bm25s.tokenize(texts, stopwords="en", stemmer=self.stem, show_progress=False)

    def batch(self, k: int, pretokenized: bool = True):
        if self.qt is None:
            self.qt = self._tok(self.texts)
        return self.model.retrieve(self.qt if pretokenized else self._tok(self.texts), k=k, n_threads=0,
                                   backend_selection="numba", show_progress=False)

    def one(self, qid: str, q: str, k: int):
        return self.model.retrieve(self._tok([q]), k=k, n_threads=0, backend_selection="numba", show_progress=False)

    def info(self) -> dict:
        return {}


class Pisa:
    """PISA through pyterrier-pisa: ``batch`` is its transformer (a pandas frame in and out);
    ``engine`` and ``one`` call the compiled retrieval that the transformer wraps, without pandas."""
    name = "pisa"

    def __init__(self, path: str, qs: dict):
        import pyterrier_pisa as pp
        ix = pp.PisaIndex(path, stemmer="none", stops="none", threads=1)
        self.retr = {k: ix.bm25(k1=0.9, b=0.4, num_results=k, threads=1) for k in KS}
        self.df = _pisa_frame(qs)
        self.items = list(enumerate(qs.values()))

    def batch(self, k: int):
        return self.retr[k].transform(self.df)

    def engine(self, k: int, items=None):
        import numpy as np
        from pyterrier_pisa import _pisathon
        items = self.items if items is None else items
        r = self.retr[k]
        n = len(items) * k
        qidx, ranks = np.empty(n, np.int32), np.empty(n, np.int32)
        docnos, scores = np.empty(n, dtype=object), np.empty(n, np.float32)
        size = _pisathon.retrieve(r._ctxt, r.query_algorithm.value, items, k=k, threads=1,
                                  query_weighted=1 if r.query_weighted else 0, pretokenised=False,
                                  result_qidxs=qidx, result_docnos=docnos, result_ranks=ranks, result_scores=scores)
        return qidx[:size], docnos[:size], scores[:size]

    def one(self, qid: str, q: str, k: int):
        return self.engine(k, [(0, q)])

    def info(self) -> dict:
        return {}


OPENERS = {"funnel": Funnel, "bm25s": BM25S, "pisa": Pisa}


def _percentiles(xs: list[float]) -> dict:
    import numpy as np
    a = np.asarray(xs) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "mean_ms": float(a.mean())}


def child_serve(args: dict) -> None:
    """Open one system cold, answer the first query, then every query one at a time; RSS at the end."""
    t_start = time.perf_counter()
    system = args["system"]
    qs = _queries(args["corpus"], args["n_queries"])
    if system == "funnel":
        import funnel.serving.search  # noqa: F401  (imports are not the open time)
    elif system == "bm25s":
        import bm25s  # noqa: F401
    else:
        import pyterrier_pisa  # noqa: F401
    t_imported = time.perf_counter()
    s = OPENERS[system](args["index"], qs)
    t_open = time.perf_counter()
    first_id, first_q = next(iter(qs.items()))
    s.one(first_id, first_q, 10)
    t_first = time.perf_counter()
    after_first = _proc_status()
    lat = {}
    for k in KS:
        for qid, q in qs.items():  # warm pass
            s.one(qid, q, k)
        times, cpu = [], []
        for qid, q in qs.items():
            t, c = time.perf_counter(), time.thread_time()
            s.one(qid, q, k)
            cpu.append(time.thread_time() - c)
            times.append(time.perf_counter() - t)
        lat[k] = {**_percentiles(times), **{f"cpu_{key}": v for key, v in _percentiles(cpu).items()}}
    warm_open = warm_full = None
    if system == "funnel":  # page cache warm now: sizes only, then every sha256 again
        from funnel.serving.search import open_index
        t = time.perf_counter()
        open_index(args["index"], verify="sizes")
        warm_open = time.perf_counter() - t
        t = time.perf_counter()
        open_index(args["index"], verify="full")
        warm_full = time.perf_counter() - t
    _done(args, {"open_verify": "cached" if system == "funnel" else None,
                 "warm_open_sizes_s": warm_open, "warm_open_full_s": warm_full, "import_s": t_imported - t_start, "open_s": t_open - t_imported, "first_s": t_first - t_open,
                 "start_to_first_s": t_first - t_start, "latency": lat, "status_after_first": after_first,
                 "status_end": _proc_status(), "info": s.info()})


def child_throughput(args: dict) -> None:
    """Batch q/s of every system, interleaved passes, best of ``repeats``."""
    qs = _queries(args["corpus"], args["n_queries"])
    systems = {name: OPENERS[name](path, qs) for name, path in args["indexes"].items()}
    runs = {}
    for name, s in systems.items():
        if name == "bm25s":
            runs["bm25s numba"] = lambda k, s=s: s.batch(k, pretokenized=True)
            runs["bm25s numba +tokenize"] = lambda k, s=s: s.batch(k, pretokenized=False)
        elif name == "pisa":
            runs["pisa"] = s.engine
            runs["pisa (pyterrier frame)"] = s.batch
        else:
            runs[name] = s.batch
            if args.get("sira"):  # SIRA with the offline prf proposer, through the same batch API
                runs["funnel sira-prf"] = s.batch_sira
    for fn in runs.values():
        for k in KS:
            fn(k)  # warm: numba compilation, caches, page cache
    best: dict = {}
    best_cpu: dict = {}
    for _ in range(args["repeats"]):
        for name, fn in runs.items():
            for k in KS:
                t, c = time.perf_counter(), time.process_time()
                fn(k)
                key = f"{name}@{k}"
                best_cpu[key] = min(best_cpu.get(key, float("inf")), time.process_time() - c)
                best[key] = min(best.get(key, float("inf")), time.perf_counter() - t)
    info = systems["funnel"].info() if "funnel" in systems else {}
    _done(args, {"qps": {key: len(qs) / s for key, s in best.items()},
                 "qps_cpu": {key: len(qs) / s for key, s in best_cpu.items()}, "n_queries": len(qs),
                 "funnel_info": info, "load_avg": os.getloadavg()[0]})


CHILDREN = {"bm25s-build": child_bm25s_build, "pisa-build": child_pisa_build,
            "serve": child_serve, "throughput": child_throughput}


# -- the run -----------------------------------------------------------------------------------

def label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def pisa_available() -> str | None:
    """None when pyterrier-pisa imports, else why not."""
    try:
        import pyterrier_pisa  # noqa: F401
    except Exception as e:  # ImportError, or a native library that fails to load
        return f"pyterrier-pisa not usable: {type(e).__name__}: {e}"
    return None


def cli_one_query(corpus: str, index: str, runs: int = 3) -> dict:
    """Wall seconds of whole `funnel search INDEX "QUERY" --k 10` processes (interpreter,
    imports, open, one query, ten hits with snippets printed): what an agent calling the
    CLI once per question waits for."""
    q = next(iter(_queries(corpus, 1).values()))
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "search", index, q, "--k", "10"]
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        walls.append(time.perf_counter() - t)
        if p.returncode != 0:
            return {"failed": p.stderr[-500:], "query": q}
    return {"wall_s": walls, "query": q}


def run_size(n: int, a, pisa_why: str | None) -> dict:
    lab = label(n)
    corpus = os.path.join(a.synth, lab)
    t = time.time()
    meta = ensure(n, corpus, seed=a.seed)
    print(f"[{lab}] corpus {corpus}: {meta['n_docs']:,} docs, {meta['corpus_bytes'] / MIB:,.0f} MiB, "
          f"{meta['n_tokens']:,} tokens ({time.time() - t:.0f}s)", flush=True)
    work = os.path.join(a.work, lab)
    os.makedirs(work, exist_ok=True)
    min_avail = int(a.min_avail_gib * GIB)
    res = {"n_docs": n, "corpus": meta, "build": {}, "serve": {}}
    idx = {s: os.path.join(work, s) for s in SYSTEMS}
    builds = {"funnel": None,
              "bm25s": ("bm25s-build", {"corpus": corpus, "out": idx["bm25s"]}),
              "pisa": ("pisa-build", {"corpus": corpus, "out": idx["pisa"], "threads": os.cpu_count()})}
    for system in builds:
        if system in a.skip or (system == "pisa" and pisa_why):
            continue
        if system == "funnel":
            b = funnel_build(corpus, idx["funnel"], a.engine, a.shards, work, min_avail, a.shard_mib)
        else:
            b = run_child(builds[system][0], builds[system][1], work, min_avail)
        res["build"][system] = b
        if "failed" not in b:
            print(f"[{lab}] build {system}: {b['wall_s']:.1f}s wall, {b['cpu_s']:.1f}s CPU, peak tree RSS "
                  f"{b['peak_tree_rss'] / MIB:,.0f} MiB (PSS {b['peak_tree_pss'] / MIB:,.0f}), "
                  f"index {b['index_bytes'] / MIB:,.0f} MiB", flush=True)
    ok = [s for s in SYSTEMS if s in res["build"] and "failed" not in res["build"][s]]
    for system in ok:
        sv = run_child("serve", {"system": system, "corpus": corpus, "index": idx[system],
                                 "n_queries": a.queries}, work, min_avail)
        res["serve"][system] = sv
        if "failed" not in sv:
            print(f"[{lab}] serve {system}: open {sv['open_s']:.2f}s, first query {1000 * sv['first_s']:.0f} ms, "
                  f"p50/p99 k=10 {sv['latency']['10']['p50_ms']:.2f}/{sv['latency']['10']['p99_ms']:.2f} ms, "
                  f"RSS {sv['status_end']['VmRSS'] / MIB:,.0f} MiB", flush=True)
    if "funnel" in ok:
        res["cli_one"] = cli_one_query(corpus, idx["funnel"])
        print(f"[{lab}] `funnel search` one query, whole process: "
              + " / ".join(f"{x:.2f}" for x in res["cli_one"]["wall_s"]) + " s", flush=True)
    tp = run_child("throughput", {"corpus": corpus, "indexes": {s: idx[s] for s in ok}, "n_queries": a.queries,
                                  "repeats": a.repeats, "sira": a.sira}, work, min_avail)
    res["throughput"] = tp
    if "failed" not in tp:
        print(f"[{lab}] q/s: " + ", ".join(f"{key} {v:,.0f}" for key, v in tp["qps"].items()), flush=True)
    if not a.keep:
        for system in SYSTEMS:
            shutil.rmtree(idx[system], ignore_errors=True)
    return res


# -- report ------------------------------------------------------------------------------------

def _mib(x) -> str:
    return f"{x / MIB:,.0f}" if x else "–"


def exponent(x1: float, x2: float, n1: int, n2: int) -> float:
    return math.log(x2 / x1) / math.log(n2 / n1)


def _get(d: dict, *keys, default=None):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def render(results: dict, a, pisa_why: str | None, command: str) -> str:
    sizes = sorted(results, key=int)
    loads = ", ".join(f"{_get(results[n], 'throughput', 'load_avg', default=0):.1f}" for n in sizes)
    L = [f"Machine: {platform.machine()}, {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * _PAGE / GIB:.0f} "
         f"GiB RAM, Python {platform.python_version()}; shared with other jobs (1-minute load average after "
         f"the query passes of each size: {loads}). Command: `{command}`. All figures below come from this one run.",
         "",
         "Corpus: `bench/synth.py`, seed " + str(a.seed) + " (Zipf-Mandelbrot pseudo-words over a "
         "300K vocabulary mixed with 2,000 topics, log-normal lengths with mean 150 words, clipped to "
         "[8, 4000]; queries of 2-8 terms of one document, half from its rarer terms). "
         "Sizes: " + "; ".join(f"{int(n):,} docs = {results[n]['corpus']['corpus_bytes'] / MIB:,.0f} MiB, "
                               f"{results[n]['corpus']['n_tokens'] / 1e6:,.0f}M tokens" for n in sizes) + ".",
         "", "### Build", "",
         "Each build is a fresh child process; CPU is the whole process tree's, peak RSS the sum over the "
         "tree sampled every 0.2 s (PSS divides shared pages, e.g. Ray's object store, among the processes "
         "that map them), 'driver' the process the command started, 'largest other' the largest of its "
         "descendants (Ray workers). 'load avg' is the machine's 1-minute load average during the build (2 "
         "cores; other jobs share them, so wall time above CPU time is mostly waiting for a core). Index size: funnel's includes the stored documents (docs/*.parquet, "
         "for snippets and `get_document`) besides the postings (in brackets); PISA's includes its forward "
         "index and the compressed block-max index; bm25s stores no documents.", "",
         "| docs | system | wall s | CPU s | load avg | peak tree RSS MiB | peak tree PSS MiB | driver peak MiB "
         "| largest other MiB | index MiB | stages (s) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for n in sizes:
        for s, b in results[n]["build"].items():
            if "failed" in b:
                L.append(f"| {int(n):,} | {s} | failed: {b['failed']} (after {b['wall_s']:.0f}s, peak tree RSS "
                         f"{_mib(b['peak_tree_rss'])} MiB) |" + " |" * 8)
                continue
            stages = b.get("stages") or _get(b, "build", "stages", default={})
            L.append(f"| {int(n):,} | {s} | {b['wall_s']:.1f} | {b['cpu_s']:.1f} | {b.get('load_avg', 0):.1f} "
                     f"| {_mib(b['peak_tree_rss'])} "
                     f"| {_mib(b['peak_tree_pss'])} | {_mib(b['peak_driver_rss'])} | {_mib(b['peak_other_rss'])} "
                     f"| {_mib(b['index_bytes'])}{' (postings ' + _mib(b['lexical_bytes']) + ')' if b.get('lexical_bytes') else ''} "
                     f"| {json.dumps(stages).replace('|', '/')} |")
    L.append("")
    for n in sizes:
        fb = results[n]["build"].get("funnel", {})
        if "build" in fb:
            e, sh = fb["build"]["engine"], fb["build"]["shards"]
            L.append(f"- {int(n):,} docs: funnel chose engine **{e['name']}** ({e['reason']}); "
                     f"**{sh['n']} shard(s)** ({sh['reason']}).")
    L += ["", "Build-time exponents, log(t2/t1)/log(n2/n1) (target for funnel: ≤ 1.1 from 100K to 3M):", ""]
    pairs = list(zip(sizes, sizes[1:])) + ([(sizes[0], sizes[-1])] if len(sizes) > 2 else [])
    for n1, n2 in pairs:
        parts = []
        for s in SYSTEMS:
            b1, b2 = results[n1]["build"].get(s, {}), results[n2]["build"].get(s, {})
            if "wall_s" in b1 and "wall_s" in b2 and "failed" not in b1 and "failed" not in b2:
                parts.append(f"{s} wall {exponent(b1['wall_s'], b2['wall_s'], int(n1), int(n2)):.2f}, "
                             f"CPU {exponent(b1['cpu_s'], b2['cpu_s'], int(n1), int(n2)):.2f}, "
                             f"peak RSS {exponent(b1['peak_tree_rss'], b2['peak_tree_rss'], int(n1), int(n2)):.2f}")
        L.append(f"- {int(n1):,} → {int(n2):,}: " + "; ".join(parts))
    L += ["", "Build ratios (funnel ÷ baseline; above 1 means funnel takes more):", ""]
    for n in sizes:
        fb = results[n]["build"].get("funnel", {})
        if "failed" in fb or not fb:
            continue
        parts = []
        for s in ("bm25s", "pisa"):
            b = results[n]["build"].get(s)
            if b and "failed" not in b:
                parts.append(f"vs {s}: wall {fb['wall_s'] / b['wall_s']:.2f}x, CPU {fb['cpu_s'] / b['cpu_s']:.2f}x, "
                             f"peak RSS {fb['peak_tree_rss'] / b['peak_tree_rss']:.2f}x, "
                             f"index size {fb['index_bytes'] / b['index_bytes']:.2f}x")
        if parts:
            L.append(f"- {int(n):,} docs: " + "; ".join(parts))

    L += ["", "### Queries", "",
          f"Throughput: the first {a.queries} generated queries, batch, one thread, best of {a.repeats} "
          "interleaved passes in one process holding every system, all warm. funnel: "
          "`Searcher.search_batch` (Lucene analysis + scoring + doc ids). bm25s: numba backend, "
          "`n_threads=0`, on pre-tokenized queries (as bm25s benchmarks itself) and '+tokenize' with "
          "`bm25s.tokenize` in the timed pass. PISA: pyterrier-pisa `PisaIndex.bm25(k1=0.9, b=0.4)`, "
          "`threads=1`, block-max WAND, raw query strings (PISA tokenizes them): 'pisa' calls the compiled "
          "retrieval (`_pisathon.retrieve`, result arrays, no pandas), 'pisa (pyterrier frame)' the "
          "transformer around it (a pandas frame in and out).", ""]
    names = []
    for n in sizes:
        for key in _get(results[n], "throughput", "qps", default={}):
            nm = key.rsplit("@", 1)[0]
            if nm not in names:
                names.append(nm)
    L.append("| docs | k | " + " | ".join(f"{nm} q/s" for nm in names) +
             " | funnel / bm25s numba | funnel / bm25s numba +tokenize | funnel / PISA | funnel / PISA frame |")
    L.append("|---:|---:|" + "---:|" * (len(names) + 4))
    def ratio(q: dict, k: int, base: str) -> str:
        return f"{q[f'funnel@{k}'] / q[f'{base}@{k}']:.2f}" if f"{base}@{k}" in q and f"funnel@{k}" in q else "–"

    def qps_cells(q: dict, k: int) -> str:
        return " | ".join(f"{q[f'{nm}@{k}']:,.0f}" if f"{nm}@{k}" in q else "–" for nm in names)

    for n in sizes:
        q = _get(results[n], "throughput", "qps", default={})
        for k in KS:
            L.append(f"| {int(n):,} | {k} | {qps_cells(q, k)} | {ratio(q, k, 'bm25s numba')} | "
                     f"{ratio(q, k, 'bm25s numba +tokenize')} | {ratio(q, k, 'pisa')} "
                     f"| {ratio(q, k, 'pisa (pyterrier frame)')} |")
    L += ["", "The same passes timed by the process's CPU time (best of the passes), which waiting for a "
          "core on the shared machine does not inflate:", "",
          "| docs | k | " + " | ".join(f"{nm} q/s (CPU)" for nm in names) + " | funnel / bm25s numba | funnel / PISA |",
          "|---:|---:|" + "---:|" * (len(names) + 2)]
    for n in sizes:
        q = _get(results[n], "throughput", "qps_cpu", default={})
        for k in KS:
            L.append(f"| {int(n):,} | {k} | {qps_cells(q, k)} | {ratio(q, k, 'bm25s numba')} | {ratio(q, k, 'pisa')} |")
    sira = [(n, k, q[f"funnel sira-prf@{k}"], q[f"funnel@{k}"]) for n in sizes
            for q in [_get(results[n], "throughput", "qps", default={})] for k in KS
            if f"funnel sira-prf@{k}" in q and f"funnel@{k}" in q]
    if sira:
        L += ["", "- SIRA with the offline prf proposer (`search_batch(mode=\"sira\", proposer=\"prf\")`, RM3 terms "
              "of the top BM25 documents, DF filter, one weighted BM25 call) in the same passes, as time per query "
              "against funnel's plain BM25 (the issue's target: at most 2×): "
              + "; ".join(f"{int(n):,} docs k={k}: {sq:,.0f} q/s, {bq / sq:.2f}× BM25's time"
                          for n, k, sq, bq in sira) + "."]
    cached = any(v.get("open_verify") == "cached" for n in sizes for v in results[n].get("serve", {}).values())
    how = ("its default verify=\"cached\": the manifest's checksum, every file's size, and the sha256 of every "
           "file not hashed at publish on this host or changed since" if cached else
           "verify=full (this run predates verify=\"cached\")")
    L += ["", "Serving: each system opened in a fresh process. Open = loading the index after imports "
          f"(funnel: `open_index` with {how}; then it memory-maps the shards; bm25s: `BM25.load`, arrays read "
          "into memory; PISA: `PisaIndex` + its retriever's context). First query = the first "
          "k=10 query after opening (funnel and bm25s load or compile numba code here). Latency = one "
          "query per call after a warm pass (funnel `search_batch` of one query; bm25s tokenize + "
          "retrieve; PISA its compiled retrieval of one query string), in wall time and in the thread's CPU "
          "time (which excludes waiting for a core). RSS = the serving process after "
          "answering every query twice at k=10 and k=100 (file = mapped index pages, anon = private). "
          "funnel's 'warm open' is a second `open_index(verify=\"sizes\")` in the same process "
          "(page cache warm, no checksums), and 'warm full' a third with verify=\"full\" (every sha256).", "",
          "| docs | system | import s | open s | first query ms | start→first answer s | p50 ms k=10 | p99 ms k=10 "
          "| p50 ms k=100 | p99 ms k=100 | CPU p50 / p99 ms k=10 | CPU p50 / p99 ms k=100 | RSS MiB (anon + file) "
          "| peak RSS MiB | warm open s | warm full s |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for n in sizes:
        for s, v in results[n]["serve"].items():
            if "failed" in v:
                L.append(f"| {int(n):,} | {s} | failed: {v['failed']} | | | | | | | | | | | | |")
                continue
            lat, st = v["latency"], v["status_end"]
            L.append(f"| {int(n):,} | {s} | {v['import_s']:.2f} | {v['open_s']:.2f} | {1000 * v['first_s']:.0f} "
                     f"| {v['start_to_first_s']:.2f} | {lat['10']['p50_ms']:.2f} | {lat['10']['p99_ms']:.2f} "
                     f"| {lat['100']['p50_ms']:.2f} | {lat['100']['p99_ms']:.2f} "
                     f"| {lat['10'].get('cpu_p50_ms', 0):.2f} / {lat['10'].get('cpu_p99_ms', 0):.2f} "
                     f"| {lat['100'].get('cpu_p50_ms', 0):.2f} / {lat['100'].get('cpu_p99_ms', 0):.2f} "
                     f"| {_mib(st['VmRSS'])} ({_mib(st.get('RssAnon'))} + {_mib(st.get('RssFile'))}) "
                     f"| {_mib(st['VmHWM'])} | {'%.2f' % v['warm_open_sizes_s'] if v.get('warm_open_sizes_s') else '–'} "
                     f"| {'%.2f' % v['warm_open_full_s'] if v.get('warm_open_full_s') else '–'} |")
    one = {n: results[n]["cli_one"] for n in sizes if results[n].get("cli_one")}
    if one:
        L += ["", "One query from the shell: `funnel search INDEX \"QUERY\" --k 10` as a whole process "
              "(interpreter start, imports, open, the query on the NumPy reference path, ten hits with their "
              "snippets printed), three runs right after the serving children above. Compare with each "
              "system's start→first answer in the table above, which is in-process (no interpreter start) and "
              "returns no document text.", "",
              "| docs | query | wall s (3 runs) | median s |", "|---:|---|---|---:|"]
        for n, c in one.items():
            if "failed" in c:
                L.append(f"| {int(n):,} | {c['query']} | failed: {c['failed'][:200]} | |")
            else:
                L.append(f"| {int(n):,} | {c['query']} | {' / '.join('%.2f' % x for x in c['wall_s'])} "
                         f"| {sorted(c['wall_s'])[len(c['wall_s']) // 2]:.2f} |")
    L += ["", "PISA: " + (pisa_why or "pyterrier-pisa " + _pkg_version("pyterrier-pisa") + " (PISA's C++ "
          "engine through its Python binding; no Java needed for indexing or retrieval). Indexed with "
          f"threads={os.cpu_count()} (funnel's build uses every core too), queried with threads=1."),
          "bm25s " + _pkg_version("bm25s") + ", numba " + _pkg_version("numba") + "."]
    if a.skip:
        L.append("Skipped by request: " + ", ".join(a.skip) + ".")
    L += ["", "Plots: `bench/plots/scale_build_time.png`, `bench/plots/scale_peak_rss.png`, "
          "`bench/plots/scale_qps.png`."]
    return "\n".join(L)


def _pkg_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "(not installed)"


def plot(results: dict, out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    sizes = sorted(results, key=int)
    colors = {"funnel": "C0", "bm25s": "C1", "pisa": "C2", "bm25s numba": "C1", "bm25s numba +tokenize": "C3",
              "pisa (pyterrier frame)": "C2"}
    paths = []

    def series(system, fn):
        xs, ys = [], []
        for n in sizes:
            b = results[n]["build"].get(system)
            if b and "failed" not in b:
                xs.append(int(n))
                ys.append(fn(b))
        return xs, ys

    for fname, title, ylabel, fn in (
            ("scale_build_time.png", "Build wall time", "seconds", lambda b: b["wall_s"]),
            ("scale_peak_rss.png", "Build peak RSS (process tree)", "GiB", lambda b: b["peak_tree_rss"] / GIB)):
        fig, ax = plt.subplots(figsize=(5, 3.4), dpi=100)
        for s in SYSTEMS:
            xs, ys = series(s, fn)
            if xs:
                ax.plot(xs, ys, "o-", color=colors[s], label=s)
        if fname == "scale_peak_rss.png":  # one process: the in-process build's driver, or the largest Ray worker
            xs, ys = series("funnel", lambda b: max(b["peak_other_rss"], b["peak_driver_rss"] if not b["peak_other_rss"]
                                                     else 0) / GIB)
            if xs:
                ax.plot(xs, ys, "o--", color=colors["funnel"], label="funnel, largest process")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        paths.append(os.path.join(out_dir, fname))
        fig.savefig(paths[-1])
        plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.6), dpi=100, sharey=True)
    names = sorted({key.rsplit("@", 1)[0] for n in sizes for key in _get(results[n], "throughput", "qps", default={})})
    for ax, k in zip(axes, KS):
        for nm in names:
            xs = [int(n) for n in sizes if f"{nm}@{k}" in _get(results[n], "throughput", "qps", default={})]
            ys = [results[str(n)]["throughput"]["qps"][f"{nm}@{k}"] for n in xs]
            if xs:
                ax.plot(xs, ys, "o-" if "(" not in nm else "o:", color=colors.get(nm, "C4"), label=nm)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents")
        ax.set_title(f"BM25 top-{k}, one thread")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("queries / s")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "scale_qps.png"))
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths


TITLE = "Scale: synthetic 100K-3M documents, build and BM25 queries vs bm25s and PISA (bench/bench_scale.py)"


SUPPLEMENT = "### Supplementary run, separate from the tables above"


def carried_runs(recorded: tuple[str, str] | None, rendered_command: str | None = None) -> str:
    """The runs of the recorded scale section (``results.recorded_section``), as supplements
    to append under a new run: its main run first (under its own command and date, its
    ``###`` headings one level down, without the plots line: the new run redraws them),
    then the supplements it already carried. So ``--write`` adds a run to the record
    instead of dropping the earlier ones; "" when nothing is recorded. The main run is left
    out when its command is ``rendered_command`` (``--from-results`` re-rendering it)."""
    if recorded is None:
        return ""
    stamp, body = recorded
    i = body.find("\n" + SUPPLEMENT)
    main, older = (body, "") if i < 0 else (body[:i], body[i:])
    cmd = re.search(r"Command: (`[^`]+`)", main)
    j = main.find("### Build")
    if cmd is None or j < 0 or cmd.group(1) == f"`{rendered_command}`":
        return older.rstrip()  # not a run this script rendered, or the run being re-rendered
    tables = "\n".join(line for line in main[j:].splitlines()
                       if not line.startswith(("Plots:", "Rendered from")))
    tables = re.sub(r"^### ", "#### ", tables, flags=re.M).strip()
    return (f"\n\n{SUPPLEMENT}\n\nCommand: {cmd.group(1)} (its own run, measured {stamp}: compare its "
            f"figures with each other, not with the run above).\n\n{tables}" + older.rstrip())


def main(argv=None):
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child":
        CHILDREN[sys.argv[2]](json.loads(sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[3:]))
    p.add_argument("--sizes", default="100k,1m", help="corpus sizes, comma-separated (default %(default)s)")
    p.add_argument("--shards", type=int, default=None, help="funnel --shards (default: funnel's auto choice)")
    p.add_argument("--shard-mib", type=int, default=None, help="funnel --shard-mib (default: funnel's 256 MiB)")
    p.add_argument("--engine", default="auto", choices=["auto", "local", "ray"], help="funnel --engine")
    p.add_argument("--queries", type=int, default=1000, help="queries per pass (default %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="throughput passes, best kept (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sira", action="store_true",
                   help="also time funnel's SIRA (offline prf proposer) in the throughput passes (default: off)")
    p.add_argument("--skip", default="", help="systems to leave out, comma-separated (funnel, bm25s, pisa)")
    p.add_argument("--min-avail-gib", type=float, default=4.0,
                   help="kill a build or query child if MemAvailable drops below this (default %(default)s)")
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"), help="corpus cache (default %(default)s)")
    p.add_argument("--work", default=os.path.join(".funnel", "scale"),
                   help="indexes, logs and results.json (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the indexes (default: delete each after its size)")
    p.add_argument("--plots", default=os.path.join(HERE, "plots"), help="PNG folder (default bench/plots)")
    p.add_argument("--write", action="store_true",
                   help="record the 'scale' section of bench/RESULTS.md (the runs recorded there are kept "
                        "below it as supplements)")
    p.add_argument("--from-results", metavar="JSON", default=None,
                   help="run nothing: print (and with --write record) the tables and plots of a saved "
                        "results.json, under the command that measured it")
    p.add_argument("--supplement", metavar="JSON", action="append", default=[],
                   help="with --from-results: the tables of another saved run, appended under its own command "
                        "(not merged: its figures are from a different run)")
    a = p.parse_args(argv)
    if a.from_results:
        import shlex
        with open(a.from_results) as f:
            saved = json.load(f)
        run_args = p.parse_args(shlex.split(saved["command"])[2:])
        run_args.skip = [s for s in run_args.skip.split(",") if s]
        pisa_why = saved.get("pisa_why")
        paths = plot(saved["results"], a.plots)
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(a.from_results)))
        body = render(saved["results"], run_args, pisa_why, saved["command"])
        for path in a.supplement:
            with open(path) as f:
                sup = json.load(f)
            sup_args = p.parse_args(shlex.split(sup["command"])[2:])
            sup_args.skip = [s for s in sup_args.skip.split(",") if s]
            text = render(sup["results"], sup_args, sup.get("pisa_why"), sup["command"])
            tables = [line for line in text.splitlines() if line.startswith(("|", "- ")) or not line.strip()]
            body += (f"\n\n{SUPPLEMENT}\n\nCommand: `{sup['command']}` "
                     "(its own run: compare its figures with each other, not with the run above).\n\n" +
                     re.sub(r"\n{3,}", "\n\n", "\n".join(tables)).strip())
        # What the record already carries stays below (the re-rendered run itself once).
        carried = carried_runs(recorded_section("scale"), saved["command"]) if a.write else ""
        report("scale", TITLE, body + f"\n\nRendered from {a.from_results}, the results of that run (last written "
               f"{stamp})." + ("\n\n" + carried.lstrip("\n") if carried else ""), a.write)
        print("plots: " + ", ".join(paths))
        return
    a.skip = [s for s in a.skip.split(",") if s]
    bad = set(a.skip) - set(SYSTEMS)
    if bad:
        p.error(f"--skip {','.join(sorted(bad))}: choose from {', '.join(SYSTEMS)}")
    sizes = [parse_count(s) for s in a.sizes.split(",")]
    command = ".venv/bin/python bench/bench_scale.py " + " ".join(sys.argv[1:] if argv is None else argv)
    pisa_why = None if "pisa" in a.skip else pisa_available()
    if pisa_why:
        print(f"PISA left out: {pisa_why}", file=sys.stderr)
    os.makedirs(a.work, exist_ok=True)
    results = {}
    for n in sizes:
        results[str(n)] = run_size(n, a, pisa_why)
        with open(os.path.join(a.work, "results.json"), "w") as f:
            json.dump({"command": command, "pisa_why": pisa_why, "results": results}, f, indent=1)
    paths = plot(results, a.plots)
    carried = carried_runs(recorded_section("scale")) if a.write else ""
    report("scale", TITLE, render(results, a, pisa_why, command) + carried, a.write)
    print("plots: " + ", ".join(paths))


if __name__ == "__main__":
    main()
