"""Oracles for the exhaustive BM25 kernels over many postings: the dense read-back (one scan
of a shard's accumulator instead of a touched list), the stored 16-bit impact levels with exact
rescoring of the candidates, and the per-query choice between block-max pruning and
exhaustive scoring. Each must give the NumPy reference's documents, score bits and tie
order; and the build must store the impacts serving reads, checked when an index opens."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_bm25_pruning import _corpus, _index, _queries, _ranked

from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
from funnel.pipelines.store.artifacts import IndexFormatError
from funnel.pipelines.lexical.postings import IMPACT_FILE, IMPACT_KEY_FILE, load_impacts
from funnel.pipelines.lexical.shard import shard_name
from funnel.serving import kernels
from funnel.serving.lexical import retriever as lexical
from funnel.serving.lexical.bm25 import BM25Params
from funnel.serving.lexical.retriever import _DEFAULT, default_impacts, impacts_key
from funnel.serving.search import open_index

needs_numba = pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba absent: only the NumPy path runs")


def _with_impacts(r):
    """The in-memory index as a build leaves it: every shard's impact levels stored."""
    for s in r.index.shards:
        s.stored_impacts = (impacts_key(r.index.avgdl), default_impacts(s.docs, s.tfs, s.norms, r.index.avgdl))
    r.index.analyzer = Analyzer(AnalyzerConfig(stopwords=False, stemmer="none"))  # the fixture's plain words
    return r


def _reference(r, terms, k, params=None):
    for s in r.index.shards:
        s.use_kernel = False
    try:
        return _ranked(r, terms, k, params)
    finally:
        for s in r.index.shards:
            s.use_kernel = True


def _texts(queries):
    return [" ".join(t for t, c in terms.items() for _ in range(c)) for terms in queries]


def _rows(r, texts, k, params=None):
    pos, score, cnt = r.search_texts(texts, k, params)
    ids = np.concatenate(r.index.docs.doc_ids)
    return [[(ids[p], float(s)) for p, s in zip(pos[i, :cnt[i]], score[i, :cnt[i]])] for i in range(len(texts))]


@needs_numba
@pytest.mark.parametrize("shards", [1, 3])
def test_stored_impacts_rescored_give_the_references_answers(monkeypatch, shards):
    """Impact levels summed, the candidates near the k-th rescored from their postings:
    the same documents, bits and tie order as the reference, per query and in a batch, for
    queries dense enough to be read back by a scan and sparse ones read from touched lists,
    for k from 1 to past the candidate buffer (which must grow on runs of exact ties)."""
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0)  # no float64 impacts: the stored levels are read
    docs, ids, words = _corpus(seed=31, n=900, vocab=1500)
    r = _with_impacts(_index(docs, ids, shards))
    r.prune_min_postings = -1
    r.rescore_min_postings = 0  # every query through the stored impacts
    r.dense_min_docs = 0  # shards this small are read back by a scan too where dense enough
    assert r._impacts32(_DEFAULT).shape == (shards, 2) and r._impacts(_DEFAULT)[0].shape == (0, 2)
    queries = _queries(words, n=150, seed=32) + [{"w000": 1}, {"w001": 1}, {"w002": 2, "w000": 1}]
    dense = sparse = 0
    for terms in queries:
        gids = np.array([r.index.vocab[t] for t in terms if t in r.index.vocab], dtype=np.int64)
        for s in r.index.shards:
            local = s.local_terms(gids)
            local = local[local >= 0]
            post = int((s.indptr[local + 1] - s.indptr[local]).sum())
            if post:
                dense += post * kernels.DENSE_DIVISOR >= s.n_docs
                sparse += post * kernels.DENSE_DIVISOR < s.n_docs
    assert dense > 20 and sparse > 20  # both read-backs are exercised
    texts = _texts(queries)
    n_ties = 0
    for k in (1, 7, 10, 33, 100, 400):
        want = [_reference(r, terms, k) for terms in queries]
        assert [_ranked(r, terms, k) for terms in queries] == want, k
        assert _rows(r, texts, k) == want, k
        n_ties += sum(a[1] == b[1] for row in want for a, b in zip(row, row[1:]))
    assert n_ties > 1000  # single common terms: long runs of equal scores at the k-th


