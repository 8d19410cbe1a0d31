"""Reading a version's stored documents: one by id, several by ids, id prefix or glob, a page of
the list, with their fields and a range of characters or lines.

What ``get_document``, ``get_documents`` and ``list_documents`` answer in Python
(``VersionSearcher``), the CLI (``funnel get``, ``funnel list``), HTTP (``GET /documents``,
``GET /documents/{id}``, ``POST /documents``) and MCP (the tools of the same names):

* **fields** (``fields``): what a document carries besides id, title and text (front matter,
  path, format, page starts, a corpus's own columns; ``pipelines/sources/fields.py``), selected as
  Elasticsearch's ``_source`` filtering selects: a list of names, or ``"*"`` for all of them.
  The default is none, so an answer is as small as before unless fields are asked for. A name
  no document of the index has is an error listing the names it has. ``acl`` is shown to
  administrators and local callers only.
* **lines** (``from_line``, ``max_lines``; qmd's ``fromLine``/``maxLines``): 1-based lines,
  an alternative to the character range ``start``/``end``; the answer holds whole lines, each
  with its newline, and the same ``start``/``end``/``line_start``/``line_end`` as any range.
* **listing** (`list_documents`): doc ids in id order (code points), a page at a time
  (``offset``, ``limit`` up to `MAX_LIST_LIMIT`), narrowed to an id prefix or a glob,
  with ``total``: how many match.
* **by prefix or glob** (`matching_ids`): ``get_documents`` fetches the first
  ``MAX_DOCUMENT_IDS`` matching ids, in id order, and says how many matched.

Access, as for every read: a caller that is not an administrator sees only documents its ACL
lets it read. A forbidden id answers exactly as a missing one; a listing never shows a
forbidden id and counts only the documents the caller may read. Arguments are checked before
any document is looked up, so a bad one answers the same whatever the id.
"""

from __future__ import annotations

import bisect
import fnmatch
import json
import re
from dataclasses import replace
from typing import Any

import numpy as np

from .answers import bounds
from .answers.citations import MAX_RANGE_CHARS, last_visible, text_range
from .errors import SearchError

# ``vs`` is the calling ``serving.search.VersionSearcher``; it is named in annotations as a
# string only, since search.py imports this module (no import cycle, tests/test_import_layers).

#: ``fields`` value that selects every field.
ALL_FIELDS = "*"
#: Field names one request may select, and characters per name.
MAX_FIELD_NAMES = 64
MAX_FIELD_NAME_CHARS = 256
#: Characters of an id prefix or glob.
MAX_PATTERN_CHARS = 1024
#: Ids one ``list_documents`` page holds by default, and at most.
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000
#: The largest line number or count taken (far past any stored text; a text is bounded at build).
MAX_LINE = 2**31 - 1
#: The largest listing offset taken.
MAX_LIST_OFFSET = 2**31 - 1
_GLOB = re.compile(r"[*?\[]")
_ACL = "acl"


# -- fields ----------------------------------------------------------------------------------

def known_fields(manifest: dict, restricted: bool = False) -> list[str]:
    """Every field name a document of this version has (the build's ``fields`` section:
    filterable ones and the rest), sorted; without ``acl`` for a ``restricted`` caller."""
    section = manifest.get("fields") or {}
    names = set(section.get("schema") or {}) | set(section.get("not_filterable") or {})
    if restricted:
        names.discard(_ACL)
    return sorted(names)


