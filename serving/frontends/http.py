"""HTTP front end (FastAPI): the same ``search()`` the CLI and MCP call, as JSON.

    funnel serve INDEX_ROOT [--host 127.0.0.1] [--port 8765] [--token TOKEN] [--insecure]
                            [--max-body-bytes 1048576] [--body-timeout 30] [--header-timeout 10]
                            [--keep-alive-timeout 5] [--max-connections 256]

    POST /search            {"query": "...", "mode": "hybrid", "k": 10, "budget": 1000, "options": {}}
                            -> SearchResult.to_dict(): {query, mode, summary, hits, trace}
                               (mode: default hybrid where the index has vectors, else bm25;
                               summary: the hits with their best passages quoted, within
                               budget tokens)
    GET  /documents/{id}?start=&end=
                            -> {doc_id, title, text, content_hash, shard, local_id, start, end,
                                length, line_start, line_end, truncated, next_start}
                               (text: characters [start, end) of the document's text, as a
                               hit's citation gives them; no range: from 0 to the end; at most
                               MAX_RANGE_CHARS characters per answer, the rest from next_start)
    POST /documents         {"ids": [...], "start"?, "end"?} -> {version, documents, missing,
                               deferred, max_chars} (``Searcher.get_documents``: at most
                               MAX_DOCUMENT_IDS ids, MAX_RANGE_CHARS characters in all)
    POST /term_stats        {"terms": ["..."]} -> {"version", "n_docs", "stats": [{term, forms, note}]}
                               (each term once; forms: [{analyzed, df, cf, idf}], one per distinct
                               analysed token; none for a stopword, and ``note`` says so)
    GET  /health            -> {status, version, n_docs, modes, refresh_error, damaged}
                               (modes: only those this index version can answer; status
                               ok | degraded | unavailable, the last with HTTP 503 and
                               every search a 503 too; damaged: [{version, file, reason,
                               since}] of versions the background scrub quarantined)
    GET  /status            -> /health's answer plus n_passages, dense, fields, access_control,
                               restricted, as the caller sees them (`index_status`)

Every error body is ``{"error": "<what was wrong and what to do>"}``; see ``ERROR_STATUS``.
Every input is bounded before any work (see "Limits" below): the body size before the
token check and before it is read, and the time the body may take to arrive
(`RequestGuard`), then the fields (term count and length, options, k), then every
option value, a finite number in its range (``serving/options.py``, in ``search()``); what
is over a limit, or is not text (a lone surrogate), is a 4xx naming the limit, never a 500.
Connections are bounded by ``serving/frontends/connections.py`` (a request head within
``--header-timeout``, idle ones closed after ``--keep-alive-timeout``, at most
``--max-connections`` open). With a token, every path but ``/health`` needs
``Authorization: Bearer TOKEN``, ``/docs`` and ``/openapi.json`` included. Beyond loopback, `serve` refuses to start without
a token unless told ``insecure=True`` (``--insecure``).
The searcher is read-only, so requests run concurrently in the threadpool (``def``
endpoints); at most once a second a request first checks whether CURRENT moved and, if so,
swaps in the newly published version (no restart needed).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections import deque
from typing import Annotated, Any, Callable, Iterable

import anyio
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, field_validator, model_validator
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from funnel.pipelines.store.artifacts import IndexFormatError

from ..answers.citations import MAX_RANGE_CHARS
from ..documents import MAX_FIELD_NAME_CHARS, MAX_FIELD_NAMES, MAX_PATTERN_CHARS
from .connections import ConnectionLimits, uvicorn_config
from .safejson import nesting_depth
from .scrub import ScrubConfig, start_scrub
from ..search import (MAX_DOCUMENT_IDS, MAX_K, MAX_PASSAGES_PER_HIT, MAX_QUERY_CHARS, ModeUnavailable, Searcher,
                     SearchError, open_index)
from ..answers.summary import DEFAULT_BUDGET, MAX_BUDGET, MIN_BUDGET

log = logging.getLogger(__name__)

# -- Limits ----------------------------------------------------------------------------------
# Bounds against abuse, not relevance limits; each is named in the error that enforces it.
#: Request body, in bytes (``--max-body-bytes``): a 100,000-character query is ~100 kB of JSON.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Seconds from the first read of a request body until all of it must have arrived
#: (``--body-timeout``), else 408: a client that declares a body and stalls (or trickles it)
#: would hold its connection and buffer open forever. A 1 MiB body at 50 kB/s takes 20 s.
DEFAULT_BODY_TIMEOUT_S = 30.0
#: ``/term_stats``: terms per request and characters per term. A term is a word or two to
#: look up; 256 characters analyse to at most ~128 tokens.
MAX_TERMS = 100
MAX_TERM_CHARS = 256
#: ``/search`` options: keys per request, characters per key and per string value, values
#: (list and object elements, nested ones included) per option, nesting depth, integer size.
#: The richest real option, ``blend_tiers``, is a handful of [rank, weight] pairs.
MAX_OPTIONS = 32
MAX_OPTION_KEY_CHARS = 64
MAX_OPTION_STR_CHARS = 256
MAX_OPTION_ITEMS = 32
MAX_OPTION_DEPTH = 2
MAX_OPTION_INT = 10**9
MAX_MODE_CHARS = 64
#: ``/documents``: the largest character offset taken for ``start`` or ``end``, far past any
#: stored text (a text is bounded at build time, 16 MiB by default: ``pipelines/sources/limits.py``);
#: a larger one is a mistake. Within it, an ``end`` past a text stops at its end.
MAX_OFFSET = 2**31 - 1
#: Validation errors listed in one message; the rest are counted.
MAX_LISTED_ERRORS = 5
#: JSON levels a request body may nest, measured before it is parsed (Python's parser raises
#: RecursionError near 1,000): a search's filter takes at most ~20 (``filters.MAX_DEPTH``
#: levels of and/or/not), an MCP request's envelope 4 more.
MAX_BODY_DEPTH = 64

# Exception class -> HTTP status. Looked up along the exception's MRO, so the most
# specific class wins (IndexFormatError and SearchError are both ValueErrors).
ERROR_STATUS: dict[type[Exception], int] = {
    ModeUnavailable: 400,
    SearchError: 400,
    IndexFormatError: 503,
}

# search() parameters that may not be smuggled in through "options".
_RESERVED_OPTIONS = frozenset({"query", "mode", "k", "budget", "passages_per_hit", "offset", "from", "fields"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a listen address) is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, insecure: bool, what: str, flag: str = "--token") -> None:
    """Refuse to listen beyond loopback without a token, unless ``insecure`` (then warn, loudly).

    Raises
    ------
    ValueError
        ``host`` is not loopback, there is no token and ``insecure`` is false.
    """
    if token or is_loopback(host):
        return
    if not insecure:
        raise ValueError(
            f"refusing to serve {what} on {host} without a token: anyone who can reach this host "
            f"could use it. Pass {flag} TOKEN (or set FUNNEL_TOKEN), listen on 127.0.0.1, or pass "
            "--insecure to run without authentication anyway")
    log.warning("INSECURE: %s listens on %s with no authentication (--insecure): anyone who can "
                "reach this host can use it. Pass %s TOKEN (or set FUNNEL_TOKEN) to require one.",
                what, host, flag)


def text_problem(value: str) -> str | None:
    """Why ``value`` is not text we can answer with (a lone surrogate), or None if it is.

    JSON may carry ``"\\ud800"``, which decodes to a string that cannot be encoded as UTF-8:
    it would fail deep in analysis or in writing the response, as a 500.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"contains a lone surrogate ({value[e.start]!a} at character {e.start}), which is not "
                "text: send valid Unicode (a surrogate only as half of a pair)")
    return None


