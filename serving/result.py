"""The result an agent gets: a short readable summary plus structured hits and a trace.

The same object is returned by the Python API, the CLI (``--json``), HTTP and MCP. Every
level is plain data: a frozen dataclass read by attribute (``hit.passage.start``) or by key
(``hit["passage"]["start"]``, `Record`), and ``to_dict()`` gives the JSON that HTTP
and MCP send.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class Record:
    """Read access by key for the result dataclasses: ``obj["name"]`` is ``obj.name`` (a
    KeyError for a name that is not a field), ``"name" in obj`` and ``keys()`` list the fields;
    ``to_dict()`` is the JSON form (nested records as dicts)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str) or key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.__dataclass_fields__

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Citation(Record):
    """A hit's best passage: what an agent quotes, and where it is.

    ``start``/``end`` are character offsets into the document's text (``text[start:end]``
    is ``text``; ``get_document(doc_id, start, end)`` fetches around it); ``line_start`` /
    ``line_end`` are its 1-based lines. ``ordinal`` is the passage's number in the
    document. Passages are ranked as passages (``serving.answers.passage_rank``); ``via`` names the
    signals that ranked this one: ``dense`` (its cosine to the query), ``bm25`` (its BM25 in
    the passage index of ``funnel build --bm25-passages``), ``terms`` (BM25 of the query
    terms over its text), or two fused, ``dense+bm25`` / ``dense+terms``. ``score`` is the
    fused score where two signals ranked it, else its one signal's score (cosine or BM25).
    ``page_start`` / ``page_end`` are the 1-based pages the passage spans in a document with
    pages (a PDF of a folder corpus; ``documents.page_span``), else None.
    """

    text: str
    start: int
    end: int
    line_start: int
    line_end: int
    ordinal: int | None = None
    score: float | None = None
    via: str = ""
    page_start: int | None = None
    page_end: int | None = None


@dataclass(frozen=True)
class Hit(Record):
    """One retrieved document.

    ``docno`` is the index-internal document number, ``shard << 32 | local_id``; it is
    what FAISS ids and postings use. ``doc_id`` is the corpus id. ``rank`` counts from 1 in
    the whole ranking (a search with ``offset`` starts at ``offset + 1``). ``fields`` are the
    stored fields a search asked for (``fields=``), None when it asked for none (and then
    absent from ``to_dict()``).
    """

    doc_id: str
    rank: int
    score: float
    title: str = ""
    snippet: str = ""
    matched_terms: tuple[str, ...] = ()
    why: str = ""
    docno: int = -1
    explain: dict[str, Any] = field(default_factory=dict)
    passage: Citation | None = None  # the best passage (see Citation); None without explain
    passages: tuple[Citation, ...] = ()  # its best passages, best first (passages_per_hit); passage is the first
    fields: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["matched_terms"] = list(self.matched_terms)
        d["passages"] = list(d["passages"])
        if d["fields"] is None:
            del d["fields"]
        return d


@dataclass(frozen=True)
class SearchResult(Record):
    """One search's answer: ``summary`` (the text an agent reads), ``hits`` best first,
    ``trace`` (parameters, timings); ``total`` (``{"value", "relation"}``: how many documents
    match, ``relation`` "eq" or, for a lower bound, "gte"; ``serving.answers.paging``) and
    ``offset`` (hits skipped before the first one here)."""

    query: str
    mode: str
    summary: str
    hits: tuple[Hit, ...]
    trace: dict[str, Any] = field(default_factory=dict)
    total: dict[str, Any] = field(default_factory=dict)
    offset: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "mode": self.mode, "summary": self.summary,
                "hits": [h.to_dict() for h in self.hits], "trace": self.trace, "total": self.total,
                "offset": self.offset}


def docno(shard: int, local_id: int) -> int:
    return (int(shard) << 32) | int(local_id)


def split_docno(n: int) -> tuple[int, int]:
    return int(n) >> 32, int(n) & 0xFFFFFFFF


def summarize(query: str, mode: str, hits: list[Hit] | tuple[Hit, ...], note: str = "") -> str:
    """One line per hit with why it matched: the summary of a search without explanations
    (``explain=False``); a search with them quotes the evidence (``serving.answers.summary``)."""
    if not hits:
        msg = f"No documents found for {query!r} ({mode})."
        return f"{msg} {note}".strip()
    lines = [f"Found {len(hits)} documents for {query!r} ({mode}):"]
    for h in hits:
        title = h.title or h.doc_id
        why = f" — {h.why}" if h.why else ""
        lines.append(f"{h.rank}. [{h.doc_id}] {title}{why}")
    if note:
        lines.append(note)
    return "\n".join(lines)