@needs_numba
def test_overrides_and_stale_impacts_fall_back_to_exact_scoring(monkeypatch):
    """Stored impacts hold the default (k1, b) for one avgdl: a per-query override, or
    impacts stored for another avgdl, never read them, and still answer as the reference."""
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0)
    docs, ids, words = _corpus(seed=33, n=500)
    r = _with_impacts(_index(docs, ids, 2))
    r.prune_min_postings = -1
    r.rescore_min_postings = 0
    override = BM25Params(1.2, 0.75)
    assert r._impacts32(override).shape == (0, 2)
    queries = _queries(words, n=60, seed=34)
    for terms in queries:
        assert _ranked(r, terms, 10, override) == _reference(r, terms, 10, override)
    stale = _with_impacts(_index(docs, ids, 2))
    key, arr = stale.index.shards[1].stored_impacts
    stale.index.shards[1].stored_impacts = ({**key, "avgdl": key["avgdl"] * 2}, arr)
    stale.prune_min_postings = -1
    stale.rescore_min_postings = 0
    assert stale._impacts32(_DEFAULT).shape == (0, 2)  # one stale shard: none are read
    for terms in queries:
        assert _ranked(stale, terms, 10) == _reference(stale, terms, 10)


@needs_numba
@pytest.mark.parametrize("use_impacts", [False, True])
def test_choosing_pruning_per_query_keeps_the_answers(monkeypatch, use_impacts):
    """With a pruning threshold above 0, each query is pruned only where its bounds already
    rule out most of its postings (``kernels._prune_pays``), and otherwise scored
    exhaustively: both kinds occur among these queries, and every answer is the reference's."""
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0 if use_impacts else lexical.IMPACT_POSTINGS)
    docs, ids, words = _corpus(seed=35, n=16000)
    r = _with_impacts(_index(docs, ids, 1))  # a common term spans 200 blocks: most below its 10th best
    r.prune_min_postings = 1
    r.rescore_min_postings = 0
    r.dense_min_docs = 0
    queries = _queries(words, n=100, seed=36) + [{w: 1} for w in words[:40]]  # one common term: prunable
    meta, proto = r._shard_args("lucene-byte4")[:2]
    den, itab = r._table(_DEFAULT)
    chosen = []
    for terms in queries:
        gids, w = r._canonical(terms)
        if len(gids):
            chosen.append(kernels._prune_pays(meta, r._blocks(_DEFAULT), proto, den, itab, *r._buffers(), gids, w, 10))
    assert 5 <= sum(chosen) <= len(chosen) - 5, sum(chosen)  # both paths taken
    before = int(r.prune_stats[0])
    texts = _texts(queries)
    for k in (10, 100):
        want = [_reference(r, terms, k) for terms in queries]
        assert [_ranked(r, terms, k) for terms in queries] == want
        assert _rows(r, texts, k) == want
    assert int(r.prune_stats[0]) > before


