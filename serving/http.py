"""HTTP front end (FastAPI): the same ``search()`` the CLI and MCP call, as JSON.

    funnel serve INDEX_ROOT [--host 127.0.0.1] [--port 8765] [--token TOKEN]

    POST /search            {"query": "...", "mode": "bm25", "k": 10, "options": {}}
                            -> SearchResult.to_dict(): {query, mode, summary, hits, trace}
    GET  /documents/{id}    -> {doc_id, title, text, content_hash, shard, local_id}
    POST /term_stats        {"terms": ["..."]} -> {"version": ..., "stats": [{term, analyzed, df, cf, idf, ...}]}
    GET  /health            -> {status, version, n_docs, modes, refresh_error}
                               (modes: only those this index version can answer)

Every error body is ``{"error": "<what was wrong and what to do>"}``; see ``ERROR_STATUS``.
With a token, every endpoint but ``/health`` needs ``Authorization: Bearer TOKEN``.
The searcher is read-only, so requests run concurrently in the threadpool (``def``
endpoints); at most once a second a request first checks whether CURRENT moved and, if so,
swaps in the newly published version (no restart needed).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from starlette.exceptions import HTTPException

from funnel.pipelines.artifacts import IndexFormatError

from .search import MAX_K, MAX_QUERY_CHARS, ModeUnavailable, Searcher, SearchError, open_index

log = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_TERMS = 1000

# Exception class -> HTTP status. Looked up along the exception's MRO, so the most
# specific class wins (IndexFormatError and SearchError are both ValueErrors).
ERROR_STATUS: dict[type[Exception], int] = {
    ModeUnavailable: 400,
    SearchError: 400,
    IndexFormatError: 503,
}

# search() parameters that may not be smuggled in through "options".
_RESERVED_OPTIONS = frozenset({"query", "mode", "k"})


class SearchRequest(BaseModel):
    """Body of ``POST /search``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="the text to search for")
    mode: str = Field("bm25", description="retrieval mode, e.g. bm25, dense, hybrid")
    k: StrictInt = Field(10, ge=1, le=MAX_K, description="number of hits to return")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="mode parameters, e.g. {\"k1\": 0.9, \"b\": 0.4}")

    @field_validator("query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the query is blank: pass the text to search for")
        return v

    @field_validator("options")
    @classmethod
    def _no_reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        bad = sorted(_RESERVED_OPTIONS.intersection(v))
        if bad:
            raise ValueError(f"{', '.join(bad)}: set at the top level of the body, not in options")
        return v


class TermStatsRequest(BaseModel):
    """Body of ``POST /term_stats``."""

    model_config = ConfigDict(extra="forbid")

    terms: list[str] = Field(min_length=1, max_length=MAX_TERMS, description="words to look up")


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


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
        field = ".".join(loc) or "body"
        msg = err.get("msg", "invalid value").removeprefix("Value error, ")
        if err.get("type") == "missing":
            msg = "field required"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{field}: {msg}")
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

    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(HTTPException, http_error)


def _bearer_check(token: str | None) -> Callable[[Request], None]:
    expected = f"Bearer {token}".encode() if token else None

    def check(request: Request) -> None:
        if expected is None:
            return
        got = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(got, expected):
            raise HTTPException(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'",
                                headers={"WWW-Authenticate": "Bearer"})

    return check


def create_app(searcher_or_root: Searcher | str | os.PathLike, token: str | None = None,
               refresh_interval: float = 1.0) -> FastAPI:
    """Build the FastAPI app over a searcher (or an index root, opened here).

    Parameters
    ----------
    searcher_or_root
        An open :class:`~funnel.serving.search.Searcher`, or an index root path.
    token
        If set, every endpoint but ``/health`` requires ``Authorization: Bearer TOKEN``.
    refresh_interval
        Seconds between checks for a newly published index version.

    Returns
    -------
    FastAPI
        The app; ``app.state.searcher`` is the searcher it serves.
    """
    searcher = (searcher_or_root if isinstance(searcher_or_root, Searcher)
                else open_index(os.fspath(searcher_or_root)))
    throttle = RefreshThrottle(searcher, refresh_interval)
    app = FastAPI(title="funnel", summary="Retrieval for agents: a summary, hits and a trace per query.")
    app.state.searcher = searcher
    _install_error_handlers(app)

    def refreshed() -> Searcher:
        throttle()
        return searcher

    auth = [Depends(_bearer_check(token))]

    @app.get("/health")
    def health() -> dict[str, Any]:
        s = refreshed()
        st = s.status()
        return {"status": st["state"], "version": st["serving_version"], "n_docs": s.index.n_docs,
                "modes": servable_modes(s), "refresh_error": st["reason"], "current": st["current"],
                "degraded_since": st["since"]}

    @app.post("/search", dependencies=auth)
    def search(req: SearchRequest, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        try:
            res = s.search(req.query, mode=req.mode, k=req.k, **req.options)
        except SearchError:
            raise
        except (TypeError, ValueError) as e:
            if not req.options or isinstance(e, IndexFormatError):
                raise
            # A bad option value (k1="high") surfaces as a conversion error deep in the mode.
            raise SearchError(f"invalid options {req.options!r} for mode {req.mode!r}: {e}") from e
        return res.to_dict()

    @app.get("/documents/{doc_id:path}", dependencies=auth)
    def get_document(doc_id: str, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        doc = s.get_document(doc_id)
        if doc is None:
            raise HTTPException(404, f"no document with doc_id {doc_id!r} in index version {s.version}")
        return doc

    @app.post("/term_stats", dependencies=auth)
    def term_stats(req: TermStatsRequest, s: Searcher = Depends(refreshed)) -> dict[str, Any]:
        return {"version": s.version, "stats": s.term_stats(req.terms)}

    return app


def serve(index_root: str, host: str = "127.0.0.1", port: int = 8765, token: str | None = None) -> int:
    """Serve ``index_root`` over HTTP with uvicorn until interrupted.

    Once listening, logs (INFO) the URL, the index and version, the modes it answers and
    whether a token is required.

    Parameters
    ----------
    index_root
        Index root (the folder holding CURRENT) or one version directory.
    host, port
        Where to listen; 127.0.0.1 by default; port 0 picks a free port (the log says which).
        Another host without a token logs a warning.
    token
        Optional bearer token required on every endpoint but ``/health``; an empty string
        is refused (it would otherwise silently mean "no authentication").

    Returns
    -------
    int
        Exit code: 0 after a clean shutdown; uvicorn's non-zero code (3) if it could not start,
        e.g. when the port is in use.
    """
    import uvicorn

    if token is not None and not token.strip():
        raise ValueError("the token is empty: pass a non-empty token, or None to serve without authentication")
    if host not in LOOPBACK and not token:
        log.warning("serving %s on %s:%d without a token: anyone who can reach this host can query "
                    "the index; pass --token (or set FUNNEL_TOKEN)", index_root, host, port)
    app = create_app(index_root, token=token)
    searcher = app.state.searcher

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
                         "required (Authorization: Bearer ...)" if token else "not required")

    level = logging.getLevelName(min(logging.getLogger().getEffectiveLevel(), logging.WARNING)).lower()
    server = Server(uvicorn.Config(app, host=host, port=port, log_level=level))
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits on startup failures such as a port in use
        return int(e.code or 1)
    return 0 if server.started else 1
