"""Build benchmark: wall time of a BM25 index build, funnel's local engine vs its Ray engine vs bm25s.

    .venv/bin/python bench/bench_build.py [--datasets scifact,nfcorpus] [--repeats 3] [--data DIR] [--write]

Per dataset, in one run, interleaved, best of ``--repeats``:

- ``funnel build --engine local`` and ``--engine ray`` as a user runs them: a fresh process
  each (``python -m funnel.serving.frontends.cli build``), so the Ray figure includes starting a local
  Ray and the local one the same interpreter and imports; the shard count is the auto one
  (1 for these corpora) on both, and RAY_ADDRESS is unset.
- funnel's local engine in this process (``build(..., engine="local")``), to set against
- bm25s at its best, in this process: PyStemmer (C) stemming of each distinct word, English
  stopwords, ``method="lucene"``; "index" is tokenize + index (what bm25s's own benchmark
  times), "end to end" adds reading corpus.jsonl and ``save()``, as a funnel build reads
  the corpus and writes its index.

Also the peak RSS of each build's process tree (sampled from /proc every 50 ms; on Ray
it includes the raylet, GCS and workers; shared pages count once per process) and the throughput in corpus MB per second of the local engine,
which set ``RAY_FIXED_SECONDS`` and ``LOCAL_BYTES_PER_SECOND`` in jobs/build_index.py.
Prints its section of bench/RESULTS.md; ``--write`` records it there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

SYSTEMS = ("funnel local (CLI)", "funnel ray (CLI)", "funnel local (in-process)", "bm25s index", "bm25s end to end")


_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and all its descendants (Ray's raylet, GCS and workers), from /proc."""
    parent, rss = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/statm") as f:
                rss[int(name)] = int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def cli_build(ddir: str, out: str, engine: str) -> tuple[float, float, dict]:
    """(wall seconds, peak RSS MiB of its process tree, the manifest's build section) of one `funnel build`."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", ddir, "--out", out,
           "--engine", engine, "--progress-seconds", "0"]
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"error: {' '.join(cmd)} failed:\n{err.read()[-3000:]}")
    cur = open(os.path.join(out, "CURRENT")).read().strip()
    build = json.load(open(os.path.join(out, cur, "manifest.json")))["build"]
    return wall, peak / (1 << 20), build


def inprocess_build(ddir: str, out: str) -> float:
    from funnel.jobs.build_index import build
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    build(ddir, out, engine="local", progress_seconds=0)
    return time.perf_counter() - t


def bm25s_build(ddir: str, out: str) -> tuple[float, float]:
    """(tokenize + index seconds, read + tokenize + index + save seconds)."""
    import bm25s
    import Stemmer
    stem = Stemmer.Stemmer("porter")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    docs = [json.loads(line) for line in open(os.path.join(ddir, "corpus.jsonl"))]
    texts = [d.get("title", "") + " " + d["text"] for d in docs]
    t1 = time.perf_counter()
    toks = bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False)
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    model.index(toks, show_progress=False)
    t2 = time.perf_counter()
    model.save(out)
    return t2 - t1, time.perf_counter() - t0


def fmt_s(x: float) -> str:
    return f"{x:.2f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--datasets", default="scifact,nfcorpus", help="comma-separated (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="builds per system, best kept (default %(default)s)")
    add_common_arguments(p)
    a = p.parse_args(argv)
    dirs = {ds: dataset_dir(a.data, ds) for ds in a.datasets.split(",")}
    import logging
    logging.basicConfig(level=logging.WARNING)
    best: dict = {}
    facts: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):  # interleaved: every system sees the same machine state
            for ds, ddir in dirs.items():
                for engine in ("local", "ray"):
                    wall, rss, info = cli_build(ddir, os.path.join(tmp, f"{ds}-{engine}"), engine)
                    key = (ds, f"funnel {engine} (CLI)")
                    best[key] = min(best.get(key, float("inf")), wall)
                    f = facts.setdefault(ds, {})
                    f[f"{engine}_rss"] = max(f.get(f"{engine}_rss", 0), rss)
                    f[f"{engine}_build"] = info
                    print(f"[{r + 1}/{a.repeats}] {ds} funnel {engine} (CLI): {wall:.2f}s", file=sys.stderr)
                t = inprocess_build(ddir, os.path.join(tmp, f"{ds}-inproc"))
                best[(ds, "funnel local (in-process)")] = min(best.get((ds, "funnel local (in-process)"), 1e9), t)
                idx, e2e = bm25s_build(ddir, os.path.join(tmp, f"{ds}-bm25s"))
                best[(ds, "bm25s index")] = min(best.get((ds, "bm25s index"), 1e9), idx)
                best[(ds, "bm25s end to end")] = min(best.get((ds, "bm25s end to end"), 1e9), e2e)
                print(f"[{r + 1}/{a.repeats}] {ds} in-process {t:.2f}s, bm25s {idx:.2f}s / {e2e:.2f}s", file=sys.stderr)

    rows = ["| dataset | docs | corpus MB | " + " | ".join(SYSTEMS) + " | ray / local (CLI) | local / bm25s e2e "
            "(in-process) | local / bm25s index (in-process) | local engine MB/s |",
            "|---|---:|---:|" + "---:|" * (len(SYSTEMS) + 4)]
    for ds, ddir in dirs.items():
        info = facts[ds]["local_build"]
        mb = info["engine"]["corpus_bytes"] / 1e6
        n_docs = sum(1 for _ in open(os.path.join(ddir, "corpus.jsonl")))
        b = {s: best[(ds, s)] for s in SYSTEMS}
        rows.append(f"| {ds} | {n_docs:,} | {mb:.1f} | " + " | ".join(fmt_s(b[s]) for s in SYSTEMS)
                    + f" | {b['funnel ray (CLI)'] / b['funnel local (CLI)']:.2f}x"
                    + f" | {b['funnel local (in-process)'] / b['bm25s end to end']:.2f}x"
                    + f" | {b['funnel local (in-process)'] / b['bm25s index']:.2f}x"
                    + f" | {mb / b['funnel local (in-process)']:.2f} |")
    mem = ["| dataset | peak RSS, funnel local (CLI) | peak RSS, funnel ray (CLI; driver, raylet, GCS, workers) | "
           "shards (auto) | engine auto picks |", "|---|---:|---:|---:|---|"]
    for ds in dirs:
        info = facts[ds]["local_build"]
        from funnel.jobs.build_index import choose_engine
        auto, why = choose_engine("auto", info["engine"]["corpus_bytes"], info["shards"]["n"])
        mem.append(f"| {ds} | {facts[ds]['local_rss']:.0f} MiB | {facts[ds]['ray_rss']:.0f} MiB | "
                   f"{info['shards']['n']} | {auto}: {why} |")
    ray_fixed = [best[(ds, "funnel ray (CLI)")] - best[(ds, "funnel local (CLI)")] for ds in dirs]
    body = "\n".join([
        "Seconds of wall time, best of "
        f"{a.repeats}, one run, interleaved; {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. Command: `.venv/bin/python bench/bench_build.py "
        f"--datasets {a.datasets} --repeats {a.repeats}`.", "",
        "CLI rows are whole `funnel build` processes (interpreter, imports, and for ray a new local Ray). "
        "In-process rows time the build call alone; bm25s \"index\" is tokenize + index, \"end to end\" adds "
        "reading corpus.jsonl and save(). Ratios above 1 mean the left one is slower.", "",
        *rows, "", *mem, "",
        f"Ray's fixed cost on this machine (ray CLI − local CLI, 1 shard each): "
        + ", ".join(f"{ds} {x:.1f}s" for ds, x in zip(dirs, ray_fixed)) + ".",
    ])
    report("build", "Build: funnel local engine vs Ray engine vs bm25s (bench/bench_build.py)", body, a.write)


if __name__ == "__main__":
    main()
