"""Packed postings (issue 50, item 1): ``funnel build --postings packed`` stores each term's
document gaps and tfs bit-packed per block of 128 postings, and serving decodes the terms a
query reads into a bounded cache (``serving/lexical/packed.py``).

What must hold: the codec gives back exactly what it packed; a packed index answers every
query exactly as the plain index of the same corpus does (ids and scores, every path: the
batch and single-query kernels, pruning, other BM25 parameters, filters, explanations,
paging, SIRA), also when the cache is far smaller than one query's postings; it is much
smaller on disk; a reindex keeps it packed; and a damaged packed file is a clear error,
never a crash. Real indexes built by the local engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fields_corpus import write_corpus
from funnel.pipelines.store.artifacts import read_current
from funnel.serving.errors import IndexDamaged
from funnel.serving.kernels.packed import PACK_BLOCK, pack_postings, term_blocks, unpack_terms
from funnel.serving.search import Searcher

QUERIES = ["river", "apple stone", "market signal garden", "harbor ledger window orbit", "castle",
           "dolphin falcon glacier island", "engine", "river river stone", "kettle lemon bridge jungle apple"]


def _random_postings(rng, n_docs: int, n_terms: int, tf_max: int, tf_dtype):
    indptr, docs, tfs = [0], [], []
    for _ in range(n_terms):
        df = int(rng.integers(0, min(n_docs, 3 * PACK_BLOCK) + 1))
        d = np.sort(rng.choice(n_docs, df, replace=False)) if df else np.zeros(0, dtype=np.int64)
        docs.extend(d.tolist())
        tfs.extend(rng.integers(1, tf_max + 1, df).tolist())
        indptr.append(len(docs))
    return (np.asarray(indptr, dtype=np.int64), np.asarray(docs, dtype=np.int32),
            np.asarray(tfs, dtype=tf_dtype))


@pytest.mark.parametrize("n_docs,tf_max,tf_dtype", [(50, 3, np.uint16), (5_000, 65_535, np.uint16),
                                                     (2_000_000_000, 2**31 - 1, np.int32)])
def test_the_codec_gives_back_what_it_packed(n_docs, tf_max, tf_dtype):
    """Random lists at every width: dense ones (gaps of 0 bits), ids near 2**31 (31-bit gaps),
    tfs up to 16 and 31 bits, empty terms, partial last blocks."""
    rng = np.random.default_rng(n_docs)
    for _ in range(20):
        n_terms = int(rng.integers(1, 12))
        if n_docs > 10**6:  # choice without replacement over 2e9 ids: draw, then dedupe
            indptr, docs, tfs = [0], [], []
            for _ in range(n_terms):
                d = np.unique(rng.integers(0, n_docs, int(rng.integers(0, 300))))
                docs.extend(d.tolist())
                tfs.extend(rng.integers(1, tf_max + 1, len(d)).tolist())
                indptr.append(len(docs))
            indptr, docs, tfs = (np.asarray(indptr, dtype=np.int64), np.asarray(docs, dtype=np.int32),
                                 np.asarray(tfs, dtype=tf_dtype))
        else:
            indptr, docs, tfs = _random_postings(rng, n_docs, n_terms, tf_max, tf_dtype)
        words, boff, first, width = pack_postings(indptr, docs, tfs)
        assert len(first) == term_blocks(indptr)[-1]
        out_d = np.full(len(docs), -1, dtype=np.int32)
        out_t = np.zeros(len(docs), dtype=tf_dtype)
        assert unpack_terms(words, boff, first, width, indptr, term_blocks(indptr), n_docs,
                            int(np.iinfo(tf_dtype).max),
                            np.arange(n_terms, dtype=np.int64), out_d, out_t) == 0
        assert np.array_equal(out_d, docs) and np.array_equal(out_t, tfs)


@pytest.mark.parametrize("n_docs,tf_max,tf_dtype", [(50, 3, np.uint16), (5_000, 65_535, np.uint16),
                                                     (1 << 24, 2**31 - 1, np.int32)])
def test_scoring_straight_from_blocks_adds_what_the_decoded_levels_add(n_docs, tf_max, tf_dtype):
    """``accumulate_packed`` (the exhaustive pass over a term the cache does not hold) reads
    each block's gaps and tfs as it adds them: on random lists at every width (gaps of 0 to
    24 bits, tfs of 0 to 31 bits, partial last blocks, empty terms), both ways of adding
    (the dense read-back and the touched list) give the sums and the first-seen documents
    that the decoded ids and levels give, added term by term in float32 as the kernel adds."""
    from funnel.serving.kernels.layout import FAULT_PACKED
    from funnel.serving.kernels.packed import accumulate_packed, level_grid, unpack_terms_levels
    rng = np.random.default_rng(n_docs + 1)
    nt, cap = 7, 16
    table = rng.uniform(0.5, 3.0, nt)
    itab = np.array([tf / (tf + table[c]) if tf else 0.0 for tf in range(cap) for c in range(nt)])
    ltab = level_grid(itab)
    code = rng.integers(0, nt, n_docs).astype(np.uint8)
    for _ in range(6):
        n_terms = int(rng.integers(1, 8))
        indptr, docs, tfs = [0], [], []
        for _ in range(n_terms):
            d = np.unique(rng.integers(0, n_docs, int(rng.integers(0, 3 * PACK_BLOCK + 5))))
            docs.extend(d.tolist())
            tfs.extend(np.minimum(rng.geometric(rng.uniform(0.01, 1.0), len(d)), tf_max).tolist())
            indptr.append(len(docs))
        indptr, docs, tfs = (np.asarray(indptr, dtype=np.int64), np.asarray(docs, dtype=np.int32),
                             np.asarray(tfs, dtype=tf_dtype))
        tfs[rng.random(len(tfs)) < 0.01] = tf_max  # the widest tfs too
        words, boff, first, width = pack_postings(indptr, docs, tfs)
        tblock = term_blocks(indptr)
        max_tf = int(np.iinfo(tf_dtype).max)
        terms = rng.permutation(n_terms).astype(np.int64)
        weights = rng.uniform(0.1, 4.0, n_terms).astype(np.float32)
        od, ot = np.empty(len(docs), np.int32), np.empty(len(docs), tf_dtype)
        lev = np.empty(len(docs), np.uint16)
        assert unpack_terms_levels(words, boff, first, width, indptr, tblock, n_docs, max_tf, terms, od, ot,
                                   code, table, itab, ltab, lev) == 0
        want = np.zeros(n_docs, np.float32)
        for w, t in zip(weights, terms):
            a, e = indptr[t], indptr[t + 1]
            want[docs[a:e]] += w * lev[a:e].astype(np.float32)
        seen = np.unique(docs)
        args = (words, boff, first, width.reshape(-1), tblock, indptr, np.array([max_tf]), code, table, ltab, cap,
                terms, weights)
        acc = np.zeros(n_docs, np.float32)
        assert accumulate_packed(*args, acc, np.zeros(0, np.int64), 0, False) == 0
        assert np.array_equal(acc, want)
        acc[:] = 0
        touched = np.zeros(n_docs + 1, np.int64)
        m = accumulate_packed(*args, acc, touched, 0, True)
        assert m == len(seen) and np.array_equal(np.sort(touched[:m]), seen) and np.array_equal(acc, want)
        if len(docs) and tfs.max() > 1:  # a tf above what the shard's dtype can hold: damage, not a sum
            low = np.array([int(tfs.max()) - 1])
            assert accumulate_packed(*args[:6], low, *args[7:], np.zeros(n_docs, np.float32),
                                     touched, 0, False) == -FAULT_PACKED
        if len(docs):  # ids past the shard's documents: damage, and nothing added past the accumulator
            short = int(docs.max())
            acc = np.zeros(short + 1, np.float32)
            assert accumulate_packed(*args, acc[:short], touched, 0, False) == -FAULT_PACKED
            assert acc[short] == 0


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str, str]:
    """(plain root, packed root, corpus) of the same 1,500-document corpus (2 shards)."""
    from funnel.jobs.build_index import build
    d = tmp_path_factory.mktemp("packed")
    corpus = str(d / "corpus.jsonl")
    write_corpus(corpus, n_docs=1500, seed=11)
    build(corpus, str(d / "plain"), shards=2, engine="local")
    build(corpus, str(d / "packed"), shards=2, engine="local", postings="packed")
    return str(d / "plain"), str(d / "packed"), corpus


def _answers(root: str, **kw) -> list:
    out = []
    with Searcher(root) as s:
        for q in QUERIES:
            for k in (3, 40):
                for extra in ({}, {"k1": 1.3, "b": 0.6}, {"filter": {"cat": "memo"}}, {"offset": 5}):
                    r = s.search(q, mode="bm25", k=k, **extra, **kw)
                    out.append([(h.doc_id, h.score, h.why if hasattr(h, "why") else None) for h in r.hits])
                    out.append(r.total)
        got = s.search_batch({str(i): q for i, q in enumerate(QUERIES)}, mode="bm25", k=25)
        out.append(got)
    return out


def test_a_packed_index_answers_exactly_as_the_plain_one(pair):
    plain, packed, _ = pair
    assert _answers(packed) == _answers(plain)


def test_a_cache_smaller_than_one_query_still_answers_exactly(pair, monkeypatch):
    """A budget of 2 KB: the approximate pass reads the terms that do not fit from their
    blocks, and a query with other parameters (which reads decoded postings only) decodes
    its terms and gives them back after, so what stays decoded never passes the budget
    once a query is done."""
    plain, packed, _ = pair
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(2048 / (1 << 20)))
    assert _answers(packed) == _answers(plain)
    with Searcher(packed) as s:
        for q in QUERIES:
            s.search(q, mode="bm25", k=10)
            s.search(q, mode="bm25", k=10, k1=1.3, b=0.6)
        cache = s._current.index.postings_cache
        assert cache.budget == 2048 and cache.used <= cache.budget and not cache._pins
        assert cache.decoded_bytes > cache.budget  # it did decode, and give back


def test_a_packed_index_gives_decoded_postings_the_builds_impact_levels(pair):
    """The exhaustive kernels read a packed shard's impact levels as a plain shard's
    impacts.npy: each decoded posting's equals what the plain build of the same corpus
    stored, and the cache counts their two bytes a posting."""
    plain, packed, _ = pair
    with Searcher(packed) as s:
        for q in QUERIES:
            s.search(q, mode="bm25", k=3)
        idx = s._current.index
        cache = idx.postings_cache
        assert cache.posting_bytes == 4 + 2 + 2
        checked = 0
        for i, sh in enumerate(idx.shards):
            stored = np.load(os.path.join(plain, read_current(plain), "lexical", f"shard-{i:04d}", "impacts.npy"))
            for t in np.flatnonzero(sh.packed.decoded):
                a, e = sh.packed.span(int(t))
                assert np.array_equal(sh.packed.impacts[a:e], stored[a:e])
                checked += e - a
        assert checked > 1000
        assert cache.used == sum(n for n, _, _ in cache._lru.values())


def test_threads_sharing_a_small_cache_answer_as_the_plain_index(pair, monkeypatch):
    """Four threads query one packed searcher whose budget (16 KB) holds less than a query's
    terms, so they decode, pin, and give back pages around each other's kernels all the
    time (pages shared with a neighbour a thread has pinned must stay); every answer is the
    plain index's."""
    import threading
    plain, packed, _ = pair
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(16384 / (1 << 20)))
    jobs = [(q, k) for q in QUERIES for k in (5, 40)] * 3
    with Searcher(plain) as s:
        want = {(q, k): [(h.doc_id, h.score) for h in s.search(q, mode="bm25", k=k).hits] for q, k in jobs}
    got, errors = {}, []
    with Searcher(packed) as s:
        def work(i):
            try:
                for q, k in jobs[i::4]:
                    got.setdefault((q, k), []).append([(h.doc_id, h.score) for h in s.search(q, mode="bm25", k=k).hits])
            except Exception as e:  # reported below, with the thread's query
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cache = s._current.index.postings_cache
        assert not errors and not cache._pins and cache.used <= cache.budget
        assert cache.decoded_bytes > 10 * cache.budget
    assert all(a == want[key] for key, answers in got.items() for a in answers) and len(got) == len(want)


