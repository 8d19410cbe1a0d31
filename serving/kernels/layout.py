"""What the kernels read and the constants they are compiled with, in plain NumPy (no numba):
the (address, length) tables that hand a shard's arrays to a kernel in one small argument
(`shard_table`, `block_table`, `impact_table`), the dtypes they are read as (`tf_dtype`),
the stored impact levels' format (``IMPACT_*``), the block size of the block maxima, the
fault codes a kernel returns for a damaged file (``FAULT_*``, `fault_parts`; ``checks.py``
says when), and the tuning constants of the kernels (each says where it was measured).
"""

from __future__ import annotations

import numpy as np

# What a kernel found impossible (the low byte of a fault code; ``FAULT_FILES`` names the
# shard's file that holds it). A fault code is ``shard << 8 | FAULT_*``, 0 when sound;
# ``FAULT_NO_SHARD`` in the shard part: the shard is not known (an id from the forward index).
FAULT_INDPTR, FAULT_DOCS, FAULT_TFS, FAULT_IMPACTS, FAULT_BLOCKS, FAULT_TERMS, FAULT_PACKED = 1, 2, 3, 4, 5, 6, 7
FAULT_NO_SHARD = (1 << 24) - 1
FAULT_FILES = {FAULT_INDPTR: "indptr.npy", FAULT_DOCS: "docs.npy", FAULT_TFS: "tfs.npy",
               FAULT_IMPACTS: "impacts.npy", FAULT_BLOCKS: "block_start.npy", FAULT_TERMS: "term_gid.npy",
               FAULT_PACKED: "packed.npy"}
