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

import numpy as np

try:
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from numba import njit
    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised where numba is absent
    HAVE_NUMBA = False

#: The score range where a 6-decimal score's repr is its fixed-point digits (module docstring).
LOW, HIGH = 1e-4, 1e7


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
            elif c == 32 or 9 <= c <= 13 or 28 <= c <= 31:  # str.isspace() in ASCII
                return None
        if f != n or (n > 0 and buf.shape[0] == off[n - 1]):
            return None
        off[n] = buf.shape[0] + 1
        return off

    _TENS = np.array([1, 10, 100, 1000, 10000, 100000, 1000000], dtype=np.int64)

    @njit(cache=True, nogil=True, inline="always")
    def _put_bytes(out, p, src, a, b):
        """Copy src[a:b] to out at p (unsigned indices: no wraparound checks); returns the end."""
        up = np.uint64(p)
        for x in range(np.uint64(a), np.uint64(b)):
            out[up] = src[x]
            up += np.uint64(1)
        return np.int64(up)

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

    @njit(cache=True, nogil=True)
    def _frac_len(frac):
        """Digits of a 6-digit fraction once trailing zeros go (at least one: ``12.0``)."""
        if frac == 0:
            return 1
        n = 6
        while frac % 10 == 0:
            frac //= 10
            n -= 1
        return n

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
            m = micro[i]
            whole = m // 1000000
            frac = m % 1000000
            p = _put_int(out, p + 1, whole, _digits(whole))
            out[p] = 46  # .
            fl = _frac_len(frac)
            p = _put_int(out, p + 1, frac // _TENS[6 - fl], fl)
            out[p] = 32
            p = _put_bytes(out, p + 1, tb, 0, tb.shape[0])
            out[p] = 10
            p += 1
        return out[:p]
else:  # pragma: no cover
    _lines = None