def test_a_batch_that_outgrows_the_cache_decodes_less_when_run_again(pair, monkeypatch):
    """A batch whose terms take about twice the budget runs in parts (``batch_cuts``), each
    pinning its terms. Run again, least recently used first gave back each part's terms to
    make room for the next part's, so every run decoded every term again; the cache now
    keeps what later parts of the running batch need and, of the rest, the terms the batch
    used first (``PostingsCache._trim``), so later runs decode a good deal less, and they
    answer as the plain index does."""
    plain, packed, _ = pair
    qs = {str(i): q for i, q in enumerate(QUERIES + [f"{a} {b}" for a, b in zip(QUERIES, QUERIES[1:])])}
    bm = {"k1": 1.3, "b": 0.6}  # not the default parameters: every term is read decoded
    with Searcher(plain) as s:
        want = s.search_batch(qs, mode="bm25", k=10, **bm)
    with Searcher(packed) as s:  # the batch's terms, decoded once with room for all of them
        s.search_batch(qs, mode="bm25", k=10, **bm)
        whole = s._current.index.postings_cache.used
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(whole / 2 / (1 << 20)))
    with Searcher(packed) as s:
        cache = s._current.index.postings_cache
        runs = []
        for _ in range(3):
            before = cache.decoded_bytes
            assert s.search_batch(qs, mode="bm25", k=10, **bm) == want
            runs.append(cache.decoded_bytes - before)
        assert not cache._pins and not cache._ahead and not cache._starts and cache.used <= cache.budget
    assert runs[0] >= whole  # the first run decodes everything
    # Least recently used first: each later run decoded twice the batch's terms (4.0x over the
    # two; 276,992 bytes each for 138,496 when this test was written); now 2.5x.
    assert runs[1] + runs[2] <= 3 * whole, (runs, whole)


