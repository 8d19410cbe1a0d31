"""Exhaustive term-at-a-time scoring: every posting of every query term, added in the
canonical order (`_accumulate`), and ``search_shards_plain``, the entry point that never
prunes.

A larger index has the build's impacts for the default (k1, b) quantized to 16-bit levels
(``impacts.npy``, ``decode.posting_levels``), memory-mapped. The exhaustive path reads those
(`_search_approx`): it sums them in float64, keeps every document within a proven margin of
the k-th approximate score (`_approx_margin`), and rescores those candidates exactly from
their postings (`_rescore_shard`), as PISA and JASS rescore their quantized top k: the
returned documents, scores and ties are float64 term-at-a-time's. Where a query has
postings for about as many documents as a shard holds, a shard's accumulator is read back
by one scan (`_accumulate_dense`, `_offer_dense`) instead of through a list of touched
documents, whose store per posting waits on the accumulator's load. The exhaustive loop
indexes with unsigned integers, so numba emits no negative-index wraparound per access.
"""

from __future__ import annotations

import numpy as np

from ._jit import BOUNDS_CHECK, jit, _prefetch, _view
from .checks import _bad_posting, _posting_fault, _range_ok
from .decode import _find, _impact_u, _local_terms
from .heap import _kth_vals, _new_top, _offer_one, _offer_scores, _top_sorted
from .layout import (DENSE_DIVISOR, FAULT_DOCS, FAULT_IMPACTS, FAULT_INDPTR, IMPACT_DTYPE, IMPACT_STEP, NEED_DECODED,
                     SCAN)
from .packed import accumulate_packed, packed_tfs


@jit
def _accumulate(indptr, docs, tfs, code, table, itab, cap, local, weights, acc, touched, m, imp):
    """Add every listed term's ``weight · tf/(tf + denom)`` to ``acc`` (term-at-a-time, in
    order; ``_score_shard``'s exhaustive path), recording first-seen documents in
    ``touched`` after the ``m`` already there (branch-free: a slot is kept only when the
    document had no score yet); returns the new count. Unsigned indices throughout
    (`_impact_u`); where ``imp`` is given (non-empty: each
    posting's impact, `posting_impacts`), it is read instead of computed, one load
    instead of three per posting.

    Every weight positive: each posting's ``w · impact`` is then above 0 (a tf of at
    least 1, a stored impact above 0: both checked), so a document's sum never comes back
    to 0.0 and it is listed once, and ``touched`` (one slot more than ``acc``) cannot
    overflow. Returns ``-FAULT_*`` at a damaged posting, ``acc`` left as it is."""
    um = np.uint64(m)
    stored = imp.shape[0] > 0  # loop-invariant: LLVM unswitches it
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    npost = docs.shape[0]
    und = np.uint64(acc.shape[0])
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR
        for p in range(np.uint64(a0), np.uint64(e0)):
            d = np.uint64(docs[p])
            if stored:
                v = imp[p]
                if BOUNDS_CHECK and ((d >= und) | (not v > 0.0)):
                    return -(FAULT_DOCS if d >= und else FAULT_IMPACTS)
            else:
                t = np.uint64(tfs[p])
                if _bad_posting(d, und, t):
                    return -_posting_fault(d, und)
                v = _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
            a = acc[d]
            touched[um] = d
            um += np.uint64(a == 0.0)
            acc[d] = a + w * v
    return np.int64(um)


@jit(inline="always")
def _accumulate_term(docs, tfs, code, table, itab, cap, a0, e0, w, acc, touched, m):
    """Add one term's ``w · tf/(tf + denom)`` over postings [a0, e0) to ``acc``, first-seen
    documents appended to ``touched`` after the ``m`` there (branch-free); returns the new
    count, or ``-FAULT_*`` at a damaged posting. `_accumulate`'s loop for one term
    (`_impact_u`); [a0, e0) checked by the caller, ``w`` positive."""
    um = np.uint64(m)
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    und = np.uint64(acc.shape[0])
    for p in range(np.uint64(a0), np.uint64(e0)):
        d = np.uint64(docs[p])
        t = np.uint64(tfs[p])
        if _bad_posting(d, und, t):
            return -_posting_fault(d, und)
        v = _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
        a = acc[d]
        touched[um] = d
        um += np.uint64(a == 0.0)
        acc[d] = a + w * v
    return np.int64(um)


