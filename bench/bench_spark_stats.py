"""Spark statistics benchmark: jobs/spark_stats.py vs the funnel build's DF stage, and equality of the tables.

    .venv/bin/python bench/bench_spark_stats.py [--dataset scifact] [--engines local,ray] [--master local[*]]
                                                [--repeats 1] [--data DIR] [--write]

In one run, interleaved, best of ``--repeats``, on one BEIR corpus:

- ``python -m funnel.jobs.build_index --engine local`` (and ``--engine ray``) as a user
  runs them: a fresh process each; from its manifest the build's "DF stage", i.e. the
  stages that produce ``stats.duckdb`` (``read_analyze_shard``: read, validate, analyze,
  per-shard terms, which also writes postings and docs; plus ``df_reduce``), and the
  whole build's wall time;
- ``python jobs/spark_stats.py`` as a user runs it: a fresh process (JVM and Spark session
  start included), its wall time and its stage times;
- the Spark job in this process on an already running session (what a Spark lake's
  long-lived session pays): the statistics stage alone;

plus the peak RSS of each process tree (sampled from /proc every 50 ms; the JVM included)
and the equality of the build's and Spark's ``stats.duckdb``: every term's df and cf, the
collection row and the per-shard rows. Prints its section of bench/RESULTS.md; ``--write``
records it there.
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

sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and all its descendants (JVM, Python workers, raylet...), from /proc."""
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


def run_process(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB of the process tree, stdout) of one command; exits on failure."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True, cwd=REPO)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"error: {' '.join(cmd)} failed:\n{err.read()[-3000:]}")
        out.seek(0)
        return wall, peak / (1 << 20), out.read()


