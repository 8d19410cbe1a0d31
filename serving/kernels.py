"""Optional numba kernels for the BM25 hot loop; the NumPy path in ``bm25.py`` is the reference.

``search_shards`` answers one query over every shard in one compiled call: it finds each
query term in each shard (binary search on ``term_gid``), scores term-at-a-time into a
reused accumulator, and cuts the top ``k`` with the ranking's tie-break (score descending,
then doc_id ascending through ``id_rank``). Per posting it computes Lucene's
``tf / (tf + denom[norm])`` from a small per-(k1, b) table of length denominators (256
entries for Lucene's one-byte norms), as Lucene's own BM25 does, so no per-posting impact
array is ever built and every (k1, b) costs the same.

Dynamic pruning is MaxScore in term-at-a-time form (Turtle & Flood 1995; Moffat & Zobel's
"continue" strategy): terms are processed in the caller's order (highest w·idf first);
each has an upper bound ``w · maxtf / (maxtf + denom[min norm])`` from per-term statistics.
Once the bounds of the terms still to come add up to less than a lower bound ``theta`` on
the k-th best final score, no document not yet seen can reach the top k: the remaining
terms only update the surviving candidates (galloping through their postings), and a
candidate is dropped as soon as its partial score plus the remaining bounds falls below
``theta``. Every kept document still gets every term added in the same order as
exhaustive scoring, so the pruned scores are bit-identical to exhaustive ones; bounds are
inflated by 1e-9 relative so rounding can never prune a document that would tie.

Tests run this against the NumPy reference (and pruned against exhaustive) and require
identical rankings; ``FUNNEL_NUMBA=0`` turns the kernels off.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

try:  # numba is an accelerator, never a requirement
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from numba import carray, njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
    HAVE_NUMBA = True
except ImportError as e:  # pragma: no cover - exercised where numba is absent
    log.info("numba unavailable (%s): using the NumPy BM25 path", e)
    HAVE_NUMBA = False

# The arrays of one shard that ``search_shards`` reads, in the order of its ``meta`` table.
FIELDS = ("indptr", "docs", "tfs", "term_gid", "max_tf", "code", "min_code")
FIELD_DTYPES = (np.int64, np.int32, np.int32, np.int32, np.int32, None, None)  # None: the code dtype


def shard_table(shards: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(meta, keep): the int64 [S, 2·len(FIELDS)] (address, length) table for ``search_shards``
    and the arrays it points into, which the caller must keep referenced while it is used."""
    code_dtype = shards[0]["code"].dtype if shards else np.dtype(np.uint8)
    meta = np.zeros((len(shards), 2 * len(FIELDS)), dtype=np.int64)
    keep = []
    for s, arrays in enumerate(shards):
        for f, (name, dt) in enumerate(zip(FIELDS, FIELD_DTYPES)):
            a = np.ascontiguousarray(arrays[name], dtype=dt or code_dtype)
            if len(a) == 0:  # a valid address for an empty array
                a = np.zeros(1, dtype=a.dtype)[:0]
            keep.append(a)
            meta[s, 2 * f] = a.ctypes.data
            meta[s, 2 * f + 1] = len(a)
    return meta, keep


