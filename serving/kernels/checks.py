"""Damaged files: the compares every kernel makes before it indexes memory with a value read
from a file.

The postings are memory-mapped, so a file whose bytes change while a version is served (a
flipped bit on disk, a bad copy over it) changes what the next query reads; the structure
checks of the open (``serving.structure``) cannot see that. So every value a kernel reads
from a file and then uses to address memory is compared before the access: a term's
postings range (``indptr``) against the postings, its blocks (``block_start``) against the
block arrays and its postings, each document id against the shard's documents (``acc``'s
length), and where a posting may start a new entry of a touched list, its tf (at least 1)
or stored impact (above 0), since a zero impact would list a document twice and run the
list past its end. One unsigned compare per posting, hoisted per term where it can be. A
kernel that meets an impossible value stops and returns a fault code (``shard << 8 |
FAULT_*``, ``layout.py``; 0 when sound) instead of raising inside numba; the caller
(``lexical.retriever.BM25Retriever``) turns it into ``errors.IndexDamaged`` naming the file. Length
codes and per-term minimum lengths are private in-memory copies checked when made
(``bm25.ShardScorer``), so they need no compare. The touched lists assume positive weights;
a query with a non-positive one is read back by a scan of the accumulator instead
(``search_shards_plain``). ``BOUNDS_CHECK`` False compiles every compare out: only the
benchmark's baseline copy of the package (``_jit.load_copy``, ``bench/bench_workloads.py
--bounds-check-cost``) does that.
"""

from __future__ import annotations

import numpy as np

from ._jit import BOUNDS_CHECK, jit
from .layout import FAULT_DOCS, FAULT_TFS


@jit(inline="always")
def _range_ok(a, b, n):
    """0 <= a <= b <= n: a term's postings ``indptr[t]``, ``indptr[t + 1]`` inside an
    array of n (always True without ``BOUNDS_CHECK``). Read each bound once into a local,
    check it, then use the local: the file may change between two reads."""
    return not BOUNDS_CHECK or (0 <= a and a <= b and b <= n)


@jit(inline="always")
def _blocks_ok(b0, b1, nblocks, a0, e0, block):
    """A term's blocks [b0, b1) inside the ``nblocks`` of the block arrays and exactly one
    per ``block`` of its postings [a0, e0) (checked already): the kernels read a block's
    postings at ``a0 + block · j``."""
    return not BOUNDS_CHECK or (0 <= b0 and b0 <= b1 and b1 <= nblocks
                                and b1 - b0 == (e0 - a0 + block - 1) // block)


@jit(inline="always")
def _bad_posting(d, und, t):
    """Whether a posting's document id ``d`` (unsigned: a negative one is huge) is not
    below ``und`` (the shard's documents) or its tf ``t`` (``np.uint64`` of the int32)
    is below 1: one compare each, no branch between them."""
    return BOUNDS_CHECK and ((d >= und) | (t - np.uint64(1) >= np.uint64(0x7FFFFFFF)))


@jit(inline="always")
def _posting_fault(d, und):
    """The fault code of a posting `_bad_posting` refused."""
    return FAULT_DOCS if d >= und else FAULT_TFS
