"""Indexes on object storage: build, open + first search, reindex and gc on local disk vs S3, side by side.

    .venv/bin/python bench/bench_s3.py [--dataset scifact] [--fraction 0.01] [--repeats 3] [--data DIR] [--write]

The S3 side is moto's server (``moto_server``, an in-memory S3 written in Python) on
127.0.0.1, reached through ``AWS_ENDPOINT_URL`` exactly as a real endpoint would be: the
figures show what the object-store path costs in requests, copies and checksums on this
machine, not a real S3's latency or bandwidth. Every timed step is the command a user runs
(a new process; BM25 only, ``--engine local``):

- build: ``funnel build --corpus A --out ROOT`` (on S3: staged locally, uploaded, CURRENT last)
- open + first search: ``funnel search ROOT "query"`` with an empty ``$FUNNEL_CACHE`` (on S3:
  download, sha256 of every file, open); then again (on S3: the cached copy, its manifest
  checksum compared with the store's and every file's sha256 checked, is reused)
- reindex: ``funnel reindex --index ROOT --corpus B`` (B: ``--fraction`` changed, added and
  deleted, bench_reindex's corpora) with an empty cache (on S3 it downloads the live version)
- gc: ``funnel gc ROOT --keep 1`` after the reindex (removes A's version)

Both reindexed indexes then answer every query (k=100) and the TREC runs are compared.
Prints its section of bench/RESULTS.md; ``--write`` records it there.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(__file__))
from bench_reindex import make_corpora  # noqa: E402
from results import add_common_arguments, dataset_dir, report  # noqa: E402

STEPS = ("build", "open + first search, new machine", "open + first search, again", "reindex", "gc --keep 1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[subprocess.Popen, str]:
    """``moto_server`` on a free loopback port; returns (process, endpoint) once it answers."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("error: moto_server did not start (pip install 'moto[server]')")


def funnel(args: list[str], env: dict) -> float:
    """Run ``funnel ARGS`` as a new process; its wall time in seconds (exits on failure)."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", *args], capture_output=True, text=True, env=env)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"error: funnel {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return secs


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_s3.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="scifact", help="BEIR dataset under --data")
    p.add_argument("--fraction", type=float, default=0.01, help="fraction changed, and added, and deleted")
    p.add_argument("--repeats", type=int, default=3, help="rounds per side (median reported)")
    p.add_argument("--query", default="vitamin D deficiency and bone fractures", help="the first search")
    add_common_arguments(p)
    a = p.parse_args(argv)
    ddir = dataset_dir(a.data, a.dataset)
    tmp = tempfile.mkdtemp(prefix="funnel-bench-s3-")
    proc, endpoint = start_moto()
    try:
        import boto3
        aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}
        os.environ.update(aws)
        s3 = boto3.client("s3")
        bucket = f"funnel-bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        c = make_corpora(os.path.join(ddir, "corpus.jsonl"), tmp, a.fraction, seed=0)
        times: dict[tuple[str, str], list[float]] = {(side, s): [] for side in ("local", "s3") for s in STEPS}
        index_bytes = 0
        for r in range(a.repeats):
            for side in ("local", "s3"):
                root = os.path.join(tmp, f"local-{r}") if side == "local" else f"s3://{bucket}/idx-{r}"

                def cache(name: str, side=side, r=r) -> dict:
                    return {**os.environ, "FUNNEL_CACHE": os.path.join(tmp, f"cache-{side}-{r}-{name}")}

                def timed(step: str, args: list[str], env: dict, side=side) -> None:
                    times[(side, step)].append(funnel(args, env))

                timed("build", ["build", "--corpus", c["A"], "--out", root, "--engine", "local"], cache("build"))
                env = cache("open")
                timed(STEPS[1], ["search", root, a.query, "--k", "10"], env)
                timed(STEPS[2], ["search", root, a.query, "--k", "10"], env)
                timed("reindex", ["reindex", "--index", root, "--corpus", c["B"], "--executor", "local"],
                      cache("reindex"))
                timed("gc --keep 1", ["gc", root, "--keep", "1"], cache("reindex"))
                if r == 0 and side == "local":
                    index_bytes = tree_bytes(os.path.join(root, "v000002"))
            print(f"round {r + 1}: " + ", ".join(f"{side} {s} {v[-1]:.2f}s" for (side, s), v in times.items()),
                  file=sys.stderr)
        runs = {}
        queries = os.path.join(ddir, "queries.jsonl")
        for side, root in (("local", os.path.join(tmp, "local-0")), ("s3", f"s3://{bucket}/idx-0")):
            runs[side] = os.path.join(tmp, f"{side}.trec")
            funnel(["search", root, "--queries", queries, "--k", "100", "--run", runs[side]],
                   {**os.environ, "FUNNEL_CACHE": os.path.join(tmp, f"cache-run-{side}")})
        same_runs = sha256(runs["local"]) == sha256(runs["s3"])
        n_lines = sum(1 for _ in open(runs["local"]))
        left = sorted({o["Key"].split("/")[1] for o in s3.list_objects_v2(Bucket=bucket, Prefix="idx-0/")
                       .get("Contents", []) if not o["Key"].endswith("/")})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

    args = argv if argv is not None else sys.argv[1:]
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        f"`{' '.join(['python', 'bench/bench_s3.py'] + args)}`, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, median of {a.repeats} rounds; each step is the command a user runs, a new "
        "process; BM25 only, `--engine local`.",
        "",
        f"{a.dataset}: {c['n'] - c['k']:,} documents in A; B = A with {c['k']} changed, {c['k']} added, "
        f"{c['k']} deleted ({a.fraction:.0%} each); one version is {index_bytes / 2**20:.1f} MiB. S3 is moto_server "
        "(in-memory, Python) on 127.0.0.1: request and copy overheads, not a real S3's latency or bandwidth.",
        "",
        "| step | local disk s (median) | S3 s (median) | S3 / local | local rounds | S3 rounds |",
        "|---|---:|---:|---:|---|---|",
    ]
    for s in STEPS:
        lo, re_ = med[("local", s)], med[("s3", s)]
        lines.append(f"| {s} | {lo:.2f} | {re_:.2f} | {re_ / lo:.2f}x | "
                     f"{', '.join(f'{x:.2f}' for x in times[('local', s)])} | "
                     f"{', '.join(f'{x:.2f}' for x in times[('s3', s)])} |")
    lines += [
        "",
        "- open + first search on S3, new machine (empty $FUNNEL_CACHE): CURRENT read, the version downloaded into "
        "$FUNNEL_CACHE/remote and every file's sha256 checked, then opened as a local version; again: the cached "
        "copy is reused (its manifest checksum compared with the store's, its files' sha256 checked as on local "
        "disk). Local disk has no cache: both rows open the version in place, `--verify full`",
        f"- TREC runs of the reindexed indexes ({n_lines:,} lines, every query, k=100), local vs S3: "
        f"{'identical (sha256)' if same_runs else 'DIFFERENT'}",
        f"- after gc --keep 1 the S3 root holds: {', '.join(left)}",
    ]
    report("s3", "Indexes on object storage: local disk vs S3 (bench/bench_s3.py)", "\n".join(lines), a.write)
    return 0 if same_runs else 1


if __name__ == "__main__":
    sys.exit(main())
