"""Lucene's Porter stemmer (``porter.porter_stem``) compiled, for many ASCII words in one call.

The build stems every distinct token once; on a real corpus that is tens of thousands of
words (SciFact: 38K of 96K distinct words), and in Python each costs ~10 us, a quarter of
a small corpus's build. :func:`stem_ascii` stems a list of lowercased ASCII tokens in one
numba call on their bytes (in place: a Porter stem is never longer than its word).

``porter.py`` stays the reference: the rule tables below are read from it, not copied, and
``tests/test_porter_kernel.py`` holds the two equal on every distinct token of the test
corpora and on generated words built to reach every rule. Words that are not ASCII, and
every word where numba is absent, go through the reference.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .porter import _Word, porter_stem

log = logging.getLogger(__name__)

try:  # numba is an accelerator, never a requirement
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from numba import njit
    HAVE_NUMBA = True
except ImportError as e:  # pragma: no cover - exercised where numba is absent
    log.info("numba unavailable (%s): stemming in Python", e)
    HAVE_NUMBA = False

    def njit(*args, **kwargs):
        return (lambda f: f) if not args or not callable(args[0]) else args[0]


def _rule_table(groups: dict) -> tuple[np.ndarray, ...]:
    """A step's rules as flat arrays: key character, suffix and replacement spans in a byte
    pool, in the reference's order (its dict order, then each tuple's)."""
    pool, key, s0, s1, r0, r1 = bytearray(), [], [], [], [], []
    for ch, rules in groups.items():
        for rule in rules:
            suffix, repl = (rule, "") if isinstance(rule, str) else rule
            key.append(ord(ch))
            s0.append(len(pool))
            pool += suffix.encode("ascii")
            s1.append(len(pool))
            r0.append(len(pool))
            pool += repl.encode("ascii")
            r1.append(len(pool))
    return (np.frombuffer(bytes(pool), dtype=np.uint8).copy(), np.array(key, dtype=np.uint8),
            np.array(s0, dtype=np.int64), np.array(s1, dtype=np.int64),
            np.array(r0, dtype=np.int64), np.array(r1, dtype=np.int64))


_STEP3 = _rule_table(_Word._STEP3)
_STEP4 = _rule_table(_Word._STEP4)
_STEP5 = _rule_table(_Word._STEP5)


@njit(cache=True, nogil=True)
def _vowel(c):
    return c == 97 or c == 101 or c == 105 or c == 111 or c == 117  # a e i o u


@njit(cache=True, nogil=True)
def _cons(b, o, i):
    """``_Word.cons``: a 'y' is a consonant at the start and after a vowel, so a run of y's
    alternates from the character before it (iterative, not recursive)."""
    c = b[o + i]
    if _vowel(c):
        return False
    if c != 121:
        return True
    s = i
    while s > 0 and b[o + s - 1] == 121:
        s -= 1
    first = True if s == 0 else _vowel(b[o + s - 1])  # cons(s) = not cons(s - 1)
    return first if (i - s) % 2 == 0 else not first


@njit(cache=True, nogil=True)
def _m(b, o, j):
    """``_Word.m``: the number of VC sequences in b[0..j]."""
    n = 0
    i = 0
    while True:
        if i > j:
            return n
        if not _cons(b, o, i):
            break
        i += 1
    i += 1
    while True:
        while True:
            if i > j:
                return n
            if _cons(b, o, i):
                break
            i += 1
        i += 1
        n += 1
        while True:
            if i > j:
                return n
            if not _cons(b, o, i):
                break
            i += 1
        i += 1


@njit(cache=True, nogil=True)
def _vowel_in_stem(b, o, j):
    for i in range(j + 1):
        if not _cons(b, o, i):
            return True
    return False


@njit(cache=True, nogil=True)
def _doublec(b, o, j):
    return j >= 1 and b[o + j] == b[o + j - 1] and _cons(b, o, j)


@njit(cache=True, nogil=True)
def _cvc(b, o, i):
    if i < 2 or not _cons(b, o, i) or _cons(b, o, i - 1) or not _cons(b, o, i - 2):
        return False
    c = b[o + i]
    return c != 119 and c != 120 and c != 121  # w x y


@njit(cache=True, nogil=True)
def _ends(b, o, k, pool, s0, s1):
    """True when b[0..k] ends with pool[s0:s1] (then the stem ends at k - (s1 - s0))."""
    n = s1 - s0
    if n > k + 1:
        return False
    for t in range(n):
        if b[o + k - n + 1 + t] != pool[s0 + t]:
            return False
    return True


@njit(cache=True, nogil=True)
def _ends_str(b, o, k, s):
    """``_ends`` for a literal suffix given as a tuple of character codes."""
    n = len(s)
    if n > k + 1:
        return False
    for t in range(n):
        if b[o + k - n + 1 + t] != s[t]:
            return False
    return True


@njit(cache=True, nogil=True)
def _setto(b, o, j, pool, r0, r1):
    """Replace b[j+1..] by pool[r0:r1]; returns the new k."""
    for t in range(r1 - r0):
        b[o + j + 1 + t] = pool[r0 + t]
    return j + r1 - r0


@njit(cache=True, nogil=True)
def _set_str(b, o, j, s):
    for t in range(len(s)):
        b[o + j + 1 + t] = s[t]
    return j + len(s)


@njit(cache=True, nogil=True)
def _rules(b, o, k, key, table, step5):
    """Steps 3 and 4 (``r``: replace when m > 0) and 5 (drop when m > 1; '-ion' only after
    s or t) over one rule table; returns the new k."""
    pool, keys, s0, s1, r0, r1 = table
    for r in range(len(keys)):
        if keys[r] != key or not _ends(b, o, k, pool, s0[r], s1[r]):
            continue
        j = k - (s1[r] - s0[r])
        if step5:
            if s1[r] - s0[r] == 3 and pool[s0[r]] == 105 and pool[s0[r] + 1] == 111 and pool[s0[r] + 2] == 110:
                if not (j >= 0 and (b[o + j] == 115 or b[o + j] == 116)):  # 'ion' needs s or t before it
                    continue
            return j if _m(b, o, j) > 1 else k
        return _setto(b, o, j, pool, r0[r], r1[r]) if _m(b, o, j) > 0 else k
    return k


@njit(cache=True, nogil=True)
def _stem_one(b, o, n, t3, t4, t5):
    """Stem b[o:o+n] in place (as ``porter_stem``); returns the stem's length."""
    k = n - 1
    # step 1ab (_Word.step1)
    if b[o + k] == 115:  # s
        if _ends_str(b, o, k, (115, 115, 101, 115)):  # sses
            k -= 2
        elif _ends_str(b, o, k, (105, 101, 115)):  # ies
            k = _set_str(b, o, k - 3, (105,))
        elif b[o + k - 1] != 115:
            k -= 1
    if _ends_str(b, o, k, (101, 101, 100)):  # eed
        if _m(b, o, k - 3) > 0:
            k -= 1
    else:
        j = -2
        if _ends_str(b, o, k, (101, 100)):  # ed
            j = k - 2
        elif _ends_str(b, o, k, (105, 110, 103)):  # ing
            j = k - 3
        if j > -2 and _vowel_in_stem(b, o, j):
            k = j
            if _ends_str(b, o, k, (97, 116)):  # at
                k = _set_str(b, o, k - 2, (97, 116, 101))
            elif _ends_str(b, o, k, (98, 108)):  # bl
                k = _set_str(b, o, k - 2, (98, 108, 101))
            elif _ends_str(b, o, k, (105, 122)):  # iz
                k = _set_str(b, o, k - 2, (105, 122, 101))
            elif _doublec(b, o, k):
                c = b[o + k]
                if not (c == 108 or c == 115 or c == 122):  # l s z
                    k -= 1
            elif _m(b, o, k) == 1 and _cvc(b, o, k):
                k = _set_str(b, o, k, (101,))
    # step 1c (_Word.step2)
    if _ends_str(b, o, k, (121,)) and _vowel_in_stem(b, o, k - 1):
        b[o + k] = 105
    # steps 2-4 of the paper (_Word.step3 to step5)
    if k != 0:
        k = _rules(b, o, k, b[o + k - 1], t3, False)
    k = _rules(b, o, k, b[o + k], t4, False)
    if k != 0:
        k = _rules(b, o, k, b[o + k - 1], t5, True)
    # step 5 of the paper (_Word.step6): m() counts up to j = k as the step began, also
    # after an 'e' is dropped
    j = k
    if b[o + k] == 101:  # e
        a = _m(b, o, j)
        if a > 1 or (a == 1 and not _cvc(b, o, k - 1)):
            k -= 1
    if b[o + k] == 108 and _doublec(b, o, k) and _m(b, o, j) > 1:
        k -= 1
    return k + 1


@njit(cache=True, nogil=True)
def _stem_all(buf, starts, lens, t3, t4, t5):
    for w in range(len(starts)):
        if lens[w] > 2:
            lens[w] = _stem_one(buf, starts[w], lens[w], t3, t4, t5)


def stem_ascii(words: list[str]) -> list[str]:
    """``[porter_stem(w) for w in words]`` for lowercased ASCII words, in one compiled call."""
    if not HAVE_NUMBA or not words:
        return [porter_stem(w) for w in words]
    lens = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    starts = np.zeros(len(words), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    buf = np.frombuffer("".join(words).encode("ascii"), dtype=np.uint8).copy()
    _stem_all(buf, starts, lens, _STEP3, _STEP4, _STEP5)
    text = buf.tobytes().decode("ascii")
    return [text[s:s + n] for s, n in zip(starts.tolist(), lens.tolist())]
