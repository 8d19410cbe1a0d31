"""Block-max pruning: MaxScore over exact per-block maxima (`_score_shard_blocks`).

With the default (k1, b) a shard that prunes uses exact block maxima (`block_maxima`: each
run of ``layout.BLOCK`` postings' largest impact, computed once per opened index): a block
whose maximum plus the later terms' bounds stays below ``theta`` brings in no new document,
so only the candidates inside it are looked up. That prunes a common term whose largest
impact is above ``theta`` but most of whose blocks are below it, which per-term bounds
cannot (a rare term next to a very common one, at k=100). ``theta`` also starts from the
block maxima: a term's k-th largest block maximum is a lower bound on the k-th score
(`_theta_from_blocks`). A query with a pruning threshold is pruned only where `_prune_pays`
expects pruning to beat the exhaustive path; on long questions over common terms it cannot
skip enough postings to repay its bookkeeping.
"""

from __future__ import annotations

import numpy as np

from ._jit import BOUNDS_CHECK, jit, _prefetch_block, _view
from .checks import _bad_posting, _blocks_ok, _posting_fault, _range_ok
from .decode import _bisect, _gallop, _impact_u, _local_terms
from .exhaustive import _accumulate_term
from .heap import _kth_vals, _push_scores
from .layout import (BLOCK, FAULT_BLOCKS, FAULT_DOCS, FAULT_FILES, FAULT_INDPTR, FAULT_REASONS, KTH_BLOCKS,
                     PREFETCH_AHEAD, PRUNE_LOOKUP, PRUNE_SKIP)
from .maxscore import _gather, _prune_candidates


def block_maxima(indptr, docs, tfs, code, table, itab, block):
    """Per term of one shard, the largest impact ``tf / (tf + table[code])`` in each run of
    ``block`` postings: (``bstart`` [V + 1]: term t's blocks are ``bmax[bstart[t]:bstart[t + 1]]``;
    ``bmax``; ``tmax`` [V]: the term's largest; ``tkth`` [V · len(KTH_BLOCKS)]: its
    ``KTH_BLOCKS[j]``-th largest block maximum at ``t · len(KTH_BLOCKS) + j``, 0 with
    fewer blocks; ``blast`` [like ``bmax``], int32: each block's last document, which
    candidate lookups search instead of the postings). Exact for this (k1, b): a block's
    bound is the impact of one of its postings. (Bounding by the block's largest tf and
    shortest document instead bounds nothing on a common term: every block has some long
    tf.)

    Raises ``errors.ShardFault`` (naming the shard's file) where ``indptr`` runs outside
    the postings or backwards, or a document id lies outside ``code``."""
    fault, bstart, bmax, tmax, tkth, blast = _block_maxima(indptr, docs, tfs, code, table, itab, block)
    if fault:
        from ..errors import ShardFault
        raise ShardFault(FAULT_FILES[fault], FAULT_REASONS[fault])
    return bstart, bmax, tmax, tkth, blast


@jit
def _block_maxima(indptr, docs, tfs, code, table, itab, block):
    """`block_maxima`: (fault, its arrays), fault a ``FAULT_*`` or 0. ``indptr`` is
    read once, into a checked copy: the file may change meanwhile."""
    V = indptr.shape[0] - 1
    cap = itab.shape[0] // table.shape[0]
    npost = docs.shape[0]
    und = np.uint64(code.shape[0])
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    ptr = np.empty(V + 1, dtype=np.int64)
    bstart = np.empty(V + 1, dtype=np.int64)
    bstart[0] = 0
    ptr[0] = indptr[0]
    for t in range(V):
        ptr[t + 1] = indptr[t + 1]
        if not _range_ok(ptr[t], ptr[t + 1], npost):  # ascending, inside the postings
            z = np.zeros(0)
            return FAULT_INDPTR, bstart[:1], z, z, z, np.zeros(0, dtype=np.int32)
        bstart[t + 1] = bstart[t] + (ptr[t + 1] - ptr[t] + block - 1) // block
    bmax = np.zeros(bstart[V])
    blast = np.zeros(bstart[V], dtype=np.int32)
    tmax = np.zeros(V)
    nk = KTH_BLOCKS.shape[0]
    tkth = np.zeros(V * nk)
    for t in range(V):
        p, e = ptr[t], ptr[t + 1]
        b = bstart[t]
        tm = 0.0
        while p < e:
            q = min(p + block, e)
            m = 0.0
            for x in range(p, q):
                d = np.uint64(docs[x])
                if BOUNDS_CHECK and d >= und:
                    z = np.zeros(0)
                    return FAULT_DOCS, bstart[:1], z, z, z, np.zeros(0, dtype=np.int32)
                v = _impact_u(np.uint64(tfs[x]), np.uint64(code[d]), table, itab, ucap, nt)
                if v > m:
                    m = v
            bmax[b] = m
            blast[b] = docs[q - 1]
            tm = max(tm, m)
            b += 1
            p = q
        tmax[t] = tm
        nb = bstart[t + 1] - bstart[t]
        if nb >= KTH_BLOCKS[0]:
            srt = np.sort(bmax[bstart[t]:bstart[t + 1]])
            for j in range(nk):
                if nb >= KTH_BLOCKS[j]:
                    tkth[t * nk + j] = srt[nb - KTH_BLOCKS[j]]
    return 0, bstart, bmax, tmax, tkth, blast


