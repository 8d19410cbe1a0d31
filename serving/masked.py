"""BM25 under a mask (``serving/filters.py``): the top k of the allowed documents, exactly.

Pre-filtering, not post-filtering: a disallowed document never enters the top-k heap, so a
filter never starves k (the failure of a fixed top-k filtered afterwards), and an allowed
document's score is the unfiltered one, bit for bit: the same terms in the same canonical
order, each posting's ``w · tf / (tf + denom)`` computed as ``kernels._impact`` computes it
(or read from the same stored per-posting impacts), added from 0.0 term by term; ties broken
by doc_id through the same id ranks. So the filtered top k equals exhaustive BM25 over the
allowed documents.

Per shard the kernel picks the cheaper of two exact strategies:

* **candidates** where the allowed documents are few next to the query's postings (a
  selective filter): for each query term, gallop through its postings to each allowed
  document, in document order. Cost ~ terms × allowed × log(gap): a 0.1% filter reads a
  small fraction of the postings, so it is faster than the unfiltered query.
* **masked term-at-a-time** otherwise: every posting is read and a disallowed document is
  skipped before it touches the accumulator.

Neither prunes: MaxScore's bounds stay valid upper bounds under a mask, but its lower bound
on the k-th score must then come from allowed documents only; the kernel keeps this simple
and exact. A broad mask (``DEEP_MIN_FRACTION`` of the documents or more) first asks the
unfiltered kernel, with its pruning, for a deeper list (``deep``: about twice the depth that
holds k allowed documents on average): that list is the exact top by (score, doc_id), so
its allowed documents, in order, are the exact top of the allowed ones; when it holds k of
them (or every matching document) they are the answer, else the masked kernel answers.
``bench/bench_filters.py`` measures each against the unfiltered search.

The small numba helpers are repeated here rather than imported from ``kernels.py``: numba's
on-disk cache (``cache=True``) is invalidated by changes to a function's own file only, so
a compiled kernel that inlined another file's helper could outlive a change to it.
``FUNNEL_NUMBA=0`` (or no numba) takes :func:`masked_reference`, the NumPy path.
"""

from __future__ import annotations

import numpy as np

from .kernels import HAVE_NUMBA

#: A shard is scored by candidates when allowed docs × query terms × this is at most its postings
#: (a gallop to a candidate costs about as much as streaming this many postings).
CANDIDATE_COST = 8
#: A mask that allows at least this fraction of the documents is first answered by the
#: unfiltered (pruned) kernel, ``DEEP_FACTOR`` times as deep as k allowed documents need on
#: average, at most ``DEEP_MAX`` deep (see :func:`search_masked`).
DEEP_MIN_FRACTION = 0.2
DEEP_FACTOR = 2.0
DEEP_MAX = 128

