"""Revoking access: the time from a corpus change to the first served answer that honours it.

    .venv/bin/python bench/bench_acl_reindex.py [--docs 10k] [--repeats 3] [--dense] [--no-baseline] [--write]

The corpus is ``bench/synth.py``'s (generated at ``.funnel/synth/<docs>`` unless there), copied
with fields: ``team`` (a keyword), ``sel`` (a number) and ``acl``: a quarter of the documents
readable by group ``eng`` only, a quarter by ``sales`` only, the rest public. Index A is built
once (local engine; ``--dense`` adds vectors) under ``.funnel/bench-acl-reindex/<docs>``, and a
copy of it is served by ``funnel serve --tokens`` (a real process; alice is in ``eng``, bob in
``sales``) for the whole run.

Each round moves one ``eng`` document to ``sales`` (the next round moves it back): the new
corpus file is written, then timed from the moment it is in place:

- ``reindex``: ``funnel reindex --index ROOT --corpus B`` as the command a user (or a cron
  job) runs: a new process, imports included, to the new version's publication;
- ``served``: from the reindex's exit until ``POST /search`` as alice (the revoked principal;
  one request every 20 ms) no longer returns the document, through the server's own refresh
  (it checks CURRENT at most once a second);
- ``total``: the corpus change to that first honouring answer.

The reindex's own stage times and what it embedded are read from the new version's manifest.
The baseline (skipped with ``--no-baseline``) is what an ACL change cost before reindex
carried fields: ``funnel build`` of the new corpus into a fresh root (its vectors, with
``--dense``, come from the embedding cache A's build filled).
Prints its section of bench/RESULTS.md; ``--write`` records it there.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(__file__))
import synth  # noqa: E402
from results import report  # noqa: E402

TOKENS = {"alice-bench-token": {"principal": "alice", "groups": ["eng"]},
          "bob-bench-token": {"principal": "bob", "groups": ["sales"]}}
POLL_S = 0.02
CLI = [sys.executable, "-m", "funnel.serving.frontends.cli"]


def with_fields(src: str, dst: str) -> list[dict]:
    """``src``'s rows with ``team``, ``sel`` and ``acl`` fields, written to ``dst``; the rows."""
    import numpy as np
    rng = np.random.default_rng(3)
    rows = []
    with open(src) as f:
        for i, line in enumerate(f):
            row = json.loads(line)
            row["team"] = ("search", "infra", "billing", "web")[i % 4]
            row["sel"] = float(rng.random())
            if i % 4 == 1:
                row["acl"] = ["eng"]
            elif i % 4 == 3:
                row["acl"] = ["sales"]
            rows.append(row)
    write_rows(dst, rows)
    return rows


