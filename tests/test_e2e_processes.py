"""``funnel serve`` and ``funnel mcp --transport streamable-http`` as real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from servers import free_port  # noqa: F401  (others import it from here too)

QUERY = "parse command line arguments"
START_TIMEOUT_S = 60
TOKEN = "e2e-token"




@contextlib.contextmanager
def funnel_process(*args: str):
    """Run ``python -m funnel.serving.frontends.cli ARGS``; always stopped (TERM, then KILL) on exit.

    Yields the Popen and a function returning the process's output so far.
    """
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "funnel.serving.frontends.cli", *args],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-4000:]

    try:
        yield proc, output
    except BaseException:
        sys.stderr.write(f"funnel {' '.join(args)} output:\n{output()}\n")
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        log.close()


def wait_until(ready, proc, output, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it was ready:\n{output()}")
        try:
            if ready():
                return
        except (httpx.TransportError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} was not ready within {timeout:.0f} s:\n{output()}")
        time.sleep(0.2)


def test_funnel_serve_over_real_http(demo_index_1):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with funnel_process("-v", "serve", demo_index_1, "--port", str(port), "--token", TOKEN) as (proc, output), \
            httpx.Client(timeout=30) as http:
        wait_until(lambda: http.get(f"{base}/health").status_code == 200, proc, output, "funnel serve")
        health = http.get(f"{base}/health").json()
        assert health["status"] == "ok" and health["n_docs"] > 0 and "bm25" in health["modes"]

        assert http.post(f"{base}/search", json={"query": QUERY}).status_code == 401
        r = http.post(f"{base}/search", json={"query": QUERY, "k": 3},
                      headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["summary"].startswith(f"Found 3 documents for {QUERY!r}")
        assert len(body["hits"]) == 3 and body["hits"][0]["doc_id"].startswith("argparse")
        assert body["trace"]["version"] == health["version"]

        # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM), output()
        assert "Finished server process" in output()


def test_funnel_mcp_over_streamable_http(demo_index_1):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    async def session_calls():
        with anyio.fail_after(60):
            async with streamable_http_client(url) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=30) as s:
                    await s.initialize()
                    tools = await s.list_tools()
                    res = await s.call_tool("search", {"query": QUERY, "k": 3})
                    bad = await s.call_tool("search", {"query": QUERY, "mode": "nope"})
                    return tools, res, bad

    with funnel_process("mcp", demo_index_1, "--transport", "streamable-http",
                        "--port", str(port)) as (proc, output):
        wait_until(listening, proc, output, "funnel mcp")
        tools, res, bad = anyio.run(session_calls)
        assert {t.name for t in tools.tools} == {"search", "get_document", "get_documents", "list_documents",
                                                  "term_stats", "status"}
        assert not res.is_error
        assert res.content[0].text.startswith(f"Found 3 documents for {QUERY!r}")
        hits = res.structured_content["hits"]
        assert len(hits) == 3 and hits[0]["doc_id"].startswith("argparse")
        assert bad.is_error and "unknown mode 'nope'" in bad.content[0].text
