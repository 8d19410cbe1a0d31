"""A server's warm-up: its first request, and the first request to a newly published version,
cost what later ones do.

Why: everything a query needs is loaded on first use (numba's compiled kernels, the query
embedder's onnxruntime session and tokenizer, the FAISS shards, the passages' spans, BM25
tables, documents' row groups), and a server's front end has first-use costs of its own (the
MCP server imports jsonschema to check a tool call's arguments on its first call). A server
pays them before it listens, and again for each version it switches to before that version
serves, never in a caller's request:

- `warm_version`: `VersionSearcher.warm` (a BM25 and a hybrid query, the embedder's first
  embedding), then `WARM_QUERIES` distinct queries from documents spread over the corpus, in
  the mode a search without one gets, so different row groups, postings and FAISS lists are
  touched and each answer is rendered as a front end renders it (``to_dict``);
- `warm_http` / `warm_mcp`: the same queries through the server's own front end, in-process
  (the HTTP API's ASGI app with its middleware; the MCP server through an in-memory client
  session), before the socket opens;
- `follow`: a searcher's `VersionFollower` runs `warm_version` on every version it is about to
  switch to (``VersionFollower.prepare``), and records the seconds in ``warmed``.

A warm-up never stops a server: what fails is logged, and the first request pays instead.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

#: Distinct queries a warm-up answers besides `VersionSearcher.warm`'s own.
WARM_QUERIES = 3
#: Words of a document a warm-up query is made of.
WARM_WORDS = 8


def warm_texts(version, n: int = WARM_QUERIES) -> list[str]:
    """``n`` query texts: the first `WARM_WORDS` words of documents spread evenly over the
    version's corpus (so their answers read different row groups); fewer for a tiny corpus."""
    docs = version.index.docs
    total = len(docs)
    out: list[str] = []
    for pos in sorted({(j * total) // n + (total // n) // 2 for j in range(n)} if total else ()):
        d = docs.get(int(docs.docnos_at([min(pos, total - 1)])[0]))
        words = " ".join(f"{d['title'] or ''} {d['text'] or ''}".split()[:WARM_WORDS])
        if words and words not in out:
            out.append(words)
    return out


def warm_version(version) -> dict[str, Any]:
    """Warm one opened version (a `VersionSearcher`) as a server needs it: `VersionSearcher.warm`,
    then `warm_texts` searched in the default mode and rendered. Returns ``{"version",
    "seconds", "embedder_s", "queries"}``; never raises (a failure is logged)."""
    t = time.perf_counter()
    base = version.warm()
    queries = 0
    try:
        for text in warm_texts(version):
            version.search(text, k=10).to_dict()
            queries += 1
    except Exception as e:  # noqa: BLE001 - a warm-up must not stop a server
        log.warning("warm-up queries on version %s failed (%s: %s); its first requests pay instead",
                    version.version, type(e).__name__, e)
    return {"version": version.version, "seconds": round(time.perf_counter() - t, 3), "warm_s": round(base, 3),
            "embedder_s": round(getattr(version, "warm_embedder_s", 0.0), 3), "queries": queries}


def follow(searcher) -> None:
    """Have ``searcher``'s follower warm each version before switching to it (`warm_version`)."""
    searcher.follower.prepare = warm_version


def warm_http(app, searcher, token: str | None = None, tokens=None) -> int:
    """POST `warm_texts` to ``app``'s ``/search`` in-process, as a client would (through
    ``RequestGuard`` with the administrator's ``token`` when there is one; with only a tokens
    file, to the routes behind it). Returns how many were answered with 200."""
    import asyncio
    target = app if token or not tokens else app.router
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    ok = 0
    for text in warm_texts(searcher.follower.current):
        status = asyncio.run(_asgi_post(target, "/search", {"query": text, "k": 10}, headers))
        if status != 200:
            log.warning("warm-up request to /search answered %s; the first request pays instead", status)
            break
        ok += 1
    return ok


async def _asgi_post(app, path: str, body: dict, headers: list[tuple[bytes, bytes]]) -> int:
    """One POST through an ASGI app in-process; its status."""
    import asyncio
    data = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "state": {},
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode()), *headers]}
    sent: list[dict] = []
    body_given = False

    async def receive() -> dict:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected; the app never needs more
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), 0)


def warm_mcp(server, searcher) -> int:
    """Call the ``search`` tool with `warm_texts` through an in-memory MCP client session on
    ``server`` (the JSON-RPC handling, the argument check and the result's conversion, which
    the transports share). Returns how many calls succeeded."""
    import anyio

    from mcp import Client
    texts = warm_texts(searcher.follower.current)

    async def calls() -> int:
        ok = 0
        async with Client(server) as client:
            for text in texts:
                res = await client.call_tool("search", {"query": text, "k": 10})
                if res.is_error:
                    log.warning("warm-up call of the search tool failed: %s", res.content)
                    break
                ok += 1
        return ok

    return anyio.run(calls)


def warm_server(searcher, front_end=None) -> dict[str, Any]:
    """A server's warm-up before it listens: `warm_version` on the version it serves, then
    ``front_end()`` (`warm_http` or `warm_mcp` bound to the server), and `follow` so each later
    version is warmed before it serves. Returns the record `warm_version` made, with the
    front end's ``requests`` answered, ``front_end_s`` and ``total_s``; never raises."""
    t = time.perf_counter()
    rec = warm_version(searcher.follower.current)
    rec["requests"], front = 0, time.perf_counter()
    if front_end is not None:
        try:
            rec["requests"] = front_end()
        except Exception as e:  # noqa: BLE001 - a warm-up must not stop a server from starting
            log.warning("warm-up requests through the server failed (%s: %s); the first request pays instead",
                        type(e).__name__, e)
    follow(searcher)
    rec["front_end_s"] = round(time.perf_counter() - front, 3)
    rec["total_s"] = round(time.perf_counter() - t, 3)
    return rec


def describe(rec: dict, unit: str) -> str:
    """The servers' log line for a `warm_server` record (bench_cpu_embed.py reads its figures)."""
    return (f"warm-up query answered in {rec['warm_s']:.2f}s (query embedder ready in {rec['embedder_s']:.2f}s; "
            f"{rec['queries']} more queries in {rec['seconds'] - rec['warm_s']:.2f}s; {rec['requests']} {unit} in "
            f"{rec['front_end_s']:.2f}s; {rec['total_s']:.2f}s in all)")