if HAVE_NUMBA:
    @njit(cache=True, nogil=True)
    def _find(term_gid, g):
        lo, hi = 0, term_gid.shape[0]
        while lo < hi:
            mid = (lo + hi) >> 1
            if term_gid[mid] < g:
                lo = mid + 1
            else:
                hi = mid
        if lo < term_gid.shape[0] and term_gid[lo] == g:
            return lo
        return -1

    @njit(cache=True, nogil=True)
    def _kth_of(acc, ids, m, k):
        """k-th largest of acc[ids[:m]] (m >= k), through a size-k min-heap: one pass, and
        after the heap fills most values cost one compare."""
        heap = np.empty(k)
        n = 0
        for j in range(m):
            v = acc[ids[j]]
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
        return heap[0]

    @njit(cache=True, nogil=True)
    def _kth_largest(vals, k):
        return _kth_of(vals, np.arange(vals.shape[0]), vals.shape[0], k)

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
        if hi > end:
            hi = end
        lo += 1
        while lo < hi:
            mid = (lo + hi) >> 1
            if docs[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @njit(cache=True, nogil=True, inline="always")
    def _impact(tf, c, table, itab, cap):
        """``tf / (tf + table[c])``, from the precomputed grid ``itab[tf, c]`` when tf < cap
        (the same float64 expression, so the same bits)."""
        if tf < cap:
            return itab[tf * table.shape[0] + c]
        x = np.float64(tf)
        return x / (x + table[c])

    @njit(cache=True, nogil=True)
    def _score_shard(indptr, docs, tfs, code, max_tf, min_code, table, itab, cap, local, weights,
                     acc, touched, k, theta, prune_min, stats):
        """Top candidates of one shard: (local ids, scores) with every score >= the shard's
        k-th (ties kept), and never a document below ``theta`` that could not be in the top k."""
        T = local.shape[0]
        rest = np.zeros(T + 1)  # rest[i]: sum of the bounds of terms i.. (inflated)
        remaining = np.zeros(T + 1, dtype=np.int64)  # postings of terms i..
        for i in range(T - 1, -1, -1):
            li = local[i]
            remaining[i] = remaining[i + 1] + (indptr[li + 1] - indptr[li] if li >= 0 else 0)
        prune = prune_min >= 0 and remaining[0] >= prune_min
        if prune:
            for i in range(T - 1, -1, -1):
                li = local[i]
                ub = 0.0
                if li >= 0:
                    mt = np.float64(max_tf[li])
                    ub = weights[i] * (mt / (mt + table[min_code[li]]))
                rest[i] = rest[i + 1] + ub * (1.0 + 1e-9) + 1e-12
        m = 0
        maxacc = 0.0
        switch_at = T
        for i in range(T):
            li = local[i]
            if li < 0:
                continue
            w = weights[i]
            for p in range(indptr[li], indptr[li + 1]):
                d = docs[p]
                v = w * _impact(tfs[p], code[d], table, itab, cap)
                a = acc[d]
                touched[m] = d  # branch-free: kept only when d was not seen before
                m += a == 0.0
                a += v
                acc[d] = a
                maxacc = max(maxacc, a)
            if prune and i + 1 < T and remaining[i + 1] >= 2 * m:
                r = rest[i + 1]
                if r < theta or (m >= k and r < maxacc):
                    th = theta
                    if m >= k and r >= theta:
                        th = max(th, _kth_of(acc, touched, m, k))
                    if r < th:
                        theta = th
                        switch_at = i + 1
                        stats[0] += 1
                        stats[1] += remaining[switch_at]
                        break
        if switch_at < T:
            # Candidates: documents seen so far that can still reach theta.
            cand = np.empty(m, dtype=touched.dtype)
            c = 0
            r = rest[switch_at]
            for j in range(m):
                d = touched[j]
                if acc[d] + r >= theta:
                    cand[c] = d
                    c += 1
            cand = np.sort(cand[:c])
            for i in range(switch_at, T):
                li = local[i]
                if li >= 0 and c > 0:
                    w = weights[i]
                    p = indptr[li]
                    end = indptr[li + 1]
                    for j in range(c):
                        d = cand[j]
                        p = _gallop(docs, p, end, d)
                        if p >= end:
                            break
                        if docs[p] == d:
                            acc[d] += w * _impact(tfs[p], code[d], table, itab, cap)
                # Drop candidates that can no longer reach theta; raise theta when k remain.
                r = rest[i + 1]
                if c >= k:
                    theta = max(theta, _kth_of(acc, cand, c, k))
                n = 0
                for j in range(c):
                    d = cand[j]
                    if acc[d] + r >= theta:
                        cand[n] = d
                        n += 1
                c = n
            ids = cand[:c]
            m_ids = c
        else:
            ids = touched
            m_ids = m
        # Keep positive scores only, and at most the k best (ties at the k-th kept).
        kth = 0.0
        if m_ids > k:
            kth = _kth_of(acc, ids, m_ids, k)
        n = 0
        for j in range(m_ids):
            v = acc[ids[j]]
            if v > 0.0 and v >= kth:
                n += 1
        out_ids = np.empty(n, dtype=np.int64)
        out_vals = np.empty(n)
        n = 0
        for j in range(m_ids):
            d = ids[j]
            v = acc[d]
            if v > 0.0 and v >= kth:
                out_ids[n] = d
                out_vals[n] = v
                n += 1
        for j in range(m):
            acc[touched[j]] = 0.0
        return out_ids, out_vals

    @intrinsic
    def _voidptr(typingctx, addr):
        """An int64 address as a void pointer (for ``carray`` over arrays the caller keeps alive)."""
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)
        return types.voidptr(types.int64), codegen

    @njit(cache=True, nogil=True, inline="always")
    def _view(meta, s, f, dtype):
        return carray(_voidptr(meta[s, 2 * f]), meta[s, 2 * f + 1], dtype)

    @njit(cache=True, nogil=True)
    def _local_terms(term_gid, gids, local):
        found = False
        for i in range(gids.shape[0]):
            local[i] = _find(term_gid, gids[i])
            if local[i] >= 0:
                found = True
        return found

    @njit(cache=True, nogil=True)
    def _merge(parts_s, parts_i, parts_v, doc_off, id_rank, k):
        total = 0
        for j in range(len(parts_s)):
            total += parts_i[j].shape[0]
        docno = np.empty(total, dtype=np.int64)
        score = np.empty(total)
        rank = np.empty(total, dtype=np.int64)
        o = 0
        for j in range(len(parts_s)):
            s = parts_s[j]
            ids = parts_i[j]
            vals = parts_v[j]
            for q in range(ids.shape[0]):
                docno[o] = (np.int64(s) << 32) | ids[q]
                score[o] = vals[q]
                rank[o] = id_rank[doc_off[s] + ids[q]]
                o += 1
        by_rank = np.argsort(rank)
        neg = np.empty(total)
        for j in range(total):
            neg[j] = -score[by_rank[j]]
        order = by_rank[np.argsort(neg, kind="mergesort")][:k]
        return docno[order], score[order]

    @njit(cache=True, nogil=True)
    def search_shards(meta, code_proto, doc_off, id_rank, acc, touched, table, itab, gids, weights, k,
                      prune_min, stats):
        """Top ``k`` over all shards: (docnos ``shard << 32 | local``, scores), best first,
        ties by ``id_rank`` ascending.

        ``meta`` is an int64 [S, 2·META_FIELDS] table of (address, length) of each shard's
        arrays in ``FIELDS`` order (``ShardTable`` builds it and keeps the arrays alive): one
        small argument instead of dozens, which numba would unbox one by one on every call.
        Length codes have ``code_proto``'s dtype: uint8 Lucene norm bytes or int32 exact
        lengths, as ``table`` is indexed. ``doc_off``: each shard's first position in the
        global document order (S + 1 entries); ``id_rank``: each document's rank by doc_id;
        ``acc`` (float64, one per document) is zeroed, and zeroed again
        on return; ``touched`` (int32) has one more slot than there are documents. ``itab`` holds ``t / (t + table[c])`` at
        ``t · len(table) + c`` for t below ``len(itab) / len(table)``: the impacts of small
        tfs, precomputed per (k1, b), so most postings cost a lookup instead of a division. A shard is
        pruned when ``prune_min >= 0`` and the query has at least ``prune_min`` postings
        there (every weight must then be positive); -1 scores exhaustively.
        ``stats`` (int64, 2) counts the shards where pruning stopped adding new documents
        and the postings of the terms left to candidates there (racy counters, for tests
        and benchmarks).
        """
        S = meta.shape[0]
        cap = itab.shape[0] // table.shape[0]
        local = np.empty(gids.shape[0], dtype=np.int64)
        parts_s = [0][:0]
        parts_i = [np.empty(0, dtype=np.int64)][:0]
        parts_v = [np.empty(0)][:0]
        theta = 0.0
        all_v = np.empty(0)
        for s in range(S):
            if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
                continue
            lo, hi = doc_off[s], doc_off[s + 1]
            ids, vals = _score_shard(_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32),
                                     _view(meta, s, 2, np.int32), _view(meta, s, 5, code_proto.dtype),
                                     _view(meta, s, 4, np.int32), _view(meta, s, 6, code_proto.dtype),
                                     table, itab, cap, local, weights, acc[lo:hi], touched[lo:hi + 1], k, theta,
                                     prune_min, stats)
            if ids.shape[0] == 0:
                continue
            parts_s.append(s)
            parts_i.append(ids)
            parts_v.append(vals)
            if prune_min >= 0 and s + 1 < S:  # a lower bound on the global k-th score for later shards
                all_v = np.concatenate((all_v, vals))
                if all_v.shape[0] >= k:
                    theta = max(theta, _kth_largest(all_v, k))
        return _merge(parts_s, parts_i, parts_v, doc_off, id_rank, k)

    @njit(cache=True, nogil=True)
    def term_bounds(indptr, docs, tfs, doclen):
        """Per term: the largest tf and the shortest document length in its postings."""
        V = indptr.shape[0] - 1
        max_tf = np.zeros(V, dtype=np.int32)
        min_dl = np.zeros(V, dtype=np.int32)
        for t in range(V):
            mt = 0
            md = np.iinfo(np.int32).max
            for p in range(indptr[t], indptr[t + 1]):
                if tfs[p] > mt:
                    mt = tfs[p]
                dl = doclen[docs[p]]
                if dl < md:
                    md = dl
            max_tf[t] = mt
            min_dl[t] = md if indptr[t + 1] > indptr[t] else 0
        return max_tf, min_dl
else:
    search_shards = None
    term_bounds = None