def _kernel_answers(root: str, k_list=(1, 10, 100), tune=None) -> tuple[list, object]:
    """(answers, the postings cache or None): every query of QUERIES and their pairs, one by
    one and as one batch, at each k, with the retriever tuned by ``tune(retriever)`` first."""
    qs = QUERIES + [f"{a} {b}" for a, b in zip(QUERIES, QUERIES[1:])] + [" ".join(QUERIES)]
    out = []
    with Searcher(root) as s:
        if tune:
            tune(s._current.bm25)
        for k in k_list:
            out += [[(h.doc_id, h.score) for h in s.search(q, mode="bm25", k=k).hits] for q in qs]
            out.append(s.search_batch({str(i): q for i, q in enumerate(qs)}, mode="bm25", k=k))
        return out, s._current.index.postings_cache


@pytest.mark.parametrize("budget", [0, 4096, None])
@pytest.mark.parametrize("dense", [True, False])
def test_terms_read_from_their_blocks_score_and_rescore_exactly(pair, monkeypatch, budget, dense):
    """The approximate pass reads a packed term the cache does not hold straight from its
    blocks (``kernels.accumulate_packed``) and rescores its candidates by looking their tfs
    up in them (``kernels.packed_tfs``): with nothing decoded (budget 0), some terms decoded
    (4 KB) and all of them (the default budget), every query on every path of that pass
    (the dense read-back and the touched list; every query takes the pass: rescore_min 0)
    answers with the plain index's documents and scores, one by one and in a batch."""
    plain, packed, _ = pair
    if budget is not None:
        monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(budget / (1 << 20)))

    def tune(r):
        r.rescore_min_postings = 0
        r.dense_min_docs = 0 if dense else -1
        r.prune_min_postings = -1
    want, _ = _kernel_answers(plain, tune=tune)
    got, cache = _kernel_answers(packed, tune=tune)
    assert got == want
    assert not cache._pins and cache.used <= cache.budget
    if budget == 0:  # nothing was decoded for it
        assert cache.decoded_bytes == 0