def check_fields(fields: Any, known: list[str]) -> tuple[str, ...] | None:
    """``fields`` as a request gives it (None, ``"*"``, ``"a,b"`` or a list of names) checked
    against the index's names: None for no fields, ``("*",)`` for all, else the names asked
    for, each once.

    Raises
    ------
    SearchError
        Not a string or a list of strings, too many or too long names, or a name no document
        of this index has (the message lists the ones it has).
    """
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = [f.strip() for f in fields.split(",") if f.strip()]
    if not isinstance(fields, (list, tuple)) or not all(isinstance(f, str) for f in fields):
        raise SearchError(f"fields is a list of field names or \"{ALL_FIELDS}\" for all of them, got "
                          f"{type(fields).__name__}")
    if len(fields) > MAX_FIELD_NAMES:
        raise SearchError(f"fields names {len(fields)} fields; at most {MAX_FIELD_NAMES} (or \"{ALL_FIELDS}\")")
    if any(len(f) > MAX_FIELD_NAME_CHARS for f in fields):
        raise SearchError(f"a field name is at most {MAX_FIELD_NAME_CHARS} characters")
    if not fields:
        return None
    if ALL_FIELDS in fields:
        return (ALL_FIELDS,)
    have = set(known)
    unknown = [f for f in dict.fromkeys(fields) if f not in have]
    if unknown:
        shown = ", ".join(known[:40]) + (f" and {len(known) - 40} more" if len(known) > 40 else "")
        raise SearchError(f"unknown field(s) {', '.join(map(repr, unknown[:5]))}; "
                          + (f"this index's fields: {shown} (or \"{ALL_FIELDS}\" for all)" if known
                             else "the documents of this index have no fields"))
    return tuple(dict.fromkeys(fields))


def parse_fields(fields_json: str | None) -> dict:
    """A stored document's fields (the JSON text ``DocStore.fields_json`` gives) as a dict."""
    return json.loads(fields_json) if fields_json else {}


def select_fields(fields_json: str | None, wanted: tuple[str, ...], restricted: bool = False) -> dict:
    """The ``wanted`` fields (`check_fields`) of one stored document; a name it lacks is
    left out. ``acl`` never for a ``restricted`` caller."""
    have = parse_fields(fields_json)
    if wanted == (ALL_FIELDS,):
        return {k: v for k, v in have.items() if not (restricted and k == _ACL)}
    return {k: have[k] for k in wanted if k in have and not (restricted and k == _ACL)}


# -- pages -----------------------------------------------------------------------------------

def has_pages(manifest: dict) -> bool:
    """Whether some document of this version has pages (a PDF of a folder corpus)."""
    names = known_fields(manifest)
    return "page_starts" in names or "pages" in names


def page_span(fields: dict, text: str, start: int, end: int) -> tuple[int, int] | None:
    """1-based first and last page of ``text[start:end]`` for a document with pages, else None.

    From its ``page_starts`` field (page ``i + 1`` begins at ``page_starts[i]``;
    ``pipelines.formats.pdf.page_of``), or, where the build left them out for size
    (``page_starts_omitted``), from the form feeds between the pages. The last page is that of
    the range's last character that is not white space (a range ending on a page break is
    still on the page before it)."""
    starts = fields.get("page_starts")
    is_pdf = fields.get("format") == "pdf"
    if not (isinstance(starts, list) and starts and all(isinstance(x, int) for x in starts)):
        starts = None
        if not is_pdf:
            return None
    last = last_visible(text, start, end)
    if starts is not None:
        return max(1, bisect.bisect_right(starts, start)), max(1, bisect.bisect_right(starts, last))
    return text.count("\f", 0, start) + 1, text.count("\f", 0, last) + 1


def hits_with(vs: "VersionSearcher", hits: list, offset: int, wanted: tuple[str, ...] | None,
              restricted: bool) -> list:
    """A search's hits as a page returns them: ranks counted on from ``offset``, the
    ``wanted`` fields (`check_fields`) added, and the pages each citation spans where
    the document has pages (`page_span`)."""
    pages = has_pages(vs.index.manifest)
    if not (offset or wanted or pages):
        return hits
    docs = vs.index.docs
    out = []
    for h in hits:
        changes: dict[str, Any] = {"rank": h.rank + offset} if offset else {}
        fields_json = docs.fields_json(h.docno) if (wanted or (pages and h.passage is not None)) else None
        if wanted:
            changes["fields"] = select_fields(fields_json, wanted, restricted)
        if pages and h.passage is not None:
            have, text = parse_fields(fields_json), docs.get(h.docno)["text"] or ""

            def paged(c):
                span = page_span(have, text, c.start, c.end)
                return c if span is None else replace(c, page_start=span[0], page_end=span[1])

            changes["passage"] = paged(h.passage)
            if getattr(h, "passages", None):
                changes["passages"] = tuple(paged(c) for c in h.passages)
        out.append(replace(h, **changes) if changes else h)
    return out