def _text(value: Any) -> Any:
    # Before pydantic's own str check, whose message ("unable to parse raw data") says less.
    if isinstance(value, str) and (why := text_problem(value)) is not None:
        raise ValueError(why)
    return value


Text = Annotated[str, BeforeValidator(_text)]
Term = Annotated[str, BeforeValidator(_text), Field(max_length=MAX_TERM_CHARS)]
FieldName = Annotated[str, BeforeValidator(_text), Field(max_length=MAX_FIELD_NAME_CHARS)]
FieldNames = Annotated[list[FieldName], Field(max_length=MAX_FIELD_NAMES)]


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Bound the ``options`` of a search (see "Limits"); raise ValueError naming the limit."""
    if len(options) > MAX_OPTIONS:
        raise ValueError(f"{len(options)} options; at most {MAX_OPTIONS}")
    for key, value in options.items():
        if len(key) > MAX_OPTION_KEY_CHARS:
            raise ValueError(f"an option name has {len(key)} characters; at most {MAX_OPTION_KEY_CHARS}")
        if (why := text_problem(key)) is not None:
            raise ValueError(f"an option name {why}")
        items = 0
        todo = [(value, 0)]
        while todo:
            x, depth = todo.pop()
            if isinstance(x, str):
                if len(x) > MAX_OPTION_STR_CHARS:
                    raise ValueError(f"option {key!r}: a string of {len(x)} characters; at most "
                                     f"{MAX_OPTION_STR_CHARS}")
                if (why := text_problem(x)) is not None:
                    raise ValueError(f"option {key!r} {why}")
            elif isinstance(x, bool) or x is None or isinstance(x, float):
                pass
            elif isinstance(x, int):
                if abs(x) > MAX_OPTION_INT:
                    raise ValueError(f"option {key!r}: integers are at most {MAX_OPTION_INT:,} "
                                     "in absolute value")
            elif isinstance(x, (list, dict)):
                if depth >= MAX_OPTION_DEPTH:
                    raise ValueError(f"option {key!r}: nested deeper than {MAX_OPTION_DEPTH} levels")
                items += len(x)
                if items > MAX_OPTION_ITEMS:
                    raise ValueError(f"option {key!r}: more than {MAX_OPTION_ITEMS} values")
                if isinstance(x, dict):
                    for k in x:
                        todo.append((k, depth + 1))
                    x = list(x.values())
                todo.extend((y, depth + 1) for y in x)
            else:
                raise ValueError(f"option {key!r}: {type(x).__name__} is not an option value")
    bad = sorted(_RESERVED_OPTIONS.intersection(options))
    if bad:
        raise ValueError(f"{', '.join(bad)}: set at the top level of the body, not in options")
    return options


class SearchRequest(BaseModel):
    """Body of ``POST /search``."""

    model_config = ConfigDict(extra="forbid")

    query: Text = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="the text to search for")
    mode: Text | None = Field(None, max_length=MAX_MODE_CHARS,
                              description="retrieval mode, e.g. bm25, dense, hybrid (default: hybrid where the index "
                                          "has vectors, else bm25)")
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="number of hits to return")
    budget: StrictInt | None = Field(None, ge=MIN_BUDGET, le=MAX_BUDGET,
                                     description="most tokens of the summary, which quotes the hits' best passages "
                                                 f"(default {DEFAULT_BUDGET})")
    passages_per_hit: StrictInt | None = Field(None, ge=1, le=MAX_PASSAGES_PER_HIT,
                                               description="ranked passages each hit carries (default 1)")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="mode parameters, e.g. {\"k1\": 0.9, \"b\": 0.4}; at most "
                                                f"{MAX_OPTIONS}, each a number, a short string or a short list")
    filter: dict[str, Any] | None = Field(None, description="only documents matching it, e.g. {\"kind\": \"runbook\", "
                                                          "\"year\": {\"gte\": 2024}} (serving/filters.py)")
    offset: StrictInt = Field(0, ge=0, le=MAX_K - 1, description="hits to skip (also \"from\"); offset + k is at "
                                                                 f"most {MAX_K}")
    fields: FieldNames | FieldName | None = Field(None, description="stored fields to add to each hit: names, or "
                                                                "\"*\" for all of them (default: none)")

    @model_validator(mode="before")
    @classmethod
    def _from_is_offset(cls, body: Any) -> Any:
        # Elasticsearch's name for the same thing; both at once would be ambiguous
        if isinstance(body, dict) and "from" in body:
            if "offset" in body:
                raise ValueError("give offset or from (the same thing), not both")
            body = {("offset" if key == "from" else key): v for key, v in body.items()}
        return body

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the query is blank: pass the text to search for")
        return v

    @field_validator("options")
    @classmethod
    def _bounded(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_options(v)


class TermStatsRequest(BaseModel):
    """Body of ``POST /term_stats``."""

    model_config = ConfigDict(extra="forbid")

    terms: list[Term] = Field(min_length=1, max_length=MAX_TERMS,
                              description=f"words to look up: at most {MAX_TERMS}, of at most "
                                          f"{MAX_TERM_CHARS} characters each")


#: ``/documents/{id}``'s query parameters; any other is refused (a misspelt ``strat`` would
#: otherwise fetch from the beginning without a word).
RANGE_PARAMS = ("start", "end", "from_line", "max_lines", "fields")
#: ``GET /documents``'s query parameters (a page of the list, ``Searcher.list_documents``).
LIST_PARAMS = ("prefix", "glob", "offset", "limit", "fields")


def check_range(start: Any = None, end: Any = None) -> tuple[int | None, int | None]:
    """``start`` and ``end`` of a document range: character offsets into its text, as a hit's
    citation gives them (None: from the beginning, to the end). Text (a query parameter) is
    read as a whole number. Checked before the document is looked up, so a bad range answers
    the same whether or not the document exists; whether ``start`` falls within a given
    document is ``citations.text_range``'s check.

    Raises
    ------
    SearchError
        A value that is not a whole number, is negative or over `MAX_OFFSET`, or an end
        before the start; the message names the parameter and what to pass instead.
    """
    got: list[int | None] = []
    for name, v in (("start", start), ("end", end)):
        if v is None:
            got.append(None)
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:  # str() refuses 4,300+ digits
            shown = f"a number of about {v.bit_length() * 0.30103:.0f} digits"
        else:
            shown = repr(v) if isinstance(v, (str, bool, int)) else f"a {type(v).__name__}"
            shown = shown if len(shown) <= 40 else shown[:39] + "…"
        if isinstance(v, str):
            digits = v.strip().removeprefix("-")
            if digits.isascii() and digits.isdigit():  # not "1e3", "+5", "5.0" or other scripts' digits
                v = (-1 if v.strip().startswith("-") else 1) * (int(digits) if len(digits) <= 18 else MAX_OFFSET + 1)
        if isinstance(v, bool) or not isinstance(v, int):
            raise SearchError(f"{name} must be a whole number of characters, got {shown}: pass e.g. {name}=0, "
                              f"or leave it out to read {'from the beginning' if name == 'start' else 'to the end'}"
                              " of the text")
        if v < 0:
            raise SearchError(f"{name} is {shown}: offsets count characters from 0; pass {name} >= 0")
        if v > MAX_OFFSET:
            raise SearchError(f"{name} is {shown}, over {MAX_OFFSET:,}: past the end of any document. Pass an offset "
                              "within the document (every answer gives its length), or leave end out to read "
                              f"to the end (at most {MAX_RANGE_CHARS:,} characters per answer; continue "
                              "from next_start)")
        got.append(v)
    if got[0] is not None and got[1] is not None and got[1] < got[0]:
        raise SearchError(f"end {got[1]} is before start {got[0]}: pass end >= start, or leave end out to read "
                          "to the end of the text")
    return got[0], got[1]


def range_params(params) -> tuple[int | None, int | None]:
    """`check_range` of a request's query parameters (a Starlette ``QueryParams``):
    only `RANGE_PARAMS`, each at most once."""
    seen = query_params(params, RANGE_PARAMS)
    return check_range(seen.get("start"), seen.get("end"))


def query_params(params, valid: tuple[str, ...]) -> dict[str, str]:
    """A request's query parameters (a Starlette ``QueryParams``) as a dict: only ``valid``
    names, each at most once, else a SearchError naming the valid ones."""
    items = params.multi_items()
    unknown = sorted({k for k, _ in items} - set(valid))
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise SearchError(f"unknown query parameter(s) {shown}; valid: {', '.join(valid)}")
    seen: dict[str, str] = {}
    for k, v in items:
        if k in seen:
            raise SearchError(f"{k} is given more than once; pass it once")
        seen[k] = v
    return seen


class DocumentsRequest(BaseModel):
    """Body of ``POST /documents``."""

    model_config = ConfigDict(extra="forbid")

    ids: list[Text] | None = Field(None, min_length=1, max_length=MAX_DOCUMENT_IDS,
                                   description=f"doc_ids from search hits: at most {MAX_DOCUMENT_IDS}; a repeated one "
                                               "is answered once")
    prefix: Text | None = Field(None, max_length=MAX_PATTERN_CHARS,
                                description=f"instead of ids: the first {MAX_DOCUMENT_IDS} ids starting with it")
    glob: Text | None = Field(None, max_length=MAX_PATTERN_CHARS,
                              description=f"instead of ids: the first {MAX_DOCUMENT_IDS} ids matching it (* ? [...])")
    start: StrictInt | None = Field(None, description="first character of each document's text (default 0)")
    end: StrictInt | None = Field(None, description="character after the last one (default: the end of the text)")
    from_line: StrictInt | None = Field(None, description="instead of start/end: the first line (1-based)")
    max_lines: StrictInt | None = Field(None, description="lines from from_line (default: to the end)")
    fields: FieldNames | FieldName | None = Field(None, description="field names to add to each document, or \"*\" "
                                                                "for all of them (default: none)")


def get_documents(searcher: Searcher, ids: list[str] | None, start: Any = None, end: Any = None,
                  principal=None, **named: Any) -> dict[str, Any]:
    """``POST /documents`` (and the MCP ``get_documents`` tool): the range checked first
    (`check_range`), then ``Searcher.get_documents`` on one index version (``named``:
    its ``prefix``, ``glob``, ``from_line``, ``max_lines``, ``fields``), its answer with the
    range asked for added as ``start`` and ``end``."""
    a, b = check_range(start, end)
    return {**searcher.get_documents(ids, a, b, principal=principal, **named), "start": a, "end": b}


def search_with_options(searcher: Searcher, query: str, mode: str | None, k: int, options: dict[str, Any],
                        filter: dict[str, Any] | None = None, principal=None, budget: int | None = None,
                        passages_per_hit: int | None = None, **page: Any):
    """``searcher.search`` for a front end (``/search``, the MCP ``search`` tool).

    Every number is checked before the search (``serving/options.py``); an option value
    that only a mode can judge (``length_norm=5``) surfaces as a TypeError or ValueError
    deep in it, and becomes a `SearchError` naming the options (a 400, a tool error).
    ``page``: ``offset`` and ``fields``, as ``search`` takes them.
    """
    try:
        return searcher.search(query, mode=mode, k=k, filter=filter, principal=principal, budget=budget,
                               passages_per_hit=passages_per_hit, **page, **options)
    except SearchError:
        raise
    except (TypeError, ValueError) as e:
        if not options or isinstance(e, IndexFormatError):
            raise
        shown = repr(options)
        shown = shown if len(shown) <= 300 else shown[:299] + "…"
        raise SearchError(f"invalid options {shown} for mode {mode!r}: {e}") from e


def term_stats(searcher: Searcher, terms: list[str], principal=None) -> dict[str, Any]:
    """``/term_stats`` (and the MCP tool): each term once, with its distinct analysed forms.

    ``Searcher.term_stats`` gives one row per analysed token, each repeating the raw term;
    here the rows are grouped back under their term, so the answer grows with the number of
    distinct tokens, not with tokens times term length. Callers bound ``terms`` first
    (`MAX_TERMS`, `MAX_TERM_CHARS`). As a ``principal`` that is not an
    administrator, the counts are over the documents it may read and idf is None
    (``Searcher.term_stats``).
    """
    stats = []
    n_docs = searcher.index.n_docs
    for raw in terms:
        forms: dict[str, dict[str, Any]] = {}
        note = None
        for row in searcher.term_stats([raw], principal=principal):
            if row["analyzed"] is None:
                note = row.get("note")
            elif row["analyzed"] not in forms:
                forms[row["analyzed"]] = {"analyzed": row["analyzed"], "df": row["df"], "cf": row["cf"],
                                          "idf": row["idf"]}
        stats.append({"term": raw, "forms": list(forms.values()), "note": note})
    if principal is not None and not principal.admin and (mask := searcher.mask(None, principal)) is not None:
        n_docs = mask.count  # the documents this caller may read
    return {"version": searcher.version, "n_docs": n_docs, "stats": stats}


class RefreshThrottle:
    """Calls ``searcher.refresh()`` at most once per ``interval`` seconds.

    A failed refresh (say a broken publication) is logged and remembered in ``error``;
    the searcher keeps serving the version it has.
    """

    def __init__(self, searcher: Searcher, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.searcher = searcher
        self.interval = interval
        self.clock = clock
        self.error: str | None = None
        self._last = clock()
        self._lock = threading.Lock()

    def __call__(self) -> None:
        if self.clock() - self._last < self.interval:
            return
        if not self._lock.acquire(blocking=False):
            return  # another request is checking right now
        try:
            if self.clock() - self._last < self.interval:
                return
            try:
                self.searcher.refresh()
                self.error = None
            except (IndexFormatError, OSError) as e:
                if str(e) != self.error:
                    log.error("could not open the newly published version; still serving %s: %s",
                              self.searcher.version, e)
                self.error = str(e)
            finally:
                self._last = self.clock()
        finally:
            self._lock.release()


def servable_modes(searcher: Searcher) -> list[str]:
    """The modes this index version can answer now, in registry order.

    ``dense`` and ``hybrid`` need vectors (``funnel build --dense``); every mode must also
    pass the searcher's own checks with its default options (an empty batch runs those
    checks and no query), which is where a mode that needs something this setup lacks
    (a SIRA proposer without its model, a mode not built yet) says ``ModeUnavailable``.
    """
    out = []
    for mode in searcher.modes():
        if mode in ("dense", "hybrid") and not searcher.dense_mode.available:
            continue
        try:
            searcher.search_batch({}, mode=mode, k=1)
        except ModeUnavailable:
            continue
        out.append(mode)
    return out


def health_of(searcher: Searcher) -> tuple[dict[str, Any], int]:
    """``GET /health``'s body and status code: 503 with ``n_docs`` None and no modes when
    nothing verified is left to serve (every search is then a 503 too), else 200."""
    st = searcher.status()
    body = {"status": st["state"], "version": st["serving_version"], "n_docs": None, "modes": [],
            "refresh_error": st["reason"], "current": st["current"], "degraded_since": st["since"],
            "damaged": searcher.follower.damaged()}  # versions the background scrub quarantined
    if st["state"] == "unavailable":
        return body, 503
    return dict(body, n_docs=searcher.index.n_docs, modes=servable_modes(searcher)), 200


def index_status(searcher: Searcher, principal=None) -> dict[str, Any]:
    """``GET /status`` and the MCP ``status`` tool: `health_of`'s body plus what an agent
    plans its calls with, as ``principal`` sees it.

    Adds ``dense`` (the index has vectors; ``modes`` says whether they can be searched now),
    ``n_passages`` (passages stored, one vector each; None for an index that stores none),
    ``fields`` (``{name: type}`` a ``filter`` may name), ``access_control`` (documents carry
    ACLs, or an absent ACL means private) and ``restricted`` (this caller reads only what
    ACLs allow). As a principal that is not an administrator, counts follow ``/term_stats``:
    ``n_docs`` counts the documents it may read, and ``n_passages``, a count over every
    document, is None.
    """
    body, code = health_of(searcher)
    if code != 200:
        return dict(body, dense=False, n_passages=None, fields={}, access_control=None, restricted=None)
    from funnel.pipelines.sources.fields import ACL_FIELD

    from ..dense import shard_entries
    manifest = searcher.index.manifest
    section = manifest.get("fields") or {}
    schema = dict(section.get("schema") or {})
    dense = manifest.get("dense") or {}
    n_passages = sum(int(sh.get("count", 0)) for sh in shard_entries(dense)) if dense.get("passages") else None
    restricted = principal is not None and not principal.admin
    if restricted:
        mask = searcher.mask(None, principal)
        body["n_docs"] = mask.count if mask is not None else body["n_docs"]
        n_passages = None
    return dict(body, dense=bool(dense), n_passages=n_passages,
                fields={k: v for k, v in sorted(schema.items()) if k != ACL_FIELD},
                access_control=ACL_FIELD in schema or section.get("acl_absent", "public") == "private",
                restricted=restricted)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    # A message quoting the caller's text must still encode; anything not text is escaped.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    errors = exc.errors()
    for err in errors[:MAX_LISTED_ERRORS]:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        field = ".".join(loc) or "body"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        if err.get("type") == "missing":
            msg = "field required"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{field}: {msg}")
    if len(errors) > MAX_LISTED_ERRORS:
        parts.append(f"and {len(errors) - MAX_LISTED_ERRORS} more")
    return "invalid request: " + "; ".join(parts)


def _install_error_handlers(app: FastAPI) -> None:
    async def mapped(request: Request, exc: Exception) -> JSONResponse:
        status = next(ERROR_STATUS[c] for c in type(exc).__mro__ if c in ERROR_STATUS)
        if status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, exc)
        return _error(status, str(exc))

    for cls in ERROR_STATUS:
        app.add_exception_handler(cls, mapped)

    async def validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, _validation_message(exc))

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still JSON; the traceback goes to the server's log.
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the details")

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def allowed_hosts(host: str, extra: Iterable[str] = ()) -> list[str]:
    """Host header values the streamable HTTP server accepts (DNS-rebinding protection).

    The loopback names always; ``host`` itself when it names one address; for a wildcard
    (``0.0.0.0``, ``::``) this machine's host name, fully qualified name and their addresses;
    and ``extra`` (``--allow-host``). Each with any port (``name:*``) and without one.
    """
    names = {"127.0.0.1", "localhost", "::1"}
    if host in ("0.0.0.0", "::", ""):
        hostname = socket.gethostname()
        names |= {hostname, socket.getfqdn()}
        try:
            names |= {str(info[4][0]) for info in socket.getaddrinfo(hostname, None)}
        except OSError:  # a host name that does not resolve: names only
            pass
    else:
        names.add(host)
    names |= {e.strip() for e in extra if e.strip()}
    out = []
    for name in sorted(n.lower() for n in names):
        if _is_ipv6(name):  # bracketed, as in a Host header
            name = f"[{name}]"
        out += [name, f"{name}:*"]
    return out


def _is_ipv6(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).version == 6
    except ValueError:
        return False


def check_body_timeout(seconds: float) -> float:
    """``seconds`` as a body timeout, or ValueError: a finite number above 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"body_timeout_s must be a finite number of seconds above 0, got {seconds!r}")
    return float(seconds)


