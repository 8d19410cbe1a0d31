"""Build peak memory: funnel's local engine, funnel's default (auto) engine and PISA, one run.

    .venv/bin/python bench/bench_build_memory.py [--sizes 1m[,3m]] [--engines local,auto] [--synth DIR] [--write]
    .venv/bin/python bench/bench_build_memory.py --from-results WORK/results.json --write   # record a saved run

Per size, on ``bench/synth.py``'s corpus (seed 0, cached under ``--synth``/SIZE), one after
the other, each a fresh child process measured from outside by ``bench_scale.measure``
(wall, CPU of the whole process tree, tree RSS and PSS summed over the child and all its
descendants every 0.2 s, each process's peak):

- ``funnel build --engine ENGINE`` (the CLI as a user runs it) for each of ``--engines``:
  ``auto`` is what a user gets without ``--engine`` (Ray above 256 MiB of corpus);
- PISA through pyterrier-pisa, as ``bench/bench_scale.py`` builds it (its index, then the
  compressed block-max BM25 index it writes on first use), with every core.

Prints a table with each build's peak tree RSS and PSS, its largest single process, and
funnel ÷ PISA per engine (issue 50's target: peak RSS at most 1.5x PISA's at 1M and 3M), and
``--write`` records the "build-memory-SIZES" section of bench/RESULTS.md (one per set of sizes). Logs, ``.mem.tsv``
timelines and ``.procs.tsv`` per-process peaks stay under ``--work``/SIZE/ENGINE; the
indexes are deleted after each size unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_scale  # noqa: E402
from results import report  # noqa: E402
from synth import ensure, parse_count  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
TITLE = "Build peak memory: funnel local and default engines vs PISA (bench/bench_build_memory.py)"


def _peak_at(log: str) -> float | None:
    """Seconds into the build at which the tree's RSS peaked (from the ``.mem.tsv`` timeline)."""
    try:
        with open(log + ".mem.tsv") as f:
            rows = [line.split("\t") for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    return float(max(rows, key=lambda r: float(r[1]))[0]) if rows else None


def run_size(n: int, a) -> dict:
    lab = bench_scale.label(n)
    corpus = os.path.join(a.synth, lab)
    meta = ensure(n, corpus, seed=a.seed)
    print(f"[{lab}] corpus {corpus}: {meta['n_docs']:,} docs, {meta['corpus_bytes'] / MIB:,.0f} MiB", flush=True)
    min_avail = int(a.min_avail_gib * GIB)
    res = {"n_docs": n, "corpus_bytes": meta["corpus_bytes"], "builds": {}}
    for engine in a.engines:
        work = os.path.join(a.work, lab, f"funnel-{engine}")
        os.makedirs(work, exist_ok=True)
        b = bench_scale.funnel_build(corpus, os.path.join(work, "index"), engine, a.shards, work, min_avail)
        res["builds"][f"funnel {engine}"] = b
        _say(lab, f"funnel {engine}", b)
        if not a.keep:
            shutil.rmtree(os.path.join(work, "index"), ignore_errors=True)
    if not a.skip_pisa:
        why = bench_scale.pisa_available()
        if why:
            res["builds"]["pisa"] = {"failed": why}
            print(f"[{lab}] PISA left out: {why}", file=sys.stderr)
        else:
            work = os.path.join(a.work, lab, "pisa")
            os.makedirs(work, exist_ok=True)
            b = bench_scale.run_child("pisa-build", {"corpus": corpus, "out": os.path.join(work, "index"),
                                                     "threads": os.cpu_count()}, work, min_avail)
            res["builds"]["pisa"] = b
            _say(lab, "pisa", b)
            if not a.keep:
                shutil.rmtree(os.path.join(work, "index"), ignore_errors=True)
    return res


def _say(lab: str, name: str, b: dict) -> None:
    if "failed" in b:
        print(f"[{lab}] {name}: failed ({b['failed']})", flush=True)
        return
    b["peak_at_s"] = _peak_at(b["log"])
    print(f"[{lab}] {name}: {b['wall_s']:.1f}s wall, {b['cpu_s']:.1f}s CPU, peak tree RSS "
          f"{b['peak_tree_rss'] / MIB:,.0f} MiB (PSS {b['peak_tree_pss'] / MIB:,.0f}) at {b['peak_at_s']}s, "
          f"largest process {max(b['peak_driver_rss'], b['peak_other_rss']) / MIB:,.0f} MiB", flush=True)


def render(results: dict, command: str) -> str:
    L = [f"Machine: {platform.machine()}, {os.cpu_count()} cores, "
         f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GIB:.0f} GiB RAM, shared with other jobs. "
         f"Command: `{command}`. All figures below come from this one run, the builds one after the other.",
         "",
         "Each build is a fresh child process measured from outside (`bench_scale.measure`): peak RSS and PSS "
         "are sums over the whole process tree (driver, Ray's GCS, raylet and workers) sampled every 0.2 s; PSS "
         "divides shared pages (Ray's object store) among the processes that map them. 'largest process' is "
         "the largest single process's peak RSS (for Ray, a shard worker). 'peak at' is when the tree's RSS "
         "peaked, in seconds from the start. Corpus: `bench/synth.py`, seed 0.", "",
         "| docs | corpus MiB | build | wall s | CPU s | peak tree RSS MiB | peak tree PSS MiB | largest process MiB "
         "| peak at s | RSS ÷ PISA | PSS ÷ PISA | stages (s) |",
         "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for n in sorted(results, key=int):
        r = results[n]
        pisa = r["builds"].get("pisa", {})
        for name, b in r["builds"].items():
            if "failed" in b:
                L.append(f"| {int(n):,} | {r['corpus_bytes'] / MIB:,.0f} | {name} | failed: {b['failed']} |"
                         + " |" * 8)
                continue
            ok = "failed" not in pisa and pisa.get("peak_tree_rss")
            rss_x = f"{b['peak_tree_rss'] / pisa['peak_tree_rss']:.2f}" if ok else "–"
            pss_x = f"{b['peak_tree_pss'] / pisa['peak_tree_pss']:.2f}" if ok else "–"
            stages = b.get("stages") or {}
            L.append(f"| {int(n):,} | {r['corpus_bytes'] / MIB:,.0f} | {name} | {b['wall_s']:.1f} | {b['cpu_s']:.1f} "
                     f"| {b['peak_tree_rss'] / MIB:,.0f} | {b['peak_tree_pss'] / MIB:,.0f} "
                     f"| {max(b['peak_driver_rss'], b['peak_other_rss']) / MIB:,.0f} | {b.get('peak_at_s')} "
                     f"| {rss_x} | {pss_x} | {json.dumps(stages).replace('|', '/')} |")
        for name, b in r["builds"].items():
            if "build" in b:
                e, sh = b["build"]["engine"], b["build"]["shards"]
                L.append(f"- {int(n):,} docs, {name}: engine **{e['name']}** ({e['reason']}); {sh['n']} shard(s).")
    return "\n".join(L)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[3:]))
    p.add_argument("--sizes", default="1m", help="corpus sizes, comma-separated (default %(default)s)")
    p.add_argument("--engines", default="local,auto",
                   help="funnel --engine values to build with, in order (default %(default)s; auto = no --engine)")
    p.add_argument("--shards", type=int, default=None, help="funnel --shards (default: its auto choice)")
    p.add_argument("--skip-pisa", action="store_true", help="leave PISA out (no ratios then)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-avail-gib", type=float, default=3.0,
                   help="kill a build if MemAvailable drops below this (default %(default)s)")
    p.add_argument("--synth", default=os.path.join(".funnel", "synth"), help="corpus cache (default %(default)s)")
    p.add_argument("--work", default=os.path.join(".funnel", "build-memory"),
                   help="logs, timelines, results.json (default %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the indexes")
    p.add_argument("--write", action="store_true", help="record the 'build-memory-SIZES' section of bench/RESULTS.md")
    p.add_argument("--from-results", metavar="JSON", default=None,
                   help="run nothing: print (and with --write record) a saved results.json under its own command")
    p.add_argument("--supplement", metavar="JSON=LABEL", action="append", default=[],
                   help="with --from-results: another saved run's table, appended under its own command and "
                        "LABEL (say what differs, e.g. the code it ran), not merged with the main run")
    a = p.parse_args(argv)
    if a.from_results:
        with open(a.from_results) as f:
            saved = json.load(f)
        body = render(saved["results"], saved["command"])
        for item in a.supplement:
            path, _, label = item.partition("=")
            with open(path) as f:
                sup = json.load(f)
            rows = [line for line in render(sup["results"], sup["command"]).splitlines()
                    if line.startswith(("|", "- "))]
            body += (f"\n\n### Supplementary run: {label}\n\nCommand: `{sup['command']}` (its own run: compare "
                     "its figures with each other, and with the run above only as before/after).\n\n" + "\n".join(rows))
        _report(saved["results"], saved["command"], a.write, body)
        return
    a.engines = [e for e in a.engines.split(",") if e]
    bad = [e for e in a.engines if e not in ("auto", "local", "ray")]
    if bad:
        p.error(f"--engines {','.join(bad)}: choose from auto, local, ray")
    command = ".venv/bin/python bench/bench_build_memory.py " + " ".join(sys.argv[1:] if argv is None else argv)
    os.makedirs(a.work, exist_ok=True)
    results = {}
    t = time.time()
    for n in [parse_count(s) for s in a.sizes.split(",")]:
        results[str(n)] = run_size(n, a)
        with open(os.path.join(a.work, "results.json"), "w") as f:
            json.dump({"command": command, "results": results}, f, indent=1)
    print(f"({time.time() - t:.0f}s)")
    _report(results, command, a.write)


def _report(results: dict, command: str, write: bool, body: str | None = None) -> None:
    sizes = ",".join(bench_scale.label(int(n)) for n in results)
    report(f"build-memory-{sizes}", f"{TITLE}, {sizes.replace(',', ' and ')} documents",
           body if body is not None else render(results, command), write)


if __name__ == "__main__":
    main()