FAULT_REASONS = {
    FAULT_INDPTR: "gives a term's postings a range outside docs.npy (or a decreasing one)",
    FAULT_DOCS: "holds a document id outside the shard's documents",
    FAULT_TFS: "holds a term frequency below 1",
    FAULT_IMPACTS: "holds an impact that is not above 0",
    FAULT_BLOCKS: "gives a term's blocks a range outside block_max.npy, or not one block per BLOCK of its postings",
    FAULT_TERMS: "holds a global term id outside the vocabulary",
    FAULT_PACKED: "holds a damaged block (a width, size, tf or document id the shard cannot have)",
}
#: What a kernel returns instead of a fault where a query needs a packed term decoded that the
#: caller did not pin (``packed_table``): the caller pins the query's terms and asks again.
NEED_DECODED = -1


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
# the queries above 0.97, about 70% between 0.93 and 0.97, and under half below 0.9. With
# the rarest terms' k-th partial score in the estimate too (issue 50), 0.85 and 0.75 were no
# better overall in a sweep over both corpora's workloads at 1M (within noise on four of five).
PRUNE_SKIP = 0.92
# Postings streamed in the time of one candidate lookup in a term's blocks, as `_prune_pays`
# charges the documents its rarest terms bring in (``serving/lexical/masked.py``'s CANDIDATE_COST,
# measured for the masked kernels' lookups). Without that charge, long questions at k=10
# were pruned where their rarest terms' k-th let most blocks go, and ran 12% slower on the
# Zipf corpus at 1M: each of those thousands of documents looked up in a dozen terms.
PRUNE_LOOKUP = 8
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
    build, ``pipelines.lexical.postings.narrow_tfs``; int32 from older builds or a shard with a tf
    above 65,535), widened to hold them all where they differ (that shard is then copied
    into memory by `shard_table` instead of mapped)."""
    return np.result_type(*(np.asarray(a["tfs"]).dtype for a in shards)) if shards else np.dtype(np.int32)


def _point(table: np.ndarray, s: int, f: int, a: np.ndarray, keep: list) -> None:
    """Field ``f`` of row ``s`` of an (address, length) table: array ``a`` (an empty one
    replaced by one with a valid address), kept referenced in ``keep``."""
    if len(a) == 0:
        a = np.zeros(1, dtype=a.dtype)[:0]
    keep.append(a)
    table[s, 2 * f] = a.ctypes.data
    table[s, 2 * f + 1] = len(a)


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
            _point(meta, s, f, np.ascontiguousarray(arrays[name], dtype=tfs_dtype if dt == "tf" else (dt or code_dtype)),
                   keep)
    return meta, keep


# Postings per block for the block-max bounds (``block_maxima``): PISA's and Lucene's size order.
BLOCK = 64
# The ranks k of each term's k-th largest block maximum kept for ``_theta_from_blocks``.
KTH_BLOCKS = np.array([10, 100, 1000], dtype=np.int64)


#: The dtypes the kernels read (``bstart``, ``bmax``, ``tmax``, ``tkth``, ``blast``) as, and the
#: build stores them in (`block_bounds32`).
BLOCK_DTYPES = (np.int64, np.float32, np.float32, np.float32, np.int32)


def _float32(a, up: bool) -> np.ndarray:
    """``a`` as float32, each value rounded up (``up``) or down to the nearest float32, so an
    upper bound stays one and a lower bound too; float32 input is taken as it is (the build
    rounded it). NaN stays NaN (a damaged file: the kernels' compares refuse it as before)."""
    a = np.asarray(a)
    if a.dtype == np.float32:
        return np.ascontiguousarray(a)
    wide = np.asarray(a, dtype=np.float64)
    out = wide.astype(np.float32)
    back = out.astype(np.float64)
    off = back < wide if up else back > wide
    if off.any():
        out[off] = np.nextafter(out[off], np.float32(np.inf if up else -np.inf))
    return out


def block_bounds32(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """(``bstart``, ``bmax``, ``tmax``, ``tkth``, ``blast``) in `BLOCK_DTYPES`: the block and term
    maxima (upper bounds) rounded up to float32, each term's k-th block maximum (a lower bound
    of the k-th score, ``_theta_from_blocks``) rounded down. Pruning only ever compares a bound
    with the k-th score, so a bound a float32 step looser prunes the same or less and the
    results keep their documents and bits; 4 bytes a block and 16 a term less than float64
    (issue 50: 0.25 of the Zipf corpus's 2.81 bytes a posting at 1M)."""
    bstart, bmax, tmax, tkth, blast = arrays
    return (np.ascontiguousarray(bstart, dtype=np.int64), _float32(bmax, True), _float32(tmax, True),
            _float32(tkth, False), np.ascontiguousarray(blast, dtype=np.int32))


def block_table(blocks: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(bmeta, keep): the int64 [S, 10] (address, length) table of each shard's
    (``bstart``, ``bmax``, ``tmax``, ``tkth``, ``blast``) from `block_maxima` (float64, rounded
    here) or as the build stored them (`block_bounds32`; an index stored before issue 50's
    float32 bounds is rounded here, in memory), for ``search_shards``; ``keep`` holds the
    arrays it points into, which the caller keeps referenced."""
    bmeta = np.zeros((len(blocks), 10), dtype=np.int64)
    keep = []
    for s, arrays in enumerate(blocks):
        for f, (a, dt) in enumerate(zip(block_bounds32(arrays), BLOCK_DTYPES, strict=True)):
            _point(bmeta, s, f, np.ascontiguousarray(a, dtype=dt), keep)
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
        _point(imeta, s, 0, np.ascontiguousarray(a, dtype=dtype), keep)
    return imeta, keep


#: ``imeta`` without per-posting impacts: each posting's impact comes from the grid.
NO_IMPACTS = np.zeros((0, 2), dtype=np.int64)


#: The arrays of one packed shard the exhaustive kernels read without decoding them first
#: (``kernels/packed.py``, ``serving/lexical/packed.py``), in the order of a ``pmeta`` table: the
#: packed stream, block offsets, first ids and widths (``[nb, 2]``, flattened), each term's
#: first block, the term ranges decode checked (a private copy of ``indptr``), and
#: ``info``: (the largest tf the shard stores,). ``exhaustive._packed_of`` reads them as these dtypes.
PACKED_FIELDS = ("words", "boff", "first", "width", "tblock", "ends", "info")
PACKED_DTYPES = (np.uint32, np.int64, np.int32, np.uint8, np.int32, np.int64, np.int64)


def packed_table(packed: list) -> tuple[np.ndarray, list[np.ndarray]]:
    """(pmeta, keep): the int64 [S, 2·len(PACKED_FIELDS)] (address, length) table of each
    shard's packed arrays (``serving.lexical.packed.PackedShard``; None for a plain shard: all
    lengths 0), and the arrays it points into, which the caller keeps referenced."""
    pmeta = np.zeros((len(packed), 2 * len(PACKED_FIELDS)), dtype=np.int64)
    keep = []
    for s, p in enumerate(packed):
        if p is None:
            continue
        arrays = (p.words, p.boff, p.first, np.asarray(p.width).reshape(-1), p.tblock, p._ends,
                  np.array([p.max_tf], dtype=np.int64))
        for f, (a, dt) in enumerate(zip(arrays, PACKED_DTYPES, strict=True)):
            a = np.asarray(a)
            if a.dtype != dt or not a.flags.c_contiguous:
                raise ValueError(f"packed array {PACKED_FIELDS[f]} is {a.dtype}, expected contiguous {np.dtype(dt)}")
            _point(pmeta, s, f, a, keep)
    return pmeta, keep


#: ``pmeta`` of an index whose every term the kernels may read decoded (plain shards, or
#: packed ones with every query term pinned).
NO_PACKED = np.zeros((0, 2 * len(PACKED_FIELDS)), dtype=np.int64)
