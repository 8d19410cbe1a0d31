"""The lines of a TREC run part as bytes, in one compiled pass (``write_run_rows``'s fast path).

Why: formatting each line with Python's ``%`` (``repr`` of every score) cost about 250 ns a
line, twice the retrieval's own time per query at k=100 on SciFact. Here the ids arrive as
one ASCII buffer each (joined by newlines) and the scores as integers of millionths, and
one numba call writes every line.

It applies only where the bytes are provably those of ``"%s Q0 %s %d %r %s\\n"``: ASCII
ids and tag, and scores already rounded to 6 decimals (Anserini's tie-break writes those)
in [1e-4, 1e7). There ``repr(s)`` is the shortest string that reads back as ``s``, which is
the 6-decimal value with its trailing zeros dropped: another string that short would be a
different multiple of 1e-6, more than a unit in the last place away from ``s``. Anything
else returns None and the caller formats in Python (which also raises the errors).
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np

try:
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from numba import njit, types
    from numba.extending import intrinsic
    from numba.core import cgutils
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    HAVE_NUMBA = False

#: The score range where a 6-decimal score's repr is its fixed-point digits (module docstring).
LOW, HIGH = 1e-4, 1e7
#: Spare bytes after the buffers ``_run_chunk`` copies from and into (fixed-size copies).
SLACK = 16


class IdTable(NamedTuple):
    """Every doc id of an index as bytes, for `write_rows`: the id at global position
    ``p`` is ``data[offsets[p]:offsets[p + 1]]``, and ``rank[p]`` is its place in str order.
    Built by `id_table`, which checks once that every id is ASCII, non-empty and
    without whitespace (what the lines need)."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, one more than there are ids
    rank: np.ndarray  # int64