@needs_numba
def test_approximate_candidates_keep_every_possible_top_k_document():
    """``_approx_margin``'s bound covers the quantization of every impact: for sums of up
    to 200 terms, impacts quantized as the build does (``_quantize``, levels rounded up)
    and summed as the kernel does (weights times ``IMPACT_STEP``, all in float32),
    the exact k-th score's documents all approximate at least c times the approximate k-th
    less the margin (the candidate bar; c: ``_approx_keep``'s float32 and float64 factors),
    whatever the weights' magnitudes; and the bar keeps few documents past
    the exact top k on these sums (the margin is not vacuous)."""
    rng = np.random.default_rng(7)
    quantize = np.vectorize(kernels._quantize)
    extra = []
    for trial in range(200):
        T = int(rng.integers(1, 200))
        n = 300
        w = rng.random(T) * 10 ** rng.uniform(-3, 2)
        v = rng.random((n, T)) * (rng.random((n, T)) < 0.5)
        v[v < 1e-6] = 0.0  # a posting's impact is above 0; absent terms add nothing
        q = np.where(v > 0, quantize(np.where(v > 0, v, 0.5)), 0.0)
        assert ((q >= 1) | (v == 0)).all() and (q <= kernels.IMPACT_LEVELS).all()
        assert (q * kernels.IMPACT_STEP >= v).all() and ((q - 1) * kernels.IMPACT_STEP < v)[v > 0].all()
        exact = np.zeros(n)
        approx = np.zeros(n, dtype=np.float32)
        qw = (w * kernels.IMPACT_STEP).astype(np.float32)
        for i in range(T):  # in order, as the kernels add them: float64 exact, float32 approximate
            exact += w[i] * v[:, i]
            approx += qw[i] * q[:, i].astype(np.float32)
        approx = approx.astype(np.float64)
        k = int(rng.integers(1, 50))
        kth_exact = np.sort(exact)[::-1][k - 1]
        kth_approx = np.sort(approx)[::-1][k - 1]
        c = kernels._approx_keep(T, 2.0 ** -24) * kernels._approx_keep(T, 2.0 ** -53)
        bar = kth_approx * c - kernels._approx_margin(w)
        assert (approx[exact >= kth_exact] >= bar).all(), trial
        extra.append(int((approx >= bar).sum()) - k)
    assert np.median(extra) < 300 - 50  # most documents are still ruled out


@needs_numba
def test_the_rescoring_lookup_finds_every_posting_and_reads_only_its_range():
    """``_find_all`` (interpolation, then galloping, then halving): on ascending lists,
    spread evenly or clustered, with values beside the range that must not be read, every
    id's position is numpy's ``searchsorted``'s where the id is there and -1 where not; on
    lists that do not ascend (a damaged ``docs.npy``) every position it gives lies in the
    range and holds the id."""
    from funnel.serving.kernels.exhaustive import _find_all
    rng = np.random.default_rng(3)
    for t in range(2000):
        nd = int(rng.integers(1, 5000))
        docs = np.sort(rng.choice(nd, size=min(int(rng.integers(0, 300)), nd), replace=False)).astype(np.int32)
        if t % 5 == 0 and len(docs) > 3:  # clustered: most of the list in the first 30 ids
            docs = np.unique(np.concatenate([docs[-3:], rng.integers(0, 30, size=len(docs))])).astype(np.int32)
        pad = int(rng.integers(0, 5))
        arr = np.concatenate([np.full(pad, -7, np.int32), docs, np.full(pad, 10 ** 6, np.int32)])
        lo, hi = pad, pad + len(docs)
        ids = np.sort(rng.choice(nd + 10, size=min(int(rng.integers(0, 60)), nd + 10), replace=False)) - 3
        pos = np.empty(len(ids), dtype=np.int64)
        _find_all(arr, lo, hi, ids.astype(np.int64), pos)
        assert (pos == np.where(np.isin(ids, docs), lo + np.searchsorted(docs, ids), -1)).all(), t
    for t in range(2000):
        arr = rng.integers(-10, 1000, size=int(rng.integers(1, 200))).astype(np.int32)
        lo = int(rng.integers(0, len(arr)))
        hi = int(rng.integers(lo, len(arr) + 1))
        ids = np.sort(rng.integers(-5, 1005, size=20)).astype(np.int64)
        pos = np.empty(20, dtype=np.int64)
        _find_all(arr, lo, hi, ids, pos)
        assert ((pos == -1) | ((pos >= lo) & (pos < hi))).all() and (arr[pos[pos >= 0]] == ids[pos >= 0]).all()