@jit
def _accumulate_levels(indptr, docs, local, weights, acc, touched, m, imp, listed):
    """The approximate pass's `_accumulate` (``listed``) or `_accumulate_dense` (not): each
    listed term's ``weights[i]`` times each of its postings' stored levels ``imp``, all in
    float32 (``acc`` a float32 view of the accumulator, ``weights`` float32): half the bytes
    the scattered additions touch and no conversions, ~25% less time a posting than float64
    at 3M documents (`_approx_keep` bounds the rounding). With ``listed``, first-seen
    documents go to ``touched`` after the ``m`` there (branch-free; every level at least 1
    and every weight positive: a sum never comes back to 0). Returns the new count (0
    without ``listed``), or ``-FAULT_*`` at a damaged posting or range."""
    um = np.uint64(m)
    npost = docs.shape[0]
    und = np.uint64(acc.shape[0])
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR
        for p in range(np.uint64(a0), np.uint64(e0)):
            d = np.uint64(docs[p])
            v = imp[p]
            if BOUNDS_CHECK and ((d >= und) | (v == 0)):
                return -(FAULT_DOCS if d >= und else FAULT_IMPACTS)
            x = w * np.float32(v)
            if listed:  # loop-invariant: LLVM unswitches it
                a = acc[d]
                touched[um] = d
                um += np.uint64(a == 0.0)
                acc[d] = a + x
            else:
                acc[d] += x
    return np.int64(um)


@jit(inline="always")
def _impacts_of(imeta, s):
    """Shard s's per-posting impacts from ``imeta``, or an empty array where there are none."""
    if imeta.shape[0] == 0:
        return np.empty(0)
    return _view(imeta, s, 0, np.float64)


@jit(inline="always")
def _impacts32_of(imeta32, s):
    """Shard s's stored quantized impacts from ``imeta32`` (``impact_table(..., IMPACT_DTYPE)``)."""
    return _view(imeta32, s, 0, IMPACT_DTYPE)


@jit(inline="always")
def _packed_of(pmeta, s):
    """Shard s's packed arrays from ``pmeta`` (``layout.PACKED_FIELDS`` order)."""
    return (_view(pmeta, s, 0, np.uint32), _view(pmeta, s, 1, np.int64), _view(pmeta, s, 2, np.int32),
            _view(pmeta, s, 3, np.uint8), _view(pmeta, s, 4, np.int32), _view(pmeta, s, 5, np.int64),
            _view(pmeta, s, 6, np.int64))


@jit(inline="always")
def _no_packed():
    """A plain shard's stand-ins for the packed arrays `_rescore_shard` takes (never read)."""
    return (np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32),
            np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))


@jit(inline="always")
def _is_dense(indptr, local, nd, dense_min):
    """Whether a shard of ``nd`` documents is read back by one scan of its accumulator
    instead of a list of touched documents: at least ``dense_min`` documents (the list
    costs little while the accumulator stays in a core's cache) and enough postings of
    the query there (``DENSE_DIVISOR``)."""
    if nd < dense_min or dense_min < 0:
        return False
    post = 0
    for i in range(local.shape[0]):
        if local[i] >= 0:
            post += indptr[local[i] + 1] - indptr[local[i]]
    return post * DENSE_DIVISOR >= nd


