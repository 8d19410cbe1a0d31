"""How deep a JSON text nests, measured before it is parsed.

Python's ``json`` parser recurses once per ``[`` or ``{`` and raises RecursionError (not a
ValueError) near 1,000 levels, and a structure that did parse may still be too deep for the
code that walks it. So every JSON text a server takes from outside (a request body, a
``--filter``, a tokens file) is measured here first and refused with a message naming its
limit. The count is vectorized: the strings are cut out with one regular expression and
the brackets summed with NumPy, a few milliseconds for a mebibyte.
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["nesting_depth", "check_depth"]

# A JSON string, escapes included (the unrolled form: no backtracking between alternatives);
# an unterminated one runs to the end of the text.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def nesting_depth(text: str | bytes, limit: int | None = None) -> int:
    """The deepest nesting of ``[`` and ``{`` in the JSON ``text``, brackets inside strings
    not counted (0 for a bare number or string).

    With ``limit``, a text with no more than ``limit`` opening brackets in all is answered
    without scanning (its depth is at most that); the number returned is then a bound that
    is at most ``limit``, not the exact depth.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    opens = data.count(b"[") + data.count(b"{")
    if limit is not None and opens <= limit:
        return opens
    if not opens:
        return 0
    bare = _STRING.sub(b"", data)
    steps = _OPEN[np.frombuffer(bare, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def check_depth(text: str | bytes, limit: int, what: str) -> None:
    """Raise ValueError when the JSON ``text`` nests deeper than ``limit`` levels; ``what``
    names it in the message ("the filter", "the tokens file")."""
    depth = nesting_depth(text, limit)
    if depth > limit:
        raise ValueError(f"{what} nests {depth:,} levels deep; at most {limit} are accepted")
