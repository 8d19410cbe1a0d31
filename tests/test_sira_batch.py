"""SIRA's compiled batch path (serving/sira/batch.py, kernels.sira_batch) against the
per-query reference path (mode.sira_arrays: proposers, DF filter, search_weighted).

The offline proposers (prf, dense, union) answer ``search_batch`` in one compiled call per
chunk; every query must get exactly the per-query ranking and scores, for the defaults and
for option settings that change each part (feedback depth, term count, tau, lambda 0, k1/b,
exact lengths). The index is tests/data/tiny-beir (40 abstracts) built with dense vectors
by the real build; the queries are its own plus every document title. One test lowers
FAISS's BLAS threshold so that the dense feedback's grouped searches are exercised.
"""

from __future__ import annotations

import json
import os

import pytest

from funnel.serving import kernels
from funnel.serving.search import open_index
from funnel.serving.sira import prepare, sira_arrays
from funnel.serving.sira.batch import batch_available, per_query_group
from funnel.serving.sira.mode import expand, expand_weights, weighted_query

from conftest import need_shared  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")

def _queries(ddir: str) -> dict[str, str]:
    qs = {o["_id"]: o["text"] for o in map(json.loads, open(os.path.join(ddir, "queries.jsonl")))}
    for o in map(json.loads, open(os.path.join(ddir, "corpus.jsonl"))):
        qs["t-" + o["_id"]] = o.get("title") or o["text"][:80]
    qs["unknown-words"] = "zzqx qqzv"          # no known term: BM25 empty, dense still proposes
    qs["stop"] = "the of and"
    return qs


def _reference(ix, queries: dict[str, str], k: int, options: dict) -> dict:
    prep = prepare(ix, dict(options))
    out = {}
    for qid, q in queries.items():
        dn, sc = sira_arrays(ix, q, k, prep)
        out[qid] = list(zip(ix.index.docs.doc_ids_of(dn), sc.tolist()))
    return out


@pytest.fixture(scope="module")
def dense_ix(ray_session, tmp_path_factory):
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("sira-batch-ix"))
    build(FIXTURE, root, shards=2, dense=True)
    return open_index(root)


OPTIONS = [{}, {"fb_docs": 3, "fb_terms": 4}, {"tau": 0.5, "lambda": 1.5}, {"lambda": 0.0},
           {"k1": 0.9, "b": 0.4}, {"length_norm": "exact"}, {"fb_docs": 40, "fb_terms": 30}]


