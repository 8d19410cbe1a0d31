"""A real rerank HTTP service for tests, on 127.0.0.1, speaking the Cohere/Jina and TEI
wire shapes.

It is not a model: it scores a document by term overlap with the query (the fraction of
distinct lower-cased query words the document contains), which is enough to check that a
client sends the right request and reads the right response. Extras for error paths:
``POST /_control/fail?times=N&status=S`` makes the next N rerank calls answer status S, and
an ``api_key`` makes every rerank call require ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import re
import socket
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel


def overlap_score(query: str, document: str) -> float:
    q = set(re.findall(r"\w+", query.lower()))
    d = set(re.findall(r"\w+", document.lower()))
    return len(q & d) / len(q) if q else 0.0


class CohereRequest(BaseModel):
    model: str
    query: str
    documents: list[str]
    top_n: int | None = None


class TEIRequest(BaseModel):
    query: str
    texts: list[str]


def create_app(api_key: str | None = None) -> FastAPI:
    app = FastAPI()
    state: dict[str, Any] = {"fail": 0, "status": 503, "requests": []}
    app.state.rerank = state

    def check(authorization: str | None) -> None:
        if api_key and authorization != f"Bearer {api_key}":
            raise HTTPException(401, "invalid api key")
        if state["fail"] > 0:
            state["fail"] -= 1
            raise HTTPException(state["status"], "injected failure")

    @app.post("/_control/fail")
    def fail(times: int = 1, status: int = 503) -> dict:
        state["fail"], state["status"] = times, status
        return {"ok": True}

    @app.post("/v1/rerank")
    def cohere(req: CohereRequest, authorization: str | None = Header(None)) -> dict:
        check(authorization)
        state["requests"].append(req.model_dump())
        scored = sorted(((i, overlap_score(req.query, d)) for i, d in enumerate(req.documents)),
                        key=lambda p: (-p[1], p[0]))
        n = len(scored) if req.top_n is None else req.top_n
        return {"id": "test", "results": [{"index": i, "relevance_score": s}
                                          for i, s in scored[:n]],
                "meta": {"api_version": {"version": "1"}}}

    @app.post("/rerank")
    def tei(req: TEIRequest, authorization: str | None = Header(None)) -> list[dict]:
        check(authorization)
        state["requests"].append(req.model_dump())
        scored = sorted(((i, overlap_score(req.query, d)) for i, d in enumerate(req.texts)),
                        key=lambda p: (-p[1], p[0]))
        return [{"index": i, "score": s} for i, s in scored]

    return app


class RerankServer:
    """Runs `create_app` with uvicorn in a thread; ``url`` is its root."""

    def __init__(self, api_key: str | None = None):
        self.app = create_app(api_key)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning",
                                                     lifespan="off"))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def requests(self) -> list[dict]:
        return self.app.state.rerank["requests"]

    def __enter__(self) -> RerankServer:
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("rerank test server did not start within 5 s")

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()