# -- lines -----------------------------------------------------------------------------------

def _whole(name: str, v: Any, low: int, high: int) -> int | None:
    """``v`` (an int, or digits as a query parameter gives them) as a whole number in
    ``low..high``; None stays None; a SearchError naming ``name`` otherwise."""
    if v is None:
        return None
    if isinstance(v, str):
        digits = v.strip()
        if digits.isascii() and digits.isdigit():
            v = int(digits) if len(digits) <= 18 else high + 1
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        shown = repr(v) if isinstance(v, (str, float)) else f"a {type(v).__name__}"
        raise SearchError(f"{name} must be a whole number, got {shown[:40]}")
    if not low <= v <= high:
        raise SearchError(f"{name} must be in {low}..{high:,}, got {v}")
    return int(v)


def check_lines(from_line: Any = None, max_lines: Any = None) -> tuple[int, int | None] | None:
    """``(from_line, max_lines)`` of a line range (1-based first line, how many; None: to the
    end), or None when neither is given. Checked before any document is looked up."""
    a = _whole("from_line", from_line, 1, MAX_LINE)
    n = _whole("max_lines", max_lines, 1, MAX_LINE)
    if a is None and n is None:
        return None
    return (a or 1), n


def line_offsets(text: str, doc_id: str, from_line: int, max_lines: int | None) -> tuple[int, int]:
    """Character offsets ``[start, end)`` of lines ``from_line`` .. ``from_line + max_lines - 1``
    of ``text`` (1-based; the last line's newline included). A SearchError when ``from_line``
    is past the last line, naming how many there are."""
    n_lines = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    if from_line > n_lines:
        raise SearchError(f"from_line {from_line} is past the end of document {doc_id!r}, which has {n_lines} "
                          f"line{'s' if n_lines != 1 else ''}: pass from_line in 1..{n_lines}")
    start = _line_start(text, from_line)
    if max_lines is None or from_line + max_lines > n_lines:
        return start, len(text)
    return start, _line_start(text, from_line + max_lines, start, from_line)


def _line_start(text: str, line: int, pos: int = 0, at: int = 1) -> int:
    """Offset where 1-based ``line`` begins, counting on from ``pos``, the start of line ``at``."""
    for _ in range(line - at):
        pos = text.index("\n", pos) + 1
    return pos


def check_ranges(start: Any, end: Any, lines: tuple | None) -> None:
    """A character range and a line range cannot both be given."""
    if lines is not None and (start is not None or end is not None):
        raise SearchError("give a character range (start, end) or a line range (from_line, max_lines), not both")


# -- one document ----------------------------------------------------------------------------

def _restricted(principal: Any) -> bool:
    return principal is not None and not principal.admin


def readable_docno(vs: "VersionSearcher", doc_id: str, principal: Any) -> int | None:
    """The docno of ``doc_id``, or None where this version lacks it or ``principal`` may not
    read it (the two answer alike)."""
    n = vs.index.docs.docno_of(doc_id)
    if n is not None and _restricted(principal):
        mask = vs.mask(None, principal)
        if mask is not None and not mask.allows_docno(n):
            n = None
    return n


def get_document(vs: "VersionSearcher", doc_id: str, start: int | None = None, end: int | None = None, *,
                 from_line: Any = None, max_lines: Any = None, fields: Any = None, principal: Any = None,
                 max_chars: int | None = None) -> dict | None:
    """``VersionSearcher.get_document``: the stored document cut to a range (characters or
    lines), with the ``fields`` asked for; None for a missing or forbidden id."""
    wanted = check_fields(fields, known_fields(vs.index.manifest, _restricted(principal)))
    lines = check_lines(from_line, max_lines)
    check_ranges(start, end, lines)
    n = readable_docno(vs, doc_id, principal)
    if n is None:
        return None
    return _fetch(vs, n, start, end, lines, wanted, _restricted(principal),
                  MAX_RANGE_CHARS if max_chars is None else max_chars)


