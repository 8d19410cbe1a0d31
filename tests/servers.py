"""Helpers the server tests share: a free port on 127.0.0.1 and an app under a real uvicorn,
configured as ``funnel serve`` configures it (``serving.frontends.connections``)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

START_TIMEOUT_S = 20


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(app, limits=None):
    """``app`` under a real uvicorn on 127.0.0.1 in a background thread, with the connection
    bounds ``limits`` (a ``ConnectionLimits``; default: the servers' defaults); yields the
    port and stops the server on exit."""
    import uvicorn

    from funnel.serving.frontends.connections import uvicorn_config
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, limits))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not t.is_alive():
            server.should_exit = True
            pytest.fail(f"uvicorn did not start within {START_TIMEOUT_S} s")
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        t.join(timeout=10)
