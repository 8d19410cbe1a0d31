"""16 HTTP clients on a real ``funnel serve`` while two new versions are published (issue 16):
no request fails, every answer is consistent with the version that gave it, and the server
ends on the newest version without a restart.

The load is bench/bench_load.py's ``LoadClients`` (16 threads, one keep-alive connection
each, ``POST /search`` as fast as answers come); the publishes are ``funnel build --engine
local`` processes into the served root. Each version adds one document with a word no other
holds, so an answer shows which corpus it was computed on. Every wait is bounded: a server
that hangs or never switches fails the test instead of blocking it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.store.artifacts import read_current

from conftest import write_jsonl
from test_build import QUERIES

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench_load import LoadClients, free_port, funnel_command, funnel_server  # noqa: E402

CLIENTS = 16
BUILD_TIMEOUT_S = 180
SWITCH_TIMEOUT_S = 60
#: Per version after the first: (doc id, a word only it holds, the query that finds it).
ADDED = [("load-v2", "quokka", "quokka marsupial"), ("load-v3", "wombat", "wombat burrow")]


def _corpus(tmp_path, base: list[str], n_added: int) -> str:
    rows = list(base)
    for doc_id, word, _ in ADDED[:n_added]:
        rows.append({"_id": doc_id, "title": f"The {word}", "text": f"The {word} is a {word}; {word} facts."})
    return write_jsonl(tmp_path / f"corpus-{n_added}.jsonl", rows)


def _publish(corpus: str, root: str) -> str:
    try:
        p = subprocess.run(funnel_command("build", "--corpus", corpus, "--out", root, "--engine", "local"),
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"funnel build did not finish in {BUILD_TIMEOUT_S}s")
    assert p.returncode == 0, p.stderr[-3000:]
    return read_current(root)


def test_16_clients_during_two_publishes_no_request_fails(demo_corpus, tmp_path):
    base = open(demo_corpus).read().splitlines()
    corpora = [_corpus(tmp_path, base, n) for n in range(3)]
    root = str(tmp_path / "ix")
    build(corpora[0], root, engine="local")
    versions = [read_current(root)]

    n_added = {}  # version -> how many ADDED documents its corpus holds, from its manifest

    def consistent(query: str, body: dict) -> str | None:
        """The hits agree with the version that answered: its own added documents, no later one's."""
        version = body["trace"]["version"]
        if version not in n_added:
            with open(os.path.join(root, version, "manifest.json")) as f:
                n_added[version] = corpora.index(json.load(f)["corpus"]["source"])
        ids = [h["doc_id"] for h in body["hits"]]
        for i, (doc_id, _, q) in enumerate(ADDED):
            if i >= n_added[version] and doc_id in ids:
                return f"{version} answered {doc_id}, which only a later version holds"
            if i < n_added[version] and query == q and ids[:1] != [doc_id]:
                return f"{version} answered {ids[:3]} to {q!r}, not {doc_id} first"
        return None

    queries = QUERIES + [q for _, _, q in ADDED]
    with funnel_server(root, free_port(), str(tmp_path / "serve.log")) as url:
        with LoadClients(url, queries, CLIENTS, k=10, check=consistent) as load:
            assert load.wait_for(versions[0], SWITCH_TIMEOUT_S) is not None, "no answer from the first version"
            for corpus in corpora[1:]:
                versions.append(_publish(corpus, root))
                assert load.wait_for(versions[-1], SWITCH_TIMEOUT_S) is not None, \
                    f"no answer from {versions[-1]} within {SWITCH_TIMEOUT_S}s of its publish"
        stats = load.stop()
        health = httpx.get(url + "/health", timeout=30).json()

    assert len(set(versions)) == 3
    assert stats.failures == [], f"{len(stats.failures)} of {stats.requests} requests failed: {stats.failures[:5]}"
    assert set(stats.versions) == set(versions), stats.versions  # answers from all three, and from no other
    assert stats.requests == sum(stats.versions.values()) and stats.requests >= CLIENTS
    assert health["status"] == "ok" and health["version"] == health["current"] == versions[-1]
