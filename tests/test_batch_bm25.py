"""The batch BM25 path (``Searcher.search_batch`` mode bm25 -> ``BM25Retriever.search_texts``
-> ``kernels.search_batch``) against the per-query path it replaces: same documents, same
score bits, same tie order, for every query; chunked ASCII analysis against the analyzer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from funnel.pipelines.lexical.analysis import _FINGERPRINT_PROBE, Analyzer, AnalyzerConfig
from funnel.serving import kernels

from conftest import need_shared
from test_bm25_pruning import PARAMS, _corpus, _index


def _per_query(r, text, k, params):
    dn, sc = r.search_arrays(dict(r.query_terms(text)), k, params)
    offsets = np.cumsum([0] + [s.n_docs for s in r.index.shards])
    return (offsets[dn >> 32] + (dn & 0xFFFFFFFF)).tolist(), sc.tolist()


def _texts(words, n=250, seed=21):
    rng = np.random.default_rng(seed)
    seps = [" ", "  ", "\t", "\n", ", ", ". ", "-", "/"]
    out = []
    for _ in range(n):
        toks = list(rng.choice(words + ["absent", "W001", "w002's"], size=int(rng.integers(1, 14))))
        out.append("".join(t + str(rng.choice(seps)) for t in toks))
    out += ["w000 café w001 w000", "absent only", "...", " w003 ", "naïve w004\u00a0w005", "w006" * 3]
    return out


def _retriever(shards):
    docs, ids, words = _corpus(seed=13, n=500)
    r = _index(docs, ids, shards=shards)
    # The fixture's terms are plain words: analysis without stopwords or stemming keeps them.
    r.index.analyzer = Analyzer(AnalyzerConfig(stopwords=False, stemmer="none"))
    return r, words


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_search_texts_equals_per_query_search(shards, params):
    r, words = _retriever(shards)
    texts = _texts(words)
    n_ties = 0
    for prune in ([-1, 0] if kernels.HAVE_NUMBA else [-1]):
        r.prune_min_postings = prune
        for k in (1, 10, 100):
            pos, sc, cnt = r.search_texts(texts, k, params)
            for i, t in enumerate(texts):
                want = _per_query(r, t, k, params)
                assert (pos[i, :cnt[i]].tolist(), sc[i, :cnt[i]].tolist()) == want, (t, k, prune)
                n_ties += sum(a == b for a, b in zip(want[1], want[1][1:]))
    assert n_ties > 50  # tie order is really exercised
    for s in r.index.shards:  # the NumPy reference path answers the batch too
        s.use_kernel = False
    pos, sc, cnt = r.search_texts(texts, 10, params)
    for s in r.index.shards:
        s.use_kernel = True
    r.prune_min_postings = -1
    pos2, sc2, cnt2 = r.search_texts(texts, 10, params)
    for i in range(len(texts)):
        assert pos[i, :cnt[i]].tolist() == pos2[i, :cnt2[i]].tolist()
        assert sc[i, :cnt[i]].tolist() == sc2[i, :cnt2[i]].tolist()


def test_empty_batch_and_queries_without_known_terms():
    r, _ = _retriever(2)
    pos, sc, cnt = r.search_texts([], 10)
    assert pos.shape == (0, 10) and cnt.shape == (0,)
    pos, sc, cnt = r.search_texts(["absent", "   ", "w000"], 5)
    assert cnt.tolist()[:2] == [0, 0] and cnt[2] > 0


def test_query_gids_equal_the_analyzer_on_whole_texts():
    """ASCII text is analyzed per whitespace chunk (cached); the stream must be the whole
    text's: possessives, mid-word punctuation, long tokens, numbers, e-mail, URLs."""
    r, _ = _retriever(1)
    a = Analyzer()
    r.index.analyzer = a
    r.index.vocab = {}
    texts = [_FINGERPRINT_PROBE, "John's O'Neill's don't  U.S.A.\tv2.0.1\n3.14,1,000 a_b __ x" + "y" * 300,
             "john.doe@example.com https://www.example.com/path?q=1 'quoted' \"double\" (paren) [x]",
             "COVID-19 SARS-CoV-2 state-of-the-art e.g. i.e., 5'-UTR 1:2 a;b 10:30 it's", "\x1c a\x1fb \x0bc\x0cd"]
    vocab = {}
    for t in texts:
        for term in a.analyze(t):
            vocab.setdefault(term, len(vocab))
    r.index.vocab = vocab
    qptr, gids = r.query_gids(texts)
    for i, t in enumerate(texts):
        assert gids[qptr[i]:qptr[i + 1]].tolist() == [vocab[x] for x in a.analyze(t)], t
    qptr2, gids2 = r.query_gids(texts)  # from the chunk cache
    assert qptr2.tolist() == qptr.tolist() and gids2.tolist() == gids.tolist()


