"""MCP front end: the same ``search()`` as tools an agent can call.

    funnel mcp INDEX_ROOT                                    (stdio, for a local agent)
    funnel mcp INDEX_ROOT --transport streamable-http --port 8766   (http://127.0.0.1:8766/mcp)
    funnel mcp INDEX_ROOT --transport streamable-http --host 0.0.0.0 --token TOKEN
               [--allow-host search.example.org]   (beyond loopback: a token, or --insecure)

Tools (all read-only):

- ``search(query, mode="bm25", k=10)``: text content is the summary an LLM reads;
  structured content is ``SearchResult.to_dict()`` (query, mode, summary, hits, trace).
- ``get_document(doc_id)``: text is the title and full text; structured content the
  stored document (doc_id, title, text, content_hash, shard, local_id).
- ``term_stats(terms)``: document frequency and idf per analyzed term, never passages;
  structured content as ``POST /term_stats``: ``{"version", "n_docs", "stats": [{term,
  forms, note}]}``, each term once.

Bad input (unknown mode, blank query, unknown document, a term over the limits, text with
a lone surrogate) comes back as a tool error (``is_error``) whose text says what was wrong
and what to do.

Over streamable HTTP, the same :class:`~funnel.serving.http.RequestGuard` as the HTTP API
sits in front of the MCP app: a body over ``--max-body-bytes`` is a 413 before anything
else, then with a token (``--token`` / ``$FUNNEL_TOKEN``) a request without
``Authorization: Bearer TOKEN`` is a 401 before its body is read. Beyond loopback the
server refuses to start without a token unless ``--insecure``.

DNS rebinding: the MCP library checks the Host header only when it listens on loopback;
on any other address it would accept every Host. Here the check is always on, against
:func:`allowed_hosts`: the loopback names, the address listened on or, for a wildcard
address (0.0.0.0, ::), this machine's host name, its fully qualified name and their
addresses, plus every ``--allow-host`` (the name clients use, e.g. behind a proxy). A
request naming any other host is a 421. The token alone would stop a rebinding page
(a browser cannot add the header), but the check also protects ``--insecure`` servers.
"""

import logging
from typing import Annotated, Any, Iterable

from pydantic import Field

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from funnel.pipelines.artifacts import IndexFormatError

from .http import (DEFAULT_MAX_BODY_BYTES, allowed_hosts, MAX_MODE_CHARS, MAX_TERM_CHARS, MAX_TERMS, RefreshThrottle,
                   RequestGuard, Term, Text, check_exposure, check_options, servable_modes,
                   term_stats as term_stats_of)
from .result import SearchResult
from .search import MAX_K, MAX_QUERY_CHARS, Searcher, SearchError, open_index

log = logging.getLogger(__name__)

TRANSPORTS = ("stdio", "streamable-http")

INSTRUCTIONS = (
    "funnel searches one document collection. Call `search` first: its text is a ranked list "
    "with why each document matched; then `get_document` with a doc_id for the full text. "
    "`term_stats` tells how common words are (df, idf) before you rephrase a query.")

