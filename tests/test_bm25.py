"""BM25 formulas on hand-built fixtures, and oracles: NumPy brute force and bm25s."""

import math

import numpy as np
import pytest

from funnel.serving.lexical.bm25 import (BM25Params, ShardScorer, byte4_to_int, idf_lucene, int_to_byte4,
                                 lucene_lengths, norm_bytes)
from funnel.pipelines.lexical.postings import build_postings


def test_smallfloat_byte4_roundtrip_and_monotone():
    # Lucene: values below 24 are exact; byte 255 encodes Integer.MAX_VALUE's bucket.
    assert [int_to_byte4(i) for i in range(24)] == list(range(24))
    assert int_to_byte4(2**31 - 1) == 255
    decoded = [byte4_to_int(b) for b in range(256)]
    assert decoded == sorted(decoded)
    assert all(int_to_byte4(d) == b for b, d in enumerate(decoded))
    for x in [24, 25, 100, 137, 1000, 12345, 10**6]:
        d = byte4_to_int(int_to_byte4(x))
        assert d <= x and (x - d) / x < 1 / 8


def test_norm_bytes_equal_int_to_byte4_for_every_length():
    """The vectorized encoder (a table below 65,536, a binary search above) against the
    scalar port of Lucene's SmallFloat: every length to 200,000, each byte's boundary and its
    neighbours, random lengths up to 2^31 - 1, both paths, and shapes and dtypes kept."""
    bounds = np.array([byte4_to_int(b) for b in range(256)], dtype=np.int64)
    rng = np.random.default_rng(7)
    lengths = np.unique(np.concatenate([np.arange(200_000), bounds, bounds - 1, bounds + 1,
                                        rng.integers(0, 2**31 - 1, 5_000)]))
    lengths = lengths[lengths >= 0]
    want = np.array([int_to_byte4(int(x)) for x in lengths], dtype=np.uint8)
    assert np.array_equal(norm_bytes(lengths), want)
    short = lengths < 65_536
    assert np.array_equal(norm_bytes(lengths[short].astype(np.int32)), want[short])  # the table path alone
    assert norm_bytes(np.array([[3, 40], [1000, 7]])).tolist() == [[3, 40], [int_to_byte4(1000), 7]]
    assert norm_bytes(np.array([], dtype=np.int32)).dtype == np.uint8
    assert np.array_equal(lucene_lengths(lengths), bounds[want].astype(np.float64))
    with pytest.raises(ValueError, match="length must be >= 0"):
        norm_bytes(np.array([5, -1]))


def test_idf_formula():
    assert idf_lucene(1, 10) == pytest.approx(math.log(1 + (10 - 1 + 0.5) / 1.5))
    assert idf_lucene(10, 10) > 0  # Lucene's idf is never negative


def _scorer(docs):
    p = build_postings(docs)
    arrays = {"indptr": p.indptr, "docs": p.docs, "tfs": p.tfs, "doclen": p.doclen,
              "term_gid": np.arange(len(p.terms), dtype=np.int32)}
    avgdl = p.doclen.sum() / np.count_nonzero(p.doclen)
    return ShardScorer(arrays, avgdl), p


def _brute(docs, query, k1, b, exact):
    n = len(docs)
    dl = np.array([len(d) for d in docs], dtype=float)
    avgdl = dl.sum() / n
    L = dl if exact else lucene_lengths(dl.astype(int))
    out = np.zeros(n)
    for t in set(query):
        w = query.count(t)
        df = sum(t in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(t)
            if tf:
                out[i] += w * idf * tf / (tf + k1 * (1 - b + b * L[i] / avgdl))
    return out


DOCS = [["cat", "sat", "mat"] * 3, ["dog", "cat"], ["bird"] * 40 + ["cat"], ["fish", "dog", "dog"],
        ["cat", "dog", "bird", "fish"] * 9]


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.2, 0.75), (0.0, 0.5)])
def test_scores_equal_numpy_reference(exact, k1, b):
    sc, p = _scorer(DOCS)
    query = ["cat", "dog", "dog", "unknown"]
    terms = {t: query.count(t) for t in set(query) if t in p.terms}
    gids = np.array([p.terms.index(t) for t in terms])
    idf = idf_lucene(p.df[gids], len(DOCS))
    params = BM25Params(k1, b, "exact" if exact else "lucene-byte4")
    got = sc.score(gids, np.array(list(terms.values())) * idf, params)
    np.testing.assert_allclose(got, _brute(DOCS, query, k1, b, exact), rtol=0, atol=1e-9)


def test_scores_equal_bm25s_lucene():
    bm25s = pytest.importorskip("bm25s")
    rng = np.random.default_rng(0)
    vocab = [f"t{i}" for i in range(60)]
    docs = [list(rng.choice(vocab, size=rng.integers(3, 80))) for _ in range(300)]
    sc, p = _scorer(docs)
    model = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
    model.index(docs, show_progress=False)
    for qi in range(20):
        q = list(rng.choice(vocab, size=4, replace=False))
        gids = np.array([p.terms.index(t) for t in q if t in p.terms])
        ours = sc.score(gids, idf_lucene(p.df[gids], len(docs)), BM25Params(0.9, 0.4, "exact"))
        theirs = model.get_scores(q)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_params_validation():
    with pytest.raises(ValueError, match="choose one of lucene-byte4, exact"):
        BM25Params(length_norm="approx")
    with pytest.raises(ValueError, match="b must be in"):
        BM25Params(b=2)