@jit
def _total_postings(meta, gids):
    """The query's postings over every shard."""
    local = np.empty(gids.shape[0], dtype=np.int64)
    post = 0
    for s in range(meta.shape[0]):
        if _local_terms(_view(meta, s, 3, np.int32), gids, local):
            indptr = _view(meta, s, 0, np.int64)
            for i in range(local.shape[0]):
                if local[i] >= 0:
                    post += indptr[local[i] + 1] - indptr[local[i]]
    return post


@jit
def _accumulate_dense(indptr, docs, tfs, code, table, itab, cap, local, weights, acc, imp):
    """`_accumulate` without the list of touched documents (read back by a scan of
    the whole accumulator instead: ``_offer_dense``, ``_approx_offer``). Keeping that
    list costs a store per posting whose address waits on the accumulator's load, so a
    query with about as many postings as the shard has documents pays more for it than
    for one pass over the accumulator. ``imp``: each posting's impact, float64 (the same
    bits as the grid's); empty: from the grid (the approximate pass's stored levels:
    `_accumulate_levels`). Same order of additions as ``_accumulate``. Returns 0, or
    ``-FAULT_*`` at a damaged posting (no touched list: any weights, any tf or impact is safe here)."""
    stored = imp.shape[0] > 0  # loop-invariant: LLVM unswitches it
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    npost = docs.shape[0]
    und = np.uint64(acc.shape[0])
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR
        for p in range(np.uint64(a0), np.uint64(e0)):
            d = np.uint64(docs[p])
            if BOUNDS_CHECK and d >= und:
                return -FAULT_DOCS
            if stored:
                v = np.float64(imp[p])
            else:
                v = _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
            acc[d] += w * v
    return 0


@jit(inline="always")
def _any_at_least(acc, j0, j1, bar):
    """Whether any of acc[j0:j1] is >= bar. A whole run (``SCAN`` entries) is a count of
    compares with a constant trip count and unsigned indices, which LLVM vectorizes:
    ~0.1 ns a score, where branching on each, a run of variable length or signed indices
    (a wraparound check per access) cost 4-15 times that."""
    if j1 - j0 < SCAN:
        return True  # the shard's last, partial run: read score by score
    hit = 0
    b = np.uint64(j0)
    for j in range(np.uint64(SCAN)):
        hit += np.int64(acc[b + j] >= bar)
    return hit > 0


@jit
def _offer_dense(acc, rank, base, bv, br, bd, n, tv, tr, k):
    """Offer every positive score in ``acc`` (one per document of the shard, read in
    order) to a ``_new_top`` collector as docno ``base | id``, then zero ``acc``; returns
    (n, tv, tr). ``SCAN`` scores at a time are compared with the collector's bar at once
    (most runs have none that pass), and only a run with one is offered score by score."""
    heap = bv.shape[0] == k
    nd = acc.shape[0]
    for j0 in range(0, nd, SCAN):
        j1 = min(j0 + SCAN, nd)
        bar = (bv[0] if n == k else 5e-324) if heap else tv  # positive: zeros never pass
        if not _any_at_least(acc, j0, j1, bar):
            continue
        for j in range(np.uint64(j0), np.uint64(j1)):
            v = acc[j]
            if v >= bar:
                n, tv, tr = _offer_one(bv, br, bd, n, tv, tr, k, v, rank[j], base | np.int64(j))
                bar = (bv[0] if n == k else 5e-324) if heap else tv
    acc[:] = 0.0
    return n, tv, tr


