"""Answers bounded in characters, whatever the corpus holds.

A build keeps a title or a text up to its field bound (16 MiB by default,
``pipelines/sources/limits.py``), and a text with no token boundary is one passage as long as the
text, so without a bound one search hit could carry megabytes. Every answer is cut here, at
answer time (indexes built before this bound existed are served the same way), to
`MAX_ANSWER_CHARS` characters of document text:

* a search (`bound_result`, applied by ``Searcher.search``, so Python, the CLI's
  ``--json``, HTTP and MCP all get it): first each hit's title, snippet and why, in rank
  order, each at most `MAX_TITLE_CHARS` / `MAX_SHORT_CHARS` and together at most half the
  bound; then, in rank order, each hit's passages (``passage`` and ``passages``, each at
  most `MAX_PASSAGE_CHARS`) and ``fields`` (at most `MAX_FIELDS_CHARS` of JSON), then the
  packed ``context``, from what is left. A cut title, snippet or why ends with `MARK`; a
  cut passage keeps its citation exact (``text`` is still the document's ``[start, end)``,
  ``end`` and ``line_end`` moved in). ``trace["bounds"]`` then lists what was cut, by rank.
* a fetched document (``documents._fetch``, for ``get_document`` and ``get_documents``): its
  title at most `MAX_TITLE_CHARS`, its ``fields`` at most `MAX_FIELDS_CHARS`,
  and its text what is left of the call's bound (``next_start`` pages on); ``title_length``
  and ``fields_truncated`` say what was cut.
* a page of ``list_documents``: each title and fields cut the same way, and the page ends
  early once its titles and fields reach `MAX_ANSWER_CHARS` (``next_offset`` goes on from
  there).

Nothing stored changes: the whole title, text and fields stay in the index, and the text is
read in pages with ``get_document``'s ``start``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from .citations import MAX_RANGE_CHARS
from ..result import Citation, Hit, SearchResult

#: Characters of document text one answer holds: a search's titles, snippets, whys, passages
#: and context together; a fetch's title, fields and text together.
MAX_ANSWER_CHARS = MAX_RANGE_CHARS
#: A title as an answer shows it: a title, not a document (real ones are under ~300).
MAX_TITLE_CHARS = 1_000
#: A hit's snippet or why.
MAX_SHORT_CHARS = 1_000
#: One passage of a hit (a passage window is ~256 tokens, ~1,500 characters of prose).
MAX_PASSAGE_CHARS = 8_000
#: A fetched document's fields, as JSON characters.
MAX_FIELDS_CHARS = 10_000
#: What ends a title, snippet or why that was cut.
MARK = "…"


def cut(text: str | None, limit: int) -> tuple[str, bool]:
    """``text`` in at most ``limit`` characters, ending with `MARK` when cut; and whether
    it was."""
    text = text or ""
    if len(text) <= limit:
        return text, False
    return (text[:limit - 1] + MARK) if limit > 0 else "", True


def cut_citation(c: Citation, limit: int) -> tuple[Citation, bool]:
    """``c`` with its text at most ``limit`` characters: a prefix of the passage, so ``text``
    is still the document's ``[start, end)`` (``end`` and ``line_end`` move with it)."""
    if len(c.text) <= limit:
        return c, False
    text = c.text[:max(limit, 0)]
    return replace(c, text=text, end=c.start + len(text), line_end=c.line_start + text.count("\n")), True


class _Budget:
    """Characters left, and what was cut to stay within them (field -> ranks)."""

    def __init__(self, chars: int):
        self.left = chars
        self.cuts: dict[str, list[int]] = {}

    def take(self, field: str, rank: int, text: str | None, cap: int) -> str:
        got, was_cut = cut(text, min(cap, self.left))
        self.left -= len(got)
        if was_cut:
            self.cuts.setdefault(field, []).append(rank)
        return got

    def cite(self, field: str, rank: int, c: Citation | None, cache: dict) -> Citation | None:
        if c is None:
            return None
        if id(c) in cache:  # ``passage`` is ``passages[0]``: cut once, counted twice (both are sent)
            got = cache[id(c)]
        else:
            got, was_cut = cut_citation(c, min(MAX_PASSAGE_CHARS, self.left))
            cache[id(c)] = got
            if was_cut:
                self.cuts.setdefault(field, []).append(rank)
        self.left -= len(got.text)
        return got


