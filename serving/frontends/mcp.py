"""MCP front end: the same ``search()`` as tools an agent can call.

    funnel mcp INDEX_ROOT                                    (stdio, for a local agent)
    funnel mcp INDEX_ROOT --transport streamable-http --port 8766   (http://127.0.0.1:8766/mcp)
    funnel mcp INDEX_ROOT --transport streamable-http --host 0.0.0.0 --token TOKEN
               [--allow-host search.example.org]   (beyond loopback: a token, or --insecure)

Tools (all read-only):

- ``search(query, mode=None, k=10, budget=None, passages_per_hit=None)``: text content is
  the summary an LLM reads (the hits with their best passages quoted, at most ``budget``
  tokens; mode: hybrid where the index has vectors, else bm25); structured content is
  ``SearchResult.to_dict()`` (query, mode, summary, hits, trace).
- ``get_document(doc_id, start=None, end=None)``: text is the title and the text, whole or
  characters ``[start, end)`` (as a hit's citation gives them), at most ``MAX_RANGE_CHARS``
  per call; structured content the stored document (doc_id, title, text, content_hash,
  shard, local_id) with ``start``, ``end``, ``length``, ``line_start``, ``line_end``,
  ``truncated`` and ``next_start`` (where to continue).
  ``from_line``/``max_lines`` instead of ``start``/``end`` fetch whole lines; ``fields``
  (names, or ``"*"``) adds the document's fields.
- ``get_documents(doc_ids, start=None, end=None)``: up to ``MAX_DOCUMENT_IDS`` documents in
  one call, ``MAX_RANGE_CHARS`` characters in all; structured content as ``POST /documents``
  (documents, missing, deferred). A document the caller may not read is ``missing``, as one
  that does not exist. Instead of ``doc_ids``, an id ``prefix`` or ``glob`` names the first
  ``MAX_DOCUMENT_IDS`` matching ids (``matched`` counts them all).
- ``list_documents(prefix=None, glob=None, offset=0, limit=100)``: a page of doc ids and
  titles in id order, with ``total`` and ``next_offset``; only documents the caller may read.
- ``status()``: index version, document and passage counts, the modes it answers, the
  fields a filter may name, whether access control is on; as ``GET /status``.
- ``term_stats(terms)``: document frequency and idf per analyzed term, never passages;
  structured content as ``POST /term_stats``: ``{"version", "n_docs", "stats": [{term,
  forms, note}]}``, each term once.

Bad input (unknown mode, blank query, unknown document, a term over the limits, text with
a lone surrogate, an option value that is not a finite number in range, an argument the
tool does not take) comes back as a tool error (``is_error``) whose text says what was
wrong and what to do.

Over stdio, a request line that is not a JSON-RPC message (not JSON, too deep, a lone
surrogate, longer than ``--max-body-bytes``) is answered with a JSON-RPC error (-32700
Parse error or -32600 Invalid Request, ``id`` null), so the caller never waits for an
answer that will not come (`_StdinLines`).

Over streamable HTTP, the same `RequestGuard` as the HTTP API
sits in front of the MCP app: a body over ``--max-body-bytes`` is a 413 before anything
else, one not all there ``--body-timeout`` seconds after it began a 408, then with a
token (``--token`` / ``$FUNNEL_TOKEN``) a request without ``Authorization: Bearer TOKEN``
is a 401 before its body is read. Beyond loopback the
server refuses to start without a token unless ``--insecure``.

DNS rebinding: the MCP library checks the Host header only when it listens on loopback;
on any other address it would accept every Host. Here the check is always on, against
`allowed_hosts`: the loopback names, the address listened on or, for a wildcard
address (0.0.0.0, ::), this machine's host name, its fully qualified name and their
addresses, plus every ``--allow-host`` (the name clients use, e.g. behind a proxy). A
request naming any other host is a 421. The token alone would stop a rebinding page
(a browser cannot add the header), but the check also protects ``--insecure`` servers.
"""

import json
import logging
import sys
from typing import Annotated, Any, Iterable

import anyio
import mcp.types as mcp_types
from pydantic import Field, StrictInt, ValidationError

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from funnel.pipelines.store.artifacts import IndexFormatError