@jit
def _theta_from_blocks(tkth, local, weights, k):
    """A lower bound on the k-th best final score before any posting is read: the largest
    ``weight · (k'-th largest block maximum)`` of a query term in this shard, k' the
    smallest of ``KTH_BLOCKS`` >= k. Each block maximum is one document's exact
    contribution, distinct blocks of a term are distinct documents, and a document's
    score is at least any one of its contributions (positive weights, sums of positive
    floats): so at least k' >= k documents score that much."""
    nk = KTH_BLOCKS.shape[0]
    j = 0
    while j < nk and KTH_BLOCKS[j] < k:
        j += 1
    best = 0.0
    if j == nk:
        return best
    for i in range(local.shape[0]):
        li = local[i]
        if li >= 0:
            best = max(best, weights[i] * tkth[li * nk + j])
    return best * (1.0 - 1e-9)


@jit
def _partial_kth(docs, tfs, code, table, itab, indptr, local, weights, pick, k, acc, touched):
    """(the k-th largest partial score over the terms ``local[pick]``, 0.0 where fewer than k
    documents hold one; those documents): each document's ``w · impact`` summed over those
    terms, a lower bound on its score, so k documents score at least that much. Sums in
    ``acc`` (zero, and zero again on return) with ``touched`` listing the documents. -1.0
    where a posting or a term's range is impossible (the scoring that follows reads them
    and says so)."""
    und = np.uint64(min(code.shape[0], acc.shape[0], touched.shape[0]))
    ucap = np.uint64(itab.shape[0] // table.shape[0])
    nt = np.uint64(table.shape[0])
    m = 0
    bad = False
    for j in range(pick.shape[0]):
        i = pick[j]
        li = local[i]
        w = weights[i]
        a0, e0 = indptr[li], indptr[li + 1]  # each read once: the file may change meanwhile
        if not (0 <= a0 and a0 <= e0 and e0 <= docs.shape[0] and e0 <= tfs.shape[0]):
            bad = True
            break
        for p in range(a0, e0):
            d = np.uint64(docs[p])
            t = np.uint64(tfs[p])
            if d >= und or t - np.uint64(1) >= np.uint64(0x7FFFFFFF):
                bad = True
                break
            a = acc[d]
            if a == 0.0:  # every contribution is above 0 (positive weights and impacts)
                touched[m] = d
                m += 1
            acc[d] = a + w * _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
        if bad:
            break
    kth = -1.0 if bad else 0.0
    if not bad and m >= k:
        vals = np.empty(m)
        for j in range(m):
            vals[j] = acc[touched[j]]
        kth = np.partition(vals, m - k)[m - k]
    for j in range(m):
        acc[touched[j]] = 0.0
    return kth, m


@jit
def _prune_pays(meta, bmeta, code_proto, table, itab, acc, touched, gids, weights, k):
    """Whether block-max pruning is expected to beat exhaustive scoring for this query:
    where, in the first shard holding one of its terms, the bounds known before any
    posting is read, each term's blocks against the bounds of the terms after it as
    ``_score_shard_blocks`` tests them, already rule out at least ``PRUNE_SKIP`` of the
    query's postings. Below that, the postings pruning still reads cost it more (touched
    lists, candidate lookups, theta refreshes) than exhaustive scoring spends on all of
    them: on a long question over common terms it skips next to nothing. Reads one shard's
    block maxima of the query's terms (1/64 of its postings there).

    ``theta`` here is the larger of ``_theta_from_blocks`` and the k-th best partial score
    over the query's rarest terms in the shard, as long as they hold at most 1/64 of its
    postings there (`_partial_kth`, summed in ``acc``, which it leaves zero): a rare term
    beside common ones has fewer than k blocks, so its k-th block maximum is 0, yet scoring
    it first raises ``theta`` above the common terms' bounds. Without it, "mi vu gu
    famivurut" (dfs 181, 669K, 709K, 802K of 1M on the Zipf corpus) went to exhaustive
    scoring: 1.73 ms, against 0.055 pruned. At 1/16 instead of 1/64 the estimate itself cost
    more than pruning saved on some queries (a sort, then a 14K-posting term: 0.4 ms)."""
    local = np.empty(gids.shape[0], dtype=np.int64)
    s = 0
    while s < meta.shape[0] and not _local_terms(_view(meta, s, 3, np.int32), gids, local):
        s += 1
    if s == meta.shape[0]:
        return False
    theta = _theta_from_blocks(_view(bmeta, s, 3, np.float32), local, weights, k)
    indptr = _view(meta, s, 0, np.int64)
    bstart = _view(bmeta, s, 0, np.int64)
    bmax = _view(bmeta, s, 1, np.float32)
    tmax = _view(bmeta, s, 2, np.float32)
    T = local.shape[0]
    sizes = np.empty(T, dtype=np.int64)  # each term's postings here, read once
    post = 0
    others = 0  # the query's terms in the shard
    for i in range(T):
        li = local[i]
        sizes[i] = indptr[li + 1] - indptr[li] if li >= 0 else 0
        post += sizes[i]
        others += li >= 0
    rest = np.zeros(T + 1)  # as _score_shard_blocks computes it
    for i in range(T - 1, -1, -1):
        ub = weights[i] * tmax[local[i]] if local[i] >= 0 else 0.0
        rest[i] = rest[i + 1] + ub * (1.0 + 1e-9) + 1e-12
    enough = PRUNE_SKIP * post
    skip = _skipped(indptr, bstart, bmax, local, weights, rest, theta)
    if skip < 0:
        return False  # damaged: the scoring that follows reads the range and says so
    if skip >= enough:
        return theta > 0.0
    # The terms with the fewest postings here, while they hold at most 1/64 of the query's.
    for i in range(T):
        if local[i] < 0:
            sizes[i] = post + 1  # absent here: never picked
    by_size = np.argsort(sizes)
    n_pick = 0
    n = 0
    top = 0.0  # no partial score over them exceeds their bounds' sum
    while n_pick < T and 64 * (n + sizes[by_size[n_pick]]) <= post:
        n += sizes[by_size[n_pick]]
        top += weights[by_size[n_pick]] * tmax[local[by_size[n_pick]]] * (1.0 + 1e-9) + 1e-12
        n_pick += 1
    # The documents those terms bring in are looked up in each other term (below): at least
    # as many as the largest of them holds.
    if n < k or sizes[by_size[n_pick - 1]] * (others - n_pick) * PRUNE_LOOKUP > post - enough:
        return False
    if top <= theta or _skipped(indptr, bstart, bmax, local, weights, rest, top) < enough:
        return False  # not even the largest theta they could give would skip enough
    docs = _view(meta, s, 1, np.int32)
    tfs = _view(meta, s, 2, code_proto[1].dtype)
    code = _view(meta, s, 5, code_proto[0].dtype)
    kth, m = _partial_kth(docs, tfs, code, table, itab, indptr, local, weights, by_size[:n_pick], k, acc, touched)
    if kth <= theta:
        return False  # damaged (-1), or no higher than the bound already tried
    if _skipped(indptr, bstart, bmax, local, weights, rest, kth * (1.0 - 1e-9)) < enough:
        return False
    # Their lookups too must stay within what exhaustive scoring would spend beyond the
    # skipped share.
    return m * (others - n_pick) * PRUNE_LOOKUP <= post - enough


@jit
def _skipped(indptr, bstart, bmax, local, weights, rest, theta):
    """The postings of the query's terms (``local``, ``weights``; ``rest[i]``: the inflated
    bounds of terms i.., as ``_score_shard_blocks`` computes them) in blocks that a
    ``theta`` rules out before any is read; -1 at a damaged block range."""
    skip = 0
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        n = indptr[li + 1] - indptr[li]
        need = theta - rest[i + 1]
        w = weights[i]
        b0, b1 = bstart[li], bstart[li + 1]
        if not (0 <= b0 and b0 <= b1 and b1 <= bmax.shape[0]):
            return -1
        for blk in range(b1 - b0):
            if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 < need:
                skip += min(BLOCK, n - blk * BLOCK)
    return skip


@jit
def _score_shard_blocks(indptr, docs, tfs, code, table, itab, cap, bstart, bmax, tmax, blast, block, local,
                        weights, acc, touched, rank, base, hv, hr, hd, nh, theta, eager, stats):
    """``_score_shard`` with exact block maxima (``block_maxima``): term-at-a-time in the
    canonical order, but once ``theta`` (a lower bound on the final k-th score) is known,
    a block of a term whose maximum plus the bounds of the terms after it stays below
    ``theta`` cannot bring in a new document: only the candidates already seen that fall
    inside it are looked up, and the block's other postings are never read. A candidate
    is found by galloping over the blocks' last documents (``blast``: 4 bytes a block,
    so the search stays in cache) and bisecting the one block that may hold it, whose
    lines are prefetched ``PREFETCH_AHEAD`` candidates ahead (the lookups are cache
    misses: at 1M documents, k=100, their share of this kernel's cycles went from 24%
    galloping through the postings to 20% by block and 16% with the prefetching); the
    block found for the prefetch is kept for the lookup (one gallop per candidate, not
    two: 2.5-3.6% less time at 1M, identical results). The candidates are sorted by
    merging runs, not by a sort: each exhaustive term appends its new documents to
    ``touched`` in doc order. Scores gathered for a k-th (``_gather``) serve the filter
    after it, so each candidate's score is read at random once (with the merge, 4% less
    time at 1M, k=100; 2.3% at k=10).
    Blocks that can bring in documents are read whole. Candidates are kept sorted by
    document from the first term that has such blocks on, and dropped once their
    partial score plus the bounds left cannot reach ``theta``.

    A document in the final top k is never skipped (its score would be below ``theta``)
    and gets every term added in the canonical order, so its score has term-at-a-time's
    bits. A document first met in a readable block after being skipped in an earlier
    block misses that term's part; its true score is below ``theta`` already, so it
    cannot reach the top k either way. ``eager`` prunes wherever the bounds allow (tests);
    otherwise the candidates go sorted only where that costs less than the postings it
    saves, a try that finds too many candidates is repeated only where a term saves half
    their cost, and ``theta`` is refreshed between terms only where the next term could
    then be skipped in part (``_theta_may_pay``): on a long query over common terms every
    refresh and try is a pass over all documents seen, for nothing. Returns (heap count,
    theta); at a damaged posting or block range (``-FAULT_*``, theta), ``acc`` left as it
    is (the caller zeroes it)."""
    k = hv.shape[0]
    T = local.shape[0]
    npost = docs.shape[0]
    nblocks = min(bmax.shape[0], blast.shape[0])
    und = np.uint64(acc.shape[0])
    ucap = np.uint64(cap)
    nt = np.uint64(table.shape[0])
    rest = np.zeros(T + 1)  # rest[i]: inflated sum of the bounds of terms i..
    remaining = np.zeros(T + 1, dtype=np.int64)
    for i in range(T - 1, -1, -1):
        li = local[i]
        ub = 0.0
        if li >= 0:
            ub = weights[i] * tmax[li]
            remaining[i] = remaining[i + 1] + indptr[li + 1] - indptr[li]
        else:
            remaining[i] = remaining[i + 1]
        rest[i] = rest[i + 1] + ub * (1.0 + 1e-9) + 1e-12
    m = 0  # documents with a score in acc (touched[:m]), for the reset
    sorted_mode = False
    cand = np.empty(0, dtype=np.int64)
    c = 0
    skipped = 0
    ahead = np.empty(PREFETCH_AHEAD, dtype=np.int64)  # the blocks of the candidates prefetched
    runs = np.empty(T + 1, dtype=np.int64)  # where each exhaustive term's new documents start in touched
    nruns = 0
    vals = np.empty(0)  # acc[touched[:nv]], gathered for the last kth (valid until acc changes)
    retry_at = 0.0  # a switch is tried where a term saves more postings than this
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
        need = theta - rest[i + 1]  # a new document needs w * impact (inflated) >= need
        if not sorted_mode and theta > 0.0:
            n_pass = 0  # postings in blocks that can bring in documents
            for blk in range(nb):
                if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 >= need:
                    n_pass += min(block, e0 - a0 - blk * block)
            saved = (e0 - a0) - n_pass  # postings never read if the candidates go sorted
            if saved > 0 and (eager or (saved > m and saved > retry_at)):
                buf, bounds, nc = _reachable_runs(acc, vals, nv, touched, m, runs, nruns, rest[i], theta)
                if eager or nc * np.log2(nc + 2) <= saved:
                    sorted_mode = True
                    c = nc
                    cand = _merge_runs(buf, bounds, nruns, nc)
                else:  # too many candidates: try again only where a term saves half their cost
                    retry_at = nc * np.log2(nc + 2) / 2
        if not sorted_mode:
            runs[nruns] = m  # each term's new documents come in doc order: touched is sorted runs
            nruns += 1
            nv = 0
            m = _accumulate_term(docs, tfs, code, table, itab, cap, a0, e0, w, acc, touched, m)
            if m < 0:
                return m, theta
            if i + 1 < T and m >= k and (eager or remaining[i + 1] >= 2 * m) and (
                    eager or _theta_may_pay(indptr, bstart, bmax, block, local, weights, rest, i, m)):
                vals = _gather(acc, touched, m)
                nv = m
                theta = max(theta, _kth_vals(vals, m, k, theta))  # partial scores: lower bounds
            continue
        # Sorted candidates: readable blocks whole; between them, only where a candidate is.
        readable = np.empty(nb, dtype=np.int64)
        nr = 0
        for blk in range(nb):
            if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 >= need:
                readable[nr] = blk
                nr += 1
        new = np.empty(nr * block, dtype=np.int64)
        nn = 0
        j = 0
        p = a0  # galloping cursor
        for x in range(nr + 1):
            if x < nr:
                p0 = a0 + readable[x] * block
                p1 = min(p0 + block, e0)
                first = docs[p0]
            else:
                p0 = e0
                p1 = e0
                first = np.iinfo(np.int32).max
            skipped += p0 - p
            bend = (p0 - a0 + block - 1) // block  # the stretch's blocks end here
            ja = j  # the candidates up to PREFETCH_AHEAD ahead have their blocks prefetched
            ba = (p - a0) // block
            while j < c and cand[j] < first:  # candidates in the unread stretch [p, p0)
                while ja < c and ja < j + PREFETCH_AHEAD and cand[ja] < first:
                    bq = _gallop(lasts, ba, bend, cand[ja])
                    ahead[ja % PREFETCH_AHEAD] = bq
                    if bq < bend:
                        ba = bq
                        _prefetch_block(docs, tfs, a0 + bq * block, block)
                    ja += 1
                d = cand[j]
                # The block that may hold d (the first whose last document is >= d, found
                # when d's block was prefetched: ja > j here), then d inside it.
                bb = ahead[j % PREFETCH_AHEAD]
                if bb == bend:
                    p = p0  # past the stretch's last document; so are the candidates after d
                else:
                    p = _bisect(docs, max(p, a0 + bb * block), min(a0 + (bb + 1) * block, p0), d)
                    if p < p0 and docs[p] == d:
                        acc[d] += w * _impact_u(np.uint64(tfs[p]), np.uint64(code[d]), table, itab, ucap, nt)
                j += 1
            if x == nr:
                break
            for q in range(np.uint64(p0), np.uint64(p1)):
                d = np.uint64(docs[q])
                t = np.uint64(tfs[q])
                if _bad_posting(d, und, t):
                    return -_posting_fault(d, und), theta
                v = w * _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
                a = acc[d]
                if a == 0.0:
                    new[nn] = d
                    nn += 1
                    touched[m] = d
                    m += 1
                acc[d] = a + v
            last = docs[p1 - 1]
            while j < c and cand[j] <= last:
                j += 1
            p = p1
        if nn > 0:  # merge the new documents (in doc order, none a candidate) into cand
            merged = np.empty(c + nn, dtype=np.int64)
            _merge2(cand, 0, c, new, 0, nn, merged, 0)
            cand = merged
            c += nn
        c, theta = _prune_candidates(acc, cand, c, k, rest[i + 1], theta)
    if sorted_mode:
        stats[0] += 1
        stats[1] += skipped
        nh = _push_scores(acc, cand, c, rank, base, hv, hr, hd, nh, False)
    else:
        nh = _push_scores(acc, touched, m, rank, base, hv, hr, hd, nh, False)
    for j in range(m):
        acc[touched[j]] = 0.0
    return nh, theta


@jit
def _theta_may_pay(indptr, bstart, bmax, block, local, weights, rest, i, m):
    """Whether refreshing ``theta`` after term ``i`` (a k-th over the ``m`` documents seen:
    ``m`` random reads) can let ``_score_shard_blocks`` switch to candidates at the next
    term present. The switch needs that term to skip more postings than there are
    documents seen; no partial score, so no theta, exceeds the processed terms' bounds
    (``rest[0] - rest[i + 1]``), so the term's blocks that even this could skip bound its
    saving. On a long query over common terms the bounds of the terms still to come
    exceed every theta: nothing can be skipped, and the k-th is not computed."""
    T = local.shape[0]
    j = i + 1
    while j < T and local[j] < 0:
        j += 1
    if j >= T:
        return False
    need = (rest[0] - rest[i + 1]) - rest[j + 1]
    if need <= 0.0:
        return False
    lj = local[j]
    w = weights[j]
    b0, b1 = bstart[lj], bstart[lj + 1]
    n = indptr[lj + 1] - indptr[lj]
    if not (0 <= b0 and b0 <= b1 and b1 <= bmax.shape[0]):  # damaged: the term's own read says so
        return False
    skip = 0
    for blk in range(b1 - b0):
        if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 < need:
            skip += min(block, n - blk * block)
    return skip > m


@jit
def _reachable_runs(acc, vals, nv, ids, m, runs, nruns, r, theta):
    """The documents of ids[:m] whose score plus ``r`` can still reach ``theta``, in
    order, and where each run of ``runs`` starts among them. Scores are read from
    ``vals[:nv]`` (``acc[ids[j]]`` gathered earlier) where given, else from ``acc``."""
    out = np.empty(m, dtype=np.int64)
    bounds = np.empty(nruns + 1, dtype=np.int64)
    n = 0
    for x in range(nruns):
        bounds[x] = n
        end = runs[x + 1] if x + 1 < nruns else m
        for j in range(runs[x], end):
            v = vals[j] if j < nv else acc[ids[j]]
            if v + r >= theta:
                out[n] = ids[j]
                n += 1
    bounds[nruns] = n
    return out, bounds, n


@jit
def _merge2(a, i, a_end, b, j, b_end, out, z):
    """Merge sorted a[i:a_end] and b[j:b_end] (no value in both) into out from z on. Not
    inlined: inlined as a while loop, the block-max kernel took ~2% longer at 1M (paired
    A/B), though merging is ~0.2% of its cycles; called, no difference."""
    for z in range(z, z + (a_end - i) + (b_end - j)):
        if j >= b_end or (i < a_end and a[i] < b[j]):
            out[z] = a[i]
            i += 1
        else:
            out[z] = b[j]
            j += 1


@jit
def _merge_runs(a, bounds, nruns, n):
    """``a[:n]`` sorted, given that each ``a[bounds[x]:bounds[x + 1]]`` is: pairwise merges."""
    if nruns <= 1:
        return a[:n]
    b = np.empty(n, dtype=a.dtype)
    while nruns > 1:
        nb = 0
        x = 0
        while x < nruns:
            lo = bounds[x]
            if x + 1 == nruns:
                for z in range(lo, bounds[x + 1]):
                    b[z] = a[z]
                bounds[nb] = lo
                nb += 1
                x += 1
                continue
            _merge2(a, lo, bounds[x + 1], a, bounds[x + 1], bounds[x + 2], b, lo)
            bounds[nb] = lo
            nb += 1
            x += 2
        bounds[nb] = n
        nruns = nb
        a, b = b, a
    return a[:n]