@needs_numba
def test_the_build_stores_the_impacts_serving_reads(demo_index_4):
    """Every shard's ``impacts.npy`` is published and checksummed, holds each posting's
    float64 impact for the default parameters as the least level at or above it (two bytes a
    posting), and is what serving maps."""
    ix = open_index(demo_index_4)
    b = ix.bm25
    den, itab = b._table(_DEFAULT)
    for s, shard in enumerate(ix.index.shards):
        rel = f"lexical/{shard_name(s)}"
        assert {f"{rel}/{IMPACT_FILE}", f"{rel}/{IMPACT_KEY_FILE}"} <= set(ix.index.manifest["files"])
        key, imp = load_impacts(os.path.join(ix.index.dir, rel))
        assert key == impacts_key(ix.index.avgdl) and imp.dtype == np.uint16 and key["dtype"] == "uint16"
        exact = kernels.posting_impacts(shard.docs, shard.tfs, shard.norms, den, itab)
        level = imp.astype(np.float64)
        assert (level >= 1).all() and (level / 65535 >= exact).all() and ((level - 1) / 65535 < exact).all()
    assert b._impacts32(_DEFAULT).shape == (ix.index.n_shards, 2)
    mapped = {int(a.ctypes.data) for a in b._impact32_args[1]}
    assert mapped == {int(s.stored_impacts[1].ctypes.data) for s in ix.index.shards}


@needs_numba  # the build stores impacts only where numba computes them
def test_damaged_impacts_are_refused_at_open(demo_index_1, tmp_path):
    """An ``impacts.npy`` of the wrong length, dtype or values stops the open with an error
    naming the file."""
    import shutil
    for bad, words in ((lambda a: a[:-1], "one impact per posting"), (lambda a: a.astype(np.float64), "uint16"),
                       (lambda a: a.astype(np.uint8), "expected uint16"),
                       (lambda a: np.where(np.arange(len(a)) == 3, np.uint16(0), a), "level 0 at position 3")):
        root = tmp_path / f"ix{len(os.listdir(tmp_path))}"
        shutil.copytree(demo_index_1, root)
        ix = open_index(str(root))
        path = os.path.join(ix.index.dir, "lexical", shard_name(0), IMPACT_FILE)
        arr = bad(np.load(path))
        os.remove(path)
        np.save(path, arr)
        with pytest.raises(IndexFormatError) as e:
            open_index(str(root), verify="none")
        assert IMPACT_FILE in str(e.value) and words in str(e.value)


@needs_numba  # the build stores impacts only where numba computes them
def test_an_index_with_float32_impacts_from_an_older_build_opens_and_answers_exactly(demo_index_1, tmp_path,
                                                                                   monkeypatch):
    """Format versioning: an index built before the 16-bit levels holds float32 impacts
    (``impacts.json`` dtype float32). It still opens (its impacts checked), never reads them
    (they are not levels) and answers every query as the NumPy reference, from its tfs and
    length codes; a float32 file that is out of range is still refused at the open."""
    import json
    import shutil
    root = tmp_path / "old"
    shutil.copytree(demo_index_1, root)
    ix = open_index(str(root))
    den, itab = ix.bm25._table(_DEFAULT)
    for s, shard in enumerate(ix.index.shards):  # rewrite each shard as the older build wrote it
        d = os.path.join(ix.index.dir, "lexical", shard_name(s))
        old = kernels.posting_impacts(shard.docs, shard.tfs, shard.norms, den, itab).astype(np.float32)
        os.remove(os.path.join(d, IMPACT_FILE))
        np.save(os.path.join(d, IMPACT_FILE), old)
        key = {**impacts_key(ix.index.avgdl), "dtype": "float32"}
        for k in ("levels", "rounding"):
            key.pop(k)
        with open(os.path.join(d, IMPACT_KEY_FILE), "w") as f:
            json.dump(key, f)
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0)  # as a large index: no float64 impacts in memory
    old_ix = open_index(str(root), verify="none")
    b = old_ix.bm25
    assert all(s.stored_impacts[1].dtype == np.float32 for s in old_ix.index.shards)
    assert b._impacts32(_DEFAULT).shape == (0, 2)  # not levels: never summed
    b.prune_min_postings, b.rescore_min_postings, b.dense_min_docs = -1, 0, 0
    vocab, df = old_ix.index.vocab, old_ix.index.df
    common = sorted(vocab, key=lambda t: (-int(df[vocab[t]]), t))[:12]  # the most postings: dense, tied
    texts = {f"{i}-{n}": " ".join(common[i:i + n]) for i in range(6) for n in (1, 3, 6)}
    for s in old_ix.index.shards:
        s.use_kernel = False
    want = old_ix.search_batch(texts, k=10)
    for s in old_ix.index.shards:
        s.use_kernel = True
    assert sum(len(v) == 10 for v in want.values()) >= 12
    assert old_ix.search_batch(texts, k=10) == want
    path = os.path.join(old_ix.index.dir, "lexical", shard_name(0), IMPACT_FILE)
    arr = np.load(path) * np.float32(2)
    os.remove(path)
    np.save(path, arr)
    with pytest.raises(IndexFormatError) as e:
        open_index(str(root), verify="none")
    assert IMPACT_FILE in str(e.value) and "outside (0, 1]" in str(e.value)