def id_table(data: np.ndarray, offsets: np.ndarray, rank: np.ndarray) -> IdTable | None:
    """An `IdTable` over these arrays, or None where `write_rows` cannot use it
    (numba absent, or an id that is empty, not ASCII, or has whitespace)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    padded = np.zeros(len(data) + SLACK, dtype=np.uint8)  # room for _run_chunk's fixed-size copies
    padded[:len(data)] = data
    rank = np.ascontiguousarray(rank, dtype=np.int64)
    if not HAVE_NUMBA or offsets.shape != (len(rank) + 1,) or not _ids_ok(padded[:len(data)], offsets):
        return None
    return IdTable(padded, offsets, rank)


#: Bytes formatted between writes by `write_rows` (grown for a row that needs more).
CHUNK = 1 << 18


def write_rows(write: Callable[[memoryview], object], qids: list[str], positions: np.ndarray,
               scores: np.ndarray, counts: np.ndarray, table: IdTable, tag: str) -> int:
    """Anserini's tie-break and the lines of a run part, compiled: ``write``s the bytes
    ``write_run_rows(..., tiebreak=True)`` writes for rows whose ids are ``table``'s at
    ``positions`` ([n, k] global positions) with ``scores``, best first. Each score is
    rounded to 4 decimals as Python's ``round`` does (`round4`); ties (equal rounded
    scores) are put in id order through ``table.rank``; the i-th of a tie is lowered by
    i·1e-6 and rounded to 6 decimals. Returns how many rows (from the first) it wrote: it stops before a row where
    the bytes would not provably be the same (a row not in descending order, a position
    out of range, or a tie-broken score outside [LOW, HIGH), not a 6-decimal value, or near
    a rounding half), and writes nothing where numba is absent or a qid or the tag is not
    ASCII or has whitespace. The caller writes the rest its general way, which decides
    those cases as Python does. Lines are formatted CHUNK bytes at a time into one reused
    buffer (no allocation the size of the run)."""
    if not HAVE_NUMBA or not len(qids):
        return 0
    try:
        qb = np.frombuffer("\n".join(qids).encode("ascii"), dtype=np.uint8)
        tb = np.frombuffer(tag.encode("ascii"), dtype=np.uint8)
    except (TypeError, UnicodeEncodeError):
        return 0
    qoff = _split(qb, len(qids))
    if qoff is None or _split(tb, 1) is None:
        return 0
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    out = np.empty(CHUNK, dtype=np.uint8)
    q = 0
    while q < len(qids):
        p, nxt, need = _run_chunk(qb, qoff, q, positions, scores, counts, table.data, table.offsets, table.rank,
                                  tb, out)
        if p:
            write(memoryview(out)[:p])
        if need < 0:  # row nxt takes the general path
            return nxt
        if need > 0:  # row nxt is larger than the buffer
            out = np.empty(need, dtype=np.uint8)
        q = nxt
    return q


def part_bytes(qids: list[str], ids: np.ndarray, scores: np.ndarray, valid: np.ndarray,
               counts: np.ndarray, tag: str) -> bytes | None:
    """``"%s Q0 %s %d %r %s\\n"`` over the part's valid cells (qid, doc id, 1-based column,
    score, tag), rows in order, as bytes; None where the fast path does not apply (numba
    absent, a non-str or non-ASCII id, an id empty or with whitespace, a score not a
    6-decimal value in [LOW, HIGH)). ``scores`` must already be rounded to 6 decimals."""
    if not HAVE_NUMBA:
        return None
    sv = scores[valid]
    if not (np.all(sv >= LOW) and np.all(sv < HIGH)):  # NaN fails too
        return None
    micro = np.rint(sv * 1e6)
    if not np.array_equal(micro / 1e6, sv):  # not a 6-decimal value: repr would differ
        return None
    flat = ids[valid].tolist()
    try:
        qb = "\n".join(qids).encode("ascii")
        idb = "\n".join(flat).encode("ascii")
        tb = tag.encode("ascii")
    except (TypeError, UnicodeEncodeError):
        return None
    cols = np.broadcast_to(np.arange(1, ids.shape[1] + 1, dtype=np.int64), ids.shape)[valid]
    qrow = np.repeat(np.arange(len(qids), dtype=np.int64), counts)
    out = _lines(np.frombuffer(qb, dtype=np.uint8), len(qids), np.frombuffer(idb, dtype=np.uint8), len(flat),
                 np.frombuffer(tb, dtype=np.uint8), qrow, cols, micro.astype(np.int64))
    return None if out is None else out.tobytes()


if HAVE_NUMBA:
    @njit(cache=True, nogil=True, inline="always")
    def _space(c):
        return c == 32 or 9 <= c <= 13 or 28 <= c <= 31  # str.isspace() in ASCII

    @njit(cache=True, nogil=True)
    def _ids_ok(data, offsets):
        """Every id non-empty, ASCII and without whitespace, and the offsets in range."""
        if offsets.shape[0] == 0 or offsets[0] != 0 or offsets[-1] != data.shape[0]:
            return False
        for p in range(offsets.shape[0] - 1):
            if offsets[p + 1] <= offsets[p]:
                return False
        for i in range(data.shape[0]):
            if data[i] >= 128 or _space(data[i]):
                return False
        return True

    @njit(cache=True, nogil=True)
    def _split(buf, n):
        """Start offsets (n + 1, the last one past the end + 1) of the n newline-joined
        fields of ``buf``; None when a field is empty, holds whitespace, or the count is off."""
        off = np.empty(n + 1, dtype=np.int64)
        off[0] = 0
        f = 1
        for i in range(buf.shape[0]):
            c = buf[i]
            if c == 10:
                if f >= n or i == off[f - 1]:
                    return None
                off[f] = i + 1
                f += 1
            elif _space(c):
                return None
        if f != n or (n > 0 and buf.shape[0] == off[n - 1]):
            return None
        off[n] = buf.shape[0] + 1
        return off

    @njit(cache=True, nogil=True, inline="always")
    def _put_bytes(out, p, src, a, b):
        """Copy src[a:b] to out at p (unsigned indices: no wraparound checks); returns the end."""
        up = np.uint64(p)
        for x in range(np.uint64(a), np.uint64(b)):
            out[up] = src[x]
            up += np.uint64(1)
        return np.int64(up)

    @intrinsic
    def _copy_slack(typingctx, dst, p, src, a):
        """SLACK bytes from src[a:] to dst[p:], as one unaligned move (no bounds check)."""
        def codegen(context, builder, signature, args):
            dt, _, st, _ = signature.args
            darr = context.make_array(dt)(context, builder, args[0])
            sarr = context.make_array(st)(context, builder, args[2])
            dptr = builder.gep(darr.data, [args[1]])
            sptr = builder.gep(sarr.data, [args[3]])
            cgutils.raw_memcpy(builder, dptr, sptr, context.get_constant(types.intp, SLACK), 1)
            return context.get_dummy_value()
        return types.void(dst, p, src, a), codegen

    @njit(cache=True, nogil=True, inline="always")
    def _put_short(out, p, src, a, b):
        """_put_bytes for sources with SLACK readable bytes past any field and outputs with
        SLACK bytes to spare: a field of at most SLACK bytes is one fixed-size copy."""
        if b - a > SLACK:
            return _put_bytes(out, p, src, a, b)
        _copy_slack(out, p, src, a)
        return p + (b - a)

    @njit(cache=True, nogil=True)
    def _digits(x):
        u = np.uint64(x)  # unsigned: no sign fix-ups in the divisions
        n = 1
        while u >= np.uint64(10):
            u //= np.uint64(10)
            n += 1
        return n

    @njit(cache=True, nogil=True, inline="always")
    def _put_int(out, p, x, width):
        """Write x >= 0 as ``width`` decimal digits (leading zeros) at p; returns the end."""
        u = np.uint64(x)
        up = np.uint64(p)
        for j in range(width):
            out[up + np.uint64(width - 1 - j)] = np.uint8(48 + u % np.uint64(10))
            u //= np.uint64(10)
        return p + width

    @njit(cache=True, nogil=True, inline="always")
    def _put_score(out, p, m):
        """Write ``m`` millionths (>= 0) as ``repr`` writes a 6-decimal value: the whole part,
        a point, the fraction without trailing zeros (at least one digit; written as six and
        cut back); returns the end."""
        whole = m // 1000000
        frac = m % 1000000
        p = _put_int(out, p, whole, _digits(whole))
        out[p] = 46  # .
        p = _put_int(out, p + 1, frac, 6)
        end = p - 5  # at least one fraction digit stays
        while p > end and out[p - 1] == 48:  # trailing zeros go
            p -= 1
        return p

    @njit(cache=True, nogil=True)
    def _lines(qb, nq, idb, n, tb, qrow, cols, micro):
        qoff = _split(qb, nq)
        doff = _split(idb, n)
        if (nq > 0 and qoff is None) or (n > 0 and doff is None) or _split(tb, 1) is None:
            return None
        longest_q = 0
        for q in range(nq):
            longest_q = max(longest_q, qoff[q + 1] - 1 - qoff[q])
        # A bound (ids' bytes plus, per line, the longest qid, the tag and 48 for the fixed
        # text, a rank below 10^19 and a score below 10^7 with 6 decimals); cut to size at the end.
        out = np.empty(idb.shape[0] + n * (longest_q + tb.shape[0] + 48), dtype=np.uint8)
        p = 0
        for i in range(n):
            q = qrow[i]
            p = _put_bytes(out, p, qb, qoff[q], qoff[q + 1] - 1)
            out[p] = 32
            out[p + 1] = 81  # Q
            out[p + 2] = 48  # 0
            out[p + 3] = 32
            p = _put_bytes(out, p + 4, idb, doff[i], doff[i + 1] - 1)
            out[p] = 32
            p = _put_int(out, p + 1, cols[i], _digits(cols[i]))
            out[p] = 32
            p = _put_score(out, p + 1, micro[i])
            out[p] = 32
            p = _put_bytes(out, p + 1, tb, 0, tb.shape[0])
            out[p] = 10
            p += 1
        return out[:p]

    @njit(cache=True, nogil=True, inline="always")
    def _near_half(y):
        """``_round_like_python``'s test: rint(y) may not be Python's rounding of y."""
        return not abs(y) < 1e12 or abs(y - np.floor(y) - 0.5) < 1e-6

    @intrinsic
    def _bits(typingctx, x):
        """The IEEE-754 bits of a float64, as a uint64 (a bitcast: no instruction)."""
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(types.uint64))
        return types.uint64(types.float64), codegen

    @njit(cache=True, nogil=True)
    def _round4(x):
        """``round(x, 4)`` as Python computes it (the exact binary value rounded to 4
        decimals, exact halves to even, then the nearest double) for 0 < x < 1e11; NaN
        elsewhere. From x's bits, x = mant·2^(ex-1075) with mant < 2^53 an integer, so
        x·10^4 = mant·625·2^(ex-1071) exactly, mant·625 < 2^63: its integer part and
        remainder are exact shifts, and the result q/10^4 one correctly rounded division, as
        Python's string round trip is."""
        if not (x > 0.0 and x < 1e11):
            return np.nan
        bits = _bits(x)
        ex = np.int64(bits >> np.uint64(52))  # the biased exponent (x > 0: no sign bit)
        mant = bits & np.uint64(0xFFFFFFFFFFFFF)
        if ex == 0:
            ex = np.int64(1)  # subnormal: no implicit bit
        else:
            mant |= np.uint64(1) << np.uint64(52)
        prod = mant * np.uint64(625)  # x·10^4 = mant·625·2^(ex - 1071)
        sh = 1071 - ex  # >= 12 below 1e11
        if sh >= 64:
            return 0.0  # below 1/2 after scaling
        q = prod >> np.uint64(sh)
        r = prod & ((np.uint64(1) << np.uint64(sh)) - np.uint64(1))
        half = np.uint64(1) << np.uint64(sh - 1)
        if r > half or (r == half and (q & np.uint64(1)) == np.uint64(1)):
            q += np.uint64(1)
        return np.float64(q) / 10000.0

    @njit(cache=True, nogil=True)
    def _run_chunk(qb, qoff, q0, pos, scores, counts, data, offs, rank, tb, out):
        """write_rows' lines from row q0 on into ``out``, whole rows only: (bytes, next row,
        need), need 0 when it stopped at the end or a full buffer, -1 when the next row
        takes the general path, else the buffer size that row needs."""
        nq = qoff.shape[0] - 1
        k = pos.shape[1]
        # " r " for every rank r, and " tag\n", copied per line instead of formatted
        rtxt = np.empty(k * 22 + SLACK, dtype=np.uint8)
        roff = np.empty(k + 1, dtype=np.int64)
        roff[0] = 0
        for j in range(k):
            a = roff[j]
            rtxt[a] = 32
            e = _put_int(rtxt, a + 1, j + 1, _digits(j + 1))
            rtxt[e] = 32
            roff[j + 1] = e + 1
        nt = tb.shape[0] + 2
        tail = np.empty(nt + SLACK, dtype=np.uint8)
        tail[0] = 32
        tail[1:nt - 1] = tb
        tail[nt - 1] = 10
        head = np.empty(64 + SLACK, dtype=np.uint8)
        row_p = np.empty(k, dtype=np.int64)
        row_s = np.empty(k, dtype=np.float64)
        p = 0
        for q in range(q0, nq):
            n = counts[q]
            if n > k or n < 0:
                return p, q, -1
            nh = qoff[q + 1] - 1 - qoff[q] + 4
            if nh > head.shape[0] - SLACK:
                head = np.empty(nh + SLACK, dtype=np.uint8)
            bound = SLACK + n * (nh + 22 + 1 + 15 + nt)  # per line: head, " rank ", the score, tail
            for j in range(n):
                x = pos[q, j]
                if x < 0 or x >= rank.shape[0]:
                    return p, q, -1
                bound += offs[x + 1] - offs[x]
            if p + bound > out.shape[0]:
                return p, q, (bound if p == 0 else 0)
            for j in range(n):
                x = pos[q, j]
                s = _round4(scores[q, j])  # NaN outside (0, 1e11): the row goes the general way below
                if j > 0 and s > row_s[j - 1]:
                    return p, q, -1  # not in order: the general path sorts it
                # insertion into the run of equal scores by id rank (runs are short)
                i = j
                while i > 0 and row_s[i - 1] == s and rank[row_p[i - 1]] > rank[x]:
                    row_p[i] = row_p[i - 1]
                    row_s[i] = row_s[i - 1]
                    i -= 1
                row_p[i] = x
                row_s[i] = s
            h = _put_bytes(head, 0, qb, qoff[q], qoff[q + 1] - 1)
            head[h] = 32
            head[h + 1] = 81  # Q
            head[h + 2] = 48  # 0
            head[h + 3] = 32
            start = p
            dup = 0
            for j in range(n):
                dup = dup + 1 if j > 0 and row_s[j] == row_s[j - 1] else 0
                y = (row_s[j] - dup * 1e-6) * 1e6
                r = np.rint(y)
                v = r / 1e6  # round(score - dup·1e-6, 6), as _round_like_python
                if _near_half(y) or not (v >= LOW and v < HIGH):
                    return start, q, -1  # repr would not be these digits: the general path
                m = np.int64(r)  # v's digits: v is r millionths, correctly rounded
                p = _put_short(out, p, head, 0, nh)
                x = row_p[j]
                p = _put_short(out, p, data, offs[x], offs[x + 1])
                p = _put_short(out, p, rtxt, roff[j], roff[j + 1])
                p = _put_score(out, p, m)
                p = _put_short(out, p, tail, 0, nt)
        return p, nq, 0
else:  # pragma: no cover
    _lines = _run_chunk = _ids_ok = _split = _round4 = None