def test_a_query_that_prunes_decodes_its_terms_and_answers_exactly(pair, monkeypatch):
    """Pruning reads decoded postings only: with the cache too small to hold a query's terms,
    the kernel answers ``NEED_DECODED`` for a query that prunes, which is then answered alone
    with every term pinned, and the batch goes on after it: the plain index's answers."""
    plain, packed, _ = pair
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", "0")

    def tune(r):
        r.prune_min_postings = 0  # prune wherever the bounds allow
        r.rescore_min_postings = 0
    want, _ = _kernel_answers(plain, k_list=(3, 10), tune=tune)
    got, cache = _kernel_answers(packed, k_list=(3, 10), tune=tune)
    assert got == want
    assert cache.decoded_bytes > 0 and cache.used == 0 and not cache._pins


def test_a_batch_that_outgrows_the_cache_decodes_at_most_the_budget(pair, monkeypatch):
    """With the default parameters a batch pins the terms that fit the budget, the most used
    first, and reads the rest from their blocks: it decodes no more than the budget, the
    same batch run again decodes nothing more, and the answers are the plain index's."""
    plain, packed, _ = pair
    qs = {str(i): q for i, q in enumerate(QUERIES + [f"{a} {b}" for a, b in zip(QUERIES, QUERIES[1:])])}

    def tune(r):
        r.rescore_min_postings = 0
        r.prune_min_postings = -1
    with Searcher(plain) as s:
        tune(s._current.bm25)
        want = s.search_batch(qs, mode="bm25", k=10)
    with Searcher(packed) as s:
        tune(s._current.bm25)
        s.search_batch(qs, mode="bm25", k=10)
        whole = s._current.index.postings_cache.used
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(whole / 2 / (1 << 20)))
    with Searcher(packed) as s:
        tune(s._current.bm25)
        cache = s._current.index.postings_cache
        runs = []
        for _ in range(3):
            before = cache.decoded_bytes
            assert s.search_batch(qs, mode="bm25", k=10) == want
            runs.append(cache.decoded_bytes - before)
        assert not cache._pins and cache.used <= cache.budget
    assert 0 < runs[0] <= whole / 2 and runs[1] == runs[2] == 0, (runs, whole)


