"""Citations: the passage of a hit that an agent quotes, and ranges of a document's text.

Every hit carries its best passage (`Citation`): the text,
its character offsets into the document's text and the lines they span, so an agent can
quote it and fetch around it (``get_document(id, start, end)``).

Which passage:

* a hit the dense list found: the passage its MaxP score came from
  (``DenseIndex.best_passage``);
* a BM25 hit of an index built with ``--bm25-passages``: the passage its MaxP score came
  from (``PassageBM25.best_passage``);
* otherwise (BM25, SIRA, a hybrid hit only BM25 found): the passage holding the most
  distinct matched query terms, then the most matches, the first on ties
  (`lexical_best`).

The passages are the index's own (``passages/``, what was embedded) where it has them;
an index without (BM25 only, ``--passages off``) is split the same way at query time, on
words and punctuation in windows of `DEFAULT_WINDOW` (`DEFAULT_SPLITTER`).
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from funnel.pipelines.dense.passages import (DEFAULT_ENDPOINT_WINDOW, DEFAULT_OVERLAP, line_span, regex_token_spans,
                                       split_spans)

from ..errors import SearchError
from ..result import Citation

#: Tokens per passage when an index stores none (the default embedder's window).
DEFAULT_WINDOW = DEFAULT_ENDPOINT_WINDOW
#: The most characters ``get_document`` returns in one call; a longer range comes back cut,
#: with ``next_start`` to continue from.
MAX_RANGE_CHARS = 100_000

_WORD = re.compile(r"\w+", re.UNICODE)


_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def default_spans(text: str, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """``(m, 2)`` passage spans of a text for an index that stores none.

    A text of at most ``window`` tokens is one passage (``split_spans``), and most are. A
    token is a word run or one punctuation mark, so a whitespace-separated piece with ``p``
    marks holds at most ``2p + 1`` tokens: when the pieces plus twice the marks fit the
    window, the text does, found without listing its tokens (~12 us against ~120 for a
    1,000-character text)."""
    if len(text.split()) + 2 * len(_PUNCT.findall(text)) <= window:
        return np.asarray([[0, len(text)]], dtype=np.int64)
    return np.asarray(split_spans(text, regex_token_spans(text), window, DEFAULT_OVERLAP), dtype=np.int64)


def lexical_best(text: str, spans: np.ndarray, terms: set[str], analyze: Callable[[str], list[str]]) -> int:
    """Index of the passage in ``spans`` with the most distinct ``terms`` (analyzed index
    terms), then the most matching words; the first on ties, 0 when nothing matches.

    Each distinct word of the text is analyzed once; a word counts for the passage its
    start falls in (an overlap's words count for both passages)."""
    if len(spans) <= 1 or not terms:
        return 0
    cols = {t: j for j, t in enumerate(sorted(terms))}
    seen: dict[str, list[int]] = {}
    starts, hit_cols = [], []
    for m in _WORD.finditer(text):
        w = m.group()
        got = seen.get(w)
        if got is None:
            got = seen[w] = sorted({cols[t] for t in analyze(w) if t in cols})
        for c in got:
            starts.append(m.start())
            hit_cols.append(c)
    if not starts:
        return 0
    starts, hit_cols = np.asarray(starts), np.asarray(hit_cols)
    lo = np.searchsorted(starts, spans[:, 0], side="left")
    hi = np.searchsorted(starts, spans[:, 1], side="left")
    distinct = np.array([len(np.unique(hit_cols[a:b])) for a, b in zip(lo, hi)])
    total = hi - lo
    return int(np.lexsort((np.arange(len(spans)), -total, -distinct))[0])


def last_visible(text: str, start: int, end: int) -> int:
    """The offset of the last character of ``text[start:end]`` that is not white space
    (``start`` where there is none): a range's last page is that character's, so a range
    ending on a page break is still on the page before it."""
    last = end - 1
    while last > start and text[last].isspace():
        last -= 1
    return max(last, start)


def make_citation(text: str, start: int, end: int, ordinal: int | None, via: str,
                  score: float | None = None) -> Citation:
    """A `Citation` of ``text[start:end]`` with its lines."""
    first, last = line_span(text, start, end)
    return Citation(text=text[start:end], start=int(start), end=int(end), line_start=first, line_end=last,
                    ordinal=ordinal, score=None if score is None else round(float(score), 6), via=via)


def text_range(doc: dict, start: int | None = None, end: int | None = None,
               max_chars: int = MAX_RANGE_CHARS) -> dict:
    """``doc`` (a stored document) with ``text`` cut to ``[start, end)`` and at most
    ``max_chars`` characters, plus ``start``, ``end``, ``length`` (of the whole text),
    ``line_start``, ``line_end``, ``truncated`` and ``next_start`` (where the next range
    begins, or None at the end of the text).

    Raises
    ------
    SearchError
        A start or end that is not a whole number, negative, past the end of the text, or
        an end before the start; the message gives the document's length.
    """
    text = doc.get("text") or ""
    n = len(text)
    for name, v in (("start", start), ("end", end)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            raise SearchError(f"{name} must be a whole number of characters, got {v!r}")
    a = 0 if start is None else int(start)
    b = n if end is None else int(end)
    if a < 0 or b < 0:
        raise SearchError(f"start and end count characters from 0; got start={a}, end={b}")
    if a > n:
        raise SearchError(f"start {a} is past the end of document {doc.get('doc_id')!r}, which has {n} "
                          f"characters: pass a start in 0..{n}")
    if b < a:
        raise SearchError(f"end {b} is before start {a}: pass end >= start (or no end, for the rest)")
    if max_chars < 1:
        raise SearchError(f"max_chars must be >= 1, got {max_chars}")
    b = min(b, n)
    cut = b - a > max_chars
    if cut:
        b = a + max_chars
    first, last = line_span(text, a, b)
    return {**doc, "text": text[a:b], "start": a, "end": b, "length": n, "line_start": first, "line_end": last,
            "truncated": cut, "next_start": b if b < n else None}