from ..answers.citations import MAX_RANGE_CHARS
from ..documents import DEFAULT_LIST_LIMIT, MAX_FIELD_NAME_CHARS, MAX_FIELD_NAMES, MAX_LIST_LIMIT, MAX_PATTERN_CHARS
from .connections import ConnectionLimits, uvicorn_config
from .http import (DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, allowed_hosts, MAX_MODE_CHARS, MAX_TERM_CHARS,
                   MAX_TERMS, RefreshThrottle, RequestGuard, Term, Text, caller_of, check_exposure, check_options,
                   check_range, get_documents as get_documents_of, index_status, search_with_options,
                   servable_modes, term_stats as term_stats_of)
from ..result import SearchResult
from .scrub import ScrubConfig, start_scrub
from .warmup import describe, warm_mcp, warm_server
from ..search import (MAX_DOCUMENT_IDS, MAX_K, MAX_PASSAGES_PER_HIT, MAX_QUERY_CHARS, Searcher, SearchError,
                     open_index)
from ..answers.summary import DEFAULT_BUDGET, MAX_BUDGET, MIN_BUDGET

log = logging.getLogger(__name__)

TRANSPORTS = ("stdio", "streamable-http")

INSTRUCTIONS = (
    "funnel searches one document collection. Call `search` first: its text is a ranked list "
    "of documents with their best passages quoted, each with its doc_id and `start`/`end`; then "
    "`get_document` with a doc_id and those `start`/`end` (widened) for the text around a passage, or "
    "with a doc_id alone for the whole text (`get_documents` fetches several at once, by ids or an id "
    "prefix; `list_documents` pages through the ids). `term_stats` tells how common words are (df, idf) "
    "before you rephrase a query; `status` says which modes and filter fields this index has.")

_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def _text_result(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _document_text(doc: dict[str, Any]) -> str:
    """A fetched document as an LLM reads it: its id and title; for a part of the text,
    which characters and where to continue; then the text."""
    head = f"[{doc['doc_id']}] {doc.get('title') or ''}".rstrip()
    if doc.get("start", 0) != 0 or doc.get("end", doc.get("length")) != doc.get("length"):
        head += f"\n(characters {doc['start']}-{doc['end']} of {doc['length']}"
        head += f"; continue with start={doc['next_start']})" if doc.get("next_start") is not None else ")"
    return f"{head}\n\n{doc.get('text') or ''}"


#: The MCP form of ``start`` and ``end`` (``http.check_range`` checks their values).
Offset = Annotated[StrictInt | None, Field(description="character offset into the document's text, as a "
                                                        "hit's citation gives it; leave out for the beginning "
                                                        "(start) or the end (end)")]
#: ``from_line`` and ``max_lines`` (``documents.check_lines`` checks their values).
FromLine = Annotated[StrictInt | None, Field(description="instead of start/end: the first line to fetch, 1-based, "
                                                          "as a hit's citation gives it (line_start)")]
MaxLines = Annotated[StrictInt | None, Field(description="how many lines from from_line (default: to the end)")]
#: ``fields``: names (``documents.check_fields`` checks them against the index's).
Fields = Annotated[Annotated[list[Annotated[Text, Field(max_length=MAX_FIELD_NAME_CHARS)]],
                             Field(max_length=MAX_FIELD_NAMES)] | Text | None,
                   Field(description="the document fields to add (front matter, path, format, your own columns): "
                                     "a list of names, or \"*\" for all of them; default none")]


class _StdinLines:
    """The request lines of stdin, each one answered if it is not a JSON-RPC message.

    The SDK's stdio reader parses each line and, when it does not parse, hands the error
    to a dispatcher that only logs it: the caller waits forever for an answer. This reader
    sits in front of it (passed as ``stdio_server(stdin=...)``) and yields only lines that
    parse as JSON-RPC messages (the SDK then parses them again: at most ``max_line_bytes``
    each, a cost that is small beside a search). Every other line is answered here, on the
    transport's own write stream (one writer, so no frame is torn), per JSON-RPC 2.0:

    - not UTF-8, not JSON, nesting past the parser's depth limit, a lone surrogate, a
      number out of range (a 5,000-digit id): -32700 Parse error, ``id`` null;
    - JSON that is not a JSON-RPC message: -32600 Invalid Request, with its ``id`` when
      that is a string or an integer, else null;
    - longer than ``max_line_bytes`` (``--max-body-bytes``, the bound on an HTTP body): the
      rest of the line is skipped unread into memory, -32600, ``id`` null.
    """

    def __init__(self, max_line_bytes: int, stream=None):
        self.max_line_bytes = max_line_bytes
        self._stream = stream if stream is not None else sys.stdin.buffer
        self._answers = None
        self._ready = anyio.Event()

    def answer_on(self, write_stream) -> None:
        """Where the errors go: the write stream ``stdio_server`` yields."""
        self._answers = write_stream
        self._ready.set()

    def _read_line(self) -> bytes | None:
        """The next line from the blocking stream (b"" at end of input), or None for one
        longer than ``max_line_bytes`` (skipped to its end, a bounded piece at a time)."""
        line = self._stream.readline(self.max_line_bytes + 1)
        if len(line) <= self.max_line_bytes or line.endswith(b"\n"):
            return line
        while line and not line.endswith(b"\n"):
            line = self._stream.readline(1 << 16)
        return None

    async def _answer(self, code: int, message: str, request_id: Any = None) -> None:
        await self._ready.wait()
        error = mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id,
                                       error=mcp_types.ErrorData(code=code, message=message))
        try:
            await self._answers.send(SessionMessage(error))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):  # the server is shutting down
            pass

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while True:
            raw = await anyio.to_thread.run_sync(self._read_line, abandon_on_cancel=True)
            if raw is None:
                await self._answer(mcp_types.INVALID_REQUEST,
                                   f"request line longer than {self.max_line_bytes:,} bytes; it was skipped "
                                   "(funnel mcp --max-body-bytes sets the limit)")
                continue
            if not raw:
                raise StopAsyncIteration
            if not raw.strip():
                continue  # a blank line between messages is no request
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                await self._answer(mcp_types.PARSE_ERROR, f"Parse error: the request line is not UTF-8 ({e.reason} "
                                                          f"at byte {e.start})")
                continue
            try:
                mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValidationError as e:
                errors = e.errors(include_url=False, include_input=False)
                parse = next((err for err in errors if err["type"] == "json_invalid"), None)
                if parse is not None:
                    await self._answer(mcp_types.PARSE_ERROR, f"Parse error: {parse['msg']}")
                else:
                    await self._answer(mcp_types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request, "
                                                                  "notification or response", _request_id(line))
                continue
            return line


