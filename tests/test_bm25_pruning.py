"""Oracles for the fast BM25 path: the compiled kernel (pruned and exhaustive) against the
NumPy reference and a brute-force scorer, over many random queries with many ties, sharded
against unsharded, Lucene norms and exact lengths, default and overridden (k1, b)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from funnel.pipelines.lexical.postings import build_postings, term_bounds
from funnel.serving import kernels
from funnel.serving.lexical.bm25 import BM25Params, ShardScorer, idf_lucene, lucene_lengths
from funnel.serving.lexical.retriever import BM25Retriever

needs_numba = pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba absent: only the NumPy path runs")


def _corpus(seed=0, n=700, vocab=120):
    """Zipf-ish documents, plus exact duplicates and same-length near-duplicates: many ties."""
    rng = np.random.default_rng(seed)
    words = [f"w{i:03d}" for i in range(vocab)]
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    docs = [list(rng.choice(words, size=int(rng.integers(1, 90)), p=p)) for _ in range(n)]
    for i in range(0, n // 3, 3):  # duplicates: identical scores for every query
        docs[n - 1 - i] = list(docs[i])
    docs.append([])  # an empty document never matches
    ids = [f"d{rng.integers(10**6):06d}-{i}" for i in range(len(docs))]
    return docs, ids, words


def _index(docs, ids, shards, bounds_on_disk=True):
    """What IndexVersion gives the retriever, built in memory: global vocabulary, hash shards."""
    terms = sorted({t for d in docs for t in d})
    gid = {t: i for i, t in enumerate(terms)}
    assign = [hash(i) % shards for i in ids] if shards > 1 else [0] * len(ids)
    n_nonempty = sum(1 for d in docs if d)
    avgdl = sum(len(d) for d in docs) / n_nonempty
    df = np.zeros(len(terms), dtype=np.int64)
    for d in docs:
        for t in set(d):
            df[gid[t]] += 1
    scorers, shard_ids = [], []
    for s in range(shards):
        members = [i for i, a in enumerate(assign) if a == s]
        p = build_postings([docs[i] for i in members])
        arrays = {"indptr": p.indptr, "docs": p.docs, "tfs": p.tfs, "doclen": p.doclen,
                  "term_gid": np.array([gid[t] for t in p.terms], dtype=np.int32)}
        if bounds_on_disk:
            arrays["term_max_tf"], arrays["term_min_dl"] = term_bounds(p.indptr, p.docs, p.tfs, p.doclen)
        scorers.append(ShardScorer(arrays, avgdl))
        shard_ids.append(np.array([ids[i] for i in members], dtype=object))
    all_ids = np.concatenate(shard_ids)
    rank = np.empty(len(all_ids), dtype=np.int64)
    rank[np.argsort(all_ids, kind="stable")] = np.arange(len(all_ids))
    bounds = np.cumsum([0] + [len(x) for x in shard_ids])
    docstore = SimpleNamespace(rank=rank, id_rank=[rank[bounds[s]:bounds[s + 1]] for s in range(shards)],
                               doc_ids=shard_ids)
    ix = SimpleNamespace(shards=scorers, docs=docstore, vocab=gid, idf=idf_lucene(df, n_nonempty), df=df,
                         avgdl=avgdl, n_docs_nonempty=n_nonempty)
    return BM25Retriever(ix)


def _ranked(r, terms, k, params=None):
    dn, sc = r.search_arrays(terms, k, params)
    ids = r.index.docs.doc_ids
    return [(ids[int(n) >> 32][int(n) & 0xFFFFFFFF], float(s)) for n, s in zip(dn, sc)]


def _queries(words, n=300, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        q = list(rng.choice(words, size=int(rng.integers(1, 13))))
        out.append({t: q.count(t) for t in q})
    out.append({"w000": 1, "absent": 2})
    out.append({"absent": 1})
    return out


def _brute(docs, ids, terms, k, params):
    """Every document scored from the formula, ranked by (-score, doc_id)."""
    n = sum(1 for d in docs if d)
    dl = np.array([len(d) for d in docs])
    avgdl = dl.sum() / n
    L = dl.astype(float) if params.length_norm == "exact" else lucene_lengths(dl)
    out = []
    for i, d in enumerate(docs):
        s = 0.0
        for t, w in terms.items():
            tf = d.count(t)
            if tf:
                df = sum(t in x for x in docs)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += w * idf * tf / (tf + params.k1 * (1 - params.b + params.b * L[i] / avgdl))
        if s > 0:
            out.append((ids[i], s))
    return sorted(out, key=lambda x: (-x[1], x[0]))[:k]


PARAMS = [BM25Params(), BM25Params(1.2, 0.75), BM25Params(0.9, 0.4, "exact"), BM25Params(0.0, 0.3)]


@needs_numba
@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_pruned_equals_exhaustive_equals_numpy_reference(params):
    docs, ids, words = _corpus()
    r = _index(docs, ids, shards=3)
    n_ties = 0
    for terms in _queries(words):
        for k in (1, 3, 10, 100):
            r.prune_min_postings = 0  # prune wherever it can
            pruned = _ranked(r, terms, k, params)
            r.prune_min_postings = -1
            exhaustive = _ranked(r, terms, k, params)
            for s in r.index.shards:
                s.use_kernel = False
            reference = _ranked(r, terms, k, params)
            for s in r.index.shards:
                s.use_kernel = True
            assert pruned == exhaustive == reference, (terms, k)  # same docs, same bits
            sc = [s for _, s in exhaustive]
            n_ties += sum(a == b for a, b in zip(sc, sc[1:]))
    assert n_ties > 100  # the fixture really exercises tie-breaking
    assert r.prune_stats[0] > 50  # ... and pruning: shards that stopped admitting documents (or skipped blocks)


@pytest.mark.parametrize("params", PARAMS[:3], ids=str)
def test_matches_brute_force_formula(params):
    docs, ids, words = _corpus(seed=3, n=250)
    r = _index(docs, ids, shards=2)
    for terms in _queries(words, n=60, seed=4):
        for k in (5, 50):
            got = _ranked(r, terms, k, params)
            want = _brute(docs, ids, terms, k, params)
            assert len(got) == len(want)
            np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-12, atol=1e-12)
            # Documents agree wherever the scores are not within rounding of each other.
            for (gd, gs), (wd, ws) in zip(got, want):
                near = [d for d, s in want if abs(s - gs) < 1e-9]
                assert gd == wd or gd in near


@pytest.mark.parametrize("prune", [0, -1])
def test_sharded_equals_unsharded(prune):
    docs, ids, words = _corpus(seed=5)
    one, four = _index(docs, ids, shards=1), _index(docs, ids, shards=4)
    one.prune_min_postings = four.prune_min_postings = prune
    for terms in _queries(words, n=150, seed=6):
        for k in (10, 100):
            assert _ranked(one, terms, k) == _ranked(four, terms, k)


def test_bounds_computed_when_the_index_predates_them():
    docs, ids, words = _corpus(seed=7, n=300)
    old, new = _index(docs, ids, 2, bounds_on_disk=False), _index(docs, ids, 2, bounds_on_disk=True)
    for a, b in zip(old.index.shards, new.index.shards):
        np.testing.assert_array_equal(a.bounds()[0], b.bounds()[0])
        np.testing.assert_array_equal(a.bounds()[1], b.bounds()[1])
    old.prune_min_postings = 0
    for terms in _queries(words, n=50, seed=8):
        assert _ranked(old, terms, 10) == _ranked(new, terms, 10)


def test_term_bounds_are_the_per_term_extremes():
    docs, _, _ = _corpus(seed=9, n=200)
    p = build_postings(docs)
    max_tf, min_dl = term_bounds(p.indptr, p.docs, p.tfs, p.doclen)
    for t in range(len(p.terms)):
        s, e = p.indptr[t], p.indptr[t + 1]
        assert max_tf[t] == p.tfs[s:e].max() and min_dl[t] == p.doclen[p.docs[s:e]].min()
    if kernels.HAVE_NUMBA:
        a, b = kernels.term_bounds(p.indptr, p.docs, p.tfs, p.doclen)
        np.testing.assert_array_equal(a, max_tf)
        np.testing.assert_array_equal(b, min_dl)


@needs_numba
def test_negative_weights_score_exhaustively_like_the_reference():
    docs, ids, words = _corpus(seed=10, n=300)
    r = _index(docs, ids, 2)
    r.prune_min_postings = 0  # must be ignored: bounds assume positive weights
    rng = np.random.default_rng(11)
    for terms in _queries(words, n=80, seed=12):
        terms = {t: w * (-1 if rng.random() < 0.3 else 1) for t, w in terms.items()}
        fast = _ranked(r, terms, 20)
        for s in r.index.shards:
            s.use_kernel = False
        assert fast == _ranked(r, terms, 20)
        for s in r.index.shards:
            s.use_kernel = True


@needs_numba
def test_block_maxima_are_each_blocks_largest_impact():
    docs, ids, _ = _corpus(seed=14, n=400)
    r = _index(docs, ids, shards=1)
    s = r.index.shards[0]
    den, itab = r._table(BM25Params())
    bstart, bmax, tmax, tkth, blast = kernels.block_maxima(s.indptr, s.docs, s.tfs, s.norms, den, itab, 8)
    nk = len(kernels.KTH_BLOCKS)
    for t in range(len(s.indptr) - 1):
        a, e = s.indptr[t], s.indptr[t + 1]
        tf = s.tfs[a:e].astype(np.float64)
        imp = tf / (tf + den[s.norms[s.docs[a:e]]])  # the same expression, elementwise
        want = [imp[i:i + 8].max() for i in range(0, e - a, 8)]
        assert bmax[bstart[t]:bstart[t + 1]].tolist() == want
        assert tmax[t] == imp.max()
        assert blast[bstart[t]:bstart[t + 1]].tolist() == [s.docs[min(i + 8, e - a) - 1 + a]
                                                           for i in range(0, e - a, 8)]  # each block's last
        for j, kk in enumerate(kernels.KTH_BLOCKS):
            assert tkth[t * nk + j] == (sorted(want, reverse=True)[kk - 1] if len(want) >= kk else 0.0)
    assert (tkth > 0).any()  # the fixture has terms with enough blocks


@needs_numba
def test_block_max_pruning_skips_postings_and_is_exact():
    """Rare terms next to very common ones (the case per-term bounds cannot prune: the
    common term's largest impact is above the k-th score, most of its blocks are not), on
    one shard and four: the block path must skip postings and still equal exhaustive scoring."""
    rng = np.random.default_rng(15)
    n = 3000
    docs = []
    for i in range(n):
        d = ["common"] * int(rng.integers(0, 4)) + ["mid"] * int(rng.random() < 0.3) + \
            [f"f{int(x)}" for x in rng.integers(0, 200, size=int(rng.integers(3, 40)))]
        if i % 97 == 0:
            d.append("rare")
        docs.append(d)
    ids = [f"doc{i:05d}" for i in range(n)]
    for shards in (1, 4):
        r = _index(docs, ids, shards=shards)
        for terms in ({"rare": 1, "common": 1}, {"rare": 1, "mid": 1, "common": 2}, {"common": 1},
                      {"mid": 1, "common": 1, "f3": 1}):
            for k in (1, 10, 100):
                r.prune_min_postings = -1
                exhaustive = _ranked(r, terms, k)
                r.prune_min_postings = 0
                assert _ranked(r, terms, k) == exhaustive, (shards, terms, k)
        assert r.prune_stats[1] > 0  # postings in blocks never read


@needs_numba
def test_block_lookups_find_candidates_anywhere_in_a_skipped_block():
    """Candidates that a skipped block holds at its first, a middle and its last posting, and
    in a short last block: the lookup (the block by its last document, then a bisection) must
    find each, or its score would miss the common term's part. The common term is in every
    document, so its blocks are runs of 64 consecutive documents."""
    n = kernels.BLOCK * 12 + 20
    docs = []
    for i in range(n):
        d = ["common"] * (1 + (i // 7) % 3) + [f"w{i % 50}"]
        if i % kernels.BLOCK in (0, 31, kernels.BLOCK - 1) or i >= n - 3:
            d += ["rare"] * (1 + (i // kernels.BLOCK) % 2)
        docs.append(d)
    ids = [f"doc{i:05d}" for i in range(n)]
    r = _index(docs, ids, shards=1)
    for k in (1, 10, 20, 39):
        r.prune_min_postings = -1
        exhaustive = _ranked(r, {"rare": 1, "common": 1}, k)
        r.prune_min_postings = 0
        assert _ranked(r, {"rare": 1, "common": 1}, k) == exhaustive, k
    assert r.prune_stats[1] > 0  # the common term's blocks were skipped, its candidates looked up


@needs_numba
def test_theta_from_blocks_is_a_lower_bound_on_the_kth_score():
    docs, ids, words = _corpus(seed=16, n=5000, vocab=60)
    r = _index(docs, ids, shards=2)
    r.prune_min_postings = 0
    r._blocks(BM25Params())
    tkth = r._block_args[1][3::5]  # each shard's (bstart, bmax, tmax, tkth, blast)
    positive = 0
    for terms in _queries(words, n=120, seed=17):
        gids, ws = r._canonical(terms)
        if len(gids) == 0:
            continue
        for k in (1, 10, 50, 100, 1000):
            r.prune_min_postings = -1
            exact = _ranked(r, terms, k)
            r.prune_min_postings = 0
            for s, shard in enumerate(r.index.shards):
                theta = kernels._theta_from_blocks(tkth[s], shard.local_terms(gids), ws, k)
                positive += theta > 0
                if len(exact) < k:
                    assert theta == 0.0
                else:
                    assert theta <= exact[-1][1]
    assert positive > 100


@needs_numba
def test_block_maxima_only_for_the_default_parameters():
    """Per-query (k1, b) overrides must not allocate anything proportional to the index."""
    docs, ids, words = _corpus(seed=18, n=300)
    r = _index(docs, ids, shards=2)
    r.prune_min_postings = 0
    _ranked(r, {"w000": 1, "w001": 1}, 10, BM25Params(1.2, 0.75))
    assert r._block_args is None
    _ranked(r, {"w000": 1, "w001": 1}, 10)
    assert r._block_args is not None


@needs_numba
def test_queries_below_the_threshold_take_the_pruning_free_kernel(monkeypatch):
    """A query whose terms' df sum stays below ``prune_min_postings`` cannot prune in any
    shard: it goes to ``search_shards_plain`` / ``search_batch_plain`` (so a small corpus
    never compiles pruning or builds block maxima) and gets exactly the pruned path's answer."""
    from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
    docs, ids, words = _corpus(seed=21)
    eager, plain = _index(docs, ids, shards=3), _index(docs, ids, shards=3)
    for r in (eager, plain):  # the fixture's terms are plain words: no stopwords, no stemming
        r.index.analyzer = Analyzer(AnalyzerConfig(stopwords=False, stemmer="none"))
    eager.prune_min_postings = 0
    df = plain.index.df
    plain.prune_min_postings = int(df.sum()) + 1  # no query reaches it
    queries = _queries(words, n=120, seed=4)
    texts = [" ".join(t for t, c in terms.items() for _ in range(c)) for terms in queries]
    want = {i: _ranked(eager, terms, 10) for i, terms in enumerate(queries)}
    want_batch = eager.search_texts(texts, 10)
    calls = []
    monkeypatch.setattr(kernels, "search_shards", lambda *a: calls.append(a))
    monkeypatch.setattr(kernels, "search_batch", lambda *a: calls.append(a))
    assert {i: _ranked(plain, terms, 10) for i, terms in enumerate(queries)} == want
    got = plain.search_texts(texts, 10)
    assert all(np.array_equal(a, b) for a, b in zip(got, want_batch))
    assert not calls and plain._block_args is None
    monkeypatch.undo()
    # At the threshold: the pruning kernel again, with its block maxima.
    plain.prune_min_postings = max(int(df[[plain.index.vocab[t] for t in terms if t in plain.index.vocab]].sum())
                                   for terms in queries)
    got = plain.search_texts(texts, 10)
    assert all(np.array_equal(a, b) for a, b in zip(got, want_batch)) and plain._block_args is not None


@needs_numba
@pytest.mark.parametrize("params", [BM25Params(), BM25Params(1.2, 0.75), BM25Params(0.9, 0.4, length_norm="exact")],
                         ids=str)
def test_per_posting_impacts_give_the_grids_answers(monkeypatch, params):
    """A small index keeps each posting's impact (``_impacts``) and the exhaustive kernels
    read it; an index above ``IMPACT_POSTINGS`` computes each from the grid. Both must give
    the same documents, score bits and tie order, per query and in a batch, per-query (k1, b)
    and exact lengths included; only the default and the latest override stay cached."""
    from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
    from funnel.serving.lexical import retriever as lexical
    docs, ids, words = _corpus(seed=23)
    cached, grid = _index(docs, ids, shards=3), _index(docs, ids, shards=3)
    for r in (cached, grid):
        r.index.analyzer = Analyzer(AnalyzerConfig(stopwords=False, stemmer="none"))
        r.prune_min_postings = -1
    queries = _queries(words, n=120, seed=5)
    texts = [" ".join(t for t, c in terms.items() for _ in range(c)) for terms in queries]
    want = {i: _ranked(cached, terms, 10, params) for i, terms in enumerate(queries)}
    want_batch = cached.search_texts(texts, 10, params)
    assert cached._impact_args and cached._impacts(params)[0].shape == (3, 2)
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0)
    assert grid._impacts(params)[0].shape == (0, 2)
    assert {i: _ranked(grid, terms, 10, params) for i, terms in enumerate(queries)} == want
    assert all(np.array_equal(a, b) for a, b in zip(grid.search_texts(texts, 10, params), want_batch))
    assert not grid._impact_args
    monkeypatch.undo()
    for p in (BM25Params(1.1, 0.5), BM25Params(1.3, 0.6), BM25Params()):
        cached._impacts(p)
    assert len(cached._impact_args) == 2 and BM25Params() in cached._impact_args


