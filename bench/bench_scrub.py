"""Scrub benchmark: what the background scrub (``serving/frontends/scrub.py``) and the open-time
structure checks (``serving/structure.py``) cost on a synthetic index.

    .venv/bin/python bench/bench_scrub.py [--docs 1m] [--rate 8] [--synth .funnel/synth]
                                          [--work .funnel/bench-scrub] [--repeats 5] [--write]

1. The corpus is ``bench/synth.py``'s (seed 0), cached under ``--synth`` as the other scale
   benchmarks cache it; the index is built once with ``funnel build`` (the CLI, default
   engine and shards) under ``--work`` and reused while its manifest matches the corpus.
2. Open cost: ``IndexVersion(root)`` (``verify="cached"``, page cache warm, records of
   every file present, so nothing is hashed) with the structure checks and with them
   replaced by no-ops, interleaved, best of ``--repeats``; and the checks alone.
3. A full scrub pass unpaced (as fast as sha256 and the page cache allow), then one at
   ``--rate`` MiB/s (default: the servers' default): wall time, the scrub thread's CPU
   time, and its share of one core over the pass.

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
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(__file__))
from results import report  # noqa: E402
from synth import ensure, parse_count  # noqa: E402


def label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def build(corpus: str, root: str, n_docs: int) -> float | None:
    """``funnel build`` of ``corpus`` into ``root`` unless it already holds it; the seconds taken, or None."""
    try:
        with open(os.path.join(root, "CURRENT")) as f:
            with open(os.path.join(root, f.read().strip(), "manifest.json")) as g:
                if json.load(g)["collection"]["n_docs"] == n_docs:
                    return None
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(root, ignore_errors=True)
    cmd = [sys.executable, "-m", "funnel.serving.frontends.cli", "build", "--corpus", os.path.join(corpus, "corpus.jsonl"),
           "--out", root, "--progress-seconds", "30"]
    print("building:", " ".join(cmd), file=sys.stderr)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    return time.perf_counter() - t


def index_bytes(vdir: str) -> tuple[int, int]:
    """(files, bytes) the manifest lists."""
    from funnel.pipelines.store.artifacts import load_manifest
    files = load_manifest(vdir)["files"]
    return len(files), sum(m["size"] for m in files.values())


def open_cost(root: str, repeats: int) -> dict:
    """Best-of-``repeats`` seconds of a cached open with and without the structure checks."""
    import funnel.serving.index as index_mod
    from funnel.serving.index import IndexVersion
    from funnel.serving import structure

    IndexVersion(root, verify="full").close()  # records for every file; the page cache warm
    real = (index_mod.check_shard, index_mod.check_doc_ids)
    checks_s: list[float] = []

    def timed(fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            fn(*a, **kw)
            checks_s.append(time.perf_counter() - t)
        return wrapper

    best = {"with": float("inf"), "without": float("inf")}
    only = float("inf")
    for _ in range(repeats):
        for mode in ("without", "with"):
            if mode == "with":
                index_mod.check_shard, index_mod.check_doc_ids = timed(structure.check_shard), \
                    timed(structure.check_doc_ids)
            else:
                index_mod.check_shard = index_mod.check_doc_ids = lambda *a, **kw: None
            checks_s.clear()
            t = time.perf_counter()
            IndexVersion(root).close()
            best[mode] = min(best[mode], time.perf_counter() - t)
            if mode == "with":
                only = min(only, sum(checks_s))
    index_mod.check_shard, index_mod.check_doc_ids = real
    return {"open_with_s": best["with"], "open_without_s": best["without"], "checks_s": only}


def scrub_pass(root: str, rate: float) -> dict:
    """One full pass at ``rate`` MiB/s over the version CURRENT names."""
    from funnel.serving.frontends.scrub import Scrubber
    from funnel.serving.search import Searcher
    with Searcher(root) as s:
        res = Scrubber(s.follower, rate_mb_s=rate).run_once()
    assert res.complete and res.damaged is None, res
    return {"rate": rate, "seconds": res.seconds, "cpu_s": res.cpu_seconds, "bytes": res.bytes, "files": res.files}


def render(a, n_docs: int, files: int, size: int, build_s: float | None, opened: dict, fast: dict,
           paced: dict, command: str) -> str:
    mib = size / 2 ** 20
    lines = [
        f"`{command}` on {platform.node()} ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end). "
        f"Index: `bench/synth.py` seed 0, {n_docs:,} documents, built with `funnel build` (default engine and "
        f"shards){'' if build_s is None else f' in {build_s:.0f} s'}; {files} files, {mib:,.0f} MiB. "
        "Page cache warm (the scrub reads through it, as the server does).",
        "",
        "| what | wall s | CPU s | CPU share of one core | read MiB/s |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = (("full pass, unpaced (as fast as it goes)", fast),
            (f"full pass at {paced['rate']:g} MiB/s (the default)", paced))
    for name, r in rows:
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['cpu_s']:.1f} | {100 * r['cpu_s'] / r['seconds']:.1f}% | "
                     f"{r['bytes'] / 2 ** 20 / r['seconds']:,.0f} |")
    lines += [
        "",
        f"At the default rate a pass over this index takes {paced['seconds'] / 60:.1f} min; with the default "
        f"interval (6 h from the end of one pass to the start of the next) every file is re-hashed about "
        f"{24 * 3600 / (6 * 3600 + paced['seconds']):.1f} times a day.",
        "",
        f"Open-time structure checks (`serving/structure.py`), `IndexVersion(root)` with `verify=\"cached\"` "
        f"(nothing hashed), best of {a.repeats} interleaved: {opened['open_without_s'] * 1000:.0f} ms without the "
        f"checks, {opened['open_with_s'] * 1000:.0f} ms with them; the checks alone {opened['checks_s'] * 1000:.0f} ms "
        f"({100 * opened['checks_s'] / opened['open_with_s']:.0f}% of the open).",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=parse_count, default=1_000_000, help="documents (default 1m)")
    p.add_argument("--rate", type=float, default=None, help="MiB/s of the paced pass (default: the servers')")
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"), help="synthetic corpus cache")
    p.add_argument("--work", default=os.path.join(".funnel", "bench-scrub"), help="where the index is built")
    p.add_argument("--repeats", type=int, default=5, help="opens per variant (default %(default)s)")
    p.add_argument("--write", action="store_true", help="record this run's section in bench/RESULTS.md")
    a = p.parse_args(argv)
    from funnel.serving.frontends.scrub import DEFAULT_RATE_MB_S
    rate = a.rate or DEFAULT_RATE_MB_S
    name = label(a.docs)
    corpus = os.path.join(a.synth, name)
    root = os.path.join(a.work, f"index-{name}")
    meta = ensure(a.docs, corpus)
    build_s = build(corpus, root, meta["n_docs"])
    with open(os.path.join(root, "CURRENT")) as f:
        files, size = index_bytes(os.path.join(root, f.read().strip()))
    opened = open_cost(root, a.repeats)
    print(f"open: {opened}", file=sys.stderr)
    fast = scrub_pass(root, 1e9)
    print(f"unpaced pass: {fast}", file=sys.stderr)
    paced = scrub_pass(root, rate)
    print(f"paced pass: {paced}", file=sys.stderr)
    command = ".venv/bin/python bench/bench_scrub.py" + "".join(
        " " + x for x in (sys.argv[1:] if argv is None else argv))
    report("scrub", f"Background scrub and open-time structure checks at {name} documents (bench/bench_scrub.py)",
           render(a, meta["n_docs"], files, size, build_s, opened, fast, paced, command), a.write)


if __name__ == "__main__":
    main()