@jit
def search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                        touched, table, itab, gids, weights, k, pk):
    """``search_shards`` with ``prune_min = -1`` (exhaustive term-at-a-time over every
    shard; the same results), in a function that leaves the pruning code out: numba
    compiles it in less than half the time ``search_shards`` takes on a fresh install, so a corpus
    whose queries never reach the pruning threshold never compiles pruning at all
    (``BM25Retriever`` chooses). ``imeta`` (``impact_table``; ``NO_IMPACTS`` for none):
    each shard's per-posting impacts, read instead of computed where given. ``imeta32``
    (``impact_table(..., IMPACT_DTYPE)``; ``NO_IMPACTS`` for none): the stored quantized
    impacts of the parameters in use, read (``_search_approx``) where there are no
    float64 ones, every weight is positive and the query has at least ``rescore_min``
    postings per (k, term) pair (the exact rescoring of about k candidates looks up each
    term once per candidate; 0: always, -1: never). A shard of at least ``dense_min``
    documents where the query has postings for at least 1/``DENSE_DIVISOR`` of them is
    read back by one scan of its accumulator (``_is_dense``), and so is every shard for
    a query with a non-positive weight (whose sums may come back to 0.0 and list a
    document twice). ``pk`` (``pmeta``, ``poff``, ``pids``, ``ltab``): the packed shards'
    arrays (``layout.packed_table``; ``NO_PACKED``: every term may be read decoded) and,
    per shard, the local terms the caller pinned decoded (``pids[poff[s]:poff[s + 1]]``,
    ascending); the approximate pass reads every other term of a packed shard from its
    blocks (`_search_approx`), and any other path answers ``NEED_DECODED`` for a query with
    such a term. Returns (docnos, scores, fault), as `search_shards`."""
    cap = itab.shape[0] // table.shape[0]
    if imeta.shape[0] == 0 and imeta32.shape[0] > 0 and rescore_min >= 0 and gids.shape[0] > 0 and \
            weights.min() > 0.0 and _total_postings(meta, gids) >= rescore_min * k * gids.shape[0]:
        return _search_approx(meta, imeta32, dense_min, code_proto, doc_off, id_rank, acc, touched, table, itab,
                              cap, gids, weights, k, pk)
    if not all_pinned(meta, pk, gids):
        return np.zeros(0, dtype=np.int64), np.zeros(0), NEED_DECODED
    local = np.empty(gids.shape[0], dtype=np.int64)
    bv, br, bd, tv, tr = _new_top(k)
    n = 0
    positive = gids.shape[0] == 0 or weights.min() > 0.0
    for s in range(meta.shape[0]):
        if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
            continue
        lo, hi = doc_off[s], doc_off[s + 1]
        nd = hi - lo  # scored in acc[:nd], as in search_shards
        indptr = _view(meta, s, 0, np.int64)
        if not positive or _is_dense(indptr, local, nd, dense_min):
            f = _accumulate_dense(indptr, _view(meta, s, 1, np.int32),
                                  _view(meta, s, 2, code_proto[1].dtype),
                                  _view(meta, s, 5, code_proto[0].dtype), table, itab, cap, local, weights, acc[:nd],
                                  _impacts_of(imeta, s))
            if f < 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -f
            n, tv, tr = _offer_dense(acc[:nd], id_rank[lo:hi], np.int64(s) << 32, bv, br, bd, n, tv, tr, k)
            continue
        m = _accumulate(indptr, _view(meta, s, 1, np.int32), _view(meta, s, 2, code_proto[1].dtype),
                        _view(meta, s, 5, code_proto[0].dtype), table, itab, cap, local, weights, acc[:nd],
                        touched[:nd + 1], 0, _impacts_of(imeta, s))
        if m < 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -m
        n, tv, tr = _offer_scores(acc[:nd], touched[:nd + 1], m, id_rank[lo:hi], np.int64(s) << 32,
                                  bv, br, bd, n, tv, tr, k, True)
    dn, sc = _top_sorted(bv, br, bd, n, k)
    return dn, sc, 0


@jit(inline="always")
def _split_pinned(local, pids, p0, p1, dec, unp):
    """Split a packed shard's query terms ``local`` into those pinned decoded (in
    ``pids[p0:p1]``, ascending) into ``dec`` and the rest into ``unp`` (-1 elsewhere);
    returns how many are not pinned."""
    n = 0
    for i in range(local.shape[0]):
        li = local[i]
        dec[i] = -1
        unp[i] = -1
        if li < 0:
            continue
        if _find(pids[p0:p1], li) >= 0:
            dec[i] = li
        else:
            unp[i] = li
            n += 1
    return n