def _fetch(vs: "VersionSearcher", n: int, start, end, lines, wanted, restricted: bool, max_chars: int) -> dict:
    """One document's answer within ``max_chars`` characters: its title (at most
    ``bounds.MAX_TITLE_CHARS``), its fields (at most ``bounds.MAX_FIELDS_CHARS`` of JSON), then
    its text in what is left (``serving.answers.bounds``); ``title_length`` / ``fields_truncated`` say
    what was cut."""
    docs = vs.index.docs
    doc = docs.get(n)
    if lines is not None:
        start, end = line_offsets(doc["text"] or "", doc["doc_id"], *lines)
    title, title_cut = bounds.cut(doc["title"], min(bounds.MAX_TITLE_CHARS, max_chars - 1))
    left = max_chars - len(title)
    fields = fields_cut = None
    if wanted:
        fields, fields_cut = bounds.bound_json(select_fields(docs.fields_json(n), wanted, restricted),
                                               min(bounds.MAX_FIELDS_CHARS, left - 1))
        left -= bounds.json_chars(fields)
    out = text_range({**doc, "title": title} if title_cut else doc, start, end, max(left, 1))
    if title_cut:
        out["title_length"] = len(doc["title"])
    if wanted:
        out["fields"] = fields
        if fields_cut:
            out["fields_truncated"] = True
    return out


# -- several ---------------------------------------------------------------------------------

