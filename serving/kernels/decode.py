"""What a posting is worth and where it is: the per-posting impact, term and posting lookups,
and the per-posting arrays the build writes.

Per posting the kernels compute Lucene's ``tf / (tf + denom[norm])`` from a small per-(k1, b)
table of length denominators (256 entries for Lucene's one-byte norms), as Lucene's own BM25
does, so a large index needs no per-posting impact array and every (k1, b) costs the same;
small tfs read it from a precomputed grid (`_impact`, `_impact_u`: the same float64
expression, so the same bits). A small index (at most ``lexical.retriever.IMPACT_POSTINGS`` postings)
does keep one (`posting_impacts`, the same float64 values): the exhaustive paths then read
one number per posting instead of a tf, a length code and a grid cell. A larger index has
the build's impacts for the default (k1, b) quantized to 16-bit levels (`posting_levels`,
``impacts.npy``, ``layout.IMPACT_*``), which ``exhaustive._search_approx`` reads. The build
also bounds each term here (`term_bounds`).
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .checks import _bad_posting, _posting_fault
from .layout import FAULT_FILES, FAULT_REASONS, IMPACT_DTYPE, IMPACT_LEVELS


@jit(inline="always")
def _impact(tf, c, table, itab, cap):
    """``tf / (tf + table[c])``, from the precomputed grid ``itab[tf, c]`` when tf < cap
    (the same float64 expression, so the same bits)."""
    if tf < cap:
        return itab[tf * table.shape[0] + c]
    x = np.float64(tf)
    return x / (x + table[c])


@jit(inline="always")
def _impact_u(tf, c, table, itab, ucap, nt):
    """`_impact` on unsigned indices (``tf``, ``c``, ``ucap``, ``nt = len(table)``:
    ``np.uint64``), for the accumulation loops: numba then emits no negative-index
    wraparound per access, which halves their cost. Same arithmetic, same bits."""
    if tf < ucap:
        return itab[tf * nt + c]
    x = np.float64(tf)
    return x / (x + table[c])


@jit
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


@jit
def _local_terms(term_gid, gids, local):
    found = False
    for i in range(gids.shape[0]):
        local[i] = _find(term_gid, gids[i])
        if local[i] >= 0:
            found = True
    return found


@jit
def _bisect(docs, lo, hi, target):
    """First position in [lo, hi) with docs[pos] >= target (hi when none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if docs[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit
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
    return _bisect(docs, lo + 1, min(hi, end), target)


@jit
def _quantize(v):
    """The least level q with q · IMPACT_STEP >= v (float64 compares), for v in (0, 1]:
    at least 1, at most IMPACT_LEVELS (`_approx_margin` relies on both)."""
    q = min(max(np.ceil(v * IMPACT_LEVELS), 1.0), float(IMPACT_LEVELS))
    while q < IMPACT_LEVELS and q / IMPACT_LEVELS < v:
        q += 1.0
    while q > 1.0 and (q - 1.0) / IMPACT_LEVELS >= v:
        q -= 1.0
    return q


@jit
def _fill_impacts(docs, tfs, code, table, itab, out, levels):
    """Each posting's impact into ``out``: as it is (float64), or with ``levels`` as its
    level (`_quantize`); 0, or the ``FAULT_*`` of a posting whose document is outside
    ``code`` or whose tf is below 1 (every impact is then above 0, as the kernels that read
    them require)."""
    und = np.uint64(code.shape[0])
    ucap = np.uint64(itab.shape[0] // table.shape[0])
    nt = np.uint64(table.shape[0])
    for p in range(docs.shape[0]):
        d = np.uint64(docs[p])
        t = np.uint64(tfs[p])
        if _bad_posting(d, und, t):
            return _posting_fault(d, und)
        v = _impact_u(t, np.uint64(code[d]), table, itab, ucap, nt)
        out[p] = _quantize(v) if levels else v
    return 0


def _impacts_or_fault(docs, tfs, code, table, itab, out, levels=False):
    fault = _fill_impacts(docs, tfs, code, table, itab, out, levels)
    if fault:
        from ..errors import ShardFault
        raise ShardFault(FAULT_FILES[fault], FAULT_REASONS[fault])
    return out


def posting_impacts(docs, tfs, code, table, itab):
    """Each posting's ``tf / (tf + table[code[doc]])``, as ``_accumulate`` computes it.
    Raises ``errors.ShardFault`` at a document id outside ``code`` or a tf below 1."""
    return _impacts_or_fault(docs, tfs, code, table, itab, np.empty(docs.shape[0]))


def posting_levels(docs, tfs, code, table, itab):
    """Each posting's impact (`posting_impacts`) as an ``IMPACT_DTYPE`` level
    (`_quantize`): what the build stores (``impacts.npy``) for the exhaustive kernels'
    approximate pass, whose candidates are then rescored exactly (``_rescore_shard``).
    Raises ``errors.ShardFault`` as `posting_impacts` does."""
    return _impacts_or_fault(docs, tfs, code, table, itab, np.empty(docs.shape[0], dtype=IMPACT_DTYPE), True)


@jit
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