@needs_numba
@pytest.mark.parametrize("k", [1, 10, 32, 33, 100, 250])
def test_top_k_collector_keeps_the_rankings_best(k):
    """The exhaustive paths' top-k collector (a heap up to HEAP_K, above it a buffer cut back
    by quickselect whenever it fills) returns exactly the best k by (score descending, id
    rank ascending), across several shards' offers, with scores drawn from a few values
    (long runs of ties) and orders that make the bar rise early, late, or never."""
    rng = np.random.default_rng(k)
    for trial in range(12):
        shards = int(rng.integers(1, 4))
        sizes = rng.integers(0, 3000, size=shards)
        rank = rng.permutation(int((sizes + 1).sum())).astype(np.int64)
        bv, br, bd, tv, tr = kernels._new_top(k)
        n, want, off = 0, [], 0
        for s, size in enumerate(sizes):
            acc = np.zeros(size + 1)
            ids = rng.permutation(size + 1)[:size].astype(np.int32)
            vals = rng.integers(0, 6 if trial % 2 else 4000, size=size) / 7.0  # zeros never rank
            if trial % 3 == 1:
                vals = np.sort(vals)  # rising: every offer beats the bar
            elif trial % 3 == 2:
                vals = np.sort(vals)[::-1].copy()  # falling: the bar is set at once
            acc[ids] = vals
            r = rank[off:off + size + 1]
            base = np.int64(s) << 32
            n, tv, tr = kernels._offer_scores(acc, ids, size, r, base, bv, br, bd, n, tv, tr, k, True)
            assert not acc.any()  # every score read was reset
            want += [(-v, r[d], int(base | d)) for d, v in zip(ids.tolist(), vals.tolist()) if v > 0]
            off += size + 1
        dn, sc = kernels._top_sorted(bv, br, bd, n, k)
        want = sorted(want)[:k]
        assert dn.tolist() == [d for _, _, d in want]
        assert sc.tolist() == [-v for v, _, _ in want]