def bound_hits(hits: tuple[Hit, ...] | list[Hit], context: list[dict] | None = None,
               max_chars: int = MAX_ANSWER_CHARS) -> tuple[list[Hit], list[dict] | None, dict | None]:
    """``hits`` and ``context`` (a trace's packed context) cut to ``max_chars`` characters of
    document text in all (module docstring); the third value says what was cut (None: nothing)."""
    short = _Budget(max_chars // 2)
    heads = []
    for h in hits:
        heads.append((short.take("title", h.rank, h.title, MAX_TITLE_CHARS),
                      short.take("snippet", h.rank, h.snippet, MAX_SHORT_CHARS),
                      short.take("why", h.rank, h.why, MAX_SHORT_CHARS)))
    rest = _Budget(max_chars - (max_chars // 2 - short.left))
    rest.cuts = short.cuts
    out = []
    for h, (title, snip, why) in zip(hits, heads):
        cache: dict = {}
        passages = tuple(rest.cite("passage", h.rank, c, cache) for c in h.passages)
        passage = rest.cite("passage", h.rank, h.passage, cache)
        changes = {}
        fields = getattr(h, "fields", None)  # the stored fields a search asked for (fields=)
        if fields is not None:
            got, was_cut = bound_json(fields, min(MAX_FIELDS_CHARS, rest.left))
            rest.left -= json_chars(got)
            if was_cut:
                rest.cuts.setdefault("fields", []).append(h.rank)
                changes["fields"] = got
        if (title, snip, why, passage, passages) != (h.title, h.snippet, h.why, h.passage, h.passages) or changes:
            h = replace(h, title=title, snippet=snip, why=why, passage=passage, passages=passages, **changes)
        out.append(h)
    if context is not None:
        bounded = []
        for i, c in enumerate(context):
            text = c.get("text") or ""
            if len(text) > rest.left:
                rest.cuts.setdefault("context", []).append(i)
                # a prefix of the packed passage: its start stays, its end moves in
                c = {**c, "text": text[:rest.left], "end": c.get("start", 0) + rest.left} if "start" in c \
                    else {**c, "text": text[:rest.left]}
            rest.left -= len(c.get("text") or "")
            bounded.append(c)
        context = bounded
    if not rest.cuts:
        return out, context, None
    return out, context, {"max_chars": max_chars, "cut": {k: sorted(set(v)) for k, v in rest.cuts.items()}}


def bound_result(res: SearchResult, max_chars: int = MAX_ANSWER_CHARS) -> SearchResult:
    """``res`` with its hits and context within ``max_chars`` characters of document text
    (`bound_hits`); what was cut is listed in ``trace["bounds"]``."""
    context = res.trace.get("context")
    hits, context, cuts = bound_hits(res.hits, context if isinstance(context, list) else None, max_chars)
    if cuts is None:
        return res
    trace = dict(res.trace)
    if context is not None:
        trace["context"] = context
    trace["bounds"] = cuts
    return replace(res, hits=tuple(hits), trace=trace)


def json_chars(value: Any) -> int:
    """Characters ``value`` takes as compact JSON (0 for None)."""
    return 0 if value is None else len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def bound_json(value: Any, limit: int) -> tuple[Any, bool]:
    """``value`` (decoded JSON: a document's fields) within about ``limit`` characters of JSON:
    strings cut (ending with `MARK`), list items and object keys past the bound left
    out; and whether anything was."""
    if json_chars(value) <= limit:
        return value, False
    left = [max(limit, 0)]

    def walk(x: Any) -> Any:
        if isinstance(x, str):
            got, _ = cut(x, max(left[0] - 2, 0))
            left[0] -= len(got) + 2
            return got
        if isinstance(x, list):
            items = []
            for v in x:
                if left[0] <= 2:
                    break
                items.append(walk(v))
                left[0] -= 1
            return items
        if isinstance(x, dict):
            obj = {}
            for k, v in x.items():
                if left[0] <= len(k) + 4:
                    break
                left[0] -= len(k) + 4
                obj[k] = walk(v)
            return obj
        left[0] -= json_chars(x)
        return x

    return walk(value), True