def check_pattern(name: str, value: Any) -> str | None:
    """An id ``prefix`` or ``glob`` as given: a string of at most `MAX_PATTERN_CHARS`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise SearchError(f"{name} is a string of the ids' first characters"
                          + (" with * ? [...] wildcards" if name == "glob" else "") + f", got {type(value).__name__}")
    if len(value) > MAX_PATTERN_CHARS:
        raise SearchError(f"{name} has {len(value)} characters; at most {MAX_PATTERN_CHARS}")
    return value


def _matching_positions(vs: "VersionSearcher", prefix: str | None, glob: str | None, principal: Any) -> np.ndarray:
    """Global positions, in id order, of the documents whose id starts with ``prefix`` or
    matches ``glob`` (``fnmatch``, case-sensitive: ``*`` any characters, ``/`` included) and
    that ``principal`` may read. A glob narrows to its literal head by binary search, then
    matches each id there."""
    docs = vs.index.docs
    head = prefix or ""
    if glob is not None:
        wild = _GLOB.search(glob)
        head = glob[:wild.start()] if wild else glob
    lo, hi = docs.id_range(head)
    pos = docs.sorted_positions()[lo:hi]
    if glob is not None:
        rx = re.compile(fnmatch.translate(glob))
        ids = docs.ids_at(pos)
        pos = pos[np.fromiter((rx.match(i) is not None for i in ids), dtype=bool, count=len(ids))]
    if _restricted(principal):
        mask = vs.mask(None, principal)
        if mask is not None and mask.allow is not None:
            pos = pos[mask.allow[pos]]
    return pos


def matching_ids(vs: "VersionSearcher", prefix: str | None, glob: str | None, principal: Any,
                 limit: int) -> tuple[list[str], int]:
    """(the first ``limit`` ids, in id order, that start with ``prefix`` or match ``glob`` and
    that ``principal`` may read; how many there are)."""
    pos = _matching_positions(vs, prefix, glob, principal)
    return vs.index.docs.ids_at(pos[:limit]).tolist(), int(len(pos))


def get_documents(vs: "VersionSearcher", doc_ids: list[str] | None, start=None, end=None, *,
                  prefix: Any = None, glob: Any = None, from_line: Any = None, max_lines: Any = None,
                  fields: Any = None, principal: Any = None, max_chars: int | None = None,
                  max_ids: int) -> dict:
    """``VersionSearcher.get_documents``: see there."""
    given = [name for name, v in (("doc_ids", doc_ids), ("prefix", prefix), ("glob", glob)) if v is not None]
    if len(given) != 1:
        raise SearchError("name the documents one way: doc_ids (a list), an id prefix, or an id glob"
                          + (f"; got {' and '.join(given)}" if given else ""))
    prefix, glob = check_pattern("prefix", prefix), check_pattern("glob", glob)
    restricted = _restricted(principal)
    wanted = check_fields(fields, known_fields(vs.index.manifest, restricted))
    lines = check_lines(from_line, max_lines)
    check_ranges(start, end, lines)
    matched = None
    if doc_ids is None:
        doc_ids, matched = matching_ids(vs, prefix, glob, principal, max_ids)
    doc_ids = list(doc_ids)
    if len(doc_ids) > max_ids:
        raise SearchError(f"{len(doc_ids)} doc_ids; at most {max_ids} per call: split them into several calls")
    ids = list(dict.fromkeys(doc_ids))
    limit = MAX_RANGE_CHARS if max_chars is None else max_chars
    budget = limit
    docs, missing, deferred = [], [], []
    for doc_id in ids:
        if budget <= 0:
            deferred.append(doc_id)
            continue
        n = readable_docno(vs, doc_id, principal)
        if n is None:
            missing.append(doc_id)
            continue
        doc = _fetch(vs, n, start, end, lines, wanted, restricted, budget)
        budget -= len(doc["text"]) + len(doc["title"] or "") + bounds.json_chars(doc.get("fields"))
        docs.append(doc)
    out = {"version": vs.version, "documents": docs, "missing": missing, "deferred": deferred, "max_chars": limit}
    if matched is not None:
        out["matched"] = matched
    return out


# -- listing ---------------------------------------------------------------------------------

def check_page(offset: Any, limit: Any) -> tuple[int, int]:
    """A listing's ``offset`` (default 0) and ``limit`` (default `DEFAULT_LIST_LIMIT`,
    at most `MAX_LIST_LIMIT`)."""
    a = _whole("offset", offset, 0, MAX_LIST_OFFSET)
    n = _whole("limit", limit, 1, MAX_LIST_LIMIT)
    return a or 0, DEFAULT_LIST_LIMIT if n is None else n


def list_documents(vs: "VersionSearcher", prefix: Any = None, *, glob: Any = None, offset: Any = None,
                   limit: Any = None, fields: Any = None, principal: Any = None) -> dict:
    """``VersionSearcher.list_documents``: see there."""
    if prefix is not None and glob is not None:
        raise SearchError("give an id prefix or an id glob, not both")
    prefix, glob = check_pattern("prefix", prefix), check_pattern("glob", glob)
    offset, limit = check_page(offset, limit)
    restricted = _restricted(principal)
    wanted = check_fields(fields, known_fields(vs.index.manifest, restricted))
    pos = _matching_positions(vs, prefix, glob, principal)
    docs = vs.index.docs
    page = []
    budget = bounds.MAX_ANSWER_CHARS  # titles and fields of the page (serving.answers.bounds): it ends early past it
    for n in docs.docnos_at(pos[offset:offset + limit]).tolist():
        if budget <= 0:
            break
        doc = docs.get(n)
        title, title_cut = bounds.cut(doc["title"], min(bounds.MAX_TITLE_CHARS, budget))
        entry = {"doc_id": doc["doc_id"], "title": title, "length": len(doc["text"] or "")}
        if title_cut:
            entry["title_length"] = len(doc["title"])
        budget -= len(title)
        if wanted:
            entry["fields"], fields_cut = bounds.bound_json(select_fields(docs.fields_json(n), wanted, restricted),
                                                            min(bounds.MAX_FIELDS_CHARS, budget))
            budget -= bounds.json_chars(entry["fields"])
            if fields_cut:
                entry["fields_truncated"] = True
        page.append(entry)
    total = int(len(pos))
    end = offset + len(page)  # a page cut short by the bound goes on from where it stopped
    nxt = end if end < total else None
    return {"version": vs.version, "prefix": prefix, "glob": glob, "offset": offset, "limit": limit,
            "total": total, "next_offset": nxt, "documents": page}
