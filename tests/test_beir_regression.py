"""Pinned-metric regressions on real BEIR data (tiers 3 and 4). Marked `beir`: .ci/run runs them.

- BM25 within 0.005 of Pyserini's published BM25 flat (SciFact 0.6789, NFCorpus 0.3218).
- Dense (all-MiniLM-L6-v2) within 0.01 of MTEB's figures (0.6451, 0.3159).
- Hybrid without a reranker at least max(bm25, dense) + 0.02 NDCG@10 on both.

Indexes live where `funnel eval` keeps them (.funnel/indexes/NAME), so the regression matrix
that .ci/run checks next reuses them; document embeddings are cached by content hash.
"""

import pytest

from funnel.serving.frontends.cli import ensure_index
from funnel.evaluation.evaluate import eval_dataset
from funnel.serving.search import open_index

from conftest import need_shared

PUBLISHED_BM25 = {"scifact": {"ndcg@10": 0.6789, "recall@100": 0.9253},
                  "nfcorpus": {"ndcg@10": 0.3218, "recall@100": 0.2457}}
MTEB_DENSE = {"scifact": 0.6451, "nfcorpus": 0.3159}


@pytest.fixture(scope="module", params=["scifact", "nfcorpus"])
def measured(request, ray_session):
    ddir = need_shared("beir", request.param)
    root = ensure_index(ddir, None, True, 4)
    res = eval_dataset(open_index(root), ddir, ["bm25", "dense", "hybrid"])
    return request.param, res["metrics"]


@pytest.mark.beir
def test_bm25_matches_published_lucene(measured):
    ds, m = measured
    for metric, expected in PUBLISHED_BM25[ds].items():
        assert m["bm25"][metric] == pytest.approx(expected, abs=0.005), metric


@pytest.mark.beir
def test_dense_matches_mteb(measured):
    ds, m = measured
    assert m["dense"]["ndcg@10"] == pytest.approx(MTEB_DENSE[ds], abs=0.01)


@pytest.mark.beir
def test_hybrid_beats_both_lists_by_two_points(measured):
    ds, m = measured
    assert m["hybrid"]["ndcg@10"] >= max(m["bm25"]["ndcg@10"], m["dense"]["ndcg@10"]) + 0.02
