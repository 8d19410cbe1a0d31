"""The HTTP API (serving/frontends/http.py) against the real 400-document demo index."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from funnel.serving.frontends.http import create_app
from funnel.serving.search import MAX_K, MAX_QUERY_CHARS, open_index
from servers import live_server

QUERY = "parse command line arguments"
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def searcher(demo_index_1):
    return open_index(demo_index_1)


@pytest.fixture(scope="module")
def client(searcher):
    with TestClient(create_app(searcher)) as c:
        yield c




@pytest.fixture(scope="module")
def live_url(searcher):
    """A real uvicorn server on 127.0.0.1 in a background thread."""
    with live_server(create_app(searcher)) as port:
        yield f"http://127.0.0.1:{port}"


def test_search_returns_summary_hits_and_trace(client, searcher):
    r = client.post("/search", json={"query": QUERY, "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"query", "mode", "summary", "hits", "trace", "total", "offset"}
    assert body["query"] == QUERY and body["mode"] == "bm25"
    assert body["summary"].startswith(f"Found {len(body['hits'])} documents for {QUERY!r} (bm25):")
    assert 1 <= len(body["hits"]) <= 5
    assert [h["rank"] for h in body["hits"]] == list(range(1, len(body["hits"]) + 1))
    scores = [h["score"] for h in body["hits"]]
    assert scores == sorted(scores, reverse=True)
    top = body["hits"][0]
    assert {"doc_id", "title", "snippet", "score", "matched_terms", "why"} <= set(top)
    assert top["doc_id"].startswith("argparse") and top["matched_terms"]
    assert body["trace"]["version"] == searcher.version
    # HTTP returns exactly what the Python API returns (timings aside).
    direct = searcher.search(QUERY, k=5).to_dict()
    assert body["hits"] == direct["hits"] and body["summary"] == direct["summary"]


def test_search_options_reach_the_scorer(client):
    r = client.post("/search", json={"query": QUERY, "k": 3, "options": {"k1": 1.2, "b": 0.75}})
    assert r.status_code == 200, r.text
    assert r.json()["trace"]["bm25"]["k1"] == 1.2 and r.json()["trace"]["bm25"]["b"] == 0.75


@pytest.mark.parametrize("body, field", [
    ({"query": ""}, "query"),
    ({"query": "   \t "}, "query"),
    ({"query": "a" * (MAX_QUERY_CHARS + 1)}, "query"),
    ({"query": QUERY, "k": 0}, "k"),
    ({"query": QUERY, "k": MAX_K + 1}, "k"),
    ({"query": QUERY, "k": "ten"}, "k"),
    ({"k": 5}, "query"),
    ({"query": QUERY, "top_k": 5}, "top_k"),
    ({"query": QUERY, "options": {"mode": "dense"}}, "options"),
])
def test_invalid_body_is_422_naming_the_field(client, body, field):
    r = client.post("/search", json=body)
    assert r.status_code == 422, r.text
    msg = r.json()["error"]
    assert msg.startswith("invalid request: ") and f"{field}:" in msg


def test_unknown_mode_lists_the_choices(client, searcher):
    r = client.post("/search", json={"query": QUERY, "mode": "nope"})
    assert r.status_code == 400
    assert r.json() == {"error": f"unknown mode 'nope'; choose one of {', '.join(searcher.modes())}"}


def test_unavailable_mode_is_400_with_the_reason(client):
    r = client.post("/search", json={"query": QUERY, "mode": "dense"})
    if r.status_code == 200:
        pytest.skip("this index serves dense retrieval")
    assert r.status_code == 400
    assert "dense" in r.json()["error"]


def test_bad_option_value_is_400(client):
    r = client.post("/search", json={"query": QUERY, "options": {"k1": "high"}})
    assert r.status_code == 400
    assert "k1" in r.json()["error"] and "high" in r.json()["error"]


def test_get_document(client, searcher):
    hit = client.post("/search", json={"query": QUERY, "k": 1}).json()["hits"][0]
    r = client.get(f"/documents/{hit['doc_id']}")
    assert r.status_code == 200
    doc = r.json()
    assert doc["doc_id"] == hit["doc_id"] and doc["title"] == hit["title"]
    assert doc == searcher.get_document(hit["doc_id"])


def test_unknown_document_is_404(client):
    r = client.get("/documents/no.such.module")
    assert r.status_code == 404
    assert "no.such.module" in r.json()["error"]


def test_term_stats(client, searcher):
    r = client.post("/term_stats", json={"terms": ["parse", "the", "zzzqqq"]})
    assert r.status_code == 200
    body = r.json()
    assert body["version"] == searcher.version
    assert body["n_docs"] == searcher.index.n_docs
    assert [s["term"] for s in body["stats"]] == ["parse", "the", "zzzqqq"]  # each term once, in order
    by_term = {s["term"]: s for s in body["stats"]}
    [parse] = by_term["parse"]["forms"]
    assert parse["analyzed"] == "pars" and 0 < parse["df"] <= searcher.index.n_docs and parse["idf"] > 0
    assert parse["cf"] >= parse["df"] and by_term["parse"]["note"] is None
    assert by_term["the"]["forms"] == [] and "stopword" in by_term["the"]["note"]
    assert [f["df"] for f in by_term["zzzqqq"]["forms"]] == [0]
    assert "text" not in r.text and "snippet" not in r.text  # never passages
    assert client.post("/term_stats", json={"terms": []}).status_code == 422


def test_term_stats_groups_a_terms_forms_under_it(client, searcher):
    # One term analysing to several tokens (one of them twice) comes back once, each
    # distinct form once, with the figures the Python API gives for that token.
    r = client.post("/term_stats", json={"terms": ["parsing arguments parse"]})
    assert r.status_code == 200, r.text
    [row] = r.json()["stats"]
    assert row["term"] == "parsing arguments parse"
    by_token = {t["analyzed"]: t for t in searcher.term_stats(["parsing arguments parse"])}
    assert [f["analyzed"] for f in row["forms"]] == list(by_token)
    assert len(by_token) < len(searcher.term_stats(["parsing arguments parse"]))  # "pars" twice
    for f in row["forms"]:
        assert {k: f[k] for k in ("df", "cf", "idf")} == {k: by_token[f["analyzed"]][k] for k in ("df", "cf", "idf")}


def test_body_limit_is_configurable(searcher):
    with TestClient(create_app(searcher, max_body_bytes=2048)) as c:
        assert c.post("/search", json={"query": "parse " * 300}).status_code == 200
        r = c.post("/search", json={"query": "parse " * 400})
        assert r.status_code == 413 and "2,048 bytes" in r.json()["error"]


def test_health_lists_only_the_modes_this_index_serves(client, searcher):
    r = client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body == {"status": "ok", "version": searcher.version, "n_docs": searcher.index.n_docs,
                    "modes": body["modes"], "refresh_error": None, "current": searcher.version,
                    "degraded_since": None, "damaged": []}
    # The demo index has no vectors: no dense, no hybrid. Every mode listed answers; every
    # other mode of the registry is refused with the reason.
    assert body["modes"][0] == "bm25" and not {"dense", "hybrid"} & set(body["modes"])
    for mode in searcher.modes():
        r = client.post("/search", json={"query": QUERY, "mode": mode, "k": 3})
        assert r.status_code == (200 if mode in body["modes"] else 400), (mode, r.text)


def test_token_auth(searcher):
    with TestClient(create_app(searcher, token=TOKEN)) as c:
        for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = c.post("/search", json={"query": QUERY}, headers=bad)
            assert r.status_code == 401 and "Bearer" in r.json()["error"]
            assert r.headers["www-authenticate"] == "Bearer"
        assert c.get("/documents/argparse").status_code == 401
        assert c.post("/term_stats", json={"terms": ["x"]}).status_code == 401
        for path in ("/docs", "/openapi.json", "/redoc", "/no/such/path"):
            assert c.get(path).status_code == 401, path
        ok = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/search", json={"query": QUERY}, headers=ok).status_code == 200
        assert c.get("/documents/argparse", headers=ok).status_code == 200
        assert c.get("/openapi.json", headers=ok).json()["info"]["title"] == "funnel"
        assert c.get("/health").status_code == 200  # open, for load balancers


def test_concurrent_requests_agree(live_url):
    def one(_):
        with httpx.Client(timeout=30) as c:
            r = c.post(f"{live_url}/search", json={"query": QUERY, "k": 10})
            return r.status_code, r.json()

    with ThreadPoolExecutor(max_workers=20) as pool:
        results = list(pool.map(one, range(20)))
    assert all(status == 200 for status, _ in results)
    first = results[0][1]
    assert first["hits"]
    for _, body in results:
        assert body["hits"] == first["hits"] and body["summary"] == first["summary"]


def test_new_version_is_picked_up_without_restart(demo_index_1, tmp_path):
    from funnel.pipelines.store.artifacts import load_manifest, new_staging_dir, publish, read_current
    root = str(tmp_path / "ix")
    shutil.copytree(demo_index_1, root)
    v1 = read_current(root)
    with TestClient(create_app(root, refresh_interval=0.2)) as c:
        assert c.get("/health").json()["version"] == v1
        staging = new_staging_dir(root)
        shutil.copytree(os.path.join(root, v1), staging, dirs_exist_ok=True)
        v2 = publish(root, staging, load_manifest(staging))
        assert v2 != v1
        deadline = time.monotonic() + 10
        while c.get("/health").json()["version"] != v2:
            assert time.monotonic() < deadline, "the new version was not picked up within 10 s"
            time.sleep(0.1)
        r = c.post("/search", json={"query": QUERY, "k": 3})
        assert r.status_code == 200 and r.json()["trace"]["version"] == v2

        # A broken publication is reported, and the last good version keeps serving.
        with open(os.path.join(root, "CURRENT"), "w") as f:
            f.write("v999999\n")
        deadline = time.monotonic() + 10
        while (h := c.get("/health").json())["status"] != "degraded":
            assert time.monotonic() < deadline, "the broken CURRENT was not noticed within 10 s"
            time.sleep(0.1)
        assert h["version"] == v2 and "v999999" in h["refresh_error"]
        r = c.post("/search", json={"query": QUERY, "k": 3})
        assert r.status_code == 200 and r.json()["trace"]["version"] == v2


def _serve(args: list[str], env_extra: dict[str, str] | None = None, drop_env: tuple[str, ...] = ()):
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env.update(env_extra or {})
    return subprocess.Popen([sys.executable, "-m", "funnel.serving.frontends.cli", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("args, env, says", [
    (["--token", ""], {}, "--token is empty"),                       # --token "$FUNNEL_TOKEN", unset
    (["--token", "   "], {}, "--token is empty"),
    ([], {"FUNNEL_TOKEN": ""}, "FUNNEL_TOKEN is set but empty"),
])
def test_serve_refuses_an_empty_token(demo_index_1, args, env, says):
    p = _serve([demo_index_1, "--port", "0", *args], env, drop_env=("FUNNEL_TOKEN",))
    try:
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 2, err
    assert err.startswith("error: ") and says in err and "Traceback" not in err


@pytest.mark.parametrize("token", [None, TOKEN])
def test_serve_says_where_it_listens_what_it_serves_and_whether_a_token_is_needed(demo_index_1, searcher, token):
    args = [demo_index_1, "--port", "0"] + (["--token", token] if token else [])
    p = _serve(args, drop_env=("FUNNEL_TOKEN",))
    try:
        deadline = time.monotonic() + 60
        line, seen = "", []
        while " at http://" not in line:
            assert time.monotonic() < deadline and p.poll() is None, "funnel serve did not start"
            line = p.stderr.readline()
            seen.append(line)
        assert any("warm-up query answered in" in s for s in seen), seen  # before it listens
        url = re.search(r"at (http://127\.0\.0\.1:\d+)", line).group(1)
        assert f"version {searcher.version}" in line and demo_index_1 in line
        modes = re.search(r"modes: ([^;]+);", line).group(1).split(", ")
        assert modes[0] == "bm25" and "dense" not in modes
        assert ("token required" in line) if token else ("token not required" in line)
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["version"] == searcher.version and health["modes"] == modes
        r = httpx.post(f"{url}/search", json={"query": QUERY}, timeout=10)
        assert r.status_code == (401 if token else 200)
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_warm_answers_a_query_so_the_first_request_loads_nothing(demo_index_1, caplog):
    """``warm()`` (what `funnel serve` and `funnel mcp` run before listening) answers one
    query: the compiled kernels are loaded then, not at the first request. Where it fails, it
    says so and returns: a server still starts."""
    with open_index(demo_index_1) as ix:
        docs = ix.index.docs
        assert not docs._groups
        assert ix.warm() > 0
        assert docs._groups  # it answered a query with hits: their text was read
        real = docs.get
        docs.get = lambda n: (_ for _ in ()).throw(OSError("disk gone"))
        try:
            assert ix.warm() >= 0
        finally:
            docs.get = real
    assert "warm-up query" in caplog.text and "disk gone" in caplog.text