def test_a_full_cache_decodes_a_term_for_a_query_only_once_it_is_asked_for_more_often(pair, monkeypatch):
    """A full cache: a query whose terms were never asked for reads them from their blocks
    and gives nothing back (decoding a term read once, in place of one other queries keep
    reading, only loses), nor when they are asked for twice as often as the terms held;
    asked for more often than that, the terms held give them their place (least recently
    used first). Every answer is the plain index's."""
    plain, packed, _ = pair
    first, other = "river apple stone market", "dolphin falcon glacier island"
    with Searcher(packed) as s:
        s.search_batch({"a": first}, mode="bm25", k=10)
        fill = s._current.index.postings_cache.used
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", str(fill / (1 << 20)))
    with Searcher(plain) as s:
        want = [(h.doc_id, h.score) for h in s.search(other, mode="bm25", k=10).hits]
    with Searcher(packed) as s:
        cache = s._current.index.postings_cache
        s.search_batch({"a": first}, mode="bm25", k=10)
        held, decoded = set(cache._lru), cache.decoded_bytes
        assert held and cache.used == fill
        assert [(h.doc_id, h.score) for h in s.search(other, mode="bm25", k=10).hits] == want
        assert set(cache._lru) == held and cache.decoded_bytes == decoded  # nothing decoded, nothing given back
        assert [(h.doc_id, h.score) for h in s.search(other, mode="bm25", k=10).hits] == want
        assert set(cache._lru) == held and cache.decoded_bytes == decoded  # twice as often: not yet
        assert [(h.doc_id, h.score) for h in s.search(other, mode="bm25", k=10).hits] == want
        assert set(cache._lru) - held and held - set(cache._lru)  # some decoded, some given back
        assert cache.decoded_bytes > decoded and cache.used <= cache.budget and not cache._pins


def _resident_pages(arr: np.ndarray) -> int:
    """Pages of ``arr``'s memory resident now (Linux ``mincore``)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    page = mmap.PAGESIZE
    start = arr.ctypes.data // page * page
    n = -(-(arr.ctypes.data + arr.nbytes - start) // page)
    vec = ctypes.create_string_buffer(n)
    assert libc.mincore(start, n * page, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw)


def test_a_cache_of_nothing_gives_every_decoded_page_back(pair, monkeypatch):
    """Budget 0: after the queries, none of the decode targets' pages stays resident, the
    pages that short neighbouring terms share included (they used to stay, up to two a term
    and array, so a process held far more decoded postings than its budget)."""
    plain, packed, _ = pair
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", "0")
    with Searcher(packed) as s:
        for q in QUERIES:
            s.search(q, mode="bm25", k=10)
            s.search(q, mode="bm25", k=10, k1=1.3, b=0.6)  # these decode their terms
        s.search_batch({str(i): q for i, q in enumerate(QUERIES)}, mode="bm25", k=10)
        s.search_batch({str(i): q for i, q in enumerate(QUERIES)}, mode="bm25", k=10, k1=1.3, b=0.6)
        idx = s._current.index
        assert idx.postings_cache.used == 0 and idx.postings_cache.decoded_bytes > 0
        for sh in idx.shards:
            for arr in (sh.packed.docs, sh.packed.tfs, sh.packed.impacts):
                assert _resident_pages(arr) == 0


def test_sira_on_a_packed_index_answers_as_on_the_plain_one(pair):
    plain, packed, _ = pair

    def run(root):
        with Searcher(root) as s:
            return [[(h.doc_id, h.score) for h in s.search(q, mode="sira", k=10).hits] for q in QUERIES] + \
                [s.search_batch({str(i): q for i, q in enumerate(QUERIES)}, mode="sira", k=10)]
    assert run(packed) == run(plain)


def _postings_bytes(root: str) -> tuple[int, int]:
    """(bytes of the postings files, postings) over the live version's shards."""
    vdir = os.path.join(root, read_current(root))
    total = n = 0
    for shard in sorted(x for x in os.listdir(os.path.join(vdir, "lexical")) if x.startswith("shard-")):
        sd = os.path.join(vdir, "lexical", shard)
        for f in os.listdir(sd):
            if f in ("docs.npy", "tfs.npy", "impacts.npy") or f.startswith("packed"):
                total += os.path.getsize(os.path.join(sd, f))
        n += int(np.load(os.path.join(sd, "indptr.npy"))[-1])
    return total, n