if HAVE_NUMBA:
    from numba import njit

    @njit(cache=True, nogil=True, inline="always")
    def _impact(tf, c, table, itab, cap):
        if tf < cap:
            return itab[tf * table.shape[0] + c]
        x = np.float64(tf)
        return x / (x + table[c])

    @njit(cache=True, nogil=True)
    def _gallop(docs, p, end, target):
        """First position in [p, end) with docs[pos] >= target (end when none)."""
        if p >= end or docs[p] >= target:
            return p
        step = 1
        lo = p
        hi = p + 1
        while hi < end and docs[hi] < target:
            lo = hi
            step <<= 1
            hi = p + step
        lo += 1
        hi = min(hi, end)
        while lo < hi:
            mid = (lo + hi) >> 1
            if docs[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @njit(cache=True, nogil=True, inline="always")
    def _sift_down(hv, hr, hd, i, n, v, r, d):
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

    @njit(cache=True, nogil=True, inline="always")
    def _push(hv, hr, hd, n, v, r, d):
        """Offer (score, id rank, docno) to a top-k heap of ``n`` entries whose root is the worst
        kept (lowest score, then highest rank); the new count."""
        k = hv.shape[0]
        if n < k:
            i = n
            while i > 0:
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

    @njit(cache=True, nogil=True)
    def heap_sorted(hv, hr, hd, n):
        """(docnos, scores) of the heap's ``n`` entries, best first."""
        out_d = np.empty(n, dtype=np.int64)
        out_v = np.empty(n)
        for j in range(n - 1, -1, -1):
            out_d[j] = hd[0]
            out_v[j] = hv[0]
            if j > 0:
                _sift_down(hv, hr, hd, 0, j, hv[j], hr[j], hd[j])
        return out_d, out_v

    @njit(cache=True, nogil=True)
    def masked_shard(indptr, docs, tfs, code, term_gid, imp, table, itab, gids, weights, acc, touched,
                     rank, base, allow, cands, cost, hv, hr, hd, n):
        """Offer one shard's allowed documents with a positive score to the heap (``n``
        entries; the new count returned). ``allow`` (uint8, one per local document) and
        ``cands`` (its set positions, ascending) describe the mask (by candidates where
        ``len(cands) · terms · cost <= postings``); ``imp`` the stored
        per-posting impacts or an empty array; ``acc`` (zeroed, one per local document) is
        zeroed again on return, ``touched`` has one more slot."""
        T = gids.shape[0]
        local = np.empty(T, dtype=np.int64)
        post = 0
        present = 0
        V = term_gid.shape[0]
        for i in range(T):
            lo, hi = 0, V
            g = gids[i]
            while lo < hi:
                mid = (lo + hi) >> 1
                if term_gid[mid] < g:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < V and term_gid[lo] == g:
                local[i] = lo
                post += indptr[lo + 1] - indptr[lo]
                present += 1
            else:
                local[i] = -1
        if present == 0 or cands.shape[0] == 0:
            return n
        cap = itab.shape[0] // table.shape[0]
        stored = imp.shape[0] > 0
        if cands.shape[0] * present * cost <= post:
            for i in range(T):
                li = local[i]
                if li < 0:
                    continue
                w = weights[i]
                p = indptr[li]
                end = indptr[li + 1]
                for j in range(cands.shape[0]):
                    d = cands[j]
                    p = _gallop(docs, p, end, d)
                    if p >= end:
                        break
                    if docs[p] == d:
                        v = imp[p] if stored else _impact(np.int64(tfs[p]), code[d], table, itab, cap)
                        acc[d] = acc[d] + w * v
            for j in range(cands.shape[0]):
                d = cands[j]
                v = acc[d]
                if v > 0.0:
                    acc[d] = 0.0
                    n = _push(hv, hr, hd, n, v, rank[d], base | np.int64(d))
            return n
        # Branch-free, as kernels._accumulate: a disallowed document adds w·v·0 = 0.0, so its
        # accumulator stays 0.0 and it is never counted in ``touched``; an allowed one adds
        # w·v·1.0, the same bits as w·v. Unsigned indices: no wraparound check per access.
        um = np.uint64(0)
        ucap = np.uint64(cap)
        nt = np.uint64(table.shape[0])
        for i in range(T):
            li = local[i]
            if li < 0:
                continue
            w = weights[i]
            for p in range(np.uint64(indptr[li]), np.uint64(indptr[li + 1])):
                d = np.uint64(docs[p])
                if stored:
                    v = imp[p]
                else:
                    tf = np.uint64(tfs[p])
                    c = np.uint64(code[d])
                    if tf < ucap:
                        v = itab[tf * nt + c]
                    else:
                        x = np.float64(tf)
                        v = x / (x + table[c])
                ok = allow[d]
                a = acc[d]
                touched[um] = d
                um += np.uint64((a == 0.0) & (ok != 0))
                acc[d] = a + w * v * np.float64(ok)
        m = np.int64(um)
        for j in range(m):
            d = touched[j]
            v = acc[d]
            acc[d] = 0.0
            if v > 0.0:
                n = _push(hv, hr, hd, n, v, rank[d], base | np.int64(d))
        return n


def search_masked(bm25, gids: np.ndarray, ws: np.ndarray, k: int, params, mask) -> tuple[np.ndarray, np.ndarray]:
    """(docnos, scores) of the top ``k`` allowed documents, best first (ties by doc_id):
    ``BM25Retriever.search_arrays`` under ``mask``, for its canonical ``gids``/``ws``."""
    if mask.count == 0 or len(gids) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if not bm25._use_kernel():
        return masked_reference(bm25, gids, ws, k, params, mask)
    n_docs = int(mask.doc_off[-1])
    if mask.count >= DEEP_MIN_FRACTION * n_docs:
        deep = min(n_docs, int(k * n_docs / mask.count * DEEP_FACTOR) + 16)
        if deep <= DEEP_MAX:
            dn, sc = bm25.search_gids(gids, ws, deep, params)
            keep = mask.allow[mask.doc_off[dn >> 32] + (dn & 0xFFFFFFFF)]
            if int(keep.sum()) >= k or len(dn) < deep:  # k allowed, or every matching document seen
                return dn[keep][:k], sc[keep][:k]
    ix = bm25.index
    den, itab = bm25._table(params)
    acc, touched = bm25._buffers()
    allow = mask.u8()
    exact = params.length_norm == "exact"
    imp_meta, imps = bm25._impacts(params)  # held while the kernel runs
    hv, hr, hd = np.empty(k), np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    n = 0
    off = mask.doc_off
    empty = np.zeros(0)
    for s, sh in enumerate(ix.shards):
        lo, hi = int(off[s]), int(off[s + 1])
        cands = mask.allowed_ids(s)
        if len(cands) == 0:
            continue
        code = sh.doclen.astype(np.int32, copy=False) if exact else sh.norms
        n = masked_shard(sh.indptr, sh.docs, sh.tfs, code, sh.term_gid, imps[s] if imps else empty, den, itab,
                         gids, ws, acc[:hi - lo], touched[:hi - lo + 1], ix.docs.id_rank[s], np.int64(s) << 32,
                         allow[lo:hi], cands, CANDIDATE_COST, hv, hr, hd, n)
    return heap_sorted(hv, hr, hd, n)


def masked_reference(bm25, gids: np.ndarray, ws: np.ndarray, k: int, params, mask
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search_masked` in NumPy: each shard's dense scores (``ShardScorer.score``, the
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