@needs_numba
def test_shards_with_uint16_and_int32_tfs_answer_as_the_reference(monkeypatch):
    """A build stores tfs as uint16 (``narrow_tfs``); an older build, or a shard with a tf past
    65,535, as int32. Shards of both widths in one index (a reindex keeps old shards) are read
    at the wider width (``kernels.tf_dtype``) on every kernel path (exhaustive, pruned,
    stored levels) and answer as the NumPy reference; shards all uint16 are mapped as they are."""
    from funnel.pipelines.lexical.postings import narrow_tfs
    monkeypatch.setattr(lexical, "IMPACT_POSTINGS", 0)
    docs, ids, words = _corpus(seed=37, n=900, vocab=400)
    assert narrow_tfs(np.array([1, 65535])).dtype == np.uint16
    assert narrow_tfs(np.array([1, 65536])).dtype == np.int32
    queries = _queries(words, n=80, seed=38)
    for widths in ((np.uint16, np.uint16, np.uint16), (np.uint16, np.int32, np.uint16)):
        r = _with_impacts(_index(docs, ids, 3))
        for s, dt in zip(r.index.shards, widths):
            s.tfs = np.asarray(s.tfs).astype(dt)
        proto = r._shard_args("lucene-byte4")[1]
        assert proto[1].dtype == np.result_type(*widths)
        for prune, rescore in ((-1, -1), (0, -1), (-1, 0)):
            r.prune_min_postings, r.rescore_min_postings = prune, rescore
            for k in (10, 100):
                assert [_ranked(r, t, k) for t in queries] == [_reference(r, t, k) for t in queries], (widths, prune)


@needs_numba
def test_a_rare_term_beside_common_ones_is_pruned():
    """A query of one rare term (one block: its k-th block maximum bounds nothing) and two
    terms in every document: ``kernels._prune_pays`` reads the rare term's few postings for
    a k-th partial score, which rules out every block of the common terms, so the query is
    pruned, and it answers as the reference at k=10 and k=100. Before, only the block
    maxima's bound was known there (the common terms' 10th block maximum at their small
    weight), nothing was ruled out, and the query was scored exhaustively."""
    rng = np.random.default_rng(41)
    docs = []
    for i in range(16000):
        d = list(rng.choice(["alpha", "beta", "filler"], size=int(rng.integers(5, 60)), p=[0.3, 0.3, 0.4]))
        d += ["alpha", "beta"]  # in every document: the smallest weights
        if i % 500 == 0:
            d += ["rare"] * int(rng.integers(1, 4))
        docs.append(d)
    ids = [f"d{i:05d}" for i in range(len(docs))]
    r = _with_impacts(_index(docs, ids, 1))
    r.prune_min_postings = 1  # every query asks _prune_pays
    terms = {"rare": 1, "alpha": 1, "beta": 1}
    gids, w = r._canonical(terms)
    meta, proto = r._shard_args("lucene-byte4")[:2]
    den, itab = r._table(_DEFAULT)
    assert kernels._prune_pays(meta, r._blocks(_DEFAULT), proto, den, itab, *r._buffers(), gids, w, 10)
    acc = r._buffers()[0]
    assert not acc.any()  # left zero for the scoring that follows
    before = int(r.prune_stats[0])
    for k in (10, 100):
        assert _ranked(r, terms, k) == _reference(r, terms, k)
    assert int(r.prune_stats[0]) > before  # pruned: the candidates went sorted