@pytest.mark.parametrize("proposer", ["prf", "dense", "union"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_batch_equals_per_query(dense_ix, proposer, options):
    qs = _queries(FIXTURE)
    opts = {"proposer": proposer, **options}
    # without numba (FUNNEL_NUMBA=0) search_batch takes the per-query path: still equal
    assert batch_available(dense_ix, prepare(dense_ix, dict(opts))) == kernels.HAVE_NUMBA
    for k in (5, 100):
        got = dense_ix.search_batch(qs, mode="sira", k=k, **opts)
        assert list(got) == list(qs)
        assert got == _reference(dense_ix, qs, k, opts)


@pytest.mark.parametrize("proposer", ["dense", "union"])
def test_batch_equals_per_query_past_the_faiss_blas_threshold(dense_ix, proposer):
    """FAISS computes a batch's inner products with BLAS (other rounding than a one-query
    search) once ``nx * d`` reaches its threshold (FAISS 1.15; ``nx`` alone in older ones).
    Lowered so that this batch of queries is far past it, the grouped dense feedback must
    still give every query exactly its per-query result."""
    import faiss
    qs = _queries(FIXTURE)
    dim = dense_ix.dense_mode.dense().indexes[0].d
    old = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 4 * dim + 1  # a group of 4 stays below it
    try:
        assert per_query_group(dim) == 4
        assert dense_ix.search_batch(qs, mode="sira", k=20, proposer=proposer) == _reference(
            dense_ix, qs, 20, {"proposer": proposer})
    finally:
        faiss.cvar.distance_compute_blas_threshold = old


@pytest.mark.parametrize("proposer", ["prf", "dense", "union"])
def test_expand_weights_equals_expand(dense_ix, proposer):
    """The batch path's per-query step without a trace (``expand_weights``, what the llm
    proposer's batch uses) gives exactly ``expand``'s two weight groups, in the same order
    (the order fixes the kernel's float sums): union proposes a term from several sources
    with different weights, and lambda 0 keeps zero-weight terms."""
    qs = _queries(FIXTURE)
    for options in OPTIONS:
        prep = prepare(dense_ix, {"proposer": proposer, **options})
        n_expanded = 0
        for q in qs.values():
            x = expand(dense_ix, q, prep)
            first, then = expand_weights(dense_ix, q, prep)
            assert list(first.items()) == list(x.query_weights.items())
            assert list(then.items()) == list(x.expansion_weights.items())
            # and both are the trace's expansion (largest weight per term) merged by weighted_query
            merged = weighted_query(x.query_terms, {t: w for t, (w, _) in x.terms.items()}, x.lam)
            assert list({**first, **then}.items()) == list(merged.items())
            n_expanded += bool(then)
        assert n_expanded >= len(qs) // 2


@pytest.mark.parametrize("proposer", ["prf", "union"])
def test_batch_equals_per_query_where_the_reference_prunes(dense_ix, proposer):
    """On a large corpus the per-query path's search_shards calls may stop early (pruning;
    forced here with prune_min_postings 0), while the batch path scores the query and its
    expansion exhaustively in one shared pass: both must give the same rankings and scores,
    and so must the per-query path without pruning."""
    qs = _queries(FIXTURE)
    bm = dense_ix.bm25
    saved = bm.prune_min_postings
    try:
        for k in (5, 100):
            batch = dense_ix.search_batch(qs, mode="sira", k=k, proposer=proposer)
            bm.prune_min_postings = -1                       # exhaustive
            exhaustive = _reference(dense_ix, qs, k, {"proposer": proposer})
            bm.prune_min_postings = 0                        # every shard may prune
            before = int(bm.prune_stats[0])
            pruned = _reference(dense_ix, qs, k, {"proposer": proposer})
            if k == 5:
                assert int(bm.prune_stats[0]) > before       # pruning really stopped early somewhere
            bm.prune_min_postings = saved
            assert batch == pruned == exhaustive
    finally:
        bm.prune_min_postings = saved


def test_batch_expands_at_all(dense_ix):
    """The batch path really adds expansion terms: its ranking differs from plain BM25's."""
    qs = _queries(FIXTURE)
    sira = dense_ix.search_batch(qs, mode="sira", k=10, proposer="union")
    bm25 = dense_ix.search_batch(qs, mode="bm25", k=10)
    assert sum(sira[q] != bm25.get(q, []) for q in qs) >= len(qs) // 2
    assert sira["unknown-words"] and not bm25.get("unknown-words")  # dense feedback alone


def test_a_thread_s_buffers_grow_from_one_shard_to_the_whole_index(dense_ix):
    """BM25 scores one shard at a time in a buffer the size of the largest shard; SIRA's
    batch kernel keeps every shard's scores, so a thread that ran BM25 first gets the whole
    index's buffer for it, and both answer as in a thread that never ran the other."""
    import threading
    qs = _queries(FIXTURE)
    want_sira = dense_ix.search_batch(qs, mode="sira", k=10, proposer="prf")
    want_bm25 = dense_ix.search_batch(qs, mode="bm25", k=10)
    bm = dense_ix.bm25  # the current version's retriever (Searcher passes attributes through)
    sizes, got = [], {}

    def run():
        got["bm25"] = dense_ix.search_batch(qs, mode="bm25", k=10)
        sizes.append(len(bm._tls.buffers[0]))
        got["sira"] = dense_ix.search_batch(qs, mode="sira", k=10, proposer="prf")
        sizes.append(len(bm._tls.buffers[0]))
        got["bm25 again"] = dense_ix.search_batch(qs, mode="bm25", k=10)
        sizes.append(len(bm._tls.buffers[0]))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    shards = [s.n_docs for s in bm.index.shards]
    assert len(shards) == 2 and sizes == [max(shards), sum(shards), sum(shards)]
    assert got == {"bm25": want_bm25, "sira": want_sira, "bm25 again": want_bm25}


def test_remove_query_and_errors_on_the_batch_path(dense_ix):
    qs = _queries(FIXTURE)
    errors = {}
    got = dense_ix.search_batch({**qs, "empty": "  "}, mode="sira", k=5, proposer="prf", remove_query=True,
                                errors=errors)
    assert set(errors) == {"empty"} and "empty" not in got
    ref = _reference(dense_ix, qs, 6, {"proposer": "prf"})
    assert got == {q: [h for h in hits if h[0] != q][:5] for q, hits in ref.items()}


@pytest.mark.beir
@pytest.mark.parametrize("ds", ["scifact", "nfcorpus"])
def test_prf_batch_equals_per_query_on_every_beir_query(ds, beir_index):
    ddir = need_shared("beir", ds)
    ix = open_index(beir_index(ds))
    qs = {o["_id"]: o["text"] for o in map(json.loads, open(f"{ddir}/queries.jsonl"))}
    assert ix.search_batch(qs, mode="sira", k=100, proposer="prf") == _reference(ix, qs, 100, {"proposer": "prf"})
