"""Packed postings (``funnel build --postings packed``): each term's list cut into blocks of
``PACK_BLOCK`` postings, each block's document gaps and tfs bit-packed at the block's own
widths into one stream of 32-bit words, as PISA's and Lucene's block codecs do.

A block stores its first document id whole (``first``), then ``n - 1`` gaps less one
(document ids ascend, so every gap is at least 1) at ``wd`` bits each, then ``n`` tfs less
one at ``wt`` bits each; it starts on a word (``boff``: its first word). ``wd`` and ``wt``
are the fewest bits that hold the block's largest value (0 where all are 0: a block of
consecutive documents with tf 1 costs no payload at all). One word of padding ends the
stream, so a value is read with one 64-bit window over two words. Widths are at most 31
bits (document ids are below 2**31, so every gap less one is too).

Serving decodes a term's postings into plain arrays (`unpack_terms`) before the kernels read
them (``serving.lexical.packed``), so the kernels themselves never see this format. The decoder
trusts nothing it reads: a width above what the values' dtype holds, a block outside the
stream or not the size its widths give, a first id that does not ascend past the previous
block or a decoded id outside the shard stops it with ``FAULT_DOCS`` (the caller names the
file), never a read outside an array.
"""

from __future__ import annotations

import numpy as np

from ._jit import HAVE_NUMBA
from .layout import FAULT_DOCS, FAULT_INDPTR, FAULT_PACKED, IMPACT_DTYPE

if HAVE_NUMBA:
    from ._jit import jit
    from .decode import _quantize
else:  # the same functions run as Python (slow, but the NumPy path stays complete)
    def jit(func=None, **_):
        return func if func is not None else (lambda f: f)

#: Postings per packed block (PISA's and Lucene's block size).
PACK_BLOCK = 128


@jit(inline="always")
def _bits(x):
    """The fewest bits that hold ``x`` (>= 0): 0 for 0."""
    n = 0
    while x > 0:
        n += 1
        x >>= 1
    return n


@jit(inline="always")
def _words(n, wd, wt):
    """Words of payload of a block of ``n`` postings at widths (wd, wt)."""
    return ((n - 1) * wd + n * wt + 31) // 32


@jit(inline="always")
def _put(out, bit, v, w):
    """OR ``v`` (below 2**w, w <= 32) into the stream at bit ``bit``."""
    if w == 0:
        return
    i = bit >> 5
    sh = bit & 31
    x = np.uint64(v) << np.uint64(sh)
    out[i] |= np.uint32(x & np.uint64(0xFFFFFFFF))
    if sh + w > 32:
        out[i + 1] |= np.uint32(x >> np.uint64(32))


@jit(inline="always")
def _uget(words, bit, mask):
    """The value at unsigned bit position ``bit`` (``np.uint64``) of the stream, ``mask`` =
    2**width - 1 (width <= 32), as ``np.uint64``: one 64-bit window over two words."""
    i = bit >> np.uint64(5)
    x = (np.uint64(words[i]) | (np.uint64(words[i + np.uint64(1)]) << np.uint64(32))) >> (bit & np.uint64(31))
    return x & mask


@jit(inline="always")
def _block_fits(o, e, n, wd, wt, nw):
    """Whether a block of ``n`` postings at widths (``wd``, ``wt``) whose words are [o, e)
    (``boff[b]``, ``boff[b + 1]``, each read once by the caller) is one the stream can hold:
    widths of at most 31 bits, a start inside the stream, and the size its widths give,
    ending before the padding word (``nw``: the stream's words less it)."""
    return not (wd > 31 or wt > 31 or o < 0 or e - o != _words(n, wd, wt) or e > nw)