def test_packed_postings_are_a_fraction_of_the_plain_ones(pair):
    plain, packed, _ = pair
    (pb, pn), (kb, kn) = _postings_bytes(plain), _postings_bytes(packed)
    assert pn == kn > 10_000
    assert not any(f.startswith("packed") for f in os.listdir(os.path.join(plain, read_current(plain), "lexical",
                                                                           "shard-0000")))
    assert kb < 0.35 * pb, (kb / kn, pb / pn)  # 8 bytes a posting (ids, tfs, impact levels) -> under 2.8


def test_a_reindex_keeps_the_postings_packed(pair, tmp_path):
    from funnel.jobs.build_index import build
    from funnel.jobs.reindex import reindex
    plain, packed, corpus = pair
    root = str(tmp_path / "packed")
    shutil.copytree(packed, root)
    rows = open(corpus).read().splitlines()
    changed = str(tmp_path / "changed.jsonl")
    with open(changed, "w") as f:  # a tenth of the documents dropped, one rewritten
        f.write("\n".join(rows[150:] + [rows[0].replace('"title": "', '"title": "apple castle ')]) + "\n")
    reindex(root, changed)
    vdir = os.path.join(root, read_current(root))
    assert all(os.path.exists(os.path.join(vdir, "lexical", s, "packed.json")) and
               not os.path.exists(os.path.join(vdir, "lexical", s, "docs.npy"))
               for s in os.listdir(os.path.join(vdir, "lexical")) if s.startswith("shard-"))
    fresh = str(tmp_path / "fresh")
    build(changed, fresh, shards=2, engine="local")
    with Searcher(root) as a, Searcher(fresh) as b:
        for q in QUERIES:
            assert [(h.doc_id, h.score) for h in a.search(q, mode="bm25", k=20).hits] == \
                [(h.doc_id, h.score) for h in b.search(q, mode="bm25", k=20).hits]


def _overwrite(path: str, index: int, value) -> None:
    arr = np.load(path, mmap_mode="r")
    raw = np.asarray([value], dtype=arr.dtype).tobytes()
    off = arr.offset + index * arr.dtype.itemsize
    del arr
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(raw)


@pytest.mark.parametrize("name,value", [("packed_width.npy", 40), ("packed_first.npy", 1 << 30),
                                        ("packed_boff.npy", 1 << 40)])
def test_a_block_damaged_while_served_is_a_clear_error(pair, tmp_path, name, value):
    """The version is open (its checks passed) when a block of 'river', not yet decoded,
    changes on disk: the query that decodes it raises IndexDamaged naming the shard's
    packed file, not a crash or a wrong answer, and leaves no term pinned."""
    _, packed, _ = pair
    root = str(tmp_path / "ix")
    shutil.copytree(packed, root)
    vdir = os.path.join(root, read_current(root))
    with Searcher(root) as s:
        ix = s._current.index
        sh = ix.shards[1]  # the second: the first shard's terms are pinned when it fails
        g = ix.vocab[ix.analyzer.analyze("river")[0]]
        li = int(sh.local_terms(np.asarray([g]))[0])
        b = int(sh.packed.tblock[li]) + (1 if name == "packed_boff.npy" else 0)
        _overwrite(os.path.join(vdir, "lexical", "shard-0001", name), b * (2 if name == "packed_width.npy" else 1),
                   value)
        with pytest.raises(IndexDamaged, match="shard-0001/packed"):  # the file the open's checks name
            s.search("river", mode="bm25", k=5)
        assert not ix.postings_cache._pins  # nothing left pinned by the query that stopped


