"""Dense and hybrid modes end to end: a real Ray build with MiniLM embeddings into FAISS,
served through the same Searcher as BM25."""


import pytest

from funnel.jobs.build_index import build
from funnel.serving.search import ModeUnavailable, open_index


@pytest.fixture(scope="module")
def dense_index(ray_session, demo_corpus, tmp_path_factory):
    small = tmp_path_factory.mktemp("dsmall") / "c.jsonl"
    with open(demo_corpus) as f, open(small, "w") as g:
        for _, line in zip(range(150), f):
            g.write(line)
    root = str(tmp_path_factory.mktemp("dix"))
    build(str(small), root, shards=2, dense=True)
    return root


def test_dense_and_hybrid_modes(dense_index):
    ix = open_index(dense_index)
    m = ix.index.manifest["dense"]
    # One vector per passage: a docstring longer than the model's window is several.
    assert m["ntotal"] >= 150 and m["passages"]["n_docs"] == 150
    assert m["fingerprint"]["model"].endswith("all-MiniLM-L6-v2")
    q = "split a string into shell-like tokens"
    dense = ix.search(q, mode="dense", k=5)
    assert len(dense.hits) == 5 and dense.hits[0].why.startswith("semantic similarity")
    assert [h.score for h in dense.hits] == sorted((h.score for h in dense.hits), reverse=True)
    hyb = ix.search(q, mode="hybrid", k=5, context_tokens=300)
    assert len(hyb.hits) == 5
    top = hyb.hits[0].explain["fusion"]
    # The explanation is the fused score's own terms: Σ contributions + bonus == score.
    assert sum(top["contributions"].values()) + top["bonus"] == pytest.approx(top["fused_score"], abs=1e-12)
    assert hyb.hits[0].score == pytest.approx(top["fused_score"], abs=1e-6)
    assert set(top["ranks"]) <= {"bm25", "dense"}
    # Convex fusion is the default: each contribution is its list's weight times the
    # min-max normalized score, so no contribution exceeds its weight (alpha 0.55 on BM25).
    assert hyb.trace["hybrid"]["fusion"] == "convex" and "dense" in hyb.trace["timings_ms"]
    assert top["contributions"].get("bm25", 0) <= 0.55 + 1e-12 and top["contributions"].get("dense", 0) <= 0.45 + 1e-12
    assert hyb.trace["context"] and sum(len(c["text"].split()) for c in hyb.trace["context"]) <= 300
    rrf = ix.search(q, mode="hybrid", k=5, fusion="rrf")
    assert rrf.trace["hybrid"]["fusion"] == "rrf"
    first = rrf.hits[0].explain["fusion"]
    assert first["contributions"] == pytest.approx({n: 1 / (60 + r) for n, r in first["ranks"].items()})
    with pytest.raises(ValueError, match="unknown fusion 'max'; choose one of rrf, convex"):
        ix.search(q, mode="hybrid", fusion="max")


def test_batch_dense_equals_single(dense_index):
    ix = open_index(dense_index)
    qs = {"a": "read a csv file", "b": "hash a password securely", "c": "sort items with a heap"}
    batch = ix.search_batch(qs, mode="dense", k=5)
    for qid, q in qs.items():
        single = [(h.doc_id, h.score) for h in ix.search(q, mode="dense", k=5).hits]
        assert [d for d, _ in batch[qid]] == [d for d, _ in single]


def test_fingerprint_mismatch_is_refused(dense_index):
    class Other:
        name, dim = "other-model", 384

        def fingerprint(self):
            return {"kind": "sentence-transformers", "model": "other-model", "dim": 384, "normalize": True,
                    "query_prompt": "", "document_prompt": ""}

        def embed_query(self, text):  # pragma: no cover - never reached
            raise AssertionError

    ix = open_index(dense_index, embedder=Other())
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2"):
        ix.search("anything", mode="dense")


def test_dense_modes_need_a_dense_index(demo_index_1):
    ix = open_index(demo_index_1)
    for mode in ("dense", "hybrid"):
        with pytest.raises(ModeUnavailable, match="--dense"):
            ix.search("x", mode=mode)


def test_hybrid_with_llm_query_expansion(dense_index):
    """Expansions come from the real SmolLM2-135M served on 127.0.0.1 by xllamacpp."""
    from funnel.serving.chat import LocalLlamaServer
    with LocalLlamaServer() as server:
        ix = open_index(dense_index, chat=server.chat())
        res = ix.search("parse command line options", mode="hybrid", k=5, expand=2, fusion="rrf")
        conv = ix.search("parse command line options", mode="hybrid", k=5, expand=2)
    exp = res.trace["hybrid"]["expansions"]
    assert isinstance(exp, list) and all(isinstance(e, str) and e for e in exp)
    assert len(res.hits) == 5
    fused = res.hits[0].explain["fusion"]
    assert set(fused["ranks"]) <= {"bm25", "dense"} | {f"{l}:x{i}" for l in ("bm25", "dense")
                                                         for i in range(1, len(exp) + 1)}
    if exp:  # with expansions the original query's lists weigh 2
        for lst in ("bm25", "dense"):
            if lst in fused["ranks"]:
                assert fused["contributions"][lst] == pytest.approx(2 / (60 + fused["ranks"][lst]))
    # Convex (the default): the original lists weigh 2 x alpha / 2 x (1 - alpha), each
    # expansion list alpha / 1 - alpha, each times a min-max score in [0, 1].
    cx = conv.hits[0].explain["fusion"]
    cexp = conv.trace["hybrid"]["expansions"]
    limits = {"bm25": 2 * 0.55 if cexp else 0.55, "dense": 2 * 0.45 if cexp else 0.45}
    for name, c in cx["contributions"].items():
        assert 0 <= c <= limits.get(name, 0.55 if name.startswith("bm25") else 0.45) + 1e-12
    with pytest.raises(ValueError, match="expand needs a chat model"):
        open_index(dense_index).search("x", mode="hybrid", expand=2)


def test_rerank_with_position_blend_and_configurable_tiers(dense_index):
    """A real second stage (the bi-encoder reranker over the same MiniLM) through the hybrid
    path: every reranked hit's score is w·(1/r) + (1−w)·rerank_norm with the configured tiers."""
    from funnel.serving.rerank import BiEncoderReranker
    ix = open_index(dense_index)
    ix.reranker = BiEncoderReranker(ix.dense_mode.dense().provider)
    tiers = ((2, 0.9), (None, 0.1))
    res = ix.search("compress data with zlib", mode="hybrid", k=6, rerank_depth=6, blend_tiers=tiers)
    assert res.trace["hybrid"]["reranker"] and "rerank" in res.trace["timings_ms"]
    for h in res.hits:
        ex = h.explain["fusion"]
        w = 0.9 if ex["fused_rank"] <= 2 else 0.1
        assert ex["position_weight"] == w
        assert ex["score"] == pytest.approx(w / ex["fused_rank"] + (1 - w) * ex["rerank_norm"])