def write_rows(path: str, rows: list[dict]) -> None:
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)  # the change lands at once, as a sync tool's rename does


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(root: str, tokens: str, port: int):
    """``funnel serve ROOT --tokens FILE`` on 127.0.0.1:port, stopped (TERM) on exit."""
    import httpx
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(CLI + ["serve", root, "--port", str(port), "--tokens", tokens],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while True:
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"funnel serve exited with {proc.returncode}:\n{log.read()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                sys.exit("funnel serve did not answer /health within 180 s")
            time.sleep(0.2)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


def run(cmd: list[str]) -> float:
    """Wall seconds of ``cmd`` (exits on failure, showing its output)."""
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t
    if p.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return secs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=synth.parse_count, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dense", action="store_true", help="build vectors too (the reindex must embed none)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the full build of the changed corpus")
    p.add_argument("--write", action="store_true", help="record the section in bench/RESULTS.md")
    a = p.parse_args(argv)

    import httpx

    from funnel.jobs.build_index import build
    from funnel.pipelines.store.artifacts import load_manifest, read_current

    label = f"{a.docs // 1000}k" if a.docs < 1_000_000 else f"{a.docs // 1_000_000}m"
    data = os.path.join(".funnel", "synth", label)
    synth.ensure(a.docs, data)
    work = os.path.abspath(os.path.join(".funnel", "bench-acl-reindex", label + ("-dense" if a.dense else "")))
    os.makedirs(work, exist_ok=True)
    corpus_a = os.path.join(work, "a.jsonl")
    rows = with_fields(os.path.join(data, "corpus.jsonl"), corpus_a)
    base = os.path.join(work, "base")
    if not os.path.exists(os.path.join(base, "CURRENT")):
        t = time.time()
        build(corpus_a, base, engine="local", dense=a.dense)
        print(f"built {base} in {time.time() - t:.0f}s", file=sys.stderr)
    root = os.path.join(work, "served")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(base, root)
    tokens = os.path.join(work, "tokens.json")
    with open(tokens, "w") as f:
        json.dump({hashlib.sha256(t.encode()).hexdigest(): v for t, v in TOKENS.items()}, f)

    target = next(i for i, r in enumerate(rows) if r.get("acl") == ["eng"])
    doc = rows[target]
    body = {"query": doc["title"] or doc["text"][:80], "k": 10, "filter": {"sel": doc["sel"]},
            "mode": "hybrid" if a.dense else "bm25"}
    port = free_port()
    url = f"http://127.0.0.1:{port}/search"
    alice = {"Authorization": "Bearer alice-bench-token"}
    corpus_b = os.path.join(work, "b.jsonl")
    rounds = []
    with serving(root, tokens, port), httpx.Client(timeout=60) as http:
        def alice_sees() -> bool:
            r = http.post(url, json=body, headers=alice)
            r.raise_for_status()
            return doc["_id"] in {h["doc_id"] for h in r.json()["hits"]}

        if not alice_sees():
            sys.exit(f"setup: alice does not see {doc['_id']} before the change")
        for i in range(a.repeats):
            revoke = i % 2 == 0  # eng -> sales, then back
            rows[target] = {**doc, "acl": ["sales"] if revoke else ["eng"]}
            write_rows(corpus_b, rows)
            t0 = time.perf_counter()
            reindex_s = run(CLI + ["reindex", "--index", root, "--corpus", corpus_b])
            t1 = time.perf_counter()
            while alice_sees() == revoke:
                if time.perf_counter() - t1 > 30:
                    sys.exit("the server did not follow the new version within 30 s")
                time.sleep(POLL_S)
            t2 = time.perf_counter()
            m = load_manifest(os.path.join(root, read_current(root)))
            rounds.append({"reindex": reindex_s, "served": t2 - t1, "total": t2 - t0,
                           "inner": m["build"]["seconds"], "stages": m["build"]["stages"],
                           "diff": m["reindex"], "version": read_current(root)})
            print(f"round {i}: {'revoke' if revoke else 'grant'} -> {rounds[-1]['version']}: reindex "
                  f"{reindex_s:.2f}s (in-process {m['build']['seconds']}s), served {t2 - t1:.2f}s later, "
                  f"total {t2 - t0:.2f}s", file=sys.stderr)

    baseline = None
    if a.baseline:
        full = os.path.join(work, "full")
        shutil.rmtree(full, ignore_errors=True)
        baseline = run(CLI + ["build", "--corpus", corpus_b, "--out", full, "--engine", "local"]
                       + (["--dense"] if a.dense else []))
        shutil.rmtree(full, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)

    med = {k: statistics.median(r[k] for r in rounds) for k in ("reindex", "inner", "served", "total")}
    last = rounds[-1]
    stages = ", ".join(f"{k} {v:.2f}" for k, v in last["stages"].items())
    vec = last["diff"].get("vectors")
    lines = [
        f"`python bench/bench_acl_reindex.py --docs {label}{' --dense' if a.dense else ''} --repeats {a.repeats}` "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}); "
        f"{len(rows):,} synthetic documents with fields (team, sel, acl), {'BM25 + vectors' if a.dense else 'BM25'}, "
        f"{len(load_manifest(os.path.join(base, read_current(base)))['shards'])} shard(s). Each round moves one "
        "document's ACL from group eng to sales (or back) and nothing else; alice (eng) is the revoked principal, "
        "asking `funnel serve --tokens` over HTTP every 20 ms.",
        "",
        "| step | median of rounds (s) | rounds (s) |",
        "|---|---:|---:|",
        f"| `funnel reindex` (the command, a new process) | {med['reindex']:.2f} | "
        + ", ".join(f"{r['reindex']:.2f}" for r in rounds) + " |",
        f"| of which the reindex itself (manifest build.seconds) | {med['inner']:.2f} | "
        + ", ".join(f"{r['inner']:.2f}" for r in rounds) + " |",
        f"| reindex exit -> first answer without the document (server refresh, at most 1/s) | {med['served']:.2f} | "
        + ", ".join(f"{r['served']:.2f}" for r in rounds) + " |",
        f"| **corpus change -> first answer that honours it** | **{med['total']:.2f}** | "
        + ", ".join(f"{r['total']:.2f}" for r in rounds) + " |",
    ]
    if baseline is not None:
        lines.append(f"| baseline: `funnel build` of the changed corpus (the only way before) | {baseline:.2f} | "
                     "one run |")
    lines += ["", f"Last round's reindex: {last['diff']['fields_changed']} document with new fields only, "
              f"{last['diff']['changed']} changed, {last['diff']['added']} added, {last['diff']['deleted']} deleted; "
              f"{last['diff']['shards_rebuilt']} shard(s) rewritten"
              + (f"; vectors {vec['reused']} reused, {vec['embedded']} embedded" if vec else "")
              + f". Its stages (s): {stages}."]
    report("acl-reindex", "Revoking access: corpus change to the first answer that honours it",
           "\n".join(lines), a.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