_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def _text_result(text: str, structured: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def build_mcp_server(searcher: Searcher, refresh_interval: float = 1.0) -> MCPServer:
    """An :class:`MCPServer` with the ``search``, ``get_document`` and ``term_stats`` tools.

    Parameters
    ----------
    searcher
        The open searcher the tools query.
    refresh_interval
        Seconds between checks for a newly published index version.

    Returns
    -------
    MCPServer
        Ready to ``run()``, or to connect to in-process with ``mcp.Client(server)``.
    """
    server = MCPServer("funnel", instructions=INSTRUCTIONS, log_level="WARNING")
    throttle = RefreshThrottle(searcher, refresh_interval)

    def guarded(fn, *args, **kwargs):
        throttle()
        try:
            return fn(*args, **kwargs)
        except (SearchError, IndexFormatError) as e:
            raise ToolError(str(e)) from e

    @server.tool(annotations=_READ_ONLY)
    def search(
        query: Annotated[Text, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                     description="what to look for, in words")],
        mode: Annotated[Text, Field(max_length=MAX_MODE_CHARS,
                                    description="retrieval mode: " + ", ".join(servable_modes(searcher)))] = "bm25",
        k: Annotated[int, Field(ge=1, le=MAX_K, description="how many documents to return")] = 10,
        options: Annotated[dict[str, Any] | None, Field(
            description="per-query options of the mode, as in the HTTP API: e.g. k1, b (bm25); "
                        "fusion, alpha (hybrid); proposer, lambda, tau, fb_docs, fb_terms (sira)")] = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Search the collection; returns a ranked list with why each document matched.

        The text is a short summary to read; the structured content has every hit
        (doc_id, title, snippet, score, matched_terms) and a trace of the scoring.
        """
        try:
            opts = check_options(dict(options or {}))
        except ValueError as e:
            raise ToolError(str(e)) from e
        res = guarded(searcher.search, query, mode=mode, k=k, **opts)
        return _text_result(res.summary, res.to_dict())

    @server.tool(annotations=_READ_ONLY)
    def get_document(
        doc_id: Annotated[Text, Field(min_length=1, description="a doc_id from a search hit")],
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """Fetch one document's title and full text by its doc_id."""
        doc = guarded(searcher.get_document, doc_id)
        if doc is None:
            raise ToolError(f"no document with doc_id {doc_id!r} in index version {searcher.version}; "
                            "use a doc_id from a search hit")
        head = f"[{doc['doc_id']}] {doc.get('title') or ''}".rstrip()
        return _text_result(f"{head}\n\n{doc.get('text') or ''}", doc)

    @server.tool(annotations=_READ_ONLY)
    def term_stats(
        terms: Annotated[list[Term], Field(min_length=1, max_length=MAX_TERMS,
                                           description=f"words to look up: at most {MAX_TERMS}, of at "
                                                       f"most {MAX_TERM_CHARS} characters each")],
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """How many documents contain each word (df) and its idf; no passages."""
        stats = guarded(term_stats_of, searcher, terms)
        lines = []
        for s in stats["stats"]:
            if not s["forms"]:
                lines.append(f"{s['term']}: not searchable ({s['note'] or 'stopword'})")
                continue
            forms = "; ".join(f"{f['analyzed']}: df {f['df']}, idf {f['idf']:.3f}" for f in s["forms"])
            lines.append(f"{s['term']} -> {forms} (of {stats['n_docs']} documents)")
        return _text_result("\n".join(lines), stats)

    return server


def run_mcp(index_root: str, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8766,
            token: str | None = None, insecure: bool = False, allow_hosts: Iterable[str] = (),
            max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, chat=None) -> int:
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
        Host header values accepted besides :func:`allowed_hosts`' defaults.
    max_body_bytes
        Largest request body accepted (413 beyond it, before the token check).
    chat
        A ``ChatProvider`` for SIRA's llm proposer and hybrid expansions (optional).

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
        if token is not None:
            raise ValueError("a token protects the streamable-http transport; over stdio the client "
                             "starts this process itself: leave --token out, or add "
                             "--transport streamable-http")
        ix = open_index(index_root, chat=chat)
        try:
            ix.warm()  # the first tool call then does not load the compiled kernels (~0.5 s)
            build_mcp_server(ix).run("stdio")
        finally:
            ix.close()  # the version's reader lease goes now, not at interpreter exit
        return 0

    import uvicorn

    if token is not None and not token.strip():
        raise ValueError("the token is empty: pass a non-empty token, or None to serve without authentication")
    check_exposure(host, token, insecure, f"MCP for {index_root}")
    hosts = allowed_hosts(host, allow_hosts)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts,
        allowed_origins=[f"{scheme}://{h}" for h in hosts for scheme in ("http", "https")])
    ix = open_index(index_root, chat=chat)
    log.info("warm-up query answered in %.2fs", ix.warm())  # before listening: no request pays it
    server = build_mcp_server(ix)
    app = RequestGuard(server.streamable_http_app(transport_security=security, host=host,
                                                  max_request_body_size=max_body_bytes),
                       token=token, max_body_bytes=max_body_bytes)
    shown = f"[{host}]" if ":" in host else host
    log.info("MCP server for %s on http://%s:%d/mcp; token %s; Host headers accepted: %s", index_root, shown,
             port, "required (Authorization: Bearer ...)" if token else "not required",
             ", ".join(h for h in hosts if not h.endswith(":*")))
    http_server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        http_server.run()
    except SystemExit as e:  # uvicorn exits on startup failures such as a port in use
        return int(e.code or 1)
    finally:
        ix.close()  # the version's reader lease goes now, not at interpreter exit
    return 0 if http_server.started else 1
