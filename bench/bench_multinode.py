"""Multi-node Ray: the build job through ``ray job submit`` on a two-node cluster (a head and a
worker started with ``ray start`` on this machine), against the same job on a one-node
cluster and the in-process local engine, in one run.

    .venv/bin/python bench/bench_multinode.py [--dataset scifact] [--data DIR] [--write]

What it does, as a user would on real machines:

1. ``ray start --head --num-cpus 1`` and ``ray start --address HEAD --num-cpus 1`` (a second
   raylet: its own node id, ports and object store; same host), both from this venv (the
   job's ``python`` is the cluster's), token auth off on loopback (``RAY_AUTH_MODE=disabled``);
2. ``ray job submit --working-dir . -- python jobs/build_index.py --engine ray ...``, timed
   from submit to the job's end;
3. Ray's state API: on which nodes the job's tasks ran (both must appear);
4. the same with one node of 2 CPUs; then ``funnel build --engine local``; the three indexes'
   TREC runs on the test queries must be identical;
5. stops only the processes of the clusters it started (never ``ray stop``, which would stop
   every Ray process of this user).

On one machine a second node adds no cores: the figure shows the cost of the cluster
machinery (object transfer between raylets, scheduling), not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

os.environ["RAY_AUTH_MODE"] = "disabled"
sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _node_ports() -> list[str]:
    """Every per-node port ``ray start`` would otherwise take at its default (two raylets on
    one machine, or another Ray beside them, would collide on the agents' ports)."""
    return [f"--node-manager-port={_port()}", f"--object-manager-port={_port()}",
            f"--dashboard-agent-listen-port={_port()}", f"--dashboard-agent-grpc-port={_port()}",
            f"--metrics-export-port={_port()}", f"--runtime-env-agent-port={_port()}"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    # This venv first on PATH, as after `source .venv/bin/activate`: the raylets start the job's
    # driver with the `python` they find, which must be the one funnel is installed in.
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)


class Cluster:
    """A Ray cluster of ``nodes`` raylets on this machine, started with ``ray start``."""

    def __init__(self, nodes: int, cpus_per_node: int):
        self.tmp = tempfile.mkdtemp(prefix="fmn", dir="/tmp")  # short: Ray's socket paths are bounded
        self.gcs_port, self.dash_port = _port(), _port()
        self.nodes, self.cpus = nodes, cpus_per_node

    def __enter__(self) -> "Cluster":
        ray = os.path.join(BIN, "ray")
        head = [ray, "start", "--head", f"--port={self.gcs_port}", f"--num-cpus={self.cpus}",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dash_port}", f"--temp-dir={self.tmp}",
                "--node-ip-address=127.0.0.1", "--min-worker-port=20000", "--max-worker-port=20999",
                f"--ray-client-server-port={_port()}", "--disable-usage-stats", *_node_ports()]
        r = _run(head, timeout=180)
        if r.returncode:
            raise RuntimeError(f"ray start --head failed: {r.stderr[-2000:]}")
        for i in range(1, self.nodes):
            lo = 21000 + 1000 * i
            r = _run([ray, "start", f"--address=127.0.0.1:{self.gcs_port}", f"--num-cpus={self.cpus}",
                      "--node-ip-address=127.0.0.1", f"--min-worker-port={lo}", f"--max-worker-port={lo + 999}",
                      "--disable-usage-stats", *_node_ports()], timeout=180)
            if r.returncode:
                raise RuntimeError(f"ray start --address (node {i + 1}) failed: {r.stderr[-2000:]}")
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.alive_nodes() >= self.nodes:
                return self
            time.sleep(1)
        raise RuntimeError(f"only {self.alive_nodes()} of {self.nodes} nodes came up")

    def alive_nodes(self) -> int:
        code = ("import ray; ray.init(address='127.0.0.1:%d', logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))" % self.gcs_port)
        r = _run([sys.executable, "-c", code], timeout=120)
        try:
            return int(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def submit(self, args: list[str]) -> tuple[float, str]:
        deadline = time.time() + 300
        while True:  # the job agent of a just-started (or busy) head needs a moment
            t = time.perf_counter()
            r = _run([os.path.join(BIN, "ray"), "job", "submit", f"--address=http://127.0.0.1:{self.dash_port}",
                      "--working-dir", ROOT, "--", "python", "jobs/build_index.py", *args], timeout=1800, cwd=ROOT)
            secs = time.perf_counter() - t
            if r.returncode == 0 or "No available agent" not in r.stdout + r.stderr or time.time() > deadline:
                break
            time.sleep(5)
        if r.returncode:
            raise RuntimeError(f"ray job submit failed ({r.returncode}): {(r.stdout + r.stderr)[-3000:]}")
        return secs, r.stdout

    def task_nodes(self) -> dict[str, int]:
        """{node id: tasks run there} for every task this cluster ran."""
        code = ("import json; from ray.util.state import list_tasks; "
                "ts = list_tasks(address='http://127.0.0.1:%d', limit=10000, detail=True, raise_on_missing_output=False); "
                "c = {}\nfor t in ts:\n    n = t.node_id or 'none'; c[n] = c.get(n, 0) + 1\nprint(json.dumps(c))"
                % self.dash_port)
        r = _run([sys.executable, "-c", code], timeout=300)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"unknown": -1, "error": r.stderr[-300:]}

    def __exit__(self, *exc) -> None:
        """Kill this cluster's processes only: those whose command line names its temp dir or
        its GCS port (``ray stop`` would stop every Ray cluster of this user)."""
        marks = (self.tmp, f"127.0.0.1:{self.gcs_port}")
        victims = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in cmd for m in marks):
                victims.append(int(name))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + 15
            while sig == signal.SIGTERM and time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in victims):
                time.sleep(0.5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _trec(root: str, ddir: str, out: str) -> str:
    subprocess.run([os.path.join(BIN, "funnel"), "search", root, "--queries", os.path.join(ddir, "queries.jsonl"),
                    "--k", "100", "--run", out], check=True, capture_output=True, timeout=600)
    with open(out) as f:
        return f.read()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="scifact")
    add_common_arguments(p)
    a = p.parse_args(argv)
    ddir = os.path.abspath(dataset_dir(a.data, a.dataset))
    work = tempfile.mkdtemp(prefix="funnel-multinode-")
    rows, runs, nodes_used = [], {}, {}
    try:
        for label, nodes, cpus in (("2 nodes x 1 CPU (ray start head + worker)", 2, 1),
                                   ("1 node x 2 CPUs (ray start head)", 1, 2)):
            out = os.path.join(work, f"idx-{nodes}")
            t0 = time.perf_counter()
            with Cluster(nodes, cpus) as c:
                up = time.perf_counter() - t0
                secs, log = c.submit(["--corpus", ddir, "--out", out, "--engine", "ray"])
                nodes_used[label] = c.task_nodes()
            rows.append((label, up, secs))
            runs[label] = _trec(out, ddir, os.path.join(work, f"run-{nodes}.trec"))
            print(f"{label}: cluster up {up:.1f} s, job {secs:.1f} s, tasks per node {nodes_used[label]}", flush=True)
        out = os.path.join(work, "idx-local")
        t = time.perf_counter()
        subprocess.run([os.path.join(BIN, "funnel"), "build", "--corpus", ddir, "--out", out, "--engine", "local"],
                       check=True, capture_output=True, timeout=900)
        rows.append(("funnel build --engine local (no Ray)", 0.0, time.perf_counter() - t))
        runs["local"] = _trec(out, ddir, os.path.join(work, "run-local.trec"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    same = len(set(runs.values())) == 1
    base = rows[-1][2]
    lines = [f"Command: `.venv/bin/python bench/bench_multinode.py --dataset {a.dataset}`. One machine "
             f"({os.cpu_count()} cores); `ray job submit -- python jobs/build_index.py --engine ray` on clusters "
             "started with `ray start`, timed from submit to the job's end (Ray start-up in the job "
             "included, cluster start-up separate); load average at the end "
             f"{os.getloadavg()[0]:.1f}.", "",
             "| setup | cluster start s | build job s | ÷ local engine |", "|---|---:|---:|---:|"]
    for label, up, secs in rows:
        lines.append(f"| {label} | {up:.1f} | {secs:.1f} | {secs / base:.2f}× |")
    lines += ["", "Tasks per node (Ray state API): " + "; ".join(
        f"{label}: {len([n for n in v if n not in ('none', 'error', 'unknown')])} nodes, "
        + ", ".join(f"{str(n)[:8]}… {c}" for n, c in v.items()) for label, v in nodes_used.items()),
        "", f"TREC runs of the three indexes on every test query identical: {'yes' if same else 'NO'}.", ""]
    report("multinode", "Multi-node Ray: the build job on a head + worker cluster (bench/bench_multinode.py)",
           "\n".join(lines), a.write)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