def _request_id(line: str) -> str | int | None:
    """The ``id`` of a JSON object line, where it is one JSON-RPC allows (string or integer)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)) else None


class FunnelMCPServer(MCPServer):
    """`MCPServer` that refuses tool arguments it does not know and answers every
    stdio line (`_StdinLines`)."""

    def __init__(self, *args, max_line_bytes: int = DEFAULT_MAX_BODY_BYTES, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_line_bytes = max_line_bytes

    async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
        """As `MCPServer.call_tool`, but an argument the tool does not take is a tool
        error naming it and the valid ones (the SDK drops it silently, so a misspelt
        ``optoins`` searched with no options; HTTP answers the same body with 422)."""
        tool = next((t for t in await self.list_tools() if t.name == name), None)
        if tool is not None:
            valid = list(tool.input_schema.get("properties", {}))
            unknown = sorted(set(arguments) - set(valid))
            if unknown:
                raise ToolError(f"unknown argument(s) {', '.join(map(repr, unknown))} for tool {name!r}; "
                                f"valid: {', '.join(valid)}")
        return await super().call_tool(name, arguments, context)

    async def run_stdio_async(self) -> None:
        """As `MCPServer.run_stdio_async`, reading stdin through `_StdinLines`."""
        lines = _StdinLines(self.max_line_bytes)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            lines.answer_on(write_stream)
            server = self._lowlevel_server
            await server.run(read_stream, write_stream, server.create_initialization_options())


def package_version() -> str:
    """The installed funnel's version (the MCP ``serverInfo.version``); "unknown" where the
    package metadata is absent (a source tree not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("funnel")
    except PackageNotFoundError:
        return "unknown"


def build_mcp_server(searcher: Searcher, refresh_interval: float = 1.0,
                     max_line_bytes: int = DEFAULT_MAX_BODY_BYTES, token: str | None = None,
                     tokens=None) -> MCPServer:
    """An `MCPServer` with the ``search``, ``get_document``, ``get_documents``,
    ``list_documents``, ``term_stats`` and ``status`` tools.

    Parameters
    ----------
    searcher
        The open searcher the tools query.
    refresh_interval
        Seconds between checks for a newly published index version.
    max_line_bytes
        Over stdio, the longest request line read; a longer one is skipped and answered
        with a JSON-RPC error.
    token, tokens
        Over streamable HTTP, the administrator's token and the callers' tokens file
        (``serving/principals.py``): each tool call runs as the principal its
        ``Authorization`` header names (ACLs apply). Neither: every caller sees everything.

    Returns
    -------
    MCPServer
        Ready to ``run()``, or to connect to in-process with ``mcp.Client(server)``.
    """
    server = FunnelMCPServer("funnel", instructions=INSTRUCTIONS, log_level="WARNING", version=package_version(),
                             max_line_bytes=max_line_bytes)
    throttle = RefreshThrottle(searcher, refresh_interval)

    def guarded(fn, *args, **kwargs):
        throttle()
        try:
            return fn(*args, **kwargs)
        except (SearchError, IndexFormatError) as e:
            raise ToolError(str(e)) from e

    def caller(ctx: Context | None):
        """The principal of this tool call (see ``token, tokens``); never guessed: a call
        whose caller cannot be told is refused."""
        if token is None and tokens is None:
            return None
        try:
            request = ctx.request_context.request
            header = request.headers.get("authorization", "")
        except (AttributeError, ValueError):
            raise ToolError("cannot tell who is calling (no HTTP request); refusing the call") from None
        who = caller_of(header.encode("utf-8"), f"Bearer {token}".encode() if token else None, tokens)
        if who is None:
            raise ToolError("missing or wrong token: send 'Authorization: Bearer TOKEN'")
        return who

    @server.tool(annotations=_READ_ONLY)
    def search(
        query: Annotated[Text, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                     description="what to look for, in words")],
        mode: Annotated[Text | None, Field(
            max_length=MAX_MODE_CHARS, description="retrieval mode: " + ", ".join(servable_modes(searcher))
            + " (default: hybrid where the index has vectors, else bm25)")] = None,
        k: Annotated[StrictInt, Field(ge=1, le=MAX_K, description="how many documents to return")] = 10,
        budget: Annotated[StrictInt | None, Field(
            ge=MIN_BUDGET, le=MAX_BUDGET, description="most tokens of the text, which quotes the hits' best "
                                                      f"passages (default {DEFAULT_BUDGET})")] = None,
        passages_per_hit: Annotated[StrictInt | None, Field(
            ge=1, le=MAX_PASSAGES_PER_HIT, description="ranked passages each structured hit carries "
                                                       "(default 1)")] = None,
        options: Annotated[dict[str, Any] | None, Field(
            description="per-query options of the mode, as in the HTTP API: e.g. k1, b (bm25); "
                        "fusion, alpha (hybrid); proposer, lambda, tau, fb_docs, fb_terms (sira)")] = None,
        filter: Annotated[dict[str, Any] | None, Field(
            description="only documents whose fields match, e.g. {\"kind\": \"runbook\"}, "
                        "{\"year\": {\"gte\": 2024}}, {\"tags\": {\"any\": [\"billing\"]}}; "
                        "and / or / not combine them")] = None,
        offset: Annotated[StrictInt, Field(ge=0, le=MAX_K - 1, description="hits to skip, for the next page: the "
                                                                          "hits ranked offset+1 .. offset+k (offset "
                                                                          f"+ k at most {MAX_K})")] = 0,
        fields: Fields = None,
        ctx: Context = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Search the collection; the text is the ranked documents with their best passages quoted.

        Each hit gives its id, title and where its best passage is (lines, PDF page, start/end
        for get_document); the passages that fit the budget are quoted under it. The
        structured content has every hit (doc_id, title, passage, score, matched_terms) and a
        trace of the scoring.
        """
        try:
            opts = check_options(dict(options or {}))
        except ValueError as e:
            raise ToolError(str(e)) from e
        res = guarded(search_with_options, searcher, query, mode, k, opts, filter=filter, principal=caller(ctx),
                      budget=budget, passages_per_hit=passages_per_hit, offset=offset, fields=fields)
        return _text_result(res.summary, res.to_dict())

    @server.tool(annotations=_READ_ONLY, description=(
        "Fetch one document's title and text by its doc_id: all of it, or characters [start, end) "
        f"(a hit's citation gives both). At most {MAX_RANGE_CHARS:,} characters per call; a longer "
        "text comes back cut, with next_start to continue from."))
    def get_document(
        doc_id: Annotated[Text, Field(min_length=1, description="a doc_id from a search hit")],
        start: Offset = None,
        end: Offset = None,
        from_line: FromLine = None,
        max_lines: MaxLines = None,
        fields: Fields = None,
        ctx: Context = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        # the range first (the same answer for any id); forbidden answers as missing; the
        # method is looked up inside guarded(): with no servable version (a scrub quarantined
        # it) the lookup itself raises IndexFormatError
        doc = guarded(lambda: searcher.get_document(doc_id, *check_range(start, end), from_line=from_line,
                                                    max_lines=max_lines, fields=fields, principal=caller(ctx)))
        if doc is None:
            raise ToolError(f"no document with doc_id {doc_id!r} in index version {searcher.version}; "
                            "use a doc_id from a search hit")
        return _text_result(_document_text(doc), doc)

    @server.tool(annotations=_READ_ONLY, description=(
        "Fetch several documents at once, each whole, characters [start, end) or lines from from_line. "
        f"Name them by doc_ids, or by an id prefix or glob (the first {MAX_DOCUMENT_IDS} matching ids; "
        f"matched counts them all). At most {MAX_DOCUMENT_IDS} ids and {MAX_RANGE_CHARS:,} characters in "
        "all: the ids past that bound come back as deferred (ask again for them). Ids this index does not "
        "have, or that you may not read, come back as missing."))
    def get_documents(
        doc_ids: Annotated[list[Text] | None, Field(min_length=1, max_length=MAX_DOCUMENT_IDS,
                                                    description=f"doc_ids from search hits: at most "
                                                                f"{MAX_DOCUMENT_IDS}; a repeated one is answered "
                                                                "once")] = None,
        prefix: Annotated[Text | None, Field(max_length=MAX_PATTERN_CHARS,
                                             description="instead of doc_ids: ids that start with it")] = None,
        glob: Annotated[Text | None, Field(max_length=MAX_PATTERN_CHARS,
                                           description="instead of doc_ids: ids that match it, e.g. "
                                                       "'runbooks/*.md' (* ? [...])")] = None,
        start: Offset = None,
        end: Offset = None,
        from_line: FromLine = None,
        max_lines: MaxLines = None,
        fields: Fields = None,
        ctx: Context = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        got = guarded(get_documents_of, searcher, doc_ids, start, end, principal=caller(ctx), prefix=prefix,
                      glob=glob, from_line=from_line, max_lines=max_lines, fields=fields)
        parts = [_document_text(d) for d in got["documents"]]
        if got["missing"]:
            parts.append("missing (not in this index): " + ", ".join(got["missing"]))
        if got["deferred"]:
            parts.append(f"deferred (over {got['max_chars']:,} characters in all; ask again): "
                         + ", ".join(got["deferred"]))
        if got.get("matched", 0) > len(got["documents"]) + len(got["deferred"]):
            parts.append(f"{got['matched']} ids match; these are the first {MAX_DOCUMENT_IDS} "
                         "(list_documents pages through all of them)")
        return _text_result("\n\n---\n\n".join(parts) or "no documents match", got)

    @server.tool(annotations=_READ_ONLY, description=(
        "List documents in id order: their doc_id, title and length, a page at a time (offset, limit), "
        "narrowed to ids that start with a prefix or match a glob. total counts every match you may read; "
        "next_offset is the next page's offset."))
    def list_documents(
        prefix: Annotated[Text | None, Field(max_length=MAX_PATTERN_CHARS,
                                             description="only ids that start with it, e.g. 'runbooks/'")] = None,
        glob: Annotated[Text | None, Field(max_length=MAX_PATTERN_CHARS,
                                           description="only ids that match it, e.g. '*.pdf' (* ? [...])")] = None,
        offset: Annotated[StrictInt, Field(ge=0, description="ids to skip")] = 0,
        limit: Annotated[StrictInt, Field(ge=1, le=MAX_LIST_LIMIT, description="ids per page")] = DEFAULT_LIST_LIMIT,
        fields: Fields = None,
        ctx: Context = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        got = guarded(lambda: searcher.list_documents(prefix, glob=glob, offset=offset, limit=limit, fields=fields,
                                                      principal=caller(ctx)))
        lines = [f"[{d['doc_id']}] {d['title'] or ''}".rstrip() for d in got["documents"]]
        shown = f"{offset + 1}-{offset + len(lines)}" if lines else "none"
        lines.append(f"({shown} of {got['total']} documents"
                     + (f"; next page: offset={got['next_offset']})" if got["next_offset"] is not None else ")"))
        return _text_result("\n".join(lines), got)

    @server.tool(annotations=_READ_ONLY)
    def term_stats(
        terms: Annotated[list[Term], Field(min_length=1, max_length=MAX_TERMS,
                                           description=f"words to look up: at most {MAX_TERMS}, of at "
                                                       f"most {MAX_TERM_CHARS} characters each")],
        ctx: Context = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """How many documents contain each word (df) and its idf; no passages."""
        stats = guarded(term_stats_of, searcher, terms, principal=caller(ctx))
        lines = []
        for s in stats["stats"]:
            if not s["forms"]:
                lines.append(f"{s['term']}: not searchable ({s['note'] or 'stopword'})")
                continue
            forms = "; ".join(f"{f['analyzed']}: df {f['df']}" + (f", idf {f['idf']:.3f}" if f["idf"] is not None
                                                                  else "") for f in s["forms"])
            lines.append(f"{s['term']} -> {forms} (of {stats['n_docs']} documents)")
        return _text_result("\n".join(lines), stats)

    @server.tool(annotations=_READ_ONLY)
    def status(ctx: Context = None) -> Annotated[CallToolResult, dict[str, Any]]:
        """What this index is: its version, how many documents and passages it has, the modes
        it answers now (dense needs vectors; sira), the fields a filter may name and whether
        access control is on. If you may read only some documents, n_docs counts those and
        n_passages is left out (null), as term_stats counts only what you may read."""
        st = guarded(index_status, searcher, caller(ctx))
        if st["n_docs"] is None:
            raise ToolError(f"the index cannot be searched now ({st['status']}): {st['refresh_error']}")
        fields = ", ".join(f"{k} ({v})" for k, v in st["fields"].items()) or "none"
        text = (f"index version {st['version']} ({st['status']}): {st['n_docs']} documents"
                + (f", {st['n_passages']} passages" if st["n_passages"] is not None else "")
                + (" you may read" if st["restricted"] else "")
                + f"\nmodes: {', '.join(st['modes'])}\nfilter fields: {fields}"
                + f"\naccess control: {'on' if st['access_control'] else 'off'}")
        return _text_result(text, st)

    return server


def mcp_http_app(searcher: Searcher, host: str, hosts: list[str], token: str | None = None, tokens=None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 server: MCPServer | None = None):
    """The streamable-HTTP MCP app over ``searcher`` as `run_mcp` serves it: the MCP
    server's app (``Host`` checked against ``hosts``, `allowed_hosts`) behind the same
    `RequestGuard` as the HTTP API, with ``token`` and ``tokens`` (a ``TokenFile``).
    ``server``: one `build_mcp_server` made with the same searcher, token and tokens (default:
    made here)."""
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts,
        allowed_origins=[f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")])
    server = server or build_mcp_server(searcher, token=token, tokens=tokens)
    return RequestGuard(server.streamable_http_app(transport_security=security, host=host,
                                                   max_request_body_size=max_body_bytes),
                        token=token, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s, tokens=tokens,
                        jsonrpc=True)


def run_mcp(index_root: str, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8766,
            token: str | None = None, insecure: bool = False, allow_hosts: Iterable[str] = (),
            max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, chat=None,
            body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, scrub: ScrubConfig | None = None,
            tokens: str | None = None, limits: ConnectionLimits | None = None) -> int:
    """Serve ``index_root`` as an MCP server until the client disconnects or interrupted.

    Parameters
    ----------
    index_root
        Index root (the folder holding CURRENT) or one version directory.
    transport
        ``stdio`` (the client spawns this process) or ``streamable-http``
        (``http://HOST:PORT/mcp``).
    host, port
        Where the streamable HTTP transport listens; 127.0.0.1 by default. A host other than
        loopback needs a token (or ``insecure``).
    token
        streamable-http only: bearer token every request must carry; an empty one is refused.
    insecure
        Listen beyond loopback without a token anyway; logs a loud warning.
    allow_hosts
        Host header values accepted besides `allowed_hosts`' defaults.
    max_body_bytes
        Largest request body accepted (413 beyond it, before the token check); over stdio,
        the longest request line (a longer one is skipped and answered with a JSON-RPC error).
    chat
        A ``ChatProvider`` for SIRA's llm proposer and hybrid expansions (optional).
    body_timeout_s
        streamable-http only: seconds a request body may take to arrive in full; then 408.
    scrub
        The background scrub's interval and read rate (``serving.frontends.scrub``; default: a pass every
        6 h at 8 MiB/s; ``ScrubConfig(interval_s=0)`` turns it off); a damaged version's
        searches become tool errors.
    tokens
        streamable-http only: a tokens file (``serving/principals.py``); each caller's tool
        calls run as its principal (ACLs apply), reloaded when the file changes. ``token``
        stays the administrator's.
    limits
        streamable-http only: the request-head deadline, the idle keep-alive time and the
        number of connections held at once (``serving.frontends.connections``).

    Returns
    -------
    int
        Exit code: 0 after a clean shutdown; uvicorn's non-zero code (3) if the HTTP server
        could not start, e.g. when the port is in use.

    Raises
    ------
    ValueError
        An unknown transport, a token with stdio, an empty token, or no token beyond
        loopback without ``insecure``; before the index is opened.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if transport == "stdio":
        if token is not None or tokens is not None:
            raise ValueError("a token protects the streamable-http transport; over stdio the client "
                             "starts this process itself: leave --token out, or add "
                             "--transport streamable-http")
        ix = open_index(index_root, chat=chat)
        scrubbing = None
        try:
            server = build_mcp_server(ix, max_line_bytes=max_body_bytes)
            warm_server(ix, lambda: warm_mcp(server, ix))  # the first tool call then loads nothing
            scrubbing = start_scrub(ix.follower, scrub)
            server.run("stdio")
        finally:
            if scrubbing is not None:
                scrubbing.close()
            ix.close()  # the version's reader lease goes now, not at interpreter exit
        return 0

    import uvicorn

    if token is not None and not token.strip():
        raise ValueError("the token is empty: pass a non-empty token, or None to serve without authentication")
    from ..principals import TokenFile
    token_file = TokenFile(tokens) if tokens else None
    check_exposure(host, token or tokens, insecure, f"MCP for {index_root}")
    hosts = allowed_hosts(host, allow_hosts)
    ix = open_index(index_root, chat=chat)
    server = build_mcp_server(ix, token=token, tokens=token_file)
    # Before listening (serving.frontends.warmup): the version, then tool calls through this server; each
    # later version is warmed before it serves.
    # In-process calls carry no token: with one required, they go to a server without it.
    unguarded = server if token is None and token_file is None else build_mcp_server(ix)
    log.info("%s", describe(warm_server(ix, lambda: warm_mcp(unguarded, ix)), "tool calls"))
    scrubbing = start_scrub(ix.follower, scrub)
    app = mcp_http_app(ix, host, hosts, token=token, tokens=token_file, max_body_bytes=max_body_bytes,
                       body_timeout_s=body_timeout_s, server=server)
    shown = f"[{host}]" if ":" in host else host
    log.info("MCP server for %s on http://%s:%d/mcp; token %s; Host headers accepted: %s", index_root, shown,
             port, "required (Authorization: Bearer ...)" if token or tokens else "not required",
             ", ".join(h for h in hosts if not h.endswith(":*")))
    http_server = uvicorn.Server(uvicorn_config(app, host, port, limits))
    try:
        http_server.run()
    except SystemExit as e:  # uvicorn exits on startup failures such as a port in use
        return int(e.code or 1)
    finally:
        if scrubbing is not None:
            scrubbing.close()
        ix.close()  # the version's reader lease goes now, not at interpreter exit
    return 0 if http_server.started else 1
