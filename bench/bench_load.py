"""Load benchmark: concurrent HTTP clients on ``funnel serve`` while two new versions are published.

    .venv/bin/python bench/bench_load.py [--dataset scifact] [--clients 16] [--seconds 30] [--k 10]
                                         [--data DIR] [--write]

One run, one server: the dataset is built (``funnel build --engine local``, BM25) into a
fresh INDEX_ROOT and served by ``funnel serve`` on 127.0.0.1, as a user runs them (new
processes). ``--clients`` threads of this process (one keep-alive ``httpx`` connection each)
then send ``POST /search`` with the dataset's queries, round robin, as fast as answers come:

1. warm-up (``--warmup`` seconds, not counted);
2. baseline: ``--seconds`` of load, nothing published;
3. publishes: ``--seconds`` of load while ``funnel build`` publishes two new versions into
   the same root (the corpus with 1% of its documents changed, then another 1%); the phase
   lasts until the server has answered from the second one.

A request fails when it raises (connection error, timeout), answers other than 200, or
answers a body without a hit list and a ``trace.version``. Latency percentiles are of the
answered requests, client side (the clients share the machine with the server and, in
phase 3, with the builds). ``LoadClients`` is also the load of tests/test_faults_load.py.
Prints its section of bench/RESULTS.md; ``--write`` records it there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(__file__))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

READY_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 30.0


# -- the load ------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(len(s) * q / 100) - 1))]


@dataclass
class LoadStats:
    """What one load phase saw."""

    clients: int
    seconds: float
    requests: int                                         # answered or failed
    failures: list[str]                                   # one line per failed request
    latencies_ms: list[float]                             # of the answered requests
    versions: Counter = field(default_factory=Counter)    # answers per trace.version
    first_seen: dict = field(default_factory=dict)        # version -> time.time() of its first answer

    def figures(self) -> dict:
        lat = self.latencies_ms
        return {"clients": self.clients, "seconds": round(self.seconds, 1), "requests": self.requests,
                "failures": len(self.failures), "qps": self.requests / self.seconds if self.seconds else 0.0,
                "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95), "p99_ms": percentile(lat, 99),
                "max_ms": max(lat) if lat else float("nan")}


class LoadClients:
    """``clients`` threads posting ``/search`` to ``url`` until stopped; a context manager.

    ``check(query, body)`` may add a test of each answer: a string (what is wrong) makes
    the request a failure. `wait_for` waits until an answer came from a version.
    """

    def __init__(self, url: str, queries: list[str], clients: int = 16, k: int = 10,
                 check: Callable[[str, dict], str | None] | None = None, timeout: float = REQUEST_TIMEOUT_S):
        if not queries:
            raise ValueError("no queries to send")
        self.url, self.queries, self.clients, self.k = url, queries, clients, k
        self.check, self.timeout = check, timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        self._requests = 0
        self._failures: list[str] = []
        self._latencies: list[float] = []
        self._versions: Counter = Counter()
        self._first_seen: dict[str, float] = {}
        self._t0 = self._t1 = 0.0

    def __enter__(self) -> "LoadClients":
        self._t0 = time.perf_counter()
        for i in range(self.clients):
            t = threading.Thread(target=self._client, args=(i,), name=f"load-client-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> LoadStats:
        """Stop the clients (each finishes its request in flight) and return the figures."""
        if not self._stop.is_set():
            self._stop.set()
            for t in self._threads:
                t.join(self.timeout + 10)
            self._t1 = time.perf_counter()
        stuck = [t.name for t in self._threads if t.is_alive()]
        with self._lock:
            failures = self._failures + [f"{name}: still waiting for an answer" for name in stuck]
            return LoadStats(self.clients, self._t1 - self._t0, self._requests + len(stuck), failures,
                             list(self._latencies), Counter(self._versions), dict(self._first_seen))

    def wait_for(self, version: str, timeout: float) -> float | None:
        """time.time() of the first answer from ``version``; None if none came within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while version not in self._first_seen:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return None
                self._seen.wait(min(left, 0.5))
            return self._first_seen[version]

    def _client(self, i: int) -> None:
        import httpx
        j = i * len(self.queries) // self.clients
        with httpx.Client(base_url=self.url, timeout=self.timeout) as c:
            while not self._stop.is_set():
                q = self.queries[j % len(self.queries)]
                j += 1
                t = time.perf_counter()
                try:
                    r = c.post("/search", json={"query": q, "k": self.k})
                    problem, version = self._problem(q, r)
                except httpx.HTTPError as e:
                    problem, version = f"{type(e).__name__}: {e}", None
                ms = (time.perf_counter() - t) * 1000
                with self._seen:
                    self._requests += 1
                    if problem:
                        self._failures.append(f"{q!r}: {problem}")
                        continue
                    self._latencies.append(ms)
                    self._versions[version] += 1
                    if version not in self._first_seen:
                        self._first_seen[version] = time.time()
                        self._seen.notify_all()

    def _problem(self, query: str, r) -> tuple[str | None, str | None]:
        if r.status_code != 200:
            return f"HTTP {r.status_code}: {r.text[:300]}", None
        try:
            body = r.json()
        except ValueError as e:
            return f"not JSON ({e}): {r.text[:300]}", None
        version = (body.get("trace") or {}).get("version") if isinstance(body, dict) else None
        if not isinstance(version, str) or not isinstance(body.get("hits"), list) \
                or not all(isinstance(h, dict) and isinstance(h.get("doc_id"), str) for h in body["hits"]):
            return f"malformed answer: {r.text[:300]}", None
        if self.check is not None and (why := self.check(query, body)):
            return why, version
        return None, version


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def funnel_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "funnel.serving.frontends.cli", *args]


