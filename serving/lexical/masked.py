"""BM25 under a mask (``serving/filters.py``): the top k of the allowed documents, exactly.

Pre-filtering, not post-filtering: a disallowed document never enters the top-k heap, so a
filter never starves k (the failure of a fixed top-k filtered afterwards), and an allowed
document's score is the unfiltered one, bit for bit: the same terms in the same canonical
order, each posting's ``w · tf / (tf + denom)`` computed as ``kernels._impact`` computes it
(or read from the same stored per-posting impacts), added from 0.0 term by term; ties broken
by doc_id through the same id ranks. So the filtered top k equals exhaustive BM25 over the
allowed documents.

Pruning stays valid under a mask: a mask can only remove documents, so the unfiltered
index's block maxima and per-term bounds remain upper bounds, and the lower bound on the
k-th score is taken from allowed documents only. Per shard the compiled path
(``kernels.masked.search_masked_shards``) picks one of two pruned strategies:

* **candidates** (``kernels.masked.masked_closed``) where the allowed documents are few next
  to the query's postings: allowed documents × terms present × ``CANDIDATE_COST`` at most
  the postings. The allowed documents are the only candidates (doc-at-a-time over a closed
  set, term by term): a term with few postings next to the candidates left is streamed, a
  longer one looks each candidate up (a gallop over the term's block last-documents, then
  inside one block) unless its partial score plus that block's maximum plus the later
  terms' bounds cannot reach the k-th, and candidates that cannot reach it are dropped after
  each term. Its cost follows the mask's popcount, not the postings: a 0.1% filter reads a
  small fraction of them, so it is faster than the unfiltered query.
* **block-max term-at-a-time** (``kernels.masked.masked_blocks``) otherwise: the unfiltered
  kernel's MaxScore with block maxima, disallowed documents never accumulated.

The choice rule (per shard, and per term inside candidates) is a cost comparison: looking a
candidate up costs about as much as streaming ``CANDIDATE_COST`` postings. Both sides are
worst cases (pruning drops candidates and skips blocks), so the constant is measured: on
the synthetic corpora (``bench/synth.py``; per-query times of both strategies forced, masks
of 0.1-3%), the shard rule's total was lowest for 5-10 at 100K and 1M documents, and the
term rule's changed by under 10% over 3-10. Where the rule errs it errs near the crossover
(about 1% of the documents there), where the two strategies cost about the same. Unlike the
unfiltered kernel, which prunes only queries with ``prune_min_postings`` postings in a
shard, the masked kernels prune every query where block maxima exist (the default
(k1, b)): under a mask, pruning's bookkeeping is over the allowed documents only, and it
measured as fast or faster than exhaustive scoring at every query size there. A mask that
allows every document takes the unfiltered search.

Without block maxima (a per-query (k1, b) override) or with a non-positive weight, a shard
is scored without pruning by the same rule's two strategies (``kernels.masked.masked_shard``).
``bench/bench_filters.py`` measures each selectivity against the unfiltered search.
``FUNNEL_NUMBA=0`` (or no numba) takes `masked_reference`, the NumPy path.
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import kernels
from ..kernels import HAVE_NUMBA

if HAVE_NUMBA:
    from ..kernels.masked import search_masked_shards

#: A shard is scored by candidates when allowed docs × query terms × this is at most its
#: postings, and a term is streamed there when candidates × this is at least its postings
#: (module docstring: how it was measured).
CANDIDATE_COST = 8

#: Forces a strategy on every shard: "candidates" or "blocks" (tests, benchmarks); "auto" is
#: the cost rule.
STRATEGY = "auto"
_STRATEGIES = {"auto": 0, "candidates": 1, "blocks": 2}
#: Racy counters (``search_masked_shards``' ``stats``): shards scored by candidates with
#: pruning, by blocks, by blocks that went to sorted candidates, without pruning; candidates
#: dropped by pruning; terms that candidates streamed. For tests and ``bench/bench_filters.py``.
STATS = np.zeros(6, dtype=np.int64)
_FLAT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _allowed_flat(mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``allow`` as uint8, the allowed global positions ascending, where each shard's start
    among them), cached per mask (masks are cached per filter and principal, so a repeated
    one pays this once)."""
    got = _FLAT.get(mask)
    if got is None:
        flat = np.flatnonzero(mask.allow).astype(np.int64)
        got = (mask.u8(), flat, np.searchsorted(flat, mask.doc_off).astype(np.int64))
        _FLAT[mask] = got
    return got


def search_masked(bm25, gids: np.ndarray, ws: np.ndarray, k: int, params, mask) -> tuple[np.ndarray, np.ndarray]:
    """(docnos, scores) of the top ``k`` allowed documents, best first (ties by doc_id):
    ``BM25Retriever.search_arrays`` under ``mask``, for its canonical ``gids``/``ws``."""
    if mask.count == 0 or len(gids) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if not bm25._use_kernel():
        return masked_reference(bm25, gids, ws, k, params, mask)
    n_docs = int(mask.doc_off[-1])
    if mask.count == n_docs:  # allows everything: the unfiltered search is the answer
        return bm25.search_gids(gids, ws, k, params)
    meta, proto, doc_off, id_rank, _ = bm25._shard_args(params.length_norm)
    den, itab = bm25._table(params)
    acc, touched = bm25._buffers()
    bmeta = bm25._blocks(params)  # block maxima: the default (k1, b) only, else none (no pruning)
    imeta, imps = bm25._impacts(params)  # held while the kernel runs
    u8, flat, cptr = _allowed_flat(mask)
    with bm25._pinned(gids):
        dn, sc, fault = search_masked_shards(meta, bmeta, imeta, proto, doc_off, id_rank, acc, touched, den, itab,
                                             gids, ws, k, u8, flat, cptr, bm25.prune_min_postings == 0,
                                             CANDIDATE_COST, _STRATEGIES[STRATEGY], kernels.BLOCK, STATS)
    if fault:  # a damaged file (kernels/checks.py, "Damaged files")
        raise bm25.fault_error(fault)
    return dn, sc


def masked_reference(bm25, gids: np.ndarray, ws: np.ndarray, k: int, params, mask
                     ) -> tuple[np.ndarray, np.ndarray]:
    """`search_masked` in NumPy: each shard's dense scores (``ShardScorer.score``, the
    unfiltered reference's arithmetic), disallowed documents zeroed, the best k kept."""
    ix = bm25.index
    scores_parts, docno_parts, tie_parts = [], [], []
    for s, shard in enumerate(ix.shards):
        lo, hi = int(mask.doc_off[s]), int(mask.doc_off[s + 1])
        scores = shard.score(gids, ws, params)
        if scores is None:
            continue
        nz = np.flatnonzero((scores > 0) & mask.allow[lo:hi])
        if len(nz) == 0:
            continue
        vals = scores[nz]
        if len(nz) > k:
            kth = np.partition(vals, len(nz) - k)[len(nz) - k]
            keep = vals >= kth
            nz, vals = nz[keep], vals[keep]
        scores_parts.append(vals)
        docno_parts.append((np.int64(s) << 32) | nz.astype(np.int64))
        tie_parts.append(ix.docs.id_rank[s][nz])
    if not scores_parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    sc = np.concatenate(scores_parts)
    order = np.lexsort((np.concatenate(tie_parts), -sc))[:k]
    return np.concatenate(docno_parts)[order], sc[order]
