"""MCP front end: the same ``search()`` as tools an agent can call.

    funnel mcp INDEX_ROOT                                    (stdio, for a local agent)
    funnel mcp INDEX_ROOT --transport streamable-http --port 8766   (http://127.0.0.1:8766/mcp)

Tools (all read-only):

- ``search(query, mode="bm25", k=10)``: text content is the summary an LLM reads;
  structured content is ``SearchResult.to_dict()`` (query, mode, summary, hits, trace).
- ``get_document(doc_id)``: text is the title and full text; structured content the
  stored document (doc_id, title, text, content_hash, shard, local_id).
- ``term_stats(terms)``: document frequency and idf per analyzed term, never passages;
  structured content ``{"version": ..., "stats": [...]}``.

Bad input (unknown mode, blank query, unknown document) comes back as a tool error
(``is_error``) whose text says what was wrong and what to do.
"""

import logging
from typing import Annotated, Any

from pydantic import Field

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

from funnel.pipelines.artifacts import IndexFormatError

from .http import LOOPBACK, MAX_TERMS, RefreshThrottle, servable_modes
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
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS,
                                    description="what to look for, in words")],
        mode: Annotated[str, Field(description="retrieval mode: " + ", ".join(servable_modes(searcher)))] = "bm25",
        k: Annotated[int, Field(ge=1, le=MAX_K, description="how many documents to return")] = 10,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Search the collection; returns a ranked list with why each document matched.

        The text is a short summary to read; the structured content has every hit
        (doc_id, title, snippet, score, matched_terms) and a trace of the scoring.
        """
        res = guarded(searcher.search, query, mode=mode, k=k)
        return _text_result(res.summary, res.to_dict())

    @server.tool(annotations=_READ_ONLY)
    def get_document(
        doc_id: Annotated[str, Field(min_length=1, description="a doc_id from a search hit")],
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
        terms: Annotated[list[str], Field(min_length=1, max_length=MAX_TERMS,
                                          description="words to look up")],
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """How many documents contain each word (df) and its idf; no passages."""
        stats = guarded(searcher.term_stats, terms)
        lines = []
        for s in stats:
            if s["analyzed"] is None:
                lines.append(f"{s['term']}: not searchable ({s.get('note', 'stopword')})")
            else:
                lines.append(f"{s['term']} -> {s['analyzed']}: df {s['df']} of {s['n_docs']} documents, "
                             f"idf {s['idf']:.3f}")
        return _text_result("\n".join(lines), {"version": searcher.version, "stats": stats})

    return server


def run_mcp(index_root: str, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8766) -> int:
    """Serve ``index_root`` as an MCP server until the client disconnects or interrupted.

    Parameters
    ----------
    index_root
        Index root (the folder holding CURRENT) or one version directory.
    transport
        ``stdio`` (the client spawns this process) or ``streamable-http``
        (``http://HOST:PORT/mcp``).
    host, port
        Where the streamable HTTP transport listens; 127.0.0.1 by default.

    Returns
    -------
    int
        Exit code: 0 after a clean shutdown; uvicorn's non-zero code (3) if the HTTP server
        could not start, e.g. when the port is in use.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    server = build_mcp_server(open_index(index_root))
    if transport == "stdio":
        server.run("stdio")
        return 0
    if host not in LOOPBACK:
        log.warning("MCP over HTTP on %s:%d has no authentication: anyone who can reach this host "
                    "can query %s", host, port, index_root)
    log.info("MCP server for %s on http://%s:%d/mcp", index_root, host, port)
    try:
        server.run("streamable-http", host=host, port=port)
    except SystemExit as e:  # uvicorn exits on startup failures such as a port in use
        return int(e.code or 1)
    return 0