@jit
def all_pinned(meta, pk, gids):
    """Whether every term of ``gids`` that a packed shard of ``pk`` holds is pinned decoded
    there (``search_shards_plain`` says what ``pk`` holds): what every path but the
    approximate pass needs."""
    pmeta, poff, pids, _ = pk
    if pmeta.shape[0] == 0:
        return True
    local = np.empty(gids.shape[0], dtype=np.int64)
    dec = np.empty(gids.shape[0], dtype=np.int64)
    unp = np.empty(gids.shape[0], dtype=np.int64)
    for s in range(meta.shape[0]):
        if pmeta[s, 1] == 0 or not _local_terms(_view(meta, s, 3, np.int32), gids, local):
            continue
        if _split_pinned(local, pids, poff[s], poff[s + 1], dec, unp):
            return False
    return True


@jit
def _approx_keep(T, u):
    """A factor c of the float rounding of a sum of ``T`` positive terms in arithmetic of
    unit roundoff ``u`` (2^-53 for float64, 2^-24 for float32), each term a product of a
    weight that was rounded once too: at most 3T roundings, so such a sum lies within
    delta = (T + 1)·8u (relative, more than ``(1 + u)^(3T) - 1``) of its real value, and
    c = (1 - delta)/(1 + delta). `_approx_margin` says how the approximate sums' factor
    (float32) and the exact sums' one (float64) are used."""
    delta = (T + 1) * 8.0 * u
    return (1.0 - delta) / (1.0 + delta)


@jit
def _approx_margin(weights):
    """The absolute part of the approximate pass's bar: ``IMPACT_STEP`` times the sum of
    the (positive) weights, rounded up.

    The bound: a stored impact q stands for q·STEP, and the build chose q as the least
    with q·STEP >= the impact (``_quantize``), so each term adds at least its exact share
    and less than w·STEP more. Summed over a document's terms, its approximate score A
    and its exact score E (real arithmetic) satisfy E <= A < E + M, M = STEP·Σw. k
    documents approximate at least theta, so the exact k-th score is above theta - M, and
    a document of the exact top k approximates at least that. With the float rounding
    of both sums (c: `_approx_keep`'s factor for the approximate sums, float32, times its
    factor for the exact ones, float64) a document below ``c · theta - M`` cannot be in the
    exact top k; those at or above it are rescored exactly."""
    return IMPACT_STEP * weights.sum() * (1.0 + 2.0 ** -40)


@jit
def _approx_compact(av, ad, n, bar, k, c, margin):
    """Raise ``bar`` to ``c`` times the k-th largest of ``av[:n]`` less ``margin``
    and keep, in place, the entries at or above it (`_approx_margin`: none of the
    exact top k is dropped); returns (n, bar)."""
    if n >= k:
        bar = max(bar, _kth_vals(av, n, k, 0.0) * c - margin)
    j = 0
    for i in range(n):
        if av[i] >= bar:
            av[j] = av[i]
            ad[j] = ad[i]
            j += 1
    return j, bar


