"""Dynamic pruning by per-term bounds: MaxScore in term-at-a-time form (`_score_shard`).

Turtle & Flood 1995; Moffat & Zobel's "continue" strategy: terms are processed in the
caller's order (highest w·idf first); each has an upper bound ``w · maxtf / (maxtf +
denom[min norm])`` from per-term statistics. Once the bounds of the terms still to come add
up to less than a lower bound ``theta`` on the k-th best final score, no document not yet
seen can reach the top k: the remaining terms only update the surviving candidates
(galloping through their postings), and a candidate is dropped as soon as its partial score
plus the remaining bounds falls below ``theta`` (`_prune_candidates`). Every kept document
still gets every term added in the same order as exhaustive scoring, so the pruned scores
are bit-identical to exhaustive ones; bounds are inflated by 1e-9 relative so rounding can
never prune a document that would tie. Per-query (k1, b) overrides use these per-term
bounds (``blockmax.py`` needs the default parameters' block maxima), so they allocate
nothing proportional to the index.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .checks import _bad_posting, _posting_fault, _range_ok
from .decode import _gallop, _impact_u
from .exhaustive import _accumulate
from .heap import _kth_vals, _push_scores
from .layout import FAULT_INDPTR


@jit
def _score_shard(indptr, docs, tfs, code, max_tf, min_code, table, itab, cap, local, weights,
                 acc, touched, rank, base, hv, hr, hd, nh, theta, prune_min, stats):
    """Offers the shard's candidates to the top-k heap (``_heap_push``; ``nh`` entries, the
    new count returned): every positive-scoring document it touched, or where pruning
    switched to candidates, those that could still reach ``theta``. ``base``: the shard's
    docno prefix; ``rank``: its documents' id ranks. Leaves ``acc`` zeroed. Every weight
    positive (the touched list relies on it). A damaged posting: ``-FAULT_*`` returned,
    ``acc`` left as it is (the caller zeroes it)."""
    k = hv.shape[0]
    T = local.shape[0]
    npost = docs.shape[0]
    und = np.uint64(acc.shape[0])
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
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
    if not prune:  # exhaustive: the plain loop (no running maximum), then one selection pass
        um = _accumulate(indptr, docs, tfs, code, table, itab, cap, local, weights, acc, touched, 0,
                         np.empty(0))
        if um < 0:
            return um
        return _push_scores(acc, touched, um, rank, base, hv, hr, hd, nh, True)
    for i in range(T):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR
        for p in range(np.uint64(a0), np.uint64(e0)):
            d = np.uint64(docs[p])
            t = np.uint64(tfs[p])
            if _bad_posting(d, und, t):
                return -_posting_fault(d, und)
            v = w * _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
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
                    th = max(th, _kth_vals(_gather(acc, touched, m), m, k, th))
                if r < th:
                    theta = th
                    switch_at = i + 1
                    stats[0] += 1
                    stats[1] += remaining[switch_at]
                    break
    if switch_at < T:
        # Candidates: documents seen so far that can still reach theta.
        cand = np.sort(_reachable(acc, touched, m, rest[switch_at], theta))
        c = cand.shape[0]
        for i in range(switch_at, T):
            li = local[i]
            if li >= 0 and c > 0:
                w = weights[i]
                p = indptr[li]
                end = indptr[li + 1]
                if not _range_ok(p, end, npost):
                    return -FAULT_INDPTR
                for j in range(c):
                    d = cand[j]
                    p = _gallop(docs, p, end, d)
                    if p >= end:
                        break
                    if docs[p] == d:
                        acc[d] += w * _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
            # Drop candidates that can no longer reach theta; raise theta when k remain.
            c, theta = _prune_candidates(acc, cand, c, k, rest[i + 1], theta)
        ids = cand[:c]
        m_ids = c
    else:
        ids = touched
        m_ids = m
    nh = _push_scores(acc, ids, m_ids, rank, base, hv, hr, hd, nh, False)
    for j in range(m):
        acc[touched[j]] = 0.0
    return nh


@jit
def _keep_reachable(acc, ids, m, r, theta, out):
    """Write the documents of ids[:m] whose score plus ``r`` (the bounds of the terms left)
    can still reach ``theta`` to ``out``, in order (``out`` may be ``ids``); returns how many."""
    n = 0
    for j in range(m):
        d = ids[j]
        if acc[d] + r >= theta:
            out[n] = d
            n += 1
    return n


@jit
def _reachable(acc, ids, m, r, theta):
    """`_keep_reachable` into a new array of ids' dtype."""
    out = np.empty(m, dtype=ids.dtype)
    return out[:_keep_reachable(acc, ids, m, r, theta, out)]


@jit
def _gather(acc, ids, m):
    """acc[ids[:m]] as a new dense array."""
    vals = np.empty(m)
    for j in range(m):
        vals[j] = acc[ids[j]]
    return vals


@jit
def _prune_candidates(acc, cand, c, k, r, theta):
    """After a term: raise ``theta`` to the k-th partial score of the candidates (partial
    scores are lower bounds) and keep, in place, those that can still reach it with ``r``
    more; returns (count kept, theta)."""
    vals = _gather(acc, cand, c)  # one random read of acc per candidate, not two
    if c >= k:
        theta = max(theta, _kth_vals(vals, c, k, theta))
    n = 0
    for j in range(c):
        if vals[j] + r >= theta:
            cand[n] = cand[j]
            n += 1
    return n, theta
