"""Oracle for the pruned masked BM25 kernels (``serving/lexical/masked.py``, ``serving/kernels/masked.py``):
the filtered top k must equal an exhaustive scoring of every document, filtered afterwards, in
ids, scores (bit for bit) and tie order, across random masks of many selectivities, k values
and queries, with every strategy forced in turn. The corpus is built by the real build job
(local engine, three shards): Zipf words so that common terms span many blocks of postings
(pruning has something to skip), and exact duplicate documents so that scores tie."""

from __future__ import annotations

import json

import numpy as np
import pytest

from funnel.serving import filters, kernels
from funnel.serving.lexical import masked
from funnel.serving.lexical.bm25 import BM25Params
from funnel.serving.search import open_index

needs_numba = pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba absent: only the NumPy path runs")

N_DOCS = 3000
VOCAB = 250
SELECTIVITIES = (0.0005, 0.002, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999)
KS = (1, 3, 10, 37, 100)


def _words(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    p = 1.0 / (np.arange(1, len(vocab) + 1) + 2.0)
    return list(rng.choice(vocab, size=n, p=p / p.sum()))


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("masked-pruning")
    rng = np.random.default_rng(7)
    vocab = [f"w{i:03d}" for i in range(VOCAB)]
    texts = [" ".join(_words(rng, vocab, int(rng.integers(4, 120)))) for _ in range(N_DOCS)]
    for i in range(0, N_DOCS // 5, 2):  # exact duplicates: identical scores for every query
        texts[N_DOCS - 1 - i] = texts[i]
    ids = [f"d{int(rng.integers(10**6)):06d}-{i}" for i in range(N_DOCS)]  # id order != position order
    with open(d / "corpus.jsonl", "w") as f:
        for doc_id, text in zip(ids, texts):
            f.write(json.dumps({"_id": doc_id, "title": "", "text": text}) + "\n")
    from funnel.jobs.build_index import build
    build(str(d / "corpus.jsonl"), str(d / "ix"), shards=3, engine="local")
    ix = open_index(str(d / "ix"))
    yield ix._current, vocab
    ix.close()


def _queries(rng: np.random.Generator, vocab: list[str], n: int) -> list[dict[str, float]]:
    """Random weighted queries: 1-9 terms, mixing common and rare words, with repeats."""
    out = []
    for _ in range(n):
        terms = [vocab[int(rng.integers(0, 12))] for _ in range(int(rng.integers(0, 4)))]  # common
        terms += [vocab[int(rng.integers(0, VOCAB))] for _ in range(int(rng.integers(1, 7)))]
        out.append({t: float(terms.count(t)) for t in terms})
    return out


def _masks(rng: np.random.Generator, vs) -> list[filters.Mask]:
    off = np.cumsum([0] + [s.n_docs for s in vs.index.shards]).astype(np.int64)
    n = int(off[-1])
    out = [filters.Mask(rng.random(n) < f, off) for f in SELECTIVITIES]
    out.append(filters.Mask(np.arange(n) % 2 == 0, off))  # every other document
    run = np.zeros(n, dtype=bool)
    run[n // 3:n // 3 + 40] = True  # one contiguous run inside one shard
    out.append(filters.Mask(run, off))
    one = np.zeros(n, dtype=bool)
    one[int(rng.integers(n))] = True  # a single document
    out.append(filters.Mask(one, off))
    return out


def _exhaustive(vs, terms: dict[str, float], mask: filters.Mask, k: int, params: BM25Params,
                then: dict[str, float] | None = None) -> list[tuple[int, float]]:
    """Every document scored (the NumPy reference, unfiltered), ranked by score then doc_id,
    and only then filtered by the mask: the top k of what remains."""
    r = vs.bm25
    gids, ws = r._canonical(terms)
    if then:
        g2, w2 = r._canonical(then)
        gids, ws = np.concatenate([gids, g2]), np.concatenate([ws, w2])
    if len(gids) == 0:
        return []
    dn, sc = r._search_reference(gids, ws, int(mask.doc_off[-1]), params)
    return [(int(n), float(s)) for n, s in zip(dn, sc) if mask.allows_docno(int(n))][:k]


def _masked(vs, terms, mask, k, params, then=None) -> list[tuple[int, float]]:
    with filters.scope(mask):
        dn, sc = vs.bm25.search_arrays(terms, k, params, then)
    return list(zip(dn.tolist(), sc.tolist()))


@needs_numba
@pytest.mark.parametrize("strategy, cost, prune_min", [
    ("auto", None, None), ("candidates", None, None), ("candidates", 0, None), ("candidates", 10**9, None),
    ("blocks", None, None), ("candidates", None, 0), ("blocks", None, 0)])
def test_pruned_masked_top_k_equals_filtered_exhaustive_scoring(index, strategy, cost, prune_min, monkeypatch):
    """Random masks x random queries x k, each strategy forced (``auto``: the per-shard cost
    rule), candidates with each term looked up (cost 0), streamed (a huge cost) or either by
    the rule; pruning as served and eager (0: wherever the bounds allow). The kernels must
    also have pruned (dropped candidates, skipped blocks), or the test would prove nothing."""
    vs, vocab = index
    monkeypatch.setattr(masked, "STRATEGY", strategy)
    if cost is not None:
        monkeypatch.setattr(masked, "CANDIDATE_COST", cost)
    if prune_min is not None:
        monkeypatch.setattr(vs.bm25, "prune_min_postings", prune_min)
    rng = np.random.default_rng(len(strategy) + (cost or 1) % 97 + 7 * (prune_min or 0))
    params = BM25Params()
    masked.STATS[:] = 0
    for mask in _masks(rng, vs):
        for terms in _queries(rng, vocab, 12):
            for k in KS:
                assert _masked(vs, terms, mask, k, params) == _exhaustive(vs, terms, mask, k, params), \
                    (mask.count, terms, k)
    closed, blocks, went_sorted, plain, dropped, streamed = masked.STATS.tolist()
    assert plain == 0  # block maxima exist for the default (k1, b): every shard pruned
    if strategy in ("auto", "candidates"):
        assert closed > 0 and dropped > 0
        assert (streamed == 0) if cost == 0 else (streamed > 0)
    if strategy in ("auto", "blocks"):
        assert blocks > 0 and went_sorted > 0


@needs_numba
def test_unpruned_paths_and_weighted_queries_equal_filtered_exhaustive_scoring(index, monkeypatch):
    """A (k1, b) override (no block maxima: no pruning), SIRA-style ``then`` terms, and a
    negative weight (bounds would not hold: no pruning) against the same oracle."""
    vs, vocab = index
    rng = np.random.default_rng(9)
    masks = _masks(rng, vs)
    for params in (BM25Params(), BM25Params(k1=1.5, b=0.3)):
        for strategy in ("candidates", "blocks"):
            monkeypatch.setattr(masked, "STRATEGY", strategy)
            for mask in masks[::2]:
                for terms in _queries(rng, vocab, 6):
                    then = {vocab[int(rng.integers(VOCAB))]: 0.3, vocab[int(rng.integers(VOCAB))]: -0.2}
                    then = {t: w for t, w in then.items() if t not in terms}
                    for k in (1, 10, 100):
                        assert _masked(vs, terms, mask, k, params) == _exhaustive(vs, terms, mask, k, params)
                        assert _masked(vs, terms, mask, k, params, then) == \
                            _exhaustive(vs, terms, mask, k, params, then), (terms, then, k)
                        assert not vs.bm25._buffers()[0].any()  # the shared accumulator left zeroed


def test_a_mask_allowing_everything_or_nothing(index):
    """Everything allowed answers as the unfiltered search; nothing allowed answers empty."""
    vs, vocab = index
    off = np.cumsum([0] + [s.n_docs for s in vs.index.shards]).astype(np.int64)
    n = int(off[-1])
    every, none = filters.Mask(np.ones(n, dtype=bool), off), filters.Mask(np.zeros(n, dtype=bool), off)
    for terms in _queries(np.random.default_rng(4), vocab, 10):
        dn, sc = vs.bm25.search_arrays(terms, 10)
        assert _masked(vs, terms, every, 10, BM25Params()) == list(zip(dn.tolist(), sc.tolist()))
        assert _masked(vs, terms, none, 10, BM25Params()) == []