def run_funnel(*args: str, timeout: float = 600) -> float:
    """Run ``funnel ARGS`` to the end as a new process; its wall time in seconds (raises on failure)."""
    t = time.perf_counter()
    p = subprocess.run(funnel_command(*args), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"funnel {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t


@contextlib.contextmanager
def funnel_server(index_root: str, port: int, log_path: str):
    """``funnel serve INDEX_ROOT --port PORT`` until the block ends (TERM, then KILL); yields its URL
    once ``/health`` answers."""
    import httpx
    env = {k: v for k, v in os.environ.items() if k != "FUNNEL_TOKEN"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(funnel_command("serve", index_root, "--port", str(port)), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"funnel serve exited {proc.returncode}:\n{open(log_path).read()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"funnel serve did not answer /health in {READY_TIMEOUT_S}s:\n"
                                   f"{open(log_path).read()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


def read_current(root: str) -> str:
    with open(os.path.join(root, "CURRENT")) as f:
        return f.read().strip()


# -- the benchmark -------------------------------------------------------------------------


def changed_corpus(corpus: str, out: str, fraction: float, seed: int) -> tuple[str, int]:
    """``corpus`` with ``fraction`` of its documents edited (a sentence appended); (path, edited)."""
    with open(corpus) as f:
        docs = [json.loads(line) for line in f if line.strip()]
    k = max(1, round(len(docs) * fraction))
    edited = set(random.Random(seed).sample(range(len(docs)), k))
    with open(out, "w") as f:
        for i, d in enumerate(docs):
            if i in edited:  # new terms, a new length, a new content hash
                other = docs[(i + 7) % len(docs)].get("title", "")
                d = {**d, "text": f"{d.get('text', '')} Revised (round {seed}): {other}"}
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return out, k


def _row(name: str, s: LoadStats) -> str:
    f = s.figures()
    versions = ", ".join(f"{v} ×{n:,}" for v, n in sorted(s.versions.items()))
    return (f"| {name} | {f['clients']} | {f['seconds']:.1f} | {f['requests']:,} | {f['failures']} | {f['qps']:.1f} | "
            f"{f['p50_ms']:.1f} | {f['p95_ms']:.1f} | {f['p99_ms']:.1f} | {f['max_ms']:.1f} | {versions} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_load.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="scifact", help="BEIR dataset under --data")
    p.add_argument("--clients", type=int, default=16, help="client threads, one connection each")
    p.add_argument("--seconds", type=float, default=30.0, help="length of the baseline and of the publish phase")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the baseline, not counted")
    p.add_argument("--k", type=int, default=10, help="hits per request")
    p.add_argument("--fraction", type=float, default=0.01, help="documents edited by each publish")
    add_common_arguments(p)
    a = p.parse_args(argv)
    ddir = dataset_dir(a.data, a.dataset)
    corpus = os.path.join(ddir, "corpus.jsonl")
    with open(os.path.join(ddir, "queries.jsonl")) as f:
        queries = [json.loads(line)["text"] for line in f if line.strip()]
    tmp = tempfile.mkdtemp(prefix="funnel-bench-load-")
    load0 = os.getloadavg()[0]
    try:
        root = os.path.join(tmp, "index")
        build = ["--engine", "local"]
        t_build = run_funnel("build", "--corpus", corpus, "--out", root, *build)
        v1 = read_current(root)
        variants = [changed_corpus(corpus, os.path.join(tmp, f"corpus-{r}.jsonl"), a.fraction, r) for r in (1, 2)]
        print(f"{a.dataset}: {v1} built in {t_build:.1f}s; serving", file=sys.stderr)
        publishes = []
        with funnel_server(root, free_port(), os.path.join(tmp, "serve.log")) as url:
            with LoadClients(url, queries, a.clients, a.k) as warm:
                time.sleep(a.warmup)
            warm_stats = warm.stop()
            with LoadClients(url, queries, a.clients, a.k) as load:
                time.sleep(a.seconds)
            baseline = load.stop()
            print(f"baseline: {baseline.figures()}", file=sys.stderr)
            with LoadClients(url, queries, a.clients, a.k) as load:
                t0 = time.perf_counter()
                for i, ((path, edited), at) in enumerate(zip(variants, (0.2, 0.55))):
                    time.sleep(max(0.0, t0 + at * a.seconds - time.perf_counter()))
                    started = time.perf_counter() - t0
                    secs = run_funnel("build", "--corpus", path, "--out", root, *build)
                    version = read_current(root)
                    published = os.stat(os.path.join(root, "CURRENT")).st_mtime  # CURRENT is renamed into place
                    seen = load.wait_for(version, 120)
                    publishes.append({"version": version, "edited": edited, "started": started, "build_s": secs,
                                      "switch_s": None if seen is None else seen - published})
                    print(f"publish {i + 1}: {publishes[-1]}", file=sys.stderr)
                time.sleep(max(0.0, t0 + a.seconds - time.perf_counter()))
            during = load.stop()
            print(f"publishes: {during.figures()}", file=sys.stderr)
            import httpx
            health = httpx.get(url + "/health", timeout=30).json()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()[0]

    args = argv if argv is not None else sys.argv[1:]
    lines = [
        f"`{' '.join(['python', 'bench/bench_load.py'] + args)}`, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; load average {load0:.1f} before, {load1:.1f} after. One "
        f"`funnel serve` process (uvicorn, one worker) on 127.0.0.1; {a.clients} client threads in the benchmark's "
        f"process, one keep-alive httpx connection each, `POST /search` k={a.k} BM25 with the {len(queries):,} "
        f"{a.dataset} queries round robin, each client sending its next request when the last is answered. "
        f"Index: `funnel build --engine local` ({t_build:.1f}s). Latency: client side, answered requests; "
        f"failures: errors, non-200 answers, bodies without hits and trace.version.",
        "",
        "| phase | clients | s | requests | failures | q/s | p50 ms | p95 ms | p99 ms | max ms | answers per version |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        _row("baseline: no publish", baseline),
        _row("two publishes during the load", during),
        "",
    ]
    for i, pb in enumerate(publishes, 1):
        switch = "never" if pb["switch_s"] is None else f"{pb['switch_s']:.2f}s after CURRENT moved to it"
        lines.append(f"- publish {i}: `funnel build --engine local` of the corpus with {pb['edited']} documents "
                     f"edited, started {pb['started']:.1f}s into the phase, {pb['build_s']:.1f}s; first answer "
                     f"from {pb['version']} {switch} (the server checks CURRENT at most once a second)")
    lines.append(f"- after the phase `/health` reports version {health['version']} (CURRENT {health['current']}, "
                 f"status {health['status']}); warm-up: {warm_stats.requests:,} requests, "
                 f"{len(warm_stats.failures)} failed")
    for name, s in (("baseline", baseline), ("publishes", during)):
        for line in s.failures[:5]:
            lines.append(f"- {name} failure: {line}")
    report("load", f"Serving under load: {a.clients} HTTP clients during two publishes (bench/bench_load.py)",
           "\n".join(lines), a.write)
    return 1 if baseline.failures or during.failures else 0


if __name__ == "__main__":
    sys.exit(main())