def test_the_chunk_cache_stays_within_its_bound(monkeypatch):
    """Distinct chunks past ``CHUNK_CACHE_ENTRIES`` clear the cache instead of growing the
    process (a stream of distinct chunks was held to 1M, ~550 MiB), and every text's terms
    are still the analyzer's."""
    from funnel.serving.lexical import retriever as lexical
    monkeypatch.setattr(lexical, "CHUNK_CACHE_ENTRIES", 8)
    r, _ = _retriever(1)
    a = Analyzer()
    r.index.analyzer = a
    words = [f"w{i:03d}" for i in range(40)]
    r.index.vocab = {w: i for i, w in enumerate(words)}
    sizes = []
    for i in range(0, 40, 3):
        text = " ".join(words[i:i + 5]) + f" x{i}"
        qptr, gids = r.query_gids([text])
        assert gids.tolist() == [r.index.vocab[t] for t in a.analyze(text) if t in r.index.vocab]
        sizes.append(len(r._chunk_gids))
    assert 0 < max(sizes) <= 8 and any(b < a for a, b in zip(sizes, sizes[1:]))  # kept, and cleared when full


def _oracle(ix, queries, k, remove_query=False, **options):
    p = ix._bm25_params(dict(options))
    out = {}
    for qid, q in queries.items():
        dn, sc = ix.bm25.search_arrays(dict(ix.bm25.query_terms(q.strip())), k + remove_query, p)
        hits = list(zip(ix.index.docs.doc_ids_of(dn), sc.tolist()))
        out[qid] = [h for h in hits if not remove_query or h[0] != qid][:k]
    return out


def test_search_batch_equals_per_query_on_a_built_index(demo_index_4, demo_corpus):
    from funnel.serving.search import SearchError, open_index
    ix = open_index(demo_index_4)
    rows = [json.loads(l) for l in open(demo_corpus)]
    queries = {r["_id"]: (r.get("title") or r["text"])[:120] for r in rows[:150]}
    queries["odd"] = "  antibiotics résistance — cells  "
    for k in (1, 10, 100):
        for rq in (False, True):
            got = ix.search_batch(queries, k=k, remove_query=rq)
            assert list(got) == list(queries) and got == _oracle(ix, queries, k, rq)
    assert ix.search_batch(queries, k=10, k1=1.2, b=0.75) == _oracle(ix, queries, 10, k1=1.2, b=0.75)
    import funnel.serving.search as search_mod
    cells, search_mod.BATCH_CELLS = search_mod.BATCH_CELLS, 7 * 11  # 7 queries per compiled call
    try:
        got = ix.search_batch(queries, k=10, remove_query=True)
    finally:
        search_mod.BATCH_CELLS = cells
    assert list(got) == list(queries) and got == _oracle(ix, queries, 10, True)
    bad = {"a": queries[next(iter(queries))], "empty": "   ", "long": "x" * 100_001, "num": 5}
    errors = {}
    got = ix.search_batch(bad, k=5, errors=errors)
    assert list(got) == ["a"] and set(errors) == {"empty", "long", "num"}
    with pytest.raises(SearchError, match="'empty'"):
        ix.search_batch(bad, k=5)


@pytest.mark.parametrize("ds", ["scifact", "nfcorpus"])
def test_search_batch_equals_per_query_on_every_beir_query(ds, beir_index):
    from funnel.serving.search import open_index
    ddir = need_shared("beir", ds)
    ix = open_index(beir_index(ds))
    qs = {o["_id"]: o["text"] for o in map(json.loads, open(f"{ddir}/queries.jsonl"))}
    for k in (10, 100):
        assert ix.search_batch(qs, k=k, remove_query=True) == _oracle(ix, qs, k, True)


@pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba absent: the kernels do not exist")
def test_query_weights_are_the_canonical_order_short_and_long():
    """A query's ids (with repeats) become distinct ids with count · idf, ordered by weight
    descending then id ascending (``np.lexsort((gids, -ws))``, what the per-query path
    does), both where they are sorted by insertion (up to SMALL_SORT ids) and through sorts
    above it; repeated idf values make ties; zero weights are dropped by ``_canonical``."""
    rng = np.random.default_rng(3)
    idf = rng.choice([0.5, 1.25, 2.0, 3.5], size=400)
    for n in list(range(0, 20)) + [kernels.SMALL_SORT, kernels.SMALL_SORT + 1, 150, 500]:
        raw = rng.integers(0, 400 if n % 2 else 40, size=n).astype(np.int64)
        g, w = kernels._query_weights(raw, idf)
        ug, cnt = np.unique(raw, return_counts=True)
        ws = cnt * idf[ug]
        order = np.lexsort((ug, -ws))
        assert g.tolist() == ug[order].tolist() and w.tolist() == ws[order].tolist()
        raw_w = rng.choice([0.0, 1.0, 2.5], size=len(ug))  # _canonical alone, with zero weights
        perm = rng.permutation(len(ug))  # ids in any order
        g2, w2 = kernels._canonical(ug[perm], raw_w[perm], idf)
        keep = raw_w != 0.0
        ws2 = raw_w[keep] * idf[ug[keep]]
        order2 = np.lexsort((ug[keep], -ws2))
        assert g2.tolist() == ug[keep][order2].tolist() and w2.tolist() == ws2[order2].tolist()
