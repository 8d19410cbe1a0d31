"""The top k: heaps and buffers ordered by the ranking itself (score descending, then
``id_rank`` ascending), and the k-th largest of a set of partial scores.

The k best are kept in one size-k heap ordered by the ranking (`_heap_push`), shared by all
shards, so no per-shard candidate lists are merged. The exhaustive paths keep them the same
way up to ``HEAP_K``; above it, in a buffer of 4k + 16 entries that only admits what beats a
bar (the k-th best at the last cut) and is cut back to its best k by quickselect when full
(`_offer_scores`, `_compact_top`), because at k=100 sifting every admitted document through
a heap's ~7 levels dominates the kernel. `_kth_vals` and `_kth_offer` keep the k largest
values of a pass in a min-heap: a lower bound ``theta`` on the final k-th score for pruning.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .layout import HEAP_K


@jit(inline="always")
def _new_heap(k):
    """An empty top-k heap: (scores, id ranks, docnos), for ``_heap_push``."""
    return np.empty(k), np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)


@jit(inline="always")
def _heap_push(hv, hr, hd, n, v, r, d):
    """Offer (score v, id rank r, docno d) to the top-k heap of ``n`` entries (k = its size);
    returns the new count. The root is the worst kept entry: lowest score, then highest
    rank; so the heap holds exactly the k best by (score descending, rank ascending)."""
    k = hv.shape[0]
    if n < k:
        i = n
        while i > 0:  # sift up while the parent ranks better than the new entry
            par = (i - 1) >> 1
            pv = hv[par]
            if pv < v or (pv == v and hr[par] > r):
                break
            hv[i] = pv
            hr[i] = hr[par]
            hd[i] = hd[par]
            i = par
        hv[i] = v
        hr[i] = r
        hd[i] = d
        return n + 1
    if v < hv[0] or (v == hv[0] and r > hr[0]):
        return n
    _sift_down(hv, hr, hd, 0, k, v, r, d)
    return n


@jit(inline="always")
def _sift_down(hv, hr, hd, i, n, v, r, d):
    """Place (v, r, d) at slot ``i`` of a heap of ``n`` entries, moving worse children up."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (hv[c + 1] < hv[c] or (hv[c + 1] == hv[c] and hr[c + 1] > hr[c])):
            c += 1
        cv = hv[c]
        if cv > v or (cv == v and hr[c] < r):
            break
        hv[i] = cv
        hr[i] = hr[c]
        hd[i] = hd[c]
        i = c
    hv[i] = v
    hr[i] = r
    hd[i] = d


@jit
def _push_scores(acc, ids, m, rank, base, hv, hr, hd, n, zero):
    """Offer every positive ``acc[ids[j]]`` (j < m) to the heap as docno ``base | id``
    and return the count; with ``zero``, reset each score read (a document listed twice,
    its sum back at exactly 0.0, reads 0.0 the second time and is skipped)."""
    for j in range(m):
        d = np.uint64(ids[j])  # unsigned: no wraparound check on the accesses
        v = acc[d]
        if zero:
            acc[d] = 0.0
        if v > 0.0:
            if n == hv.shape[0] and v < hv[0]:
                continue
            n = _heap_push(hv, hr, hd, n, v, rank[d], base | np.int64(d))
    return n


@jit
def _heap_sorted(hv, hr, hd, n):
    """(docnos, scores) of the heap's ``n`` entries, best first; empties the heap."""
    out_d = np.empty(n, dtype=np.int64)
    out_v = np.empty(n)
    for j in range(n - 1, -1, -1):  # pop the worst into the last free slot
        out_d[j] = hd[0]
        out_v[j] = hv[0]
        if j > 0:
            _sift_down(hv, hr, hd, 0, j, hv[j], hr[j], hd[j])
    return out_d, out_v


@jit(inline="always")
def _new_top(k):
    """An empty top-k collector for ``_offer_scores``: (scores, id ranks, docnos, bar
    score, bar rank). For k <= HEAP_K it is a size-k heap (``_heap_push``), which is
    cheapest there; above, a buffer with room for 4k + 16 entries, cut back to its best k
    when full, whose bar is the k-th best entry of the last cut (at first the smallest
    positive float and any rank, so any positive score passes)."""
    c = k if k <= HEAP_K else 4 * k + 16
    return np.empty(c), np.empty(c, dtype=np.int64), np.empty(c, dtype=np.int64), 5e-324, np.int64(2**62)


@jit
def _compact_top(bv, br, bd, n, k):
    """Move the best ``k`` of the buffer's ``n`` entries (score descending, rank ascending;
    ranks are distinct, so no two keys tie) to its first k slots, in no order, by
    quickselect (Hoare partition, median-of-three pivot); returns the k-th best (score,
    rank), which is then at slot k - 1. Needs n > k."""
    lo = 0
    hi = n - 1
    t = k - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        # median of three by the ranking's order, as the pivot key
        a, b, c = lo, mid, hi
        if bv[b] > bv[a] or (bv[b] == bv[a] and br[b] < br[a]):
            a, b = b, a
        if bv[c] > bv[b] or (bv[c] == bv[b] and br[c] < br[b]):
            b, c = c, b
            if bv[b] > bv[a] or (bv[b] == bv[a] and br[b] < br[a]):
                a, b = b, a
        pv = bv[b]
        pr = br[b]
        i = lo
        j = hi
        while i <= j:
            while bv[i] > pv or (bv[i] == pv and br[i] < pr):
                i += 1
            while bv[j] < pv or (bv[j] == pv and br[j] > pr):
                j -= 1
            if i <= j:
                bv[i], bv[j] = bv[j], bv[i]
                br[i], br[j] = br[j], br[i]
                bd[i], bd[j] = bd[j], bd[i]
                i += 1
                j -= 1
        if t <= j:
            hi = j
        elif t >= i:
            lo = i
        else:
            break
    return bv[t], br[t]