@pytest.mark.parametrize("load", ["0", "1"])
def test_random_bit_flips_in_packed_files_never_crash(pair, tmp_path, load):
    """Bits flipped at random in the packed files of a version, then queries, in a process of
    its own (a crash there fails this test): the open refuses the version (a damaged block
    table), or each query answers or raises IndexDamaged (a damaged block, found as it is
    decoded). A flip inside a block's payload can also decode to other valid ids or tfs, as a
    flip in a plain docs.npy can: only the file hashes (funnel verify, the scrub) see that.
    With ``FUNNEL_LOAD_POSTINGS=1`` the open copies the damaged blocks into memory, and every
    read of them is checked the same way."""
    _, packed, _ = pair
    root = str(tmp_path / "ix")
    shutil.copytree(packed, root)
    script = textwrap.dedent(f"""
        import os, random, numpy as np
        from funnel.pipelines.store.artifacts import IndexFormatError, read_current
        from funnel.serving.errors import IndexDamaged
        from funnel.serving.index import IndexVersion
        from funnel.serving.lexical.retriever import BM25Retriever
        root = {root!r}
        vdir = os.path.join(root, read_current(root))
        rng = random.Random(3)
        files = [os.path.join(vdir, "lexical", s, f) for s in ("shard-0000", "shard-0001")
                 for f in ("packed.npy", "packed_boff.npy", "packed_first.npy", "packed_width.npy")]
        pristine = {{p: open(p, "rb").read() for p in files}}
        outcomes = {{"ok": 0, "damaged": 0, "refused": 0}}
        for round in range(80):
            for p, raw in pristine.items():  # each round's damage on its own
                with open(p, "r+b") as f:
                    f.write(raw)
            path = rng.choice(files)
            arr = np.load(path, mmap_mode="r")
            off, n = arr.offset, arr.nbytes
            del arr
            with open(path, "r+b") as f:
                for _ in range(rng.randint(1, 4)):
                    pos = off + rng.randrange(n)
                    f.seek(pos)
                    byte = f.read(1)[0]
                    f.seek(pos)
                    f.write(bytes([byte ^ (1 << rng.randrange(8))]))
            try:
                ix = IndexVersion(vdir, verify="none")
            except IndexFormatError:
                outcomes["refused"] += 1
                continue
            bm = BM25Retriever(ix)
            for q in {QUERIES!r}:
                try:
                    bm.search(q, k=10)
                    outcomes["ok"] += 1
                except IndexDamaged:
                    outcomes["damaged"] += 1
            ix.close()
        print(outcomes)
        assert outcomes["damaged"] > 0 and outcomes["refused"] > 0 and outcomes["ok"] > 0
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "FUNNEL_LOAD_POSTINGS": load})
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_packed_version_is_format_3_and_an_older_reader_refuses_it_with_a_rebuild_message(pair, monkeypatch):
    """Format versioning (issue 50, item 5): a packed version is published as format 3, a plain
    one as 2; a funnel that reads only 1 and 2 refuses the packed one, naming the rebuild,
    instead of finding its docs.npy missing."""
    from funnel.pipelines.store import artifacts
    from funnel.pipelines.store.artifacts import IndexFormatError, load_manifest
    plain, packed, _ = pair
    assert load_manifest(os.path.join(plain, read_current(plain)))["format_version"] == 2
    assert load_manifest(os.path.join(packed, read_current(packed)))["format_version"] == 3
    monkeypatch.setattr(artifacts, "READ_FORMAT_VERSIONS", (1, 2))
    with pytest.raises(IndexFormatError, match="Rebuild the index"):
        Searcher(packed)


@pytest.mark.parametrize("variable, raw, says", [
    ("FUNNEL_POSTINGS_CACHE_MB", "lots", "not a number"), ("FUNNEL_POSTINGS_CACHE_MB", "-5", "negative"),
    ("FUNNEL_LOAD_POSTINGS", "yes", "set it to 1"), ("FUNNEL_LOAD_POSTINGS", "2", "set it to 1")])
@pytest.mark.parametrize("which", [0, 1], ids=["plain", "packed"])
def test_a_bad_memory_setting_is_a_clear_error_naming_the_variable(pair, monkeypatch, variable, raw, says, which):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ValueError, match=f"{variable}.*{says}") as e:
        Searcher(pair[which])
    assert "damaged" not in str(e.value)


def _mapped(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory is a mapped file (np.load's ``mmap_mode``)."""
    import mmap
    b = arr
    while b is not None:
        if isinstance(b, (np.memmap, mmap.mmap)):
            return True
        b = getattr(b, "base", None)
    return False


def test_postings_read_into_memory_answer_as_mapped_ones(pair, monkeypatch):
    """``FUNNEL_LOAD_POSTINGS=1`` reads a plain index's document ids, tfs and impact levels,
    and a packed index's blocks, into the process's memory at open (read-only, as the mapped
    ones are): every answer is the same, pruned, filtered, paged or batched, the packed
    index's with every term read from its blocks (budget 0) or decoded."""
    plain, packed, _ = pair
    mapped = _answers(plain)
    monkeypatch.setenv("FUNNEL_LOAD_POSTINGS", "1")
    with Searcher(plain) as s:
        for sh in s.index.shards:
            for arr in (sh.docs, sh.tfs, sh.stored_impacts[1]):
                assert not _mapped(arr) and not arr.flags.writeable
            assert _mapped(sh.indptr)
    with Searcher(packed) as s:
        for sh in s.index.shards:
            for arr in (sh.packed.words, sh.packed.boff, sh.packed.first, sh.packed.width):
                assert not _mapped(arr) and not arr.flags.writeable
    assert _answers(plain) == mapped
    assert _answers(packed) == mapped
    monkeypatch.setenv("FUNNEL_POSTINGS_CACHE_MB", "0")
    assert _answers(packed) == mapped


def test_a_packed_shard_keeps_one_copy_of_its_term_ranges(pair):
    """A packed shard's term ranges are read at open into its own read-only array, which the
    kernels, the decoder and `release` all read, and ``indptr.npy`` is not left mapped (one
    copy in memory instead of two: 23 MiB at 3M documents); answers stay the plain index's."""
    plain, packed, _ = pair
    with Searcher(packed) as s:
        for sh in s.index.shards:
            assert sh.indptr is sh.packed.indptr is sh.packed._ends
            assert not _mapped(sh.indptr) and not sh.indptr.flags.writeable
        with open("/proc/self/maps") as f:  # this index's files only: other tests' may be open
            assert not [x for x in f.read().splitlines() if os.path.realpath(packed) in x and "indptr.npy" in x]
        assert _answers(packed) == _answers(plain)


def test_a_shard_with_a_tf_above_65535_decodes_every_shard_as_int32(tmp_path):
    """One document repeats a word 70,000 times: its shard stores int32 tfs, the other uint16.
    The kernels read one tf dtype, so every packed shard decodes into int32 (a widened copy of
    the decode targets would copy whatever was decoded when it was made); answers equal the
    plain index's."""
    import json
    from funnel.jobs.build_index import build
    corpus = str(tmp_path / "c.jsonl")
    write_corpus(corpus, n_docs=300, seed=2)
    with open(corpus, "a") as f:
        f.write(json.dumps({"_id": "loud", "title": "", "text": "zephyr " * 70_000 + "river"}) + "\n")
    build(corpus, str(tmp_path / "plain"), shards=2, engine="local")
    build(corpus, str(tmp_path / "packed"), shards=2, engine="local", postings="packed")
    vdir = os.path.join(str(tmp_path / "packed"), read_current(str(tmp_path / "packed")))
    kinds = sorted(json.load(open(os.path.join(vdir, "lexical", s, "packed.json")))["tfs_dtype"]
                   for s in ("shard-0000", "shard-0001"))
    assert kinds == ["int32", "uint16"]
    got = {}
    for name in ("plain", "packed"):
        with Searcher(str(tmp_path / name)) as s:
            got[name] = [[(h.doc_id, h.score) for h in s.search(q, mode="bm25", k=10).hits]
                         for q in ("zephyr", "river", "zephyr river apple", "stone market")]
            if name == "packed":
                assert {np.dtype(sh.tfs.dtype) for sh in s._current.index.shards} == {np.dtype(np.int32)}
    assert got["packed"] == got["plain"] and got["plain"][0][0][0] == "loud"