@jit
def pack_postings(indptr, docs, tfs):
    """(words uint32, boff int64 [nb + 1], first int32 [nb], width uint8 [nb, 2]) of a shard's
    postings (``indptr``, ascending ``docs`` per term, ``tfs`` >= 1). Block b of term t is
    block ``term_blocks(indptr)[t] + j`` for its j-th ``PACK_BLOCK`` postings."""
    V = indptr.shape[0] - 1
    nb = 0
    for t in range(V):
        nb += (indptr[t + 1] - indptr[t] + PACK_BLOCK - 1) // PACK_BLOCK
    first = np.empty(nb, dtype=np.int32)
    width = np.zeros((nb, 2), dtype=np.uint8)
    boff = np.empty(nb + 1, dtype=np.int64)
    b = 0
    words = 0
    for t in range(V):
        for s in range(indptr[t], indptr[t + 1], PACK_BLOCK):
            n = min(PACK_BLOCK, indptr[t + 1] - s)
            mg = 0
            mt = 0
            for j in range(s + 1, s + n):
                mg = max(mg, np.int64(docs[j]) - np.int64(docs[j - 1]) - 1)
            for j in range(s, s + n):
                mt = max(mt, np.int64(tfs[j]) - 1)
            first[b] = docs[s]
            width[b, 0] = _bits(mg)
            width[b, 1] = _bits(mt)
            boff[b] = words
            words += _words(n, np.int64(width[b, 0]), np.int64(width[b, 1]))
            b += 1
    boff[nb] = words
    out = np.zeros(words + 1, dtype=np.uint32)  # + the padding word
    b = 0
    for t in range(V):
        for s in range(indptr[t], indptr[t + 1], PACK_BLOCK):
            n = min(PACK_BLOCK, indptr[t + 1] - s)
            wd = np.int64(width[b, 0])
            wt = np.int64(width[b, 1])
            bit = boff[b] * 32
            for j in range(s + 1, s + n):
                _put(out, bit, np.int64(docs[j]) - np.int64(docs[j - 1]) - 1, wd)
                bit += wd
            for j in range(s, s + n):
                _put(out, bit, np.int64(tfs[j]) - 1, wt)
                bit += wt
            b += 1
    return out, boff, first, width


@jit
def _unpack_range(words, boff, first, width, b, a, e, n_docs, max_tf, odocs, otfs):
    """Decode the blocks from ``b`` on that hold one term's postings [a, e) into
    ``odocs[a:e]``, ``otfs[a:e]``; 0, or ``FAULT_DOCS`` at a damaged block (module docstring):
    ``max_tf`` is the largest tf ``otfs`` holds."""
    nb = first.shape[0]
    nw = words.shape[0] - 1  # the padding word is never a block's
    prev = -1
    s = a
    while s < e:
        if b >= nb:
            return FAULT_DOCS
        n = min(PACK_BLOCK, e - s)
        wd = np.int64(width[b, 0])
        wt = np.int64(width[b, 1])
        o = boff[b]
        if not _block_fits(o, boff[b + 1], n, wd, wt, nw):
            return FAULT_DOCS
        d = np.int64(first[b])
        if d <= prev or d >= n_docs:
            return FAULT_DOCS
        # Unsigned indices throughout (no negative-index wraparound per access); each value
        # read on its own from its bit position, then the ids summed in a second loop: the
        # reads do not wait on one another.
        ubit = np.uint64(o * 32)
        us = np.uint64(s)
        un = np.uint64(n)
        uwd = np.uint64(wd)
        uwt = np.uint64(wt)
        mask = (np.uint64(1) << uwd) - np.uint64(1)
        for j in range(np.uint64(1), un):
            odocs[us + j] = _uget(words, ubit + (j - np.uint64(1)) * uwd, mask)
        ubit += (un - np.uint64(1)) * uwd
        mask = (np.uint64(1) << uwt) - np.uint64(1)
        top = np.uint64(0)
        for j in range(un):
            v = _uget(words, ubit + j * uwt, mask)
            top = max(top, v)
            otfs[us + j] = v + np.uint64(1)
        if top >= np.uint64(max_tf):  # a tf above what the shard's tfs hold
            return FAULT_DOCS
        odocs[us] = d
        for j in range(np.uint64(1), un):
            d += 1 + np.int64(odocs[us + j])
            odocs[us + j] = d
        if d >= n_docs:  # ascending: the last is the largest (each gap below 2**32, n small: no overflow)
            return FAULT_DOCS
        prev = d
        s += n
        b += 1
    return 0


def level_grid(itab: np.ndarray) -> np.ndarray:
    """Each cell of an impact grid (``lexical.retriever.impact_tables``) as its ``IMPACT_DTYPE`` level
    (``decode._quantize``): `unpack_terms_levels` looks small tfs' levels up here."""
    return _levels_of(np.ascontiguousarray(itab, dtype=np.float64), np.empty(len(itab), dtype=IMPACT_DTYPE))


@jit
def _levels_of(itab, out):
    for i in range(itab.shape[0]):
        v = itab[i]
        out[i] = _quantize(v) if v > 0.0 else 1.0  # tf 0: never read
    return out


