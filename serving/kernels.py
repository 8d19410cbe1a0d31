"""Optional numba kernels for the BM25 hot loop; the NumPy path in ``bm25.py`` is the reference.

``search_shards`` answers one query over every shard in one compiled call: it finds each
query term in each shard (binary search on ``term_gid``), scores term-at-a-time into a
reused accumulator, and cuts the top ``k`` with the ranking's tie-break (score descending,
then doc_id ascending through ``id_rank``). Per posting it computes Lucene's
``tf / (tf + denom[norm])`` from a small per-(k1, b) table of length denominators (256
entries for Lucene's one-byte norms), as Lucene's own BM25 does, so a large index needs
no per-posting impact array and every (k1, b) costs the same. A small index (at most
``lexical.IMPACT_POSTINGS`` postings) does keep one (``posting_impacts``, the same float64
values): the exhaustive paths then read one number per posting instead of a tf, a length
code and a grid cell.

A larger index has the build's impacts for the default (k1, b) quantized to 16-bit levels
(``impacts.npy``, ``posting_levels``), memory-mapped. The exhaustive path reads those
(``_search_approx``): it sums them in float64, keeps every document within a proven margin
of the k-th approximate score (``_approx_margin``), and rescores those candidates exactly from their
postings (``_rescore_shard``), as PISA and JASS rescore their quantized top k: the returned
documents, scores and ties are float64 term-at-a-time's. Where a query has postings for
about as many documents as a shard holds, a shard's accumulator is read back by one scan
(``_accumulate_dense``, ``_offer_dense``) instead of through a list of touched documents,
whose store per posting waits on the accumulator's load. A query with a pruning threshold
is pruned only where ``_prune_pays`` expects pruning to beat this exhaustive path; on long
questions over common terms it cannot skip enough postings to repay its bookkeeping.

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

With the default (k1, b) a shard that prunes uses exact block maxima instead
(``block_maxima``: each run of 64 postings' largest impact, computed once per opened
index; ``_score_shard_blocks``): a block whose maximum plus the later terms' bounds stays
below ``theta`` brings in no new document, so only the candidates inside it are looked
up. That prunes a common term whose largest impact is above ``theta`` but most of whose
blocks are below it, which per-term bounds cannot (a rare term next to a very common one,
at k=100). ``theta`` also starts from the block maxima: a term's k-th largest block
maximum is a lower bound on the k-th score. Per-query (k1, b) overrides keep the per-term
bounds, so they allocate nothing proportional to the index.

The k best are kept in one size-k heap ordered by the ranking itself (score, then
``id_rank``), shared by all shards, so no per-shard candidate lists are merged. The
exhaustive paths keep them the same way up to ``HEAP_K``; above it, in a buffer of 4k + 16
entries that only admits what beats a bar (the k-th best at the last cut) and is cut back
to its best k by quickselect when full (``_offer_scores``), because at k=100 sifting every
admitted document through a heap's ~7 levels dominates the kernel. The exhaustive loop
indexes with unsigned integers, so numba emits no negative-index wraparound per access.
``search_batch`` runs many queries (flat term-id arrays, CSR) through ``search_shards`` in
one call.

Damaged files. The postings are memory-mapped, so a file whose bytes change while a version
is served (a flipped bit on disk, a bad copy over it) changes what the next query reads;
the structure checks of the open (``serving.structure``) cannot see that. So every value
a kernel reads from a file and then uses to address memory is compared before the access:
a term's postings range (``indptr``) against the postings, its blocks (``block_start``)
against the block arrays and its postings, each document id against the shard's documents
(``acc``'s length), and where a posting may start a new entry of a touched list, its tf
(at least 1) or stored impact (above 0), since a zero impact would list a document twice
and run the list past its end. One unsigned compare per posting, hoisted per term where it
can be. A kernel that meets an impossible value stops and returns a fault code
(``shard << 8 | FAULT_*``; 0 when sound) instead of raising inside numba; the caller
(``lexical.BM25Retriever``) turns it into ``errors.IndexDamaged`` naming the file. Length
codes and per-term minimum lengths are private in-memory copies checked when made
(``bm25.ShardScorer``), so they need no compare. The touched lists assume positive weights;
a query with a non-positive one is read back by a scan of the accumulator instead
(``search_shards_plain``). ``BOUNDS_CHECK`` False compiles every compare out: only the
benchmark's baseline copy of this module (``bench/bench_workloads.py --bounds-check-cost``)
does that.

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
    from llvmlite import ir as llvmir
    from numba import carray, njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
    HAVE_NUMBA = True
except ImportError as e:  # pragma: no cover - exercised where numba is absent
    log.info("numba unavailable (%s): using the NumPy BM25 path", e)
    HAVE_NUMBA = False

#: Whether the kernels check the values they index with (module docstring, "Damaged files").
#: A copy of this module loaded with ``_UNCHECKED`` set in its namespace compiles without
#: them, and is not cached on disk (its functions would share the checked ones' cache files):
#: the baseline of ``bench/bench_workloads.py --bounds-check-cost``. Never for serving.
BOUNDS_CHECK = not globals().get("_UNCHECKED", False)
_CACHE = BOUNDS_CHECK

# What a kernel found impossible (the low byte of a fault code; ``FAULT_FILES`` names the
# shard's file that holds it). A fault code is ``shard << 8 | FAULT_*``, 0 when sound;
# ``FAULT_NO_SHARD`` in the shard part: the shard is not known (an id from the forward index).
FAULT_INDPTR, FAULT_DOCS, FAULT_TFS, FAULT_IMPACTS, FAULT_BLOCKS, FAULT_TERMS = 1, 2, 3, 4, 5, 6
FAULT_NO_SHARD = (1 << 24) - 1
FAULT_FILES = {FAULT_INDPTR: "indptr.npy", FAULT_DOCS: "docs.npy", FAULT_TFS: "tfs.npy",
               FAULT_IMPACTS: "impacts.npy", FAULT_BLOCKS: "block_start.npy", FAULT_TERMS: "term_gid.npy"}
FAULT_REASONS = {
    FAULT_INDPTR: "gives a term's postings a range outside docs.npy (or a decreasing one)",
    FAULT_DOCS: "holds a document id outside the shard's documents",
    FAULT_TFS: "holds a term frequency below 1",
    FAULT_IMPACTS: "holds an impact that is not above 0",
    FAULT_BLOCKS: "gives a term's blocks a range outside block_max.npy, or not one block per BLOCK of its postings",
    FAULT_TERMS: "holds a global term id outside the vocabulary",
}


def fault_parts(fault: int) -> tuple[int | None, str, str]:
    """(shard or None, file in the shard's folder, what is wrong) of a kernel's fault code."""
    shard, what = int(fault) >> 8, int(fault) & 0xFF
    return (None if shard == FAULT_NO_SHARD else shard), FAULT_FILES[what], FAULT_REASONS[what]


# The arrays of one shard that ``search_shards`` reads, in the order of its ``meta`` table.
FIELDS = ("indptr", "docs", "tfs", "term_gid", "max_tf", "code", "min_code")
FIELD_DTYPES = (np.int64, np.int32, "tf", np.int32, np.int32, None, None)  # None: the code dtype; "tf": tf_dtype
# The exhaustive paths keep their top k in a heap up to this k and in a buffer cut back by
# quickselect above it (``_new_top``): on SciFact and NFCorpus the buffer is faster at k=100
# and the heap at k=10.
HEAP_K = 32
# Block-max pruning prefetches the blocks of this many candidates ahead of the one it looks up
# (at 1M synthetic documents, k=100, 8 was the fastest of none / 4 / 8 / 16).
PREFETCH_AHEAD = 8
# The exhaustive paths score a large shard (``BM25Retriever.dense_min_docs``) without a list
# of touched documents, reading its accumulator back by one scan, where the query has at least
# (shard documents / this) postings there (``_is_dense``). The scan and the reset cost ~0.2 ns
# a document; the list ~0.6 ns a posting plus a random read per document touched. At 1M
# documents (5 shards) 8 and 32 were both faster than 2 on every workload of
# bench/bench_workloads.py, within noise of each other.
DENSE_DIVISOR = 16
# A query is pruned (block-max) only where the bounds known before reading a posting already
# rule out this share of its postings (``_prune_pays``). At 1M documents (Zipf and topical
# corpora, natural-language and short queries, per query, one thread) pruning won 98% of
# the queries above 0.97, about 70% between 0.93 and 0.97, and under half below 0.9.
PRUNE_SKIP = 0.92
# Scores per run that the dense read-back compares with its bar at once (``_offer_dense``).
SCAN = 64
# The build's stored impacts for the default (k1, b) (``impacts.npy``, ``posting_levels``):
# each posting's impact as a level q of this dtype standing for q · IMPACT_STEP, q the least
# with q · IMPACT_STEP >= the impact (never 0: every impact is above 0). Two bytes a posting
# instead of float32's four; the exhaustive path's margin is IMPACT_STEP times the sum of the
# query's weights (``_approx_margin``) and its candidates are rescored exactly. uint8 levels
# (one byte) were measured too, at 100K Zipf documents (bench/RESULTS.md, "Notes: figures
# moved from code comments"): their margin, 257 times wider, let so many near-ties through
# to the exact rescoring that short queries at k=100 took 1.36x the CPU of float32 impacts.
IMPACT_DTYPE = np.uint16
IMPACT_LEVELS = int(np.iinfo(IMPACT_DTYPE).max)
IMPACT_STEP = 1.0 / IMPACT_LEVELS
# A query's term ids (with repeats) are put in canonical order by insertion up to this many,
# by sorts above (insertion is quadratic; a query of thousands of terms stays cheap).
SMALL_SORT = 64


def tf_dtype(shards: list[dict[str, np.ndarray]]) -> np.dtype:
    """The dtype the kernels read every shard's tfs as: the shards' own (uint16 from the
    build, ``pipelines.postings.narrow_tfs``; int32 from older builds or a shard with a tf
    above 65,535), widened to hold them all where they differ (that shard is then copied
    into memory by `shard_table` instead of mapped)."""
    return np.result_type(*(np.asarray(a["tfs"]).dtype for a in shards)) if shards else np.dtype(np.int32)


def shard_table(shards: list[dict[str, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(meta, keep): the int64 [S, 2·len(FIELDS)] (address, length) table for ``search_shards``
    and the arrays it points into, which the caller must keep referenced while it is used.
    The kernels take ``code_proto``: (a zero-length array of the length codes' dtype, one
    of `tf_dtype`'s), so they are compiled for the dtypes the table points at."""
    code_dtype = shards[0]["code"].dtype if shards else np.dtype(np.uint8)
    tfs_dtype = tf_dtype(shards)
    meta = np.zeros((len(shards), 2 * len(FIELDS)), dtype=np.int64)
    keep = []
    for s, arrays in enumerate(shards):
        for f, (name, dt) in enumerate(zip(FIELDS, FIELD_DTYPES)):
            a = np.ascontiguousarray(arrays[name], dtype=tfs_dtype if dt == "tf" else (dt or code_dtype))
            if len(a) == 0:  # a valid address for an empty array
                a = np.zeros(1, dtype=a.dtype)[:0]
            keep.append(a)
            meta[s, 2 * f] = a.ctypes.data
            meta[s, 2 * f + 1] = len(a)
    return meta, keep


# Postings per block for the block-max bounds (``block_maxima``): PISA's and Lucene's size order.
BLOCK = 64
# The ranks k of each term's k-th largest block maximum kept for ``_theta_from_blocks``.
KTH_BLOCKS = np.array([10, 100, 1000], dtype=np.int64)


def block_table(blocks: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(bmeta, keep): the int64 [S, 10] (address, length) table of each shard's
    (``bstart``, ``bmax``, ``tmax``, ``tkth``, ``blast``) from `block_maxima`, for
    ``search_shards``; ``keep`` holds the arrays it points into, which the caller keeps
    referenced."""
    bmeta = np.zeros((len(blocks), 10), dtype=np.int64)
    keep = []
    for s, arrays in enumerate(blocks):
        for f, (a, dt) in enumerate(zip(arrays, (np.int64, np.float64, np.float64, np.float64, np.int32), strict=True)):
            a = np.ascontiguousarray(a, dtype=dt)
            if len(a) == 0:
                a = np.zeros(1, dtype=dt)[:0]
            keep.append(a)
            bmeta[s, 2 * f] = a.ctypes.data
            bmeta[s, 2 * f + 1] = len(a)
    return bmeta, keep


#: ``bmeta`` without block maxima: pruning uses per-term bounds only.
NO_BLOCKS = np.zeros((0, 10), dtype=np.int64)


def impact_table(impacts: list[np.ndarray], dtype=np.float64) -> tuple[np.ndarray, list[np.ndarray]]:
    """(imeta, keep): the int64 [S, 2] (address, length) table of each shard's per-posting
    impacts (`posting_impacts`, or stored levels: `posting_levels`) for the
    exhaustive kernels; ``keep`` holds the arrays, which the caller keeps referenced."""
    imeta = np.zeros((len(impacts), 2), dtype=np.int64)
    keep = []
    for s, a in enumerate(impacts):
        a = np.ascontiguousarray(a, dtype=dtype)
        if len(a) == 0:
            a = np.zeros(1, dtype=dtype)[:0]
        keep.append(a)
        imeta[s] = (a.ctypes.data, len(a))
    return imeta, keep


#: ``imeta`` without per-posting impacts: each posting's impact comes from the grid.
NO_IMPACTS = np.zeros((0, 2), dtype=np.int64)


if HAVE_NUMBA:
    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @intrinsic
    def _prefetch(typingctx, arr, idx):
        """Ask the CPU to bring arr[idx]'s cache line in (``llvm.prefetch``: a hint; it never
        faults, so idx may lie past the array's end)."""
        def codegen(context, builder, signature, args):
            a = context.make_array(signature.args[0])(context, builder, args[0])
            i8p = llvmir.IntType(8).as_pointer()
            i32 = llvmir.IntType(32)
            fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p],
                                                  fnty=llvmir.FunctionType(llvmir.VoidType(), [i8p, i32, i32, i32]))
            # read, keep in all cache levels, data cache
            builder.call(fn, [builder.bitcast(builder.gep(a.data, [args[1]]), i8p), i32(0), i32(3), i32(1)])
            return context.get_dummy_value()
        return types.void(arr, idx), codegen

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _prefetch_block(docs, tfs, q0, block):
        """Prefetch the ``block`` docs and tfs from q0 on (int32: 16 to a 64-byte line)."""
        for x in range(0, block, 16):
            _prefetch(docs, q0 + x)
            _prefetch(tfs, q0 + x)

    @njit(cache=_CACHE, nogil=True)
    def _bisect(docs, lo, hi, target):
        """First position in [lo, hi) with docs[pos] >= target (hi when none)."""
        while lo < hi:
            mid = (lo + hi) >> 1
            if docs[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _range_ok(a, b, n):
        """0 <= a <= b <= n: a term's postings ``indptr[t]``, ``indptr[t + 1]`` inside an
        array of n (always True without ``BOUNDS_CHECK``). Read each bound once into a local,
        check it, then use the local: the file may change between two reads."""
        return not BOUNDS_CHECK or (0 <= a and a <= b and b <= n)

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _blocks_ok(b0, b1, nblocks, a0, e0, block):
        """A term's blocks [b0, b1) inside the ``nblocks`` of the block arrays and exactly one
        per ``block`` of its postings [a0, e0) (checked already): the kernels read a block's
        postings at ``a0 + block · j``."""
        return not BOUNDS_CHECK or (0 <= b0 and b0 <= b1 and b1 <= nblocks
                                    and b1 - b0 == (e0 - a0 + block - 1) // block)

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _bad_posting(d, und, t):
        """Whether a posting's document id ``d`` (unsigned: a negative one is huge) is not
        below ``und`` (the shard's documents) or its tf ``t`` (``np.uint64`` of the int32)
        is below 1: one compare each, no branch between them."""
        return BOUNDS_CHECK and ((d >= und) | (t - np.uint64(1) >= np.uint64(0x7FFFFFFF)))

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _posting_fault(d, und):
        """The fault code of a posting `_bad_posting` refused."""
        return FAULT_DOCS if d >= und else FAULT_TFS

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _impact(tf, c, table, itab, cap):
        """``tf / (tf + table[c])``, from the precomputed grid ``itab[tf, c]`` when tf < cap
        (the same float64 expression, so the same bits)."""
        if tf < cap:
            return itab[tf * table.shape[0] + c]
        x = np.float64(tf)
        return x / (x + table[c])

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _impact_u(tf, c, table, itab, ucap, nt):
        """`_impact` on unsigned indices (``tf``, ``c``, ``ucap``, ``nt = len(table)``:
        ``np.uint64``), for the accumulation loops: numba then emits no negative-index
        wraparound per access, which halves their cost. Same arithmetic, same bits."""
        if tf < ucap:
            return itab[tf * nt + c]
        x = np.float64(tf)
        return x / (x + table[c])

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _new_heap(k):
        """An empty top-k heap: (scores, id ranks, docnos), for ``_heap_push``."""
        return np.empty(k), np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n):
        """Query ``q``'s ranked docnos as global positions (``doc_off[shard] + local``) and
        scores into row ``q`` of the batch outputs, and their count."""
        for j in range(dn.shape[0]):
            out_pos[q, j] = doc_off[dn[j] >> 32] + (dn[j] & 0xFFFFFFFF)
            out_score[q, j] = sc[j]
        out_n[q] = dn.shape[0]

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _new_top(k):
        """An empty top-k collector for ``_offer_scores``: (scores, id ranks, docnos, bar
        score, bar rank). For k <= HEAP_K it is a size-k heap (``_heap_push``), which is
        cheapest there; above, a buffer with room for 4k + 16 entries, cut back to its best k
        when full, whose bar is the k-th best entry of the last cut (at first the smallest
        positive float and any rank, so any positive score passes)."""
        c = k if k <= HEAP_K else 4 * k + 16
        return np.empty(c), np.empty(c, dtype=np.int64), np.empty(c, dtype=np.int64), 5e-324, np.int64(2**62)

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _reachable(acc, ids, m, r, theta):
        """`_keep_reachable` into a new array of ids' dtype."""
        out = np.empty(m, dtype=ids.dtype)
        return out[:_keep_reachable(acc, ids, m, r, theta, out)]

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _gather(acc, ids, m):
        """acc[ids[:m]] as a new dense array."""
        vals = np.empty(m)
        for j in range(m):
            vals[j] = acc[ids[j]]
        return vals

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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
            from .errors import ShardFault
            raise ShardFault(FAULT_FILES[fault], FAULT_REASONS[fault])
        return bstart, bmax, tmax, tkth, blast

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @intrinsic
    def _voidptr(typingctx, addr):
        """An int64 address as a void pointer (for ``carray`` over arrays the caller keeps alive)."""
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], cgutils.voidptr_t)
        return types.voidptr(types.int64), codegen

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _view(meta, s, f, dtype):
        return carray(_voidptr(meta[s, 2 * f]), meta[s, 2 * f + 1], dtype)

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _impacts_of(imeta, s):
        """Shard s's per-posting impacts from ``imeta``, or an empty array where there are none."""
        if imeta.shape[0] == 0:
            return np.empty(0)
        return _view(imeta, s, 0, np.float64)

    @njit(cache=_CACHE, nogil=True, inline="always")
    def _impacts32_of(imeta32, s):
        """Shard s's stored quantized impacts from ``imeta32`` (``impact_table(..., IMPACT_DTYPE)``)."""
        return _view(imeta32, s, 0, IMPACT_DTYPE)

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _accumulate_dense(indptr, docs, tfs, code, table, itab, cap, local, weights, acc, imp):
        """`_accumulate` without the list of touched documents (read back by a scan of
        the whole accumulator instead: ``_offer_dense``, ``_approx_offer``). Keeping that
        list costs a store per posting whose address waits on the accumulator's load, so a
        query with about as many postings as the shard has documents pays more for it than
        for one pass over the accumulator. ``imp``: each posting's impact, float64 (the same
        bits as the grid's) or stored levels (``IMPACT_DTYPE``, the weights scaled by
        ``IMPACT_STEP``: approximate sums, rescored after); empty:
        from the grid. Same order of additions as ``_accumulate``. Returns 0, or ``-FAULT_*``
        at a damaged posting (no touched list: any weights, any tf or impact is safe here)."""
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

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True, inline="always")
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _approx_keep(T):
        """The factor c of the float rounding in an approximate pass over ``T`` terms:
        each weight times ``IMPACT_STEP`` rounds once and each of the approximate and the
        exact sums rounds T times at 2^-53, so both lie within delta = (T + 1)·2^-52
        (relative, taken twice over) of their real values, and c = (1 - delta)/(1 + delta).
        `_approx_margin` says how it is used."""
        delta = (T + 1) * 2.0 ** -50
        return (1.0 - delta) / (1.0 + delta)

    @njit(cache=_CACHE, nogil=True)
    def _approx_margin(weights):
        """The absolute part of the approximate pass's bar: ``IMPACT_STEP`` times the sum of
        the (positive) weights, rounded up.

        The bound: a stored impact q stands for q·STEP, and the build chose q as the least
        with q·STEP >= the impact (``_quantize``), so each term adds at least its exact share
        and less than w·STEP more. Summed over a document's terms, its approximate score A
        and its exact score E (real arithmetic) satisfy E <= A < E + M, M = STEP·Σw. k
        documents approximate at least theta, so the exact k-th score is above theta - M, and
        a document of the exact top k approximates at least that. With the float rounding
        of both sums (`_approx_keep`'s c) a document below ``c² · theta - M`` cannot be in the
        exact top k; those at or above it are rescored exactly."""
        return IMPACT_STEP * weights.sum() * (1.0 + 2.0 ** -40)

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _find_all(docs, lo, hi, ids, pos):
        """``pos[j]``: the position of ``ids[j]`` in ``docs[lo:hi]`` (ascending), or -1. All the
        binary searches advance one halving at a time together and without branches: the
        probes of one halving are independent loads (most of them cache misses) that the CPU
        overlaps, where searching one id after another waits on each probe in turn."""
        m = ids.shape[0]
        n = hi - lo
        if n <= 0:
            pos[:] = -1
            return
        base = np.full(m, lo, dtype=np.int64)
        while n > 1:
            half = n >> 1
            for j in range(m):
                b = base[j]
                base[j] = b + half if docs[b + half] < ids[j] else b
            n -= half
        for j in range(m):
            b = base[j]
            p = b + 1 if docs[b] < ids[j] else b
            pos[j] = p if p < hi and docs[p] == ids[j] else -1

    @njit(cache=_CACHE, nogil=True)
    def _rescore_shard(indptr, docs, tfs, code, table, itab, cap, local, weights, ids, rank, base,
                       bv, br, bd, n, tv, tr, k):
        """The exact scores of one shard's documents ``ids`` (ascending), offered to a
        ``_new_top`` collector; returns (n, tv, tr). Each term's posting of a document is
        found by lookup and its impact computed as ``_accumulate`` computes it, added from
        0.0 in the canonical order: the bits exhaustive scoring gives. Term by term, all the
        candidates' lookups of one term together (``_find_all``). ``ids`` come from
        checked postings; a damaged range: (``-FAULT_INDPTR``, tv, tr)."""
        sc = np.zeros(ids.shape[0])
        pos = np.empty(ids.shape[0], dtype=np.int64)
        ucap = np.uint64(cap)
        nt = np.uint64(table.shape[0])
        for i in range(local.shape[0]):
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

    @njit(cache=_CACHE, nogil=True)
    def _search_approx(meta, imeta32, dense_min, code_proto, doc_off, id_rank, acc, touched, table, itab, cap, gids,
                       weights, k):
        """``search_shards_plain`` over the stored quantized impacts (positive weights):
        every shard's approximate scores (each posting's ``IMPACT_DTYPE`` level times its
        term's weight · ``IMPACT_STEP``, summed in float64) into one candidate buffer whose
        bar is its k-th best less the proven margin (`_approx_margin`), then the survivors
        (the k best and their near-ties) rescored exactly (``_rescore_shard``) and ranked:
        the same documents and bits as exhaustive float64 scoring, at two bytes a posting
        read instead of a tf, a length code and a table cell. Returns (docnos, scores, fault)."""
        local = np.empty(gids.shape[0], dtype=np.int64)
        c = _approx_keep(gids.shape[0])
        c = c * c
        margin = _approx_margin(weights)
        qweights = weights * IMPACT_STEP
        av = np.empty(4 * k + 16)
        ad = np.empty(4 * k + 16, dtype=np.int64)
        n = 0
        bar = 5e-324  # the smallest positive float: any positive score passes
        for s in range(meta.shape[0]):
            if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
                continue
            lo, hi = doc_off[s], doc_off[s + 1]
            nd = hi - lo  # scored in acc[:nd], as in search_shards
            indptr = _view(meta, s, 0, np.int64)
            docs = _view(meta, s, 1, np.int32)
            tfs = _view(meta, s, 2, code_proto[1].dtype)
            code = _view(meta, s, 5, code_proto[0].dtype)
            imp = _impacts32_of(imeta32, s)
            if _is_dense(indptr, local, nd, dense_min):
                f = _accumulate_dense(indptr, docs, tfs, code, table, itab, cap, local, qweights, acc[:nd], imp)
                if f < 0:
                    return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -f
                av, ad, n, bar = _approx_offer(acc[:nd], touched, -1, np.int64(s) << 32, av, ad, n, bar, k, c,
                                               margin)
            else:
                m = _accumulate(indptr, docs, tfs, code, table, itab, cap, local, qweights, acc[:nd], touched[:nd + 1],
                                0, imp)
                if m < 0:
                    return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -m
                av, ad, n, bar = _approx_offer(acc[:nd], touched, m, np.int64(s) << 32, av, ad, n, bar, k, c,
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
            nn, tv, tr = _rescore_shard(_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32),
                                        _view(meta, s, 2, code_proto[1].dtype), _view(meta, s, 5, code_proto[0].dtype),
                                        table, itab,
                                        cap, local, weights, cand[j:e] & np.int64(0xFFFFFFFF), id_rank[lo:hi],
                                        np.int64(s) << 32, bv, br, bd, nn, tv, tr, k)
            if nn < 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -nn
            j = e
        dn, sc = _top_sorted(bv, br, bd, nn, k)
        return dn, sc, 0

    @njit(cache=_CACHE, nogil=True)
    def place_postings(tids, docs, tfs, indptr):
        """(docs, tfs) with each posting moved to its term's next free slot (``indptr[t]``
        on), in input order: the build's counting sort (``PostingsBuilder.finish``)."""
        nxt = indptr[:-1].copy()
        out_d = np.empty(docs.shape[0], dtype=docs.dtype)
        out_t = np.empty(tfs.shape[0], dtype=tfs.dtype)
        for i in range(tids.shape[0]):
            t = tids[i]
            j = nxt[t]
            out_d[j] = docs[i]
            out_t[j] = tfs[i]
            nxt[t] = j + 1
        return out_d, out_t

    @njit(cache=_CACHE, nogil=True)
    def _quantize(v):
        """The least level q with q · IMPACT_STEP >= v (float64 compares), for v in (0, 1]:
        at least 1, at most IMPACT_LEVELS (`_approx_margin` relies on both)."""
        q = min(max(np.ceil(v * IMPACT_LEVELS), 1.0), float(IMPACT_LEVELS))
        while q < IMPACT_LEVELS and q / IMPACT_LEVELS < v:
            q += 1.0
        while q > 1.0 and (q - 1.0) / IMPACT_LEVELS >= v:
            q -= 1.0
        return q

    @njit(cache=_CACHE, nogil=True)
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
            from .errors import ShardFault
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

    @njit(cache=_CACHE, nogil=True)
    def _local_terms(term_gid, gids, local):
        found = False
        for i in range(gids.shape[0]):
            local[i] = _find(term_gid, gids[i])
            if local[i] >= 0:
                found = True
        return found

    @njit(cache=_CACHE, nogil=True)
    def _prune_pays(meta, bmeta, gids, weights, k):
        """Whether block-max pruning is expected to beat exhaustive scoring for this query:
        where, in the first shard holding one of its terms, the bounds known before any
        posting is read (``theta`` from ``_theta_from_blocks``, each term's blocks against
        the bounds of the terms after it, as ``_score_shard_blocks`` tests them) already rule
        out at least ``PRUNE_SKIP`` of the query's postings. Below that, the postings pruning
        still reads cost it more (touched lists, candidate lookups, theta refreshes) than
        exhaustive scoring spends on all of them: on a long question over common terms it
        skips next to nothing. Reads one shard's block maxima of the query's terms (1/64 of
        its postings there)."""
        local = np.empty(gids.shape[0], dtype=np.int64)
        s = 0
        while s < meta.shape[0] and not _local_terms(_view(meta, s, 3, np.int32), gids, local):
            s += 1
        if s == meta.shape[0]:
            return False
        theta = _theta_from_blocks(_view(bmeta, s, 3, np.float64), local, weights, k)
        if theta <= 0.0:
            return False
        indptr = _view(meta, s, 0, np.int64)
        bstart = _view(bmeta, s, 0, np.int64)
        bmax = _view(bmeta, s, 1, np.float64)
        tmax = _view(bmeta, s, 2, np.float64)
        T = local.shape[0]
        rest = np.zeros(T + 1)  # as _score_shard_blocks computes it
        for i in range(T - 1, -1, -1):
            ub = weights[i] * tmax[local[i]] if local[i] >= 0 else 0.0
            rest[i] = rest[i + 1] + ub * (1.0 + 1e-9) + 1e-12
        post = 0
        skip = 0
        for i in range(T):
            li = local[i]
            if li < 0:
                continue
            n = indptr[li + 1] - indptr[li]
            post += n
            need = theta - rest[i + 1]
            w = weights[i]
            b0, b1 = bstart[li], bstart[li + 1]
            if not (0 <= b0 and b0 <= b1 and b1 <= bmax.shape[0]):
                return False  # damaged: the scoring that follows reads the range and says so
            for blk in range(b1 - b0):
                if w * bmax[b0 + blk] * (1.0 + 1e-9) + 1e-12 < need:
                    skip += min(BLOCK, n - blk * BLOCK)
        return skip >= PRUNE_SKIP * post

    @njit(cache=_CACHE, nogil=True)
    def search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                      touched, table, itab, gids, weights, k, prune_min, stats):
        """Top ``k`` over all shards: (docnos ``shard << 32 | local``, scores), best first,
        ties by ``id_rank`` ascending.

        ``meta`` is an int64 [S, 2·META_FIELDS] table of (address, length) of each shard's
        arrays in ``FIELDS`` order (``ShardTable`` builds it and keeps the arrays alive): one
        small argument instead of dozens, which numba would unbox one by one on every call.
        ``code_proto`` is (a zero-length array of the length codes' dtype, one of the tfs'):
        length codes are uint8 Lucene norm bytes or int32 exact lengths, as ``table`` is
        indexed; tfs uint16 (or int32: `tf_dtype`). ``doc_off``: each shard's first position in the
        global document order (S + 1 entries); ``id_rank``: each document's rank by doc_id;
        ``acc`` (float64, at least one per document of the largest shard) is zeroed, and zeroed
        again on return; ``touched`` (int32) has one more slot. Every shard is scored in the
        same leading region ``acc[:shard size]`` (a shard's scores are gone when the next one
        starts), so the working set is one shard's, not the corpus's (a slice per shard of
        a corpus-sized array leaves the L3 cache at a few million documents). ``itab`` holds ``t / (t + table[c])`` at
        ``t · len(table) + c`` for t below ``len(itab) / len(table)``: the impacts of small
        tfs, precomputed per (k1, b), so most postings cost a lookup instead of a division. A shard is
        pruned when ``prune_min >= 0`` and the query has at least ``prune_min`` postings
        there (every weight must then be positive); -1 scores exhaustively.
        ``stats`` (int64, 2) counts the shards where pruning stopped adding new documents
        and the postings of the terms left to candidates there (racy counters, for tests
        and benchmarks). ``bmeta`` (``block_table``; ``NO_BLOCKS`` for none) holds each
        shard's block maxima: where given, pruning shards use ``_score_shard_blocks``
        (``prune_min == 0`` makes it prune wherever the bounds allow, for tests), and a
        query that ``_prune_pays`` judges not worth pruning goes to
        `search_shards_plain` (with ``imeta``, ``imeta32``, ``rescore_min`` and
        ``dense_min``, as that takes them), and so does ``prune_min = -1`` or a non-positive
        weight (whose scores that reads back without a touched list).

        Returns (docnos, scores, fault): fault 0, or ``shard << 8 | FAULT_*`` where a value
        read from the shard's files was impossible (module docstring); then the docnos are
        empty and ``acc`` is not zeroed (the caller zeroes it).
        """
        if prune_min < 0 or gids.shape[0] == 0 or weights.min() <= 0.0 or (
                prune_min > 0 and bmeta.shape[0] > 0 and not _prune_pays(meta, bmeta, gids, weights, k)):
            return search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank,
                                       acc, touched, table, itab, gids, weights, k)
        S = meta.shape[0]
        cap = itab.shape[0] // table.shape[0]
        local = np.empty(gids.shape[0], dtype=np.int64)
        hv, hr, hd = _new_heap(k)
        n = 0
        theta = 0.0
        blocks = bmeta.shape[0] > 0 and prune_min >= 0
        for s in range(S):
            if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
                continue
            lo, hi = doc_off[s], doc_off[s + 1]
            nd = hi - lo  # the shard's documents, scored in acc[:nd] (the docstring says why)
            if blocks:
                indptr = _view(meta, s, 0, np.int64)
                post = 0
                for i in range(local.shape[0]):
                    if local[i] >= 0:
                        post += indptr[local[i] + 1] - indptr[local[i]]
                if post >= prune_min:
                    theta = max(theta, _theta_from_blocks(_view(bmeta, s, 3, np.float64), local, weights, k))
                    n, theta = _score_shard_blocks(
                        indptr, _view(meta, s, 1, np.int32), _view(meta, s, 2, code_proto[1].dtype),
                        _view(meta, s, 5, code_proto[0].dtype), table, itab, cap,
                        _view(bmeta, s, 0, np.int64), _view(bmeta, s, 1, np.float64), _view(bmeta, s, 2, np.float64),
                        _view(bmeta, s, 4, np.int32),
                        BLOCK, local, weights, acc[:nd], touched[:nd + 1], id_rank[lo:hi], np.int64(s) << 32,
                        hv, hr, hd, n, theta, prune_min == 0, stats)
                    if n < 0:
                        return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -n
                    if n == k:
                        theta = max(theta, hv[0])
                    continue
            n = _score_shard(_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32),
                             _view(meta, s, 2, code_proto[1].dtype), _view(meta, s, 5, code_proto[0].dtype),
                             _view(meta, s, 4, np.int32), _view(meta, s, 6, code_proto[0].dtype),
                             table, itab, cap, local, weights, acc[:nd], touched[:nd + 1],
                             id_rank[lo:hi], np.int64(s) << 32, hv, hr, hd, n, theta, prune_min, stats)
            if n < 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -n
            if n == k:  # the k-th best so far bounds the final k-th from below
                theta = max(theta, hv[0])
        dn, sc = _heap_sorted(hv, hr, hd, n)
        return dn, sc, 0

    @njit(cache=_CACHE, nogil=True)
    def search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                            touched, table, itab, gids, weights, k):
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
        document twice). Returns (docnos, scores, fault), as `search_shards`."""
        cap = itab.shape[0] // table.shape[0]
        if imeta.shape[0] == 0 and imeta32.shape[0] > 0 and rescore_min >= 0 and gids.shape[0] > 0 and \
                weights.min() > 0.0 and _total_postings(meta, gids) >= rescore_min * k * gids.shape[0]:
            return _search_approx(meta, imeta32, dense_min, code_proto, doc_off, id_rank, acc, touched, table, itab,
                                  cap, gids, weights, k)
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

    @njit(cache=_CACHE, nogil=True)
    def search_batch_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc, touched,
                           table, itab, idf, qptr, qgids, k, out_pos, out_score, out_n):
        """``search_batch`` with ``prune_min = -1`` through `search_shards_plain`; returns
        0 or a fault code, as ``search_batch``."""
        for q in range(qptr.shape[0] - 1):
            a, b = qptr[q], qptr[q + 1]
            out_n[q] = 0
            if b == a:
                continue
            gids, ws = _query_weights(qgids[a:b], idf)
            dn, sc, fault = search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                                id_rank, acc, touched, table, itab, gids, ws, k)
            if fault:
                return fault
            _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
        return 0

    @njit(cache=_CACHE, nogil=True)
    def _split_weights(qgids, qraw, a, s, b, idf):
        """(gids, raw · idf) of one weighted query of ``search_batch_weighted``: the terms
        ``qgids[a:s]`` first, then ``qgids[s:b]``, each group in the canonical order, as
        ``BM25Retriever.search_arrays(terms, k, params, then)`` orders them."""
        g1, w1 = _canonical(qgids[a:s], qraw[a:s], idf)
        g2, w2 = _canonical(qgids[s:b], qraw[s:b], idf)
        n1 = g1.shape[0]
        gids = np.empty(n1 + g2.shape[0], dtype=np.int64)
        ws = np.empty(n1 + g2.shape[0])
        gids[:n1] = g1
        gids[n1:] = g2
        ws[:n1] = w1
        ws[n1:] = w2
        return gids, ws

    @njit(cache=_CACHE, nogil=True)
    def search_batch_weighted(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                              touched, table, itab, idf, qptr, qsplit, qgids, qraw, k, prune_min, stats, out_pos,
                              out_score, out_n):
        """Many weighted queries in one call, each exactly as ``search_shards`` answers it
        through ``search_arrays``: query ``q``'s distinct terms are ``qgids[qptr[q]:qptr[q + 1]]``
        with weights ``qraw`` (before idf; zeros dropped), those before ``qsplit[q]`` scored
        first (SIRA's query, then its expansion). Outputs and returns as ``search_batch``."""
        for q in range(qptr.shape[0] - 1):
            out_n[q] = 0
            gids, ws = _split_weights(qgids, qraw, qptr[q], qsplit[q], qptr[q + 1], idf)
            if gids.shape[0] == 0:
                continue
            dn, sc, fault = search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                          id_rank, acc, touched, table, itab, gids, ws, k,
                                          prune_min if ws.min() > 0 else -1, stats)
            if fault:
                return fault
            _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
        return 0

    @njit(cache=_CACHE, nogil=True)
    def search_batch_weighted_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                                    touched, table, itab, idf, qptr, qsplit, qgids, qraw, k, out_pos, out_score,
                                    out_n):
        """``search_batch_weighted`` through `search_shards_plain` (returns as ``search_batch``)."""
        for q in range(qptr.shape[0] - 1):
            out_n[q] = 0
            gids, ws = _split_weights(qgids, qraw, qptr[q], qsplit[q], qptr[q + 1], idf)
            if gids.shape[0] > 0:
                dn, sc, fault = search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                                    id_rank, acc, touched, table, itab, gids, ws, k)
                if fault:
                    return fault
                _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
        return 0

    @njit(cache=_CACHE, nogil=True)
    def _query_weights(raw, idf):
        """(distinct gids, count · idf) of one query's term ids (with repeats), in the canonical
        order: weight descending, then gid ascending (``np.lexsort((gids, -ws))``)."""
        ug, cnt = _distinct_counts(raw)
        return _canonical(ug, cnt, idf)

    @njit(cache=_CACHE, nogil=True)
    def search_batch(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc, touched,
                     table, itab, idf, qptr, qgids, k, prune_min, stats, out_pos, out_score, out_n):
        """Many queries in one call, each exactly as ``search_shards`` answers it.

        Query ``q``'s analyzed terms are the global ids ``qgids[qptr[q]:qptr[q + 1]]`` (repeats
        count: weight = count · idf). Writes its top ``k`` (k <= out_pos.shape[1]) as global
        document positions (``doc_off[shard] + local``) into ``out_pos[q]``, scores into
        ``out_score[q]``, and how many into ``out_n[q]``. Returns 0, or the first query's fault
        code (`search_shards`), where it stops.
        """
        for q in range(qptr.shape[0] - 1):
            a, b = qptr[q], qptr[q + 1]
            out_n[q] = 0
            if b == a:
                continue
            gids, ws = _query_weights(qgids[a:b], idf)
            pm = prune_min if ws.min() > 0 else -1
            dn, sc, fault = search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                          id_rank, acc, touched, table, itab, gids, ws, k, pm, stats)
            if fault:
                return fault
            _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
        return 0

    @njit(cache=_CACHE, nogil=True)
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

    # -- SIRA's offline proposers, whole batches in one call (serving/sira/batch.py) --------

    @njit(cache=_CACHE, nogil=True)
    def _distinct_counts(raw):
        """(distinct ids ascending, their counts as float64) of one query's term ids; up to
        SMALL_SORT ids by insertion (no sort call, two allocations), more through a sort."""
        ug = np.empty(raw.shape[0], dtype=np.int64)
        cnt = np.empty(raw.shape[0])
        n = 0
        if raw.shape[0] <= SMALL_SORT:
            for i in range(raw.shape[0]):
                x = raw[i]
                j = n
                while j > 0 and ug[j - 1] > x:
                    j -= 1
                if j > 0 and ug[j - 1] == x:
                    cnt[j - 1] += 1.0
                    continue
                for t in range(n, j, -1):
                    ug[t] = ug[t - 1]
                    cnt[t] = cnt[t - 1]
                ug[j] = x
                cnt[j] = 1.0
                n += 1
            return ug[:n], cnt[:n]
        g = np.sort(raw)
        for i in range(g.shape[0]):
            if n > 0 and ug[n - 1] == g[i]:
                cnt[n - 1] += 1.0
            else:
                ug[n] = g[i]
                cnt[n] = 1.0
                n += 1
        return ug[:n], cnt[:n]

    @njit(cache=_CACHE, nogil=True)
    def _eligible_marks(df, short, tau_n, rmark):
        """``rmark`` as `_rm3_select` takes it: 3 where a term can never be proposed
        (df > tau_n, or one character), else 0."""
        for t in range(rmark.shape[0]):
            rmark[t] = 3 if df[t] > tau_n or short[t] else 0

    @njit(cache=_CACHE, nogil=True)
    def _rm3_select(fptr, fg, ftf, fdl, rows, dw, idf, use_idf, qg, n_terms, racc, rmark,
                    out_g, out_w):
        """``feedback.ForwardIndex.rm3_weights`` + ``select_terms`` for one query: sums
        ``w_d · tf / |d|`` per term in the same order (bit-identical to the bincount), keeps
        eligible terms (df <= tau·N, two characters or more, not a query term, weight > 0;
        times idf for the dense proposer), the best ``n_terms`` by (weight desc, id asc),
        scaled so the best is 1. Writes them to ``out_g``/``out_w``; returns how many.
        ``racc`` (one slot per term) is zero on entry and on return; ``rmark`` (one per term)
        is `_eligible_marks` on entry and on return: 3 marks a term that can never be
        kept (df > tau·N or shorter than two characters), whose entries are then skipped
        before any arithmetic (they would be dropped after it; every kept term's sum is the
        same either way). n_terms >= 1. Returns -1 (marks and sums then not restored: the
        caller stops) where the forward index holds a term id outside the vocabulary (it is
        built from the shards' ``term_gid``)."""
        V = np.uint64(rmark.shape[0])
        for x in range(qg.shape[0]):  # query terms: never proposed, never listed
            if rmark[qg[x]] == 0:
                rmark[qg[x]] = 2
        nt = 0
        for j in range(rows.shape[0]):  # first pass: count the entries, to size the touched list
            nt += fptr[rows[j] + 1] - fptr[rows[j]]
        cand = np.empty(nt, dtype=np.int64)
        nc = np.uint64(0)
        for j in range(rows.shape[0]):
            r = rows[j]
            w = dw[j] if dw[j] > 0.0 else 0.0
            d = fdl[r]
            scale = w / d if d > 0.0 else 0.0
            # Branch-free (2.7x faster than branching on the mark, NFCorpus/SciFact): every
            # entry writes a candidate slot, kept only for a first-seen eligible term; a query
            # term or a never-kept one (mark >= 2) adds exactly 0.0 to its slot, which stays 0.
            for e in range(np.uint64(fptr[r]), np.uint64(fptr[r + 1])):
                t = np.uint64(fg[e])
                if BOUNDS_CHECK and t >= V:
                    return -1
                mk = rmark[t]
                first = mk == 0
                cand[nc] = t
                nc += np.uint64(first)
                rmark[t] = mk | np.uint8(first)
                racc[t] += np.float64(ftf[e]) * (scale if mk < 2 else 0.0)
        m = 0  # the best n_terms so far, best first: (weight desc, id asc), by insertion
        for i in range(nc):
            t = cand[i]
            v = racc[t] * idf[t] if use_idf else racc[t]
            racc[t] = 0.0
            rmark[t] = 0
            if v <= 0.0:  # (df and length were checked through rmark)
                continue
            if m == n_terms and (v < out_w[m - 1] or (v == out_w[m - 1] and t > out_g[m - 1])):
                continue
            p = m if m < n_terms else n_terms - 1
            while p > 0 and (out_w[p - 1] < v or (out_w[p - 1] == v and out_g[p - 1] > t)):
                if p < n_terms:
                    out_w[p] = out_w[p - 1]
                    out_g[p] = out_g[p - 1]
                p -= 1
            out_w[p] = v
            out_g[p] = t
            if m < n_terms:
                m += 1
        for x in range(qg.shape[0]):
            if rmark[qg[x]] == 2:
                rmark[qg[x]] = 0
        if m > 0:
            top = out_w[0]
            for i in range(m):
                out_w[i] = out_w[i] / top
        return m

    @njit(cache=_CACHE, nogil=True)
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

    @njit(cache=_CACHE, nogil=True)
    def _accumulate_all(meta, imeta, code_proto, doc_off, acc, touched, table, itab, gids, weights, mcount):
        """`_accumulate` over every shard (``mcount[s]``: shard s's touched count);
        returns 0 or a fault code (`search_shards`)."""
        cap = itab.shape[0] // table.shape[0]
        local = np.empty(gids.shape[0], dtype=np.int64)
        for s in range(meta.shape[0]):
            if gids.shape[0] == 0 or not _local_terms(_view(meta, s, 3, np.int32), gids, local):
                continue
            lo, hi = doc_off[s], doc_off[s + 1]
            m = _accumulate(_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32),
                            _view(meta, s, 2, code_proto[1].dtype), _view(meta, s, 5, code_proto[0].dtype), table, itab,
                            cap, local, weights, acc[lo:hi], touched[lo:hi + 1], mcount[s], _impacts_of(imeta, s))
            if m < 0:
                return (s << 8) | -m
            mcount[s] = m
        return 0

    @njit(cache=_CACHE, nogil=True)
    def _top_of(doc_off, id_rank, acc, touched, mcount, k, zero):
        """(docnos, scores) of the best ``k`` accumulated documents of every shard, ranked as
        ``search_shards`` ranks (score descending, then doc_id); with ``zero`` the
        accumulators are reset (and ``mcount`` too)."""
        bv, br, bd, tv, tr = _new_top(k)
        n = 0
        for s in range(mcount.shape[0]):
            if mcount[s] == 0:
                continue
            lo, hi = doc_off[s], doc_off[s + 1]
            n, tv, tr = _offer_scores(acc[lo:hi], touched[lo:hi + 1], mcount[s], id_rank[lo:hi], np.int64(s) << 32,
                                      bv, br, bd, n, tv, tr, k, zero)
            if zero:
                mcount[s] = 0
        return _top_sorted(bv, br, bd, n, k)

    @njit(cache=_CACHE, nogil=True)
    def _canonical(gids, raw, idf):
        """(gids, raw · idf) in the canonical term order: weight descending, then gid ascending;
        zero weights dropped (as ``BM25Retriever.weights`` drops them). ``gids`` are distinct.
        Up to SMALL_SORT terms by insertion (cheaper for a short query than three sorts and a
        dozen arrays), more through argsort and a stable mergesort."""
        n = gids.shape[0]
        if n <= SMALL_SORT:
            g = np.empty(n, dtype=np.int64)  # by gid
            w = np.empty(n)
            m = 0
            for i in range(n):
                if raw[i] == 0.0:
                    continue
                x = gids[i]
                j = m
                while j > 0 and g[j - 1] > x:
                    g[j] = g[j - 1]
                    w[j] = w[j - 1]
                    j -= 1
                g[j] = x
                w[j] = raw[i]
                m += 1
            og = np.empty(m, dtype=np.int64)  # then by weight descending, stably: ties keep gid order
            ow = np.empty(m)
            for i in range(m):
                v = w[i] * idf[g[i]]
                j = i
                while j > 0 and ow[j - 1] < v:
                    og[j] = og[j - 1]
                    ow[j] = ow[j - 1]
                    j -= 1
                og[j] = g[i]
                ow[j] = v
            return og, ow
        by_id = np.argsort(gids)
        g = gids[by_id]
        w = raw[by_id]
        keep = np.empty(g.shape[0], dtype=np.int64)
        m = 0
        for i in range(g.shape[0]):
            if w[i] != 0.0:
                keep[m] = i
                m += 1
        g = g[keep[:m]]
        neg = np.empty(m)
        for i in range(m):
            neg[i] = -(w[keep[i]] * idf[g[i]])
        order = np.argsort(neg, kind="mergesort")
        return g[order], -neg[order]

    @njit(cache=_CACHE, nogil=True)
    def sira_batch(meta, imeta, code_proto, doc_off, id_rank, acc, touched, table, itab, idf, qptr, qgids, k,
                   fptr, fg, ftf, fdl, df, short, tau_n, fb_docs, fb_terms, lam,
                   use_prf, dense_rows, dense_w, dense_n, racc, rmark, out_pos, out_score, out_n, out_nexp):
        """SIRA with the prf and/or dense proposer for many queries, each exactly as
        ``sira.mode.sira_arrays`` answers it.

        Per query: the query's terms are scored once into the accumulators (pass 1); with
        ``use_prf`` its BM25 top ``fb_docs`` are read from them (what ``search_shards`` would
        return for the query alone); the dense neighbours come in as global rows
        ``dense_rows[q, :dense_n[q]]`` with scores ``dense_w``; RM3 terms per source
        (`_rm3_select`; from both, a term keeps the larger weight); then the expansion
        terms, weighted ``lam`` · weight · idf in canonical order, are added to the same
        accumulators (pass 2), and the top ``k`` taken. So each score is BM25(q) + λ·BM25(e)
        summed in that order, as ``search_arrays(q, k, then=e)`` sums it, and the query's
        postings are read once. Outputs as ``search_batch``, plus the number of expansion
        terms per query in ``out_nexp``. Returns 0, or a fault code (`search_shards`)
        where it stops."""
        mask = np.int64(0xFFFFFFFF)
        S = meta.shape[0]
        mcount = np.zeros(S, dtype=np.int64)
        _eligible_marks(df, short, tau_n, rmark)
        pg = np.empty(fb_terms, dtype=np.int64)
        pw = np.empty(fb_terms)
        dg = np.empty(fb_terms, dtype=np.int64)
        dwt = np.empty(fb_terms)
        for q in range(qptr.shape[0] - 1):
            a, b = qptr[q], qptr[q + 1]
            out_n[q] = 0
            out_nexp[q] = 0
            ug, cnt = _distinct_counts(qgids[a:b])
            qg, qw = _canonical(ug, cnt, idf)
            fault = _accumulate_all(meta, imeta, code_proto, doc_off, acc, touched, table, itab, qg, qw, mcount)
            if fault:
                return fault
            npf = 0
            if use_prf and qg.shape[0] > 0:
                dn, sc = _top_of(doc_off, id_rank, acc, touched, mcount, fb_docs, False)
                rows = np.empty(dn.shape[0], dtype=np.int64)
                for j in range(dn.shape[0]):
                    rows[j] = doc_off[dn[j] >> 32] + (dn[j] & mask)
                npf = _rm3_select(fptr, fg, ftf, fdl, rows, sc, idf, False, ug, fb_terms, racc, rmark, pg, pw)
            nde = 0
            if dense_n[q] > 0 and npf >= 0:
                nde = _rm3_select(fptr, fg, ftf, fdl, dense_rows[q, :dense_n[q]], dense_w[q, :dense_n[q]], idf,
                                  True, ug, fb_terms, racc, rmark, dg, dwt)
            if npf < 0 or nde < 0:
                return (FAULT_NO_SHARD << 8) | FAULT_TERMS
            eg = np.empty(npf + nde, dtype=np.int64)
            ew = np.empty(npf + nde)
            ne = 0
            for i in range(npf + nde):
                t = pg[i] if i < npf else dg[i - npf]
                w = pw[i] if i < npf else dwt[i - npf]
                dup = -1
                for x in range(ne):  # the same term from both proposers: the larger weight
                    if eg[x] == t:
                        dup = x
                        break
                if dup >= 0:
                    if w > ew[dup]:
                        ew[dup] = w
                    continue
                eg[ne] = t
                ew[ne] = w
                ne += 1
            for x in range(ne):
                ew[x] = 0.0 + lam * ew[x]
            xg, xw = _canonical(eg[:ne], ew[:ne], idf)
            out_nexp[q] = ne
            fault = _accumulate_all(meta, imeta, code_proto, doc_off, acc, touched, table, itab, xg, xw, mcount)
            if fault:
                return fault
            dn, sc = _top_of(doc_off, id_rank, acc, touched, mcount, k, True)
            _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
        return 0
else:
    search_shards = None
    search_batch = None
    search_shards_plain = None
    search_batch_plain = None
    term_bounds = None
    block_maxima = None
    sira_batch = None
    posting_impacts = None
    posting_levels = None
    place_postings = None