@jit
def _approx_scan(acc, ids, m, j, base, av, ad, n, bar, k, c, margin):
    """Append (approximate score, docno ``base | id``) of each document at or above
    ``bar`` (positive) to the candidate buffer ``av, ad`` from entry ``j`` on: every
    document of the shard where ``m < 0`` (``acc`` read in order, ``SCAN`` at a time as
    ``_offer_dense`` reads it; the caller zeroes it after), else ``ids[:m]`` (zeroing
    each score read). A full buffer is compacted (``_approx_compact``). Returns (next
    entry, n, bar): it stops early, after a compaction that left the buffer over half
    full (near-ties), for the caller to grow it (``_approx_offer``)."""
    end = acc.shape[0] if m < 0 else m
    cap = av.shape[0]
    while j < end:
        j1 = min((j // SCAN + 1) * SCAN, end)
        if m < 0 and not _any_at_least(acc, j, j1, bar):
            j = j1
            continue
        for x in range(j, j1):
            d = np.uint64(x) if m < 0 else np.uint64(ids[x])  # unsigned: no wraparound check
            v = acc[d]
            if m >= 0:
                acc[d] = 0.0
            if v >= bar:
                av[n] = v
                ad[n] = base | np.int64(d)
                n += 1
                if n == cap:
                    n, bar = _approx_compact(av, ad, n, bar, k, c, margin)
                    if 2 * n > cap:
                        return x + 1, n, bar
        j = j1
    return end, n, bar


@jit
def _approx_offer(acc, ids, m, base, av, ad, n, bar, k, c, margin):
    """`_approx_scan` of the whole shard, the buffer doubled wherever it stops;
    leaves ``acc`` zeroed; returns (av, ad, n, bar)."""
    j = 0
    end = acc.shape[0] if m < 0 else m
    while True:
        j, n, bar = _approx_scan(acc, ids, m, j, base, av, ad, n, bar, k, c, margin)
        if j >= end:
            if m < 0:
                acc[:] = 0.0
            return av, ad, n, bar
        nav = np.empty(2 * av.shape[0])
        nad = np.empty(2 * av.shape[0], dtype=np.int64)
        nav[:n] = av[:n]
        nad[:n] = ad[:n]
        av, ad = nav, nad


#: Postings on either side of its interpolated position whose cache lines `_find_all` asks
#: for before any search: a long question's lookups at 1M documents land a median 23
#: postings from it (90%: within 90).
FIND_AHEAD = 32


@jit
def _find_all(docs, lo, hi, ids, pos):
    """``pos[j]``: the position of ``ids[j]`` in ``docs[lo:hi]`` (ascending), or -1. Each
    search starts where the id would lie if the term's documents were spread evenly between
    its first and last (interpolation), gallops out from there until it brackets the id, then
    halves the bracket: a term's documents are spread about evenly over a shard, so the
    probes stay within a few cache lines of the first one, where a binary search over the
    whole list took ~log2(n) probes across as many pages (at 3M documents, a long question's
    100 candidates: 1.4-1.6 ms of lookups against 1.2-1.35 then, of 10-12 ms). The lines
    around every id's first probe are prefetched before any search (``FIND_AHEAD``), so
    their misses overlap instead of each waiting on the branch before it (0.25-0.35 ms of
    lookups a long question at 1M documents with ~24 candidates a shard, against
    0.33-0.42). Every probe lies in [lo, hi) whatever ``docs`` holds; a list that does not
    ascend finds less, never reads outside it."""
    m = ids.shape[0]
    n = hi - lo
    if n <= 0:
        pos[:] = -1
        return
    first = np.int64(docs[lo])
    last = np.int64(docs[hi - 1])
    scale = (n - 1) / max(last - first, 1)
    for j in range(m):  # every search's first cache lines asked for at once (no branch waits)
        x = min(max(np.int64(ids[j]), first), last)
        g = lo + min(np.int64((x - first) * scale), n - 1)
        pos[j] = g  # the search below starts here
        for t in range(-FIND_AHEAD, FIND_AHEAD + 1, 16):
            _prefetch(docs, min(max(g + t, lo), hi - 1))
    for j in range(m):
        x = np.int64(ids[j])
        if x < first or x > last:
            pos[j] = -1
            continue
        g = pos[j]
        # Bracket x: docs[a] < x <= docs[e - 1] (a = lo - 1 / e = hi standing for the ends).
        if np.int64(docs[g]) < x:
            a = g
            step = 1
            while a + step < hi and np.int64(docs[a + step]) < x:
                a += step
                step *= 2
            e = min(a + step, hi - 1) + 1
        else:
            e = g + 1
            step = 1
            while e - 1 - step >= lo and np.int64(docs[e - 1 - step]) >= x:
                e -= step
                step *= 2
            a = max(e - 1 - step, lo - 1)
        while e - a > 1:  # docs[a] < x <= docs[e - 1]: halve to the first at or above x
            mid = (a + e) >> 1
            if np.int64(docs[mid]) < x:
                a = mid
            else:
                e = mid
        pos[j] = e if e < hi and np.int64(docs[e]) == x else -1


@jit
def _rescore_shard(indptr, docs, tfs, code, table, itab, cap, local, weights, ids, rank, base,
                   bv, br, bd, n, tv, tr, k, unp, pw, pb, pf, pwd, ptb, pe, max_tf):
    """The exact scores of one shard's documents ``ids`` (ascending), offered to a
    ``_new_top`` collector; returns (n, tv, tr). Each term's posting of a document is
    found by lookup and its impact computed as ``_accumulate`` computes it, added from
    0.0 in the canonical order: the bits exhaustive scoring gives. Term by term, all the
    candidates' lookups of one term together (``_find_all``); a term of a packed shard not
    decoded (``unp[i]`` >= 0; ``pw`` ... ``pe``, ``max_tf``: the shard's packed arrays) is
    looked up in its blocks (``packed_tfs``). ``ids`` come from checked postings; a
    damaged range or block: (``-FAULT_*``, tv, tr)."""
    sc = np.zeros(ids.shape[0])
    pos = np.empty(ids.shape[0], dtype=np.int64)
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    for i in range(local.shape[0]):
        if unp[i] >= 0:
            f = packed_tfs(pw, pb, pf, pwd, ptb, pe, max_tf, code.shape[0], unp[i], ids, pos)
            if f:
                return -f, tv, tr
            w = weights[i]
            for j in range(ids.shape[0]):
                t = pos[j]
                if t > 0:
                    sc[j] += w * _impact_u(np.uint64(t), np.uint64(code[ids[j]]), table, itab, ucap, nt)
            continue
        li = local[i]
        if li < 0:
            continue
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, docs.shape[0]):
            return -FAULT_INDPTR, tv, tr
        _find_all(docs, a0, e0, ids, pos)
        w = weights[i]
        for j in range(ids.shape[0]):
            p = pos[j]
            if p >= 0:
                sc[j] += w * _impact_u(np.uint64(tfs[p]), np.uint64(code[ids[j]]), table, itab, ucap, nt)
    for j in range(ids.shape[0]):
        n, tv, tr = _offer_one(bv, br, bd, n, tv, tr, k, sc[j], rank[ids[j]], base | ids[j])
    return n, tv, tr


@jit
def _search_approx(meta, imeta32, dense_min, code_proto, doc_off, id_rank, acc, touched, table, itab, cap, gids,
                   weights, k, pk):
    """``search_shards_plain`` over the stored quantized impacts (positive weights):
    every shard's approximate scores (each posting's ``IMPACT_DTYPE`` level times its
    term's weight · ``IMPACT_STEP``, in float32: `_accumulate_levels`) into one candidate
    buffer whose bar is its k-th best less the proven margin (`_approx_margin`), then the survivors
    (the k best and their near-ties) rescored exactly (``_rescore_shard``) and ranked:
    the same documents and bits as exhaustive float64 scoring, at two bytes a posting
    read instead of a tf, a length code and a table cell. A packed shard's terms not pinned
    decoded (``pk``, ``search_shards_plain``) are read from their blocks, the same levels
    (``packed.accumulate_packed``), and rescored from them. Returns (docnos, scores, fault)."""
    pmeta, poff, pids, ltab = pk
    local = np.empty(gids.shape[0], dtype=np.int64)
    dec = np.empty(gids.shape[0], dtype=np.int64)
    unp = np.full(gids.shape[0], -1, dtype=np.int64)
    nop = _no_packed()
    acc32 = acc.view(np.float32)  # zero where acc is, and left so
    c = _approx_keep(gids.shape[0], 2.0 ** -24) * _approx_keep(gids.shape[0], 2.0 ** -53)
    margin = _approx_margin(weights)
    qweights = (weights * IMPACT_STEP).astype(np.float32)
    av = np.empty(4 * k + 16)
    ad = np.empty(4 * k + 16, dtype=np.int64)
    n = 0
    bar = 5e-324  # the smallest positive float: any positive score passes
    for s in range(meta.shape[0]):
        if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
            continue
        lo, hi = doc_off[s], doc_off[s + 1]
        nd = hi - lo  # scored in acc32[:nd]
        indptr = _view(meta, s, 0, np.int64)
        docs = _view(meta, s, 1, np.int32)
        tfs = _view(meta, s, 2, code_proto[1].dtype)
        code = _view(meta, s, 5, code_proto[0].dtype)
        imp = _impacts32_of(imeta32, s)
        packed = pmeta.shape[0] > 0 and pmeta[s, 1] > 0
        nun = _split_pinned(local, pids, poff[s], poff[s + 1], dec, unp) if packed else 0
        loc = dec if nun else local
        if _is_dense(indptr, local, nd, dense_min):
            f = _accumulate_levels(indptr, docs, loc, qweights, acc32[:nd], touched, 0, imp, False)
            if f >= 0 and nun:
                f = accumulate_packed(*_packed_of(pmeta, s), code, table, ltab, cap, unp, qweights, acc32[:nd],
                                      touched, 0, False)
            if f < 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -f
            av, ad, n, bar = _approx_offer(acc32[:nd], touched, -1, np.int64(s) << 32, av, ad, n, bar, k, c,
                                           margin)
        else:
            m = _accumulate_levels(indptr, docs, loc, qweights, acc32[:nd], touched[:nd + 1], 0, imp, True)
            if m >= 0 and nun:
                m = accumulate_packed(*_packed_of(pmeta, s), code, table, ltab, cap, unp, qweights, acc32[:nd],
                                      touched[:nd + 1], m, True)
            if m < 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -m
            av, ad, n, bar = _approx_offer(acc32[:nd], touched, m, np.int64(s) << 32, av, ad, n, bar, k, c,
                                           margin)
    n, bar = _approx_compact(av, ad, n, bar, k, c, margin)
    cand = np.sort(ad[:n])
    bv, br, bd, tv, tr = _new_top(k)
    nn = 0
    j = 0
    while j < n:
        s = cand[j] >> 32
        e = j
        while e < n and (cand[e] >> 32) == s:
            e += 1
        _local_terms(_view(meta, s, 3, np.int32), gids, local)
        lo, hi = doc_off[s], doc_off[s + 1]
        ids = cand[j:e] & np.int64(0xFFFFFFFF)
        args = (_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32), _view(meta, s, 2, code_proto[1].dtype),
                _view(meta, s, 5, code_proto[0].dtype), table, itab, cap)
        tail = (id_rank[lo:hi], np.int64(s) << 32, bv, br, bd, nn, tv, tr, k)
        if pmeta.shape[0] > 0 and pmeta[s, 1] > 0 and _split_pinned(local, pids, poff[s], poff[s + 1], dec, unp):
            pw, pb, pf, pwd, ptb, pe, info = _packed_of(pmeta, s)
            nn, tv, tr = _rescore_shard(*args, dec, weights, ids, *tail, unp, pw, pb, pf, pwd, ptb, pe, info[0])
        else:
            unp[:] = -1
            nn, tv, tr = _rescore_shard(*args, local, weights, ids, *tail, unp, *nop, 0)
        if nn < 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -nn
        j = e
    dn, sc = _top_sorted(bv, br, bd, nn, k)
    return dn, sc, 0