@jit
def unpack_terms(words, boff, first, width, indptr, tblock, n_docs, max_tf, terms, odocs, otfs):
    """Decode every local term of ``terms`` (``tblock``: each term's first block) into
    ``odocs`` / ``otfs`` at its own positions (``indptr``); 0, or the ``FAULT_*`` of the
    first damaged term (``FAULT_INDPTR``: a range outside the arrays)."""
    return unpack_terms_levels(words, boff, first, width, indptr, tblock, n_docs, max_tf, terms, odocs, otfs,
                               np.zeros(0, dtype=np.uint8), np.zeros(1), np.zeros(1),
                               np.zeros(0, dtype=IMPACT_DTYPE), np.zeros(0, dtype=IMPACT_DTYPE))


@jit
def unpack_terms_levels(words, boff, first, width, indptr, tblock, n_docs, max_tf, terms, odocs, otfs,
                        code, table, itab, ltab, olev):
    """`unpack_terms`, and each decoded posting's impact level into ``olev`` (none where it is
    empty), as the build stores a plain shard's (``decode.posting_levels`` with ``code``,
    ``table`` and ``itab`` for the default parameters: ``ltab = level_grid(itab)`` holds the
    levels of the tfs the grid holds, larger tfs are computed), each term's right after its
    decode."""
    P = odocs.shape[0]
    V = indptr.shape[0] - 1
    levels = olev.shape[0] > 0
    nt = np.uint64(table.shape[0])
    ucap = np.uint64(itab.shape[0] // table.shape[0])
    und = np.uint64(code.shape[0])
    for i in range(terms.shape[0]):
        t = terms[i]
        if t < 0 or t >= V or t >= tblock.shape[0]:
            return FAULT_INDPTR
        a = indptr[t]
        e = indptr[t + 1]
        if not (0 <= a and a <= e and e <= P and (e <= olev.shape[0] or not levels)):
            return FAULT_INDPTR
        f = _unpack_range(words, boff, first, width, tblock[t], a, e, n_docs, max_tf, odocs, otfs)
        if f:
            return f
        if not levels:
            continue
        for p in range(np.uint64(a), np.uint64(e)):
            d = np.uint64(odocs[p])
            if d >= und:
                return FAULT_DOCS
            tf = np.uint64(otfs[p])
            c = np.uint64(code[d])
            if tf < ucap:
                olev[p] = ltab[tf * nt + c]
            else:
                x = np.float64(tf)
                olev[p] = _quantize(x / (x + table[c]))
    return 0


@jit
def _busy(ends, decoded, x0, x1):
    """Whether a term marked in ``decoded`` has postings in [x0, x1) (``ends``: indptr)."""
    lo, hi = 0, ends.shape[0]
    while lo < hi:  # the first term starting after x0, less one: the term holding x0
        mid = (lo + hi) >> 1
        if ends[mid] <= x0:
            lo = mid + 1
        else:
            hi = mid
    j = max(lo - 1, 0)
    while j < decoded.shape[0] and ends[j] < x1:
        if decoded[j] and ends[j + 1] > x0:
            return True
        j += 1
    return False


@jit
def free_pages(ends, decoded, spans, size, page, out):
    """The byte ranges of an array of ``size``-byte postings that postings ``spans`` (rows
    [a, e), ascending, their terms no longer marked in ``decoded``) may give back: the pages
    they cover, less a page at either end that a still decoded term has postings in,
    adjacent ranges merged, into ``out`` (rows [lo, hi)); returns their count."""
    n = 0
    P = ends[ends.shape[0] - 1]
    for i in range(spans.shape[0]):
        a = spans[i, 0]
        e = spans[i, 1]
        lo = (a * size) // page * page
        hi = -(-(e * size) // page) * page
        if (a * size) % page and _busy(ends, decoded, lo // size, a):
            lo += page
        if (e * size) % page and _busy(ends, decoded, e, min(-(-hi // size), P)):
            hi -= page
        if hi <= lo:
            continue
        if n and lo <= out[n - 1, 1]:
            out[n - 1, 1] = max(out[n - 1, 1], hi)
        else:
            out[n, 0] = lo
            out[n, 1] = hi
            n += 1
    return n


def term_blocks(indptr: np.ndarray) -> np.ndarray:
    """Each term's first packed block (int64 [V + 1]; the last entry: the block count)."""
    n = (np.diff(np.asarray(indptr, dtype=np.int64)) + PACK_BLOCK - 1) // PACK_BLOCK
    return np.concatenate([[0], np.cumsum(n)]).astype(np.int64)


# Scoring straight from the packed stream (issue 50): the exhaustive approximate pass reads a
# term the postings cache has not decoded from its blocks here, and its exact rescoring looks
# the candidates' tfs up in them, so a query whose terms outgrow the cache decodes nothing
# into it (``exhaustive._search_approx``, ``serving.lexical.packed``).


@jit(inline="always")
def _block_head(words, boff, first, width, b, n, n_docs, prev):
    """Block ``b`` of ``n`` postings as the passes straight from the blocks read it
    (``width`` flat: two widths a block): (its gaps' width, its tfs' width, its first word,
    its first id), the first id -1 where the block is damaged: outside the block table, not
    of the size its widths give (`_block_fits`), or its first id not after ``prev`` or not
    below ``n_docs``."""
    if b >= first.shape[0] or b + 1 >= boff.shape[0] or 2 * b + 1 >= width.shape[0]:
        return np.int64(0), np.int64(0), np.int64(0), np.int64(-1)
    wd = np.int64(width[2 * b])
    wt = np.int64(width[2 * b + 1])
    o = boff[b]
    d = np.int64(first[b])
    if not _block_fits(o, boff[b + 1], n, wd, wt, words.shape[0] - 1) or d <= prev or d >= n_docs:
        return np.int64(0), np.int64(0), np.int64(0), np.int64(-1)
    return wd, wt, o, d


@jit(inline="always")
def _level(tf, c, table, ltab, ucap, nt):
    """A posting's stored level for the default parameters, as `unpack_terms_levels` computes
    it (``tf``, ``c``, ``ucap``, ``nt``: ``np.uint64``), as float32 (a whole number: exact),
    the approximate pass's arithmetic (``exhaustive._accumulate_levels``)."""
    if tf < ucap:
        return np.float32(ltab[tf * nt + c])
    x = np.float64(tf)
    return np.float32(_quantize(x / (x + table[c])))  # a whole number up to IMPACT_LEVELS: exact


@jit
def accumulate_packed(words, boff, first, width, tblock, ends, info, code, table, ltab, cap, local, weights, acc,
                      touched, m, listed):
    """Add each listed term's ``weights[i] · level`` (its postings' stored levels for the
    default parameters, `_level`) to ``acc`` straight from the packed blocks: the
    approximate pass of ``exhaustive._search_approx`` over a term nobody decoded, the same
    sums as over decoded levels. ``local[i]`` < 0: not this call's term. With ``listed``,
    first-seen documents go to ``touched`` after the ``m`` there (as ``_accumulate``:
    every level is at least 1 and every weight positive); returns the new count, or
    ``-FAULT_PACKED`` / ``-FAULT_INDPTR`` at a damaged block or range. ``words`` ...
    ``ends``, ``info``: the shard's packed arrays (``layout.PACKED_FIELDS``).

    One pass a block: its gaps and its tfs each read by a 64-bit window that takes in a
    word whenever it holds fewer bits than the next value, each posting added as it is
    read. Measured on the 3M topical corpus's long questions (the terms of 4 shards the
    cache did not hold, 46M postings, one process): 2.0 ns a posting, against 2.8 for
    decoding a block's ids and tfs into buffers first, each value read from its own pair of
    words; a batch of 100 long questions 6-7% faster (``bench/RESULTS.md``).
    Every id is checked below the shard's size before it is added, so a damaged block
    never writes outside ``acc``; a tf too large is found at the block's end, and the
    caller zeroes what a fault leaves in ``acc`` (``lexical.retriever.BM25Retriever.fault_error``)."""
    max_tf = np.uint64(info[0])
    um = np.uint64(m)
    und = np.uint64(acc.shape[0])
    nt = np.uint64(table.shape[0])
    ucap = np.uint64(cap)
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        if li + 1 >= ends.shape[0] or li >= tblock.shape[0]:
            return -FAULT_INDPTR
        w = weights[i]
        a = ends[li]
        e = ends[li + 1]
        b = tblock[li]
        prev = np.int64(-1)
        s = a
        while s < e:
            n = min(PACK_BLOCK, e - s)
            wd, wt, o, d0 = _block_head(words, boff, first, width, b, n, np.int64(und), prev)
            if d0 < 0:
                return -FAULT_PACKED
            uwd = np.uint64(wd)
            uwt = np.uint64(wt)
            one = np.uint64(1)
            dmask = (one << uwd) - one
            tmask = (one << uwt) - one
            gi = np.uint64(o)  # the gaps' window: the next word to take in, the bits it holds
            gwin = np.uint64(0)
            ghave = np.uint64(0)
            tbit = np.uint64(o * 32) + np.uint64(n - 1) * uwd  # the tfs' window
            ti = (tbit >> np.uint64(5)) + one
            twin = np.uint64(words[ti - one]) >> (tbit & np.uint64(31))
            thave = np.uint64(32) - (tbit & np.uint64(31))
            x = np.uint64(d0)
            top = np.uint64(0)
            for j in range(np.uint64(n)):
                if j > 0:
                    if ghave < uwd:
                        gwin |= np.uint64(words[gi]) << ghave
                        gi += one
                        ghave += np.uint64(32)
                    x += (gwin & dmask) + one
                    gwin >>= uwd
                    ghave -= uwd
                if thave < uwt:
                    twin |= np.uint64(words[ti]) << thave
                    ti += one
                    thave += np.uint64(32)
                v = twin & tmask
                twin >>= uwt
                thave -= uwt
                top = max(top, v)
                if x >= und:
                    return -FAULT_PACKED
                p = w * _level(v + one, np.uint64(code[x]), table, ltab, ucap, nt)
                if listed:
                    y = acc[x]
                    touched[um] = x
                    um += np.uint64(y == 0.0)
                    acc[x] = y + p
                else:
                    acc[x] += p
            if top >= max_tf:
                return -FAULT_PACKED
            prev = np.int64(x)
            s += n
            b += 1
    return np.int64(um)


@jit
def packed_tfs(words, boff, first, width, tblock, ends, max_tf, n_docs, li, ids, out):
    """``out[j]``: the tf of document ``ids[j]`` (ascending) in local term ``li``'s packed
    postings, 0 where the term has none (the exact rescoring's lookup, as ``_find_all``
    finds them in decoded ones): each id's block found by a binary search of the blocks'
    first ids from the previous id's block on, its gaps read up to the id, and its tf read
    at that position alone. Returns 0, or ``FAULT_PACKED`` / ``FAULT_INDPTR``."""
    if li < 0 or li + 1 >= ends.shape[0] or li >= tblock.shape[0]:
        return FAULT_INDPTR
    a = ends[li]
    e = ends[li + 1]
    b0 = tblock[li]
    nbt = (e - a + PACK_BLOCK - 1) // PACK_BLOCK
    nb = first.shape[0]
    if b0 < 0 or b0 + nbt > nb or b0 + nbt >= boff.shape[0] or 2 * (b0 + nbt) > width.shape[0]:
        return FAULT_PACKED
    bi = 0
    for j in range(ids.shape[0]):
        x = np.int64(ids[j])
        out[j] = 0
        if nbt == 0 or x < first[b0]:
            continue
        lo, hi = bi, nbt  # the last block whose first id is at most x, from the previous one on
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if first[b0 + mid] <= x:
                lo = mid
            else:
                hi = mid
        bi = lo
        b = b0 + bi
        n = min(PACK_BLOCK, e - a - bi * PACK_BLOCK)
        wd, wt, o, d = _block_head(words, boff, first, width, b, n, n_docs, np.int64(-1))
        if d < 0:
            return FAULT_PACKED
        ubit = np.uint64(o * 32)
        uwd = np.uint64(wd)
        mask = (np.uint64(1) << uwd) - np.uint64(1)
        p = 0
        while d < x and p + 1 < n:
            p += 1
            d += 1 + np.int64(_uget(words, ubit + np.uint64(p - 1) * uwd, mask))
        if d != x:
            continue
        if d >= n_docs:
            return FAULT_PACKED
        uwt = np.uint64(wt)
        tf = _uget(words, ubit + np.uint64(n - 1) * uwd + np.uint64(p) * uwt,
                   (np.uint64(1) << uwt) - np.uint64(1)) + np.uint64(1)
        if tf > np.uint64(max_tf):
            return FAULT_PACKED
        out[j] = np.int64(tf)
    return 0