def cli_build(ddir: str, out: str, engine: str) -> tuple[float, float, dict, str]:
    """(wall s, peak RSS MiB, manifest build section, stats.duckdb path) of one build process."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    shutil.rmtree(out, ignore_errors=True)
    wall, rss, _ = run_process([sys.executable, "-m", "funnel.jobs.build_index", "--corpus", ddir, "--out", out,
                                "--engine", engine, "--progress-seconds", "0"], env)
    cur = open(os.path.join(out, "CURRENT")).read().strip()
    build = json.load(open(os.path.join(out, cur, "manifest.json")))["build"]
    return wall, rss, build, os.path.join(out, cur, "stats.duckdb")


def cli_spark(ddir: str, out: str, master: str) -> tuple[float, float, dict]:
    """(wall s, peak RSS MiB, the job's report) of one ``jobs/spark_stats.py`` process."""
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    wall, rss, stdout = run_process([sys.executable, os.path.join(REPO, "jobs", "spark_stats.py"), "--corpus",
                                     ddir, "--out", out, "--master", master, "--json"], env)
    return wall, rss, json.loads(stdout.strip().splitlines()[-1])


def tables(db: str) -> dict:
    import duckdb
    con = duckdb.connect(db, read_only=True)
    try:
        return {"terms": con.execute("SELECT term, df, cf FROM terms ORDER BY term").fetchall(),
                "collection": con.execute("SELECT * FROM collection").fetchall(),
                "shards": con.execute("SELECT * FROM shards ORDER BY shard").fetchall()}
    finally:
        con.close()


def compare(ref: dict, other: dict) -> dict:
    """Counts of terms, term rows that differ (df or cf, or a term on one side only), and table equality."""
    a, b = dict((t, (d, c)) for t, d, c in ref["terms"]), dict((t, (d, c)) for t, d, c in other["terms"])
    differ = sum(1 for t in a.keys() | b.keys() if a.get(t) != b.get(t))
    return {"terms": len(a), "terms_other": len(b), "differ": differ,
            "collection": ref["collection"] == other["collection"], "shards": ref["shards"] == other["shards"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--dataset", default="scifact", help="BEIR dataset under --data (default %(default)s)")
    p.add_argument("--engines", default="local,ray",
                   help="funnel build engines to compare with, comma-separated (default %(default)s)")
    p.add_argument("--master", default="local[*]", help="Spark master (default %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="runs per system, best kept (default %(default)s)")
    add_common_arguments(p)
    a = p.parse_args(argv)
    ddir = dataset_dir(a.data, a.dataset)
    engines = [e for e in a.engines.split(",") if e]
    import logging
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from funnel.jobs.spark_stats import _session, compute_stats

    best: dict[str, dict] = {}

    def keep(name: str, wall: float, **facts) -> None:
        if name not in best or wall < best[name]["wall"]:
            best[name] = {"wall": wall, **facts}

    with tempfile.TemporaryDirectory() as tmp:
        dbs: dict[str, str] = {}
        for r in range(a.repeats):  # interleaved: every system sees the same machine state
            for engine in engines:
                wall, rss, info, db = cli_build(ddir, os.path.join(tmp, f"build-{engine}-{r}"), engine)
                st = info["stages"]
                keep(f"funnel build --engine {engine} (process)", wall, rss=rss,
                     df=st["read_analyze_shard"] + st["df_reduce"], stages=st, build_s=info["seconds"])
                dbs.setdefault(f"build-{engine}", db)
                print(f"[{r + 1}/{a.repeats}] build {engine}: {wall:.2f}s, DF stage "
                      f"{st['read_analyze_shard'] + st['df_reduce']:.2f}s", file=sys.stderr)
            out = os.path.join(tmp, f"spark-cli-{r}.duckdb")
            wall, rss, rep = cli_spark(ddir, out, a.master)
            st = rep["stage_seconds"]
            keep("jobs/spark_stats.py (process)", wall, rss=rss, df=st["read_analyze_df"] + st["duckdb_write"],
                 stages=st, partitions=rep["partitions"], chunks=rep["chunks"])
            dbs.setdefault("spark-cli", out)
            print(f"[{r + 1}/{a.repeats}] spark process: {wall:.2f}s, stages {st}", file=sys.stderr)

        spark, created = _session(a.master)
        try:
            cores = spark.sparkContext.defaultParallelism
            compute_stats(ddir, os.path.join(tmp, "warmup.duckdb"), spark=spark)  # Python workers, JIT
            for r in range(a.repeats):
                out = os.path.join(tmp, f"spark-warm-{r}.duckdb")
                t = time.perf_counter()
                rep = compute_stats(ddir, out, spark=spark)
                wall = time.perf_counter() - t
                keep("Spark job on a running session (in-process)", wall, rss=None,
                     df=wall, stages=rep.stage_seconds)
                dbs.setdefault("spark-warm", out)
                print(f"[{r + 1}/{a.repeats}] spark warm session: {wall:.2f}s", file=sys.stderr)
        finally:
            if created:
                spark.stop()

        ref_name = f"build-{engines[0]}" if engines else "spark-cli"
        ref = tables(dbs[ref_name])
        checks = {name: compare(ref, tables(db)) for name, db in dbs.items() if name != ref_name}
        coll = ref["collection"][0]

    rows = ["| system | wall s (whole process or call) | DF stage s | stages | peak RSS MiB |",
            "|---|---:|---:|---|---:|"]
    for name, b in best.items():
        stages = ", ".join(f"{k} {v:.2f}" for k, v in b["stages"].items())
        rss = f"{b['rss']:.0f}" if b.get("rss") is not None else "—"
        rows.append(f"| {name} | {b['wall']:.2f} | {b['df']:.2f} | {stages} | {rss} |")
    eq = ["| compared with " + ref_name + " | terms | term rows whose df or cf differ | collection equal | "
          "shards equal |", "|---|---:|---:|---|---|"]
    all_equal = True
    for name, c in checks.items():
        ok = c["differ"] == 0 and c["terms"] == c["terms_other"] and c["collection"] and c["shards"]
        all_equal &= ok
        eq.append(f"| {name} | {c['terms_other']:,} of {c['terms']:,} | {c['differ']} | {c['collection']} | "
                  f"{c['shards']} |")
    spark_proc = best["jobs/spark_stats.py (process)"]
    local = best.get("funnel build --engine local (process)")
    warm = best["Spark job on a running session (in-process)"]
    summary = [f"**Equal: {'yes' if all_equal else 'NO'}** — every term's df and cf, the collection row "
               f"(n_docs {coll[0]:,}, n_docs_nonempty {coll[1]:,}, total_terms {coll[2]:,}, avgdl {coll[3]:.4f}, "
               f"n_shards {coll[4]}, n_terms {coll[5]:,}) and the shards rows."]
    if local:
        summary.append(
            f"Spark process / local build process: {spark_proc['wall'] / local['wall']:.2f}x wall time "
            f"({spark_proc['wall']:.1f}s vs {local['wall']:.1f}s), {spark_proc['rss'] / local['rss']:.1f}x peak RSS; "
            f"Spark's statistics stage alone on a running session: {warm['df']:.2f}s vs the local build's DF stage "
            f"{local['df']:.2f}s ({warm['df'] / local['df']:.2f}x). Spark's start-up (JVM + session) in the "
            f"process run: {spark_proc['stages'].get('spark_start', 0):.1f}s.")
    body = "\n".join([
        f"{a.dataset}, best of {a.repeats}, one run, interleaved; {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Spark master {a.master} ({cores} cores), Python {platform.python_version()}. Command: "
        f"`.venv/bin/python bench/bench_spark_stats.py --dataset {a.dataset} --engines {a.engines} "
        f"--repeats {a.repeats}`.", "",
        "\"DF stage\": for a build, the stages that produce stats.duckdb (read_analyze_shard, which also writes "
        "postings and docs, + df_reduce); for Spark, read + analyze + DF (read_analyze_df) + the DuckDB write. "
        "Process rows are fresh processes as a user runs them (interpreter, imports, Ray or the JVM); RSS is the "
        "whole process tree.", "",
        *rows, "", *eq, "", *summary,
    ])
    report("spark-stats", f"Spark statistics job vs the funnel build's DF stage on {a.dataset} "
           "(bench/bench_spark_stats.py)", body, a.write)
    if not all_equal:
        sys.exit("error: the Spark and build statistics differ")


if __name__ == "__main__":
    main()