#: Where `RequestGuard` leaves the authenticated caller in the ASGI scope.
PRINCIPAL_KEY = "funnel.principal"


def caller_of(header: bytes, admin: bytes | None, tokens) -> Any:
    """The principal an ``Authorization`` header authenticates: the administrator for the
    single token (``b"Bearer TOKEN"`` in ``admin``), a tokens file's principal, or None."""
    from ..principals import ADMIN
    if admin is not None and secrets.compare_digest(header, admin):
        return ADMIN
    if tokens is not None and header.startswith(b"Bearer "):
        try:
            return tokens.lookup(header[7:].decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return None


def principal_of(request: Request) -> Any:
    """The caller `RequestGuard` authenticated (None: no authentication, every document)."""
    return request.scope.get(PRINCIPAL_KEY)


class RequestGuard:
    """ASGI middleware: what a request must pass before the app sees it, cheapest check first.

    0. With ``hosts`` (`allowed_hosts` patterns), a ``Host`` header naming another
       host: 421 (DNS-rebinding protection: a web page's script cannot reach a loopback
       server through a name it controls).
    1. A declared ``Content-Length`` over ``max_body_bytes``: 413, before anything is read
       and before the token check.
    2. With a ``token``, a missing or wrong ``Authorization: Bearer TOKEN`` on any path but
       ``open_paths``: 401, before the body is read.
    3. The body, counted as it streams in (a chunked body declares no length): past
       ``max_body_bytes``, 413; not all there ``body_timeout_s`` seconds after its reading
       began (a stalled or trickled body), 408. What was read (at most ``max_body_bytes``)
       is replayed to the app, which never sees an oversized or partial body.
    4. The body's JSON nesting, measured before anything parses it: deeper than
       `MAX_BODY_DEPTH` levels, 400 (with ``jsonrpc``, the MCP app's, the body is a
       JSON-RPC error, which an MCP client shows its caller).

    Answers are ``{"error": ...}`` JSON; a 413 or 408 closes the connection (the rest of
    the body is never read). Wraps any ASGI app: the HTTP API and the MCP server's.
    """

    def __init__(self, app: ASGIApp, *, token: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, open_paths: frozenset[str] = frozenset(),
                 hosts: Iterable[str] | None = None, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 tokens=None, jsonrpc: bool = False):
        if max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be 0 or more, got {max_body_bytes}")
        self.body_timeout_s = check_body_timeout(body_timeout_s)
        self.app = app
        pats = list(hosts) if hosts is not None else None
        self._hosts = None if pats is None else {p for p in pats if not p.endswith(":*")}
        self._any_port = None if pats is None else {p[:-2] for p in pats if p.endswith(":*")}
        self.max_body_bytes = max_body_bytes
        self.open_paths = open_paths
        self._expected = f"Bearer {token}".encode() if token else None
        self.tokens = tokens  # principals.TokenFile: per-caller tokens (--tokens), beside the admin's
        self.jsonrpc = jsonrpc

    def _host_ok(self, value: str) -> bool:
        v = value.strip().lower()
        if v in self._hosts:
            return True
        name, sep, port = v.rpartition(":")
        return bool(sep) and port.isdigit() and name in self._any_port

    def _too_large(self, what: str) -> JSONResponse:
        return _error(413, f"request body too large: {what}; the limit is {self.max_body_bytes:,} bytes "
                           "(funnel serve / funnel mcp --max-body-bytes)", headers={"Connection": "close"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._hosts is not None and not self._host_ok(headers.get("host", "")):
            await _error(421, f"Host {headers.get('host', '')[:80]!r} is not served here (DNS-rebinding protection); "
                              "start the server with --allow-host NAME to accept it")(scope, receive, send)
            return
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await _error(400, f"Content-Length {declared[:40]!r} is not a number of bytes",
                             headers={"Connection": "close"})(scope, receive, send)
                return
            if int(declared) > self.max_body_bytes:
                await self._too_large(f"Content-Length is {int(declared)}")(scope, receive, send)
                return
        if (self._expected is not None or self.tokens is not None) and scope["path"] not in self.open_paths:
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            who = caller_of(got, self._expected, self.tokens)
            if who is None:
                await _error(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'",
                             headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
            scope[PRINCIPAL_KEY] = who  # the endpoints search as this caller

        body = bytearray()
        with anyio.move_on_after(self.body_timeout_s) as deadline:  # the whole body, not each read
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away mid-body: nobody to answer
                    return
                body += message.get("body", b"")
                if len(body) > self.max_body_bytes or not message.get("more_body", False):
                    break
        if len(body) > self.max_body_bytes:
            await self._too_large(f"more than {self.max_body_bytes:,} bytes arrived")(scope, receive, send)
            return
        if deadline.cancelled_caught:
            what = f"Content-Length {int(declared):,} declared" if declared is not None else "a chunked body"
            await _error(408, f"request body incomplete: {what}, {len(body):,} bytes arrived within "
                              f"{self.body_timeout_s:g} s (funnel serve / funnel mcp --body-timeout); "
                              "send the whole body at once", headers={"Connection": "close"})(scope, receive, send)
            return
        depth = nesting_depth(body, MAX_BODY_DEPTH) if body else 0
        if depth > MAX_BODY_DEPTH:
            why = (f"the request body nests {depth:,} JSON levels deep; at most {MAX_BODY_DEPTH} are accepted "
                   "(a filter takes at most 8 levels of and/or/not)")
            if self.jsonrpc:
                await JSONResponse({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": why}},
                                   status_code=400)(scope, receive, send)
            else:
                await _error(400, why)(scope, receive, send)
            return
        pending: deque[Message] = deque([{"type": "http.request", "body": bytes(body), "more_body": False}])

        async def replay() -> Message:
            return pending.popleft() if pending else await receive()

        await self.app(scope, replay, send)


def create_app(searcher_or_root: Searcher | str | os.PathLike, token: str | None = None,
               refresh_interval: float = 1.0, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               hosts: Iterable[str] | None = None, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
               tokens=None) -> FastAPI:
    """Build the FastAPI app over a searcher (or an index root, opened here).

    ``tokens`` (a `TokenFile`) authenticates callers who
    each search as their principal (ACLs apply); ``token`` is the administrator's.

    Parameters
    ----------
    searcher_or_root
        An open `Searcher`, or an index root path.
    token
        If set, every path but ``/health`` (``/docs`` and ``/openapi.json`` included)
        requires ``Authorization: Bearer TOKEN``.
    refresh_interval
        Seconds between checks for a newly published index version.
    max_body_bytes
        Largest request body accepted; a larger one is a 413 before it is read.
    body_timeout_s
        Seconds a request body may take to arrive in full; then 408 (`RequestGuard`).

    Returns
    -------
    FastAPI
        The app; ``app.state.searcher`` is the searcher it serves.
    """
    check_body_timeout(body_timeout_s)  # here, not at the first request (middleware is built then)
    searcher = (searcher_or_root if isinstance(searcher_or_root, Searcher)
                else open_index(os.fspath(searcher_or_root)))
    throttle = RefreshThrottle(searcher, refresh_interval)
    app = FastAPI(title="funnel", summary="Retrieval for agents: a summary, hits and a trace per query.")
    app.state.searcher = searcher
    _install_error_handlers(app)
    app.add_middleware(RequestGuard, token=token, max_body_bytes=max_body_bytes, hosts=hosts,
                       open_paths=frozenset({"/health"}), body_timeout_s=body_timeout_s, tokens=tokens)

    def refreshed() -> Searcher:
        throttle()
        return searcher

    @app.get("/health")
    def health() -> Any:
        body, code = health_of(refreshed())
        return body if code == 200 else JSONResponse(body, status_code=code)

    @app.get("/status")
    def status(request: Request, s: Searcher = Depends(refreshed)) -> Any:
        body = index_status(s, principal_of(request))
        return body if body["n_docs"] is not None else JSONResponse(body, status_code=503)

    @app.post("/search")
    def search(req: SearchRequest, request: Request, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        return search_with_options(s, req.query, req.mode, req.k, req.options, filter=req.filter,
                                   principal=principal_of(request), budget=req.budget,
                                   passages_per_hit=req.passages_per_hit, offset=req.offset,
                                   fields=req.fields).to_dict()

    @app.get("/documents")
    def list_documents(request: Request, s: Searcher = Depends(refreshed),
                       prefix: str | None = Query(None, description="only ids that start with it"),
                       glob: str | None = Query(None, description="only ids that match it (* ? [...])"),
                       offset: str | None = Query(None, description="ids to skip (default 0)"),
                       limit: str | None = Query(None, description="ids per page (default 100, at most 1000)"),
                       fields: str | None = Query(None, description="field names to add (a,b) or *")
                       ) -> dict[str, Any]:
        # declared for the OpenAPI page; query_params reads them and refuses any other parameter
        q = query_params(request.query_params, LIST_PARAMS)
        return s.list_documents(q.get("prefix"), glob=q.get("glob"), offset=q.get("offset"), limit=q.get("limit"),
                                fields=q.get("fields"), principal=principal_of(request))

    @app.get("/documents/{doc_id:path}")
    def get_document(doc_id: str, request: Request, s: Searcher = Depends(refreshed),
                     start: str | None = Query(None, description="first character (default 0)"),
                     end: str | None = Query(None, description="character after the last (default: the end)"),
                     from_line: str | None = Query(None, description="instead of start/end: the first line (1-based)"),
                     max_lines: str | None = Query(None, description="lines from from_line (default: to the end)"),
                     fields: str | None = Query(None, description="field names to add (a,b) or * (default: none)")
                     ) -> dict[str, Any]:
        # declared for the OpenAPI page; query_params reads them, refuses any other parameter,
        # and the checks run before the lookup: a bad range answers the same for any id
        q = query_params(request.query_params, RANGE_PARAMS)
        a, b = check_range(q.get("start"), q.get("end"))
        doc = s.get_document(doc_id, a, b, from_line=q.get("from_line"), max_lines=q.get("max_lines"),
                             fields=q.get("fields"), principal=principal_of(request))  # forbidden answers as missing
        if doc is None:
            raise HTTPException(404, f"no document with doc_id {doc_id!r} in index version {s.version}")
        return doc

    @app.post("/documents")
    def get_documents_(req: DocumentsRequest, request: Request, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        return get_documents(s, req.ids, req.start, req.end, principal=principal_of(request), prefix=req.prefix,
                             glob=req.glob, from_line=req.from_line, max_lines=req.max_lines, fields=req.fields)

    @app.post("/term_stats")
    def term_stats_(req: TermStatsRequest, request: Request, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        return term_stats(s, req.terms, principal=principal_of(request))

    return app


def serve(index_root: str, host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
          insecure: bool = False, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, chat=None,
          allow_hosts: Iterable[str] = (), body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
          scrub: ScrubConfig | None = None, tokens: str | None = None,
          limits: ConnectionLimits | None = None) -> int:
    """Serve ``index_root`` over HTTP with uvicorn until interrupted.

    Once listening, logs (INFO) the URL, the index and version, the modes it answers and
    whether a token is required.

    Parameters
    ----------
    index_root
        Index root (the folder holding CURRENT) or one version directory.
    host, port
        Where to listen; 127.0.0.1 by default; port 0 picks a free port (the log says which).
        A host other than loopback needs a token (or ``insecure``).
    token
        Bearer token required on every path but ``/health``; an empty string is refused (it
        would otherwise silently mean "no authentication").
    insecure
        Listen beyond loopback without a token anyway; logs a loud warning.
    max_body_bytes
        Largest request body accepted (413 beyond it, before the token check).
    chat
        A ``ChatProvider`` for SIRA's llm proposer and hybrid expansions (optional).
    allow_hosts
        ``Host`` header names accepted besides loopback and ``host`` itself (behind a proxy,
        the name clients use); any other gets 421 (`allowed_hosts`).
    body_timeout_s
        Seconds a request body may take to arrive in full; then 408 (`RequestGuard`).
    scrub
        The background scrub's interval and read rate (``serving.frontends.scrub``; default: a pass every
        6 h at 8 MiB/s; ``ScrubConfig(interval_s=0)`` turns it off).
    tokens
        A tokens file (``serving/principals.py``): each caller's token names its principal and
        groups, and its searches and fetches see only what the documents' ACLs let it read;
        reloaded when it changes. ``token`` stays the administrator's, who sees everything.
    limits
        How long a request head may take and an idle connection may stay, and how many
        connections are held at once (``serving.frontends.connections``; default ``ConnectionLimits()``:
        10 s, 5 s, 256).

    Returns
    -------
    int
        Exit code: 0 after a clean shutdown; uvicorn's non-zero code (3) if it could not start,
        e.g. when the port is in use.

    Raises
    ------
    ValueError
        An empty token, or no token beyond loopback without ``insecure``; a tokens file that
        cannot be read; before the index is opened.
    """
    import uvicorn

    from ..principals import TokenFile

    if token is not None and not token.strip():
        raise ValueError("the token is empty: pass a non-empty token, or None to serve without authentication")
    token_file = TokenFile(tokens) if tokens else None
    check_exposure(host, token or tokens, insecure, f"the HTTP API for {index_root}")
    app = create_app(open_index(index_root, chat=chat) if chat is not None else index_root,
                     token=token, max_body_bytes=max_body_bytes, hosts=allowed_hosts(host, allow_hosts),
                     body_timeout_s=body_timeout_s, tokens=token_file)
    searcher = app.state.searcher
    from .warmup import describe, warm_http, warm_server
    # Before listening, no request pays for loading anything: the version, then real requests
    # through this app; each later version is warmed before it serves (serving.frontends.warmup).
    log.info("%s", describe(warm_server(searcher, lambda: warm_http(app, searcher, token, token_file)),
                            "requests through the API"))
    scrubbing = start_scrub(searcher.follower, scrub)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                bound = [sock.getsockname() for srv in self.servers for sock in (srv.sockets or ())]
                where = bound[0][1] if bound else port
                shown = f"[{host}]" if ":" in host else host
                log.info("serving %s (version %s, %d documents) at http://%s:%d; modes: %s; token %s",
                         index_root, searcher.version, searcher.index.n_docs, shown, where,
                         ", ".join(servable_modes(searcher)),
                         "required (Authorization: Bearer ...)" if token or tokens else "not required")

    level = logging.getLevelName(min(logging.getLogger().getEffectiveLevel(), logging.WARNING)).lower()
    server = Server(uvicorn_config(app, host, port, limits, log_level=level))
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits on startup failures such as a port in use
        return int(e.code or 1)
    finally:
        if scrubbing is not None:
            scrubbing.close()
        searcher.close()  # the version's reader lease goes now, not at interpreter exit
    return 0 if server.started else 1
