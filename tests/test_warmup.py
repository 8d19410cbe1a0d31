"""A server's warm-up (serving/frontends/warmup.py): real requests through the HTTP API and the MCP server
before they listen, and a newly published version warmed before it serves.

Real components throughout: in-process builds of a small dense index (onnxruntime, FAISS),
the FastAPI app under a real uvicorn on 127.0.0.1 (tests/servers.py), an in-memory MCP client
session on the real MCP server. What is asserted is what a warm-up leaves behind (the
follower's record of the version, the version's dense index and documents loaded before any
request reached it), never how long anything took.
"""

from __future__ import annotations

import httpx
import pytest

from funnel.serving.frontends.http import create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.search import open_index
from funnel.serving.frontends.warmup import warm_http, warm_mcp, warm_server, warm_texts

from conftest import write_jsonl
from servers import live_server

TOKEN = "warm-up-token"
WORDS = ("rain clouds water vapour droplets condense fall weather storm thunder lightning "
         "protein folding enzyme cell membrane vaccine immune antibody virus").split()


def _corpus(path, n: int, shift: int = 0) -> str:
    rows = [{"_id": f"d{i:03d}", "title": f"doc {i}",
             "text": " ".join(WORDS[(i * 7 + j + shift) % len(WORDS)] for j in range(30))} for i in range(n)]
    return write_jsonl(path, rows)


@pytest.fixture
def dense_root(tmp_path):
    from funnel.jobs.build_index import build
    root = str(tmp_path / "ix")
    build(_corpus(tmp_path / "c1.jsonl", 40), root, shards=1, dense=True, engine="local")
    return root, tmp_path


def test_warm_texts_come_from_documents_spread_over_the_corpus(dense_root):
    root, _ = dense_root
    with open_index(root) as ix:
        texts = warm_texts(ix.follower.current)
        assert len(texts) == 3 and len(set(texts)) == 3
        firsts = {" ".join(f"{d['title']} {d['text']}".split()[:8]) for d in map(ix.index.docs.get, range(40))}
        assert set(texts) <= firsts


def test_http_server_warms_through_its_api_and_warms_a_new_version_before_serving_it(dense_root):
    from funnel.jobs.build_index import build
    root, tmp = dense_root
    searcher = open_index(root)
    app = create_app(searcher, token=TOKEN, refresh_interval=0.0)
    rec = warm_server(searcher, lambda: warm_http(app, searcher, TOKEN))
    first = searcher.version
    assert rec["version"] == first and rec["requests"] == 3 and rec["queries"] == 3
    assert searcher.follower.prepare is not None and searcher.follower.warmed == {}
    with live_server(app) as port:
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        build(_corpus(tmp / "c2.jsonl", 50, shift=3), root, shards=1, dense=True, engine="local")
        # /health searches nothing: the switch it triggers is all that touches the new version.
        health = httpx.get(f"{url}/health", timeout=60).json()
        new = health["version"]
        assert new != first
        assert list(searcher.follower.warmed) == [new]  # warmed before it answered anything
        served = searcher.follower.current
        assert served.version == new
        assert served.dense_mode._dense is not None  # the FAISS index and the query embedder, open
        assert served.index.docs._groups  # documents' text read by the warm-up's answers
        r = httpx.post(f"{url}/search", json={"query": "thunder lightning storm", "k": 3}, headers=auth, timeout=60)
        assert r.status_code == 200 and r.json()["hits"]
    searcher.close()


def test_a_failing_warm_up_of_a_new_version_still_switches_to_it(dense_root, caplog):
    from funnel.jobs.build_index import build
    root, tmp = dense_root
    with open_index(root) as searcher:
        searcher.follower.prepare = lambda v: (_ for _ in ()).throw(OSError("disk gone"))
        build(_corpus(tmp / "c2.jsonl", 45, shift=5), root, shards=1, dense=True, engine="local")
        assert searcher.refresh()
        assert searcher.follower.warmed == {}
        assert searcher.search("storm", mode="bm25", k=3).hits
    assert "disk gone" in caplog.text and "serves cold" in caplog.text


def test_mcp_server_warms_through_a_client_session(dense_root):
    root, _ = dense_root
    with open_index(root) as ix:
        server = build_mcp_server(ix)
        rec = warm_server(ix, lambda: warm_mcp(server, ix))
        assert rec["requests"] == 3 and rec["embedder_s"] > 0
        assert ix.follower.current.dense_mode._dense is not None


def test_damage_a_warm_up_finds_keeps_the_new_version_out_of_service(dense_root):
    """A warm-up query that finds a file damaged (``IndexVersion.damaged``, what the BM25 kernels
    call on an impossible value) does not wait on the follower it is warming for (the switch
    holds its lock): the version is not served, the one before it keeps answering, and status
    says why."""
    import threading

    from funnel.jobs.build_index import build
    root, tmp = dense_root
    with open_index(root) as searcher:
        first = searcher.version

        def finds_damage(v):
            v.index.damaged("manifest.json", "holds an impossible value")

        searcher.follower.prepare = finds_damage
        build(_corpus(tmp / "c2.jsonl", 45, shift=5), root, shards=1, dense=True, engine="local")
        t = threading.Thread(target=lambda: setattr(t, "switched", searcher.refresh()), daemon=True)
        t.start()
        t.join(timeout=60)
        assert not t.is_alive() and t.switched is False
        assert searcher.version == first and searcher.search("storm", mode="bm25", k=3).hits
        st = searcher.status()
        assert st["state"] == "degraded" and "found by its warm-up" in st["reason"]
        assert not searcher.refresh()  # not tried again while the file is unchanged