@jit
def _offer_scores(acc, ids, m, rank, base, bv, br, bd, n, tv, tr, k, zero):
    """``_push_scores`` into a collector from ``_new_top``: offer every positive
    ``acc[ids[j]]`` (j < m) as docno ``base | id``; returns (n, tv, tr). In buffer mode an
    entry that beats the bar (tv, tr) is appended, and a full buffer is cut back to its
    best k (``_compact_top``), whose k-th becomes the bar: most documents cost one
    compare with a bar that only rises, and the buffer is cut every ~3k appends, where a
    heap sifts every entry that beats its root through log2(k) levels (at k=10 the heap
    is cheaper)."""
    if bv.shape[0] == k:  # heap mode (k <= HEAP_K)
        return _push_scores(acc, ids, m, rank, base, bv, br, bd, n, zero), tv, tr
    cap = bv.shape[0]
    for j in range(m):
        d = np.uint64(ids[j])  # unsigned: no wraparound check on the accesses
        v = acc[d]
        if zero:
            acc[d] = 0.0
        if v >= tv:  # the bar is positive: zeros never pass
            r = rank[d]
            if v == tv and r > tr:
                continue
            bv[n] = v
            br[n] = r
            bd[n] = base | np.int64(d)
            n += 1
            if n == cap:
                tv, tr = _compact_top(bv, br, bd, n, k)
                n = k
    return n, tv, tr


@jit(inline="always")
def _offer_one(bv, br, bd, n, tv, tr, k, v, r, d):
    """Offer one positive (score v, id rank r, docno d) to a ``_new_top`` collector, as
    ``_offer_scores`` offers each of its documents; returns (n, tv, tr)."""
    if bv.shape[0] == k:  # heap mode
        if n < k or v > bv[0] or (v == bv[0] and r < br[0]):
            n = _heap_push(bv, br, bd, n, v, r, d)
        return n, tv, tr
    if v > tv or (v == tv and r <= tr):
        bv[n] = v
        br[n] = r
        bd[n] = d
        n += 1
        if n == bv.shape[0]:
            tv, tr = _compact_top(bv, br, bd, n, k)
            n = k
    return n, tv, tr


@jit
def _top_sorted(bv, br, bd, n, k):
    """(docnos, scores) of the collector's best ``min(n, k)`` entries, best first."""
    if bv.shape[0] == k:  # heap mode
        return _heap_sorted(bv, br, bd, n)
    if n > k:
        _compact_top(bv, br, bd, n, k)
        n = k
    order = np.argsort(-bv[:n])  # by score; runs of equal scores then by rank below
    out_d = np.empty(n, dtype=np.int64)
    out_v = np.empty(n)
    out_r = np.empty(n, dtype=np.int64)
    for j in range(n):
        o = order[j]
        v = bv[o]
        r = br[o]
        d = bd[o]
        i = j
        while i > 0 and out_v[i - 1] == v and out_r[i - 1] > r:  # insertion within a tie
            out_v[i] = out_v[i - 1]
            out_r[i] = out_r[i - 1]
            out_d[i] = out_d[i - 1]
            i -= 1
        out_v[i] = v
        out_r[i] = r
        out_d[i] = d
    return out_d, out_v


@jit
def _kth_vals(vals, m, k, floor=0.0):
    """max(floor, k-th largest of vals[:m]) (m >= k), through a size-k min-heap of the
    values above ``floor``: one pass, and most values cost one compare. The callers pass
    theta, a lower bound they already hold: values at or below it cannot raise it and
    never enter the heap (with the floor, 0.889x time at 1M, k=100; 0.970x at k=10).
    Callers gather ``acc[ids]`` into ``vals`` once (``_gather``) and reuse it for the
    filter that follows, which then reads no score at random again."""
    heap = np.empty(k)
    n = 0
    for j in range(m):
        v = vals[j]
        if v <= floor:
            continue
        if n < k:
            i = n
            n += 1
            while i > 0:  # sift up
                parent = (i - 1) >> 1
                if heap[parent] <= v:
                    break
                heap[i] = heap[parent]
                i = parent
            heap[i] = v
        elif v > heap[0]:
            i = 0
            while True:  # sift down from the root
                c = 2 * i + 1
                if c >= k:
                    break
                if c + 1 < k and heap[c + 1] < heap[c]:
                    c += 1
                if heap[c] >= v:
                    break
                heap[i] = heap[c]
                i = c
            heap[i] = v
    return heap[0] if n == k else floor


@jit(inline="always")
def _kth_offer(heap, n, v):
    """Offer v to a min-heap of the k largest values offered (k = its size, ``n`` held);
    the new count. Its root is then the k-th largest once ``n == k``."""
    k = heap.shape[0]
    if n < k:
        i = n
        while i > 0:
            parent = (i - 1) >> 1
            if heap[parent] <= v:
                break
            heap[i] = heap[parent]
            i = parent
        heap[i] = v
        return n + 1
    if v <= heap[0]:
        return n
    i = 0
    while True:
        c = 2 * i + 1
        if c >= k:
            break
        if c + 1 < k and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = v
    return n
