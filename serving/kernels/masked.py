"""Compiled BM25 under a mask: the kernels behind ``serving/lexical/masked.py``.

Three per-shard kernels, each exact (an allowed document's score is the unfiltered one, bit
for bit: every term added from 0.0 in the canonical order with ``decode._impact``'s
arithmetic, ties by id rank; a disallowed document never enters the heap):

* `masked_shard`: no pruning. Term-at-a-time over every posting, a disallowed document
  left out when the scores are offered to the heap; or, for a selective mask, galloping
  through each term's postings to each allowed document. Used where there are no block maxima (a
  per-query (k1, b) override) or a weight is not positive (the bounds need positive ones).
* `masked_blocks`: ``blockmax._score_shard_blocks`` (block-max MaxScore) under a mask.
  The block maxima and per-term bounds are the unfiltered ones: a mask only removes
  documents, so they stay upper bounds. The lower bound ``theta`` on the k-th score comes
  from allowed documents only (partial scores of the allowed documents seen, or the shared
  heap, which only ever holds allowed documents), so it is a lower bound on the k-th
  *allowed* score; the unfiltered kernel's head start from the blocks' k-th maxima
  (``_theta_from_blocks``) is not valid under a mask (those documents may be disallowed)
  and is not used.
* `masked_closed`: the allowed documents are the only candidates from the start
  (a closed set: no posting outside them matters). Term by term in the canonical order, a
  term with few postings next to the candidates left is streamed; for a longer one each
  candidate is looked up by galloping over the term's block last-documents and then inside
  its one block, and before the lookup, a candidate whose partial score plus its block's
  maximum plus the bounds of the later terms cannot reach ``theta`` is dropped (and never
  looked up again). ``theta`` rises during each pass: a size-k heap of the partial scores
  of the pass (each candidate once per pass, so k distinct allowed documents) gives a
  lower bound on the final k-th allowed score.

A dropped document's bound is below ``theta``, so it cannot reach the top k, ties
included (bounds are inflated by 1e-9 relative, as in ``maxscore.py``); every kept document
gets every term, in order. So each kernel's top k is exhaustive scoring's, filtered.

Every value read from the index's files and then used to address memory is checked first,
as in the unfiltered kernels (``checks.py``): postings ranges, block ranges,
document ids, and the tf or stored impact of a posting that may start a touched-list entry.
A damaged one ends the search with a fault code (``layout.FAULT_*``), never a read outside
an array. (The checks are the shared ones: the benchmark's unchecked copy of the package,
``_jit.load_copy``, compiles them out here too.)

The helpers it shares with the unfiltered kernels (heap, lookups, impacts, checks, candidate
runs) are theirs, imported: the package's disk cache is stamped with every one of its
sources (``_jit.py``), so a change to one recompiles these kernels too.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, _prefetch_block, _view
from .blockmax import _merge2, _merge_runs, _reachable_runs, _theta_may_pay
from .checks import _bad_posting, _blocks_ok, _posting_fault, _range_ok
from .decode import _bisect, _gallop, _impact_u
from .heap import _heap_push, _heap_sorted, _kth_offer, _kth_vals
from .layout import FAULT_BLOCKS, FAULT_DOCS, FAULT_IMPACTS, FAULT_INDPTR, PREFETCH_AHEAD
from .maxscore import _gather, _prune_candidates


@jit
def search_masked_shards(meta, bmeta, imeta, code_proto, doc_off, id_rank, acc, touched, table, itab, gids,
                         weights, k, allow, cands, cptr, eager, cost, force, block, stats):
    """Top ``k`` allowed documents over every shard, in one call: (docnos ``shard << 32 |
    local``, scores), best first, ties by ``id_rank``. ``meta``/``bmeta``/``imeta`` and the
    buffers as ``search.search_shards`` takes them (``bmeta`` empty: no pruning);
    ``allow`` (uint8, one per global position) and ``cands`` (the allowed positions,
    ascending; shard s's at ``cands[cptr[s]:cptr[s + 1]]``) the mask. Per shard the
    strategy is ``masked.py``'s rule: by candidates where allowed documents × terms
    present × ``cost`` is at most the query's postings there, else term-at-a-time; both
    pruned by block maxima where ``bmeta`` has them (``eager``: wherever the bounds
    allow, for tests), neither pruned otherwise. ``force`` 1 or 2 takes candidates or
    term-at-a-time everywhere (tests, benchmarks); 0 the rule.
    ``stats`` (int64, 6; racy counters for tests and benchmarks) counts the shards scored
    by candidates with pruning, by blocks, by blocks that went to sorted candidates,
    without pruning, the candidates that pruning dropped and the terms that candidates
    streamed. Returns (docnos, scores, fault), fault as ``search.search_shards`` gives it
    (``shard << 8 | FAULT_*``; 0 when sound; then the docnos are empty and ``acc`` is
    not zeroed)."""
    S = meta.shape[0]
    T = gids.shape[0]
    local = np.empty(T, dtype=np.int64)
    hv = np.empty(k)
    hr = np.empty(k, dtype=np.int64)
    hd = np.empty(k, dtype=np.int64)
    n = 0
    theta = 0.0
    blocks = bmeta.shape[0] > 0
    for i in range(T):
        if weights[i] <= 0.0:  # the bounds need positive weights (as unfiltered pruning)
            blocks = False
    for s in range(S):
        c0, c1 = cptr[s], cptr[s + 1]
        if c0 == c1:
            continue
        indptr = _view(meta, s, 0, np.int64)
        present, post = local_terms(_view(meta, s, 3, np.int32), gids, indptr, local)
        if present == 0:
            continue
        lo, hi = doc_off[s], doc_off[s + 1]
        nd = hi - lo
        by_cands = force == 1 or (force == 0 and (c1 - c0) * present * cost <= post)
        docs = _view(meta, s, 1, np.int32)
        tfs = _view(meta, s, 2, code_proto[1].dtype)
        code = _view(meta, s, 5, code_proto[0].dtype)
        base = np.int64(s) << 32
        if blocks:
            bstart = _view(bmeta, s, 0, np.int64)
            bmax = _view(bmeta, s, 1, np.float32)
            tmax = _view(bmeta, s, 2, np.float32)
            blast = _view(bmeta, s, 4, np.int32)
            if by_cands:
                stats[0] += 1
                n, theta = masked_closed(indptr, docs, tfs, code, table, itab, bstart, bmax, tmax, blast, block,
                                         local, weights, allow[lo:hi], cands[c0:c1], lo, cost, acc[:nd],
                                         id_rank[lo:hi], base, hv, hr, hd, n, theta, stats)
            else:
                stats[1] += 1
                n, theta = masked_blocks(indptr, docs, tfs, code, table, itab, bstart, bmax, tmax, blast, block,
                                         local, weights, allow[lo:hi], acc[:nd], touched[:nd + 1], id_rank[lo:hi],
                                         base, hv, hr, hd, n, theta, eager, stats)
        else:
            stats[3] += 1
            imp = np.empty(0) if imeta.shape[0] == 0 else _view(imeta, s, 0, np.float64)
            n = masked_shard(indptr, docs, tfs, code, imp, table, itab, local, weights, acc[:nd],
                             touched[:nd + 1], id_rank[lo:hi], base, allow[lo:hi], cands[c0:c1], lo, by_cands,
                             hv, hr, hd, n)
        if n < 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -n
        if n == k:
            theta = max(theta, hv[0])
    dn, sc = _heap_sorted(hv, hr, hd, n)
    return dn, sc, 0


@jit
def local_terms(term_gid, gids, indptr, local):
    """Each query term's local id in the shard (-1 where absent) into ``local``; returns
    (terms present, their postings)."""
    V = term_gid.shape[0]
    post = 0
    present = 0
    for i in range(gids.shape[0]):
        g = gids[i]
        lo = _bisect(term_gid, 0, V, g)
        if lo < V and term_gid[lo] == g:
            local[i] = lo
            post += indptr[lo + 1] - indptr[lo]
            present += 1
        else:
            local[i] = -1
    return present, post


@jit
def masked_shard(indptr, docs, tfs, code, imp, table, itab, local, weights, acc, touched,
                 rank, base, allow, cands, lo, by_cands, hv, hr, hd, n):
    """Offer one shard's allowed documents with a positive score to the heap (``n``
    entries; the new count returned), without pruning: galloping to each of ``cands``
    (the allowed documents' global positions, ascending; ``lo`` the shard's first) where
    ``by_cands``, else every posting with
    ``allow`` (uint8, one per local document) checked. ``imp``: the stored per-posting
    impacts or an empty array; ``acc`` (zeroed, one per local document) is zeroed again
    on return, ``touched`` has one more slot. With a non-positive weight (a sum may come
    back to 0.0, which would list a document twice) no touched list is kept: every
    document is read back. A damaged posting or range: ``-FAULT_*`` returned, ``acc``
    left as it is (the caller zeroes it)."""
    T = local.shape[0]
    cap = itab.shape[0] // table.shape[0]
    stored = imp.shape[0] > 0
    npost = docs.shape[0]
    und = np.uint64(acc.shape[0])
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    if by_cands:
        for i in range(T):
            li = local[i]
            if li < 0:
                continue
            w = weights[i]
            p = indptr[li]
            end = indptr[li + 1]
            if not _range_ok(p, end, npost):
                return -FAULT_INDPTR
            for j in range(cands.shape[0]):
                d = cands[j] - lo
                p = _gallop(docs, p, end, d)
                if p >= end:
                    break
                if docs[p] == d:
                    v = imp[p] if stored else _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab,
                                                        ucap, nt)
                    acc[d] = acc[d] + w * v
        for j in range(cands.shape[0]):
            d = cands[j] - lo
            v = acc[d]
            acc[d] = 0.0  # every candidate: a negative weight leaves scores below zero too
            if v > 0.0:
                n = _heap_push(hv, hr, hd, n, v, rank[d], base | np.int64(d))
        return n
    # Every posting accumulated as ``exhaustive._accumulate`` does (branch-free; unsigned
    # indices: no wraparound check per access), the mask read once per document touched
    # when the scores are offered: reading it per posting made this loop ~1.4x slower.
    um = np.uint64(0)
    listed = weights.min() > 0.0  # loop-invariant: keep the touched list (see the docstring)
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
            if stored:
                v = imp[p]
                if (d >= und) | (not v > 0.0):
                    return -(FAULT_DOCS if d >= und else FAULT_IMPACTS)
            else:
                t = np.uint64(tfs[p])
                if _bad_posting(d, und, t):
                    return -_posting_fault(d, und)
                v = _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
            a = acc[d]
            if listed:
                touched[um] = d
                um += np.uint64(a == 0.0)
            acc[d] = a + w * v
    # A disallowed document's score is multiplied by 0.0, not branched on: under a 50%
    # mask that branch is a coin toss per document (mispredicted half the time, 2x this
    # kernel's time). ``bar``: the heap's root once full (what a document must reach).
    k = hv.shape[0]
    bar = 0.0 if n < k else hv[0]
    for j in range(np.int64(um) if listed else acc.shape[0]):
        d = np.uint64(touched[j]) if listed else np.uint64(j)
        v = acc[d] * np.float64(allow[d])
        acc[d] = 0.0
        if v > bar or (v == bar and v > 0.0):
            n = _heap_push(hv, hr, hd, n, v, rank[d], base | np.int64(d))
            if n == k:
                bar = hv[0]
    return n


@jit
def masked_blocks(indptr, docs, tfs, code, table, itab, bstart, bmax, tmax, blast, block, local, weights,
                  allow, acc, touched, rank, base, hv, hr, hd, nh, theta, eager, stats):
    """``blockmax._score_shard_blocks`` for the allowed documents only (module docstring):
    term-at-a-time in the canonical order until ``theta`` lets a term skip blocks, then
    sorted candidates (allowed documents seen that can still reach ``theta``): blocks
    that can bring in a new document are read whole (their disallowed documents skipped),
    the others only where a candidate is. ``eager`` prunes wherever the bounds allow
    (tests). Offers the survivors to the heap; returns (heap count, theta); (``-FAULT_*``,
    theta) at a damaged posting or range, ``acc`` left as it is. ``stats[2]`` counts the
    shards where it went to sorted candidates."""
    k = hv.shape[0]
    T = local.shape[0]
    cap = itab.shape[0] // table.shape[0]
    npost = docs.shape[0]
    nblocks = min(bmax.shape[0], blast.shape[0])
    und = np.uint64(acc.shape[0])
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    rest = _bounds_left(indptr, tmax, local, weights)
    remaining = np.zeros(T + 1, dtype=np.int64)
    for i in range(T - 1, -1, -1):
        li = local[i]
        remaining[i] = remaining[i + 1] + (indptr[li + 1] - indptr[li] if li >= 0 else 0)
    m = 0
    sorted_mode = False
    cand = np.empty(0, dtype=np.int64)
    c = 0
    ahead = np.empty(PREFETCH_AHEAD, dtype=np.int64)
    runs = np.empty(T + 1, dtype=np.int64)
    nruns = 0
    vals = np.empty(0)
    retry_at = 0.0
    nv = 0
    for i in range(T):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        b0, b1 = bstart[li], bstart[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR, theta
        if not _blocks_ok(b0, b1, nblocks, a0, e0, block):
            return -FAULT_BLOCKS, theta
        nb = b1 - b0
        lasts = blast[b0:b0 + nb]
        need = theta - rest[i + 1]
        if not sorted_mode and theta > 0.0:
            n_pass = 0
            for blk in range(nb):
                if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 >= need:
                    n_pass += min(block, e0 - a0 - blk * block)
            saved = (e0 - a0) - n_pass
            if saved > 0 and (eager or (saved > m and saved > retry_at)):
                buf, bounds, nc = _reachable_runs(acc, vals, nv, touched, m, runs, nruns, rest[i], theta)
                if eager or nc * np.log2(nc + 2) <= saved:
                    sorted_mode = True
                    c = nc
                    cand = _merge_runs(buf, bounds, nruns, nc)
                else:
                    retry_at = nc * np.log2(nc + 2) / 2
        if not sorted_mode:
            runs[nruns] = m  # each term's new documents come in doc order: touched is sorted runs
            nruns += 1
            nv = 0
            m = _accumulate_masked(docs, tfs, code, table, itab, cap, a0, e0, w, allow, acc, touched, m)
            if m < 0:
                return m, theta
            if i + 1 < T and m >= k and (eager or remaining[i + 1] >= 2 * m) and (
                    eager or _theta_may_pay(indptr, bstart, bmax, block, local, weights, rest, i, m)):
                vals = _gather(acc, touched, m)
                nv = m
                theta = max(theta, _kth_vals(vals, m, k, theta))
            continue
        readable = np.empty(nb, dtype=np.int64)
        nr = 0
        for blk in range(nb):
            if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 >= need:
                readable[nr] = blk
                nr += 1
        new = np.empty(nr * block + 1, dtype=np.int64)  # one spare: written past the last kept
        nn = 0
        j = 0
        p = a0
        for x in range(nr + 1):
            if x < nr:
                p0 = a0 + readable[x] * block
                p1 = min(p0 + block, e0)
                first = docs[p0]
            else:
                p0 = e0
                p1 = e0
                first = np.iinfo(np.int32).max
            bend = (p0 - a0 + block - 1) // block
            ja = j
            ba = (p - a0) // block
            while j < c and cand[j] < first:
                while ja < c and ja < j + PREFETCH_AHEAD and cand[ja] < first:
                    bq = _gallop(lasts, ba, bend, cand[ja])
                    ahead[ja % PREFETCH_AHEAD] = bq
                    if bq < bend:
                        ba = bq
                        _prefetch_block(docs, tfs, a0 + bq * block, block)
                    ja += 1
                d = cand[j]
                bb = ahead[j % PREFETCH_AHEAD]
                if bb == bend:
                    p = p0
                else:
                    p = _bisect(docs, max(p, a0 + bb * block), min(a0 + (bb + 1) * block, p0), d)
                    if p < p0 and docs[p] == d:
                        acc[d] += w * _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
                j += 1
            if x == nr:
                break
            for q in range(np.uint64(p0), np.uint64(p1)):  # branch-free on the mask, as _accumulate_masked
                d = np.uint64(docs[q])
                t = np.uint64(tfs[q])
                if _bad_posting(d, und, t):
                    return -_posting_fault(d, und), theta
                ok = allow[d]
                v = w * _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
                a = acc[d]
                fresh = (a == 0.0) & (ok != 0)
                new[nn] = d
                nn += fresh
                touched[m] = d
                m += fresh
                acc[d] = a + v * np.float64(ok)
            last = docs[p1 - 1]
            while j < c and cand[j] <= last:
                j += 1
            p = p1
        if nn > 0:
            merged = np.empty(c + nn, dtype=np.int64)
            _merge2(cand, 0, c, new, 0, nn, merged, 0)
            cand = merged
            c += nn
        c, theta = _prune_candidates(acc, cand, c, k, rest[i + 1], theta)
    if sorted_mode:
        stats[2] += 1
        nh = _offer(acc, cand, c, rank, base, hv, hr, hd, nh)
    else:
        nh = _offer(acc, touched, m, rank, base, hv, hr, hd, nh)
    for j in range(m):
        acc[touched[j]] = 0.0
    return nh, theta


@jit
def masked_closed(indptr, docs, tfs, code, table, itab, bstart, bmax, tmax, blast, block, local, weights,
                  allow, cands, lo, cost, acc, rank, base, hv, hr, hd, nh, theta, stats):
    """The top k of a closed candidate set, ``cands`` (the shard's allowed documents,
    ascending), with block-max pruning (module docstring). Per term, by the same cost
    rule as the shard's: a term with at most (candidates kept) × ``cost`` postings is
    streamed (every posting, ``allow`` multiplied in; a dropped candidate's sum is never
    read again), a longer one is one pass over the candidates kept: a gallop over the
    term's blocks' last documents finds the block that may hold the candidate; if its
    partial score plus that block's maximum plus the later terms' bounds stays below
    ``theta`` it is dropped, else it is looked up in the block (galloping from the last
    position found). After each term, candidates that cannot reach ``theta`` are dropped.
    Offers the survivors to the heap and leaves ``acc`` zeroed; returns (heap count,
    theta). ``cands`` holds global positions, ``lo`` the shard's first; ``stats[4]``
    counts the candidates dropped, ``stats[5]`` the terms streamed. (``-FAULT_*``, theta)
    at a damaged posting or range, ``acc`` left as it is."""
    k = hv.shape[0]
    T = local.shape[0]
    cap = itab.shape[0] // table.shape[0]
    npost = docs.shape[0]
    nblocks = min(bmax.shape[0], blast.shape[0])
    und = np.uint64(acc.shape[0])
    rest = _bounds_left(indptr, tmax, local, weights)
    c = cands.shape[0]
    cand = np.empty(c, dtype=np.int64)
    for j in range(c):
        cand[j] = cands[j] - lo
    kth = np.empty(k)
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    for i in range(T):
        li = local[i]
        if li < 0 or c == 0:
            continue
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]
        if not _range_ok(a0, e0, npost):
            return -FAULT_INDPTR, theta
        after = rest[i + 1]
        nk = 0
        n = 0
        if e0 - a0 <= c * cost:
            for p in range(np.uint64(a0), np.uint64(e0)):  # as _accumulate_masked (no touched list)
                d = np.uint64(docs[p])
                if d >= und:
                    return -FAULT_DOCS, theta
                v = _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
                acc[d] = acc[d] + w * v * np.float64(allow[d])
            stats[5] += 1
            for j in range(c):
                d = cand[j]
                s = acc[d]
                if s + after < theta:
                    stats[4] += 1
                    continue
                cand[n] = d
                n += 1
                if s > 0.0:  # k distinct allowed documents with partial scores: a lower bound
                    nk = _kth_offer(kth, nk, s)
                    if nk == k and kth[0] > theta:
                        theta = kth[0]
            c = n
            continue
        b0, b1 = bstart[li], bstart[li + 1]
        if not _blocks_ok(b0, b1, nblocks, a0, e0, block):
            return -FAULT_BLOCKS, theta
        nb = b1 - b0
        bi = 0
        p = a0
        for j in range(c):
            d = cand[j]
            s = acc[d]
            if bi < nb:
                bi = _gallop(blast, b0 + bi, b0 + nb, d) - b0
            if bi < nb:
                if s + w * bmax[b0 + bi] * (1.0 + 1e-9) + 1e-12 + after < theta:
                    stats[4] += 1  # cannot reach the top k: dropped
                    continue
                q0 = a0 + bi * block
                p = _gallop(docs, max(p, q0), min(q0 + block, e0), d)
                if p < e0 and docs[p] == d:
                    s += w * _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
                    acc[d] = s
            elif s + after < theta:
                stats[4] += 1
                continue
            cand[n] = d
            n += 1
            if s > 0.0:
                nk = _kth_offer(kth, nk, s)
                if nk == k and kth[0] > theta:
                    theta = kth[0]
        c = n
    for j in range(c):
        d = cand[j]
        v = acc[d]
        if v > 0.0 and not (nh == k and v < hv[0]):
            nh = _heap_push(hv, hr, hd, nh, v, rank[d], base | np.int64(d))
    for j in range(cands.shape[0]):  # every candidate, dropped ones included
        acc[cands[j] - lo] = 0.0
    return nh, theta


@jit
def _accumulate_masked(docs, tfs, code, table, itab, cap, a0, e0, w, allow, acc, touched, m):
    """Add one term's ``w · impact`` over postings [a0, e0) to the allowed documents'
    ``acc``, first-seen allowed documents appended to ``touched`` after the ``m`` there
    (branch-free, as `masked_shard`); the new count, or ``-FAULT_*`` at a damaged
    posting. [a0, e0) checked by the caller; ``w`` positive."""
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
        ok = allow[d]
        a = acc[d]
        touched[um] = d
        um += np.uint64((a == 0.0) & (ok != 0))
        acc[d] = a + w * v * np.float64(ok)
    return np.int64(um)


@jit
def _offer(acc, ids, m, rank, base, hv, hr, hd, nh):
    """Offer every positive ``acc[ids[j]]`` (j < m) to the heap as docno ``base | id``."""
    k = hv.shape[0]
    for j in range(m):
        d = ids[j]
        v = acc[d]
        if v > 0.0 and not (nh == k and v < hv[0]):
            nh = _heap_push(hv, hr, hd, nh, v, rank[d], base | np.int64(d))
    return nh


@jit
def _bounds_left(indptr, tmax, local, weights):
    """rest[i]: the inflated sum of the upper bounds of terms i.. (rest[T] = 0)."""
    T = local.shape[0]
    rest = np.zeros(T + 1)
    for i in range(T - 1, -1, -1):
        li = local[i]
        ub = weights[i] * tmax[li] if li >= 0 else 0.0
        rest[i] = rest[i + 1] + ub * (1.0 + 1e-9) + 1e-12
    return rest
