"""Hostile input and exposure of ``funnel serve`` and ``funnel mcp --transport streamable-http``.

Every test talks to a real server process on 127.0.0.1 (raw sockets where a well-behaved
client library would refuse to misbehave; the real ``mcp`` client otherwise). What they
pin down (issue 16, "A request can kill the server" and "Authentication"):

- a body over the limit is refused with 413 before the token check and before it is read,
  and the server's peak memory does not move;
- ``/term_stats``: bounded term count and length, each term once in the answer;
- lone surrogates anywhere in a body are a 4xx, never a 500;
- ``/docs`` and ``/openapi.json`` need the token like the API;
- beyond loopback both servers refuse to start without a token unless ``--insecure``;
- the MCP server over HTTP takes a token and keeps its Host-header check on 0.0.0.0.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

import anyio
import httpx
import pytest

QUERY = "parse command line arguments"
TOKEN = "limits-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START_TIMEOUT_S = 60
MIB = 1 << 20
HUGE = 256 * MIB
#: How much a server's peak RSS may grow while refusing a huge body.
RSS_SLACK_KB = 100 * 1024


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def funnel_process(*args: str, env: dict[str, str] | None = None):
    """``python -m funnel.serving.frontends.cli ARGS`` with FUNNEL_TOKEN unset unless ``env`` sets it;
    always stopped (TERM, then KILL). Yields the Popen and a function returning its output."""
    log = tempfile.TemporaryFile("w+")
    full_env = {k: v for k, v in os.environ.items() if k != "FUNNEL_TOKEN"}
    full_env.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "funnel.serving.frontends.cli", *args], env=full_env,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output() -> str:
        log.flush()
        log.seek(0)
        return log.read()[-6000:]

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


def wait_listening(proc, output, port: int, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} before it listened:\n{output()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not listen within {START_TIMEOUT_S} s:\n{output()}")
        time.sleep(0.2)


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command that must exit on its own (a refusal); a server that starts instead
    is killed and the test fails."""
    full_env = {k: v for k, v in os.environ.items() if k != "FUNNEL_TOKEN"}
    full_env.update(env or {})
    try:
        return subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", *args], env=full_env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"funnel {' '.join(args)} did not refuse to start; it was still running after "
                    f"{timeout:.0f} s:\n{(e.stderr or b'')[-3000:]!r}")


# -- a raw HTTP client ---------------------------------------------------------------------


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, sent: int):
        self.status, self.headers, self.body, self.sent = status, headers, body, sent

    def json(self):
        return json.loads(self.body)


def raw_request(port: int, head: str, chunks=(), timeout: float = 15) -> RawResponse:
    """Send ``head`` (request line and headers), then ``chunks`` until the server answers
    or stops reading; return the answer. ``sent`` counts the body bytes that went out."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(head.encode("latin-1"))
        sent = 0
        sock.settimeout(2)  # a server that stopped reading blocks our send: then read its answer
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(chunk)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        sock.settimeout(timeout)
        data = b""
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
        head_bytes, _, body = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        want = int(headers.get("content-length", "0"))
        while len(body) < want:
            part = sock.recv(65536)
            if not part:
                break
            body += part
        return RawResponse(status, headers, body, sent)
    finally:
        sock.close()


def post_head(path: str, port: int, *, length: int | None = None, token: str | None = None) -> str:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return "\r\n".join(lines) + "\r\n\r\n"


def chunked(total: int, size: int = 64 * 1024):
    """``total`` bytes of a JSON-looking body in HTTP/1.1 chunked framing."""
    data = b"a" * size
    yield f"{size:x}\r\n".encode() + b'{"query": "' + data[11:] + b"\r\n"
    for _ in range(total // size - 1):
        yield f"{size:x}\r\n".encode() + data + b"\r\n"
    yield b"0\r\n\r\n"


# -- funnel serve --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(demo_index_1):
    """``funnel serve`` with a token and the default limits; yields (port, pid)."""
    port = free_port()
    with funnel_process("serve", demo_index_1, "--port", str(port), "--token", TOKEN) as (proc, output):
        wait_listening(proc, output, port, "funnel serve")
        yield port, proc.pid


@pytest.fixture
def http(server):
    port, _ = server
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=AUTH, timeout=30) as c:
        yield c


def _error(r, status: int) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


def test_a_declared_huge_body_is_refused_before_the_token_and_unread(server):
    port, pid = server
    httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).raise_for_status()
    before = peak_rss_kb(pid)
    # 256 MiB announced, 14 bytes sent, no token: the answer comes without waiting for the rest.
    r = raw_request(port, post_head("/search", port, length=HUGE), [b'{"query": "x"}'], timeout=15)
    assert r.status == 413, r.body
    msg = r.json()["error"]
    assert str(HUGE) in msg and f"{MIB:,}" in msg and "--max-body-bytes" in msg
    r = raw_request(port, post_head("/term_stats", port, length=HUGE, token=TOKEN), [b"{}"])
    assert r.status == 413
    assert peak_rss_kb(pid) - before < RSS_SLACK_KB


def test_a_streamed_huge_body_is_cut_at_the_limit(server):
    port, pid = server
    httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).raise_for_status()
    before = peak_rss_kb(pid)
    # Chunked, so no length is declared: with the token the server counts what arrives...
    r = raw_request(port, post_head("/search", port, token=TOKEN), chunked(HUGE), timeout=30)
    assert r.status == 413, r.body
    assert f"{MIB:,}" in r.json()["error"]
    assert r.sent < HUGE // 4  # it stopped reading long before the end
    # ... and without the token it refuses before reading any of it.
    r = raw_request(port, post_head("/search", port), chunked(HUGE), timeout=30)
    assert r.status == 401 and "Bearer" in r.json()["error"]
    assert r.sent < HUGE // 4
    assert peak_rss_kb(pid) - before < RSS_SLACK_KB


def test_term_stats_bounds_terms_and_their_length(http):
    msg = _error(http.post("/term_stats", json={"terms": [f"w{i}" for i in range(101)]}), 422)
    assert "terms" in msg and "100" in msg
    msg = _error(http.post("/term_stats", json={"terms": ["ok", "x" * 257]}), 422)
    assert "terms.1" in msg and "256" in msg
    # Under the body limit but over the term limit: still a 422, not an analysis of 900 kB.
    assert http.post("/term_stats", json={"terms": ["y" * 900_000]}).status_code == 422


def test_term_stats_gives_each_term_once_with_its_forms(http, server):
    # 100 terms of 256 characters, each analysing to many tokens: the answer names each
    # term once (the reported defect echoed it once per token: 205 MB for 100 x 4 kB).
    terms = [" ".join(f"t{i}w{j}" for j in range(40))[:256] for i in range(100)]
    r = http.post("/term_stats", json={"terms": terms})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [s["term"] for s in body["stats"]] == terms
    assert all(r.text.count(t) == 1 for t in terms[:10])
    assert len(r.content) < 2 * MIB
    first = body["stats"][0]
    assert [f["analyzed"] for f in first["forms"]] == [f"t0w{j}" for j in range(len(first["forms"]))]
    assert all(f["df"] == 0 and f["cf"] == 0 for f in first["forms"])


@pytest.mark.parametrize("path, raw_body, field", [
    ("/term_stats", '{"terms": ["ok", "\\ud800"]}', "terms.1"),
    ("/term_stats", '{"terms": ["a\\udfffb"]}', "terms.0"),
    ("/search", '{"query": "x\\ud800"}', "query"),
    ("/search", '{"query": "x", "options": {"\\ud800": 1}}', "options"),
    ("/search", '{"query": "x", "options": {"fusion": "\\ud800"}}', "options"),
    ("/search", '{"query": "x", "options": {"blend_tiers": [["\\udc00", 1]]}}', "options"),
    ("/search", '{"query": "x", "mode": "\\ud800"}', "mode"),
])
def test_lone_surrogates_are_4xx_never_500(http, path, raw_body, field):
    r = http.post(path, content=raw_body.encode(), headers={"Content-Type": "application/json"})
    msg = _error(r, 422)
    assert f"{field}:" in msg and "surrogate" in msg


@pytest.mark.parametrize("options, says", [
    ({f"o{i}": 1 for i in range(33)}, "at most 32"),
    ({"k" * 65: 1}, "64"),
    ({"fusion": "r" * 257}, "256"),
    ({"blend_tiers": [[i, 0.5] for i in range(40)]}, "32"),
    ({"blend_tiers": [[[[[1]]]]]}, "nested"),
    ({"candidates": 10 ** 30}, "1,000,000,000"),
])
def test_search_options_are_bounded(http, options, says):
    msg = _error(http.post("/search", json={"query": QUERY, "options": options}), 422)
    assert msg.startswith("invalid request: options") and says in msg


def test_k_is_bounded(http):
    msg = _error(http.post("/search", json={"query": QUERY, "k": 10 ** 6}), 422)
    assert "k:" in msg and "1000" in msg


def test_docs_and_openapi_need_the_token(server):
    port, _ = server
    base = f"http://127.0.0.1:{port}"
    for path in ("/docs", "/openapi.json", "/redoc"):
        r = httpx.get(base + path, timeout=30)
        assert r.status_code == 401 and "Bearer" in r.json()["error"], path
    assert httpx.get(base + "/openapi.json", headers=AUTH, timeout=30).json()["info"]["title"] == "funnel"
    assert httpx.get(base + "/docs", headers=AUTH, timeout=30).status_code == 200
    assert httpx.get(base + "/health", timeout=30).status_code == 200  # open, for load balancers


# -- refusing to start beyond loopback -----------------------------------------------------


@pytest.mark.parametrize("command", [
    ["serve"],
    ["mcp", "--transport", "streamable-http"],
])
def test_beyond_loopback_without_a_token_refuses_to_start(demo_index_1, command):
    p = run_cli(command[0], demo_index_1, *command[1:], "--host", "0.0.0.0", "--port", "0")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    assert "0.0.0.0" in p.stderr and "--token" in p.stderr and "--insecure" in p.stderr


@pytest.mark.parametrize("command", [
    ["serve"],
    ["mcp", "--transport", "streamable-http"],
])
def test_insecure_starts_beyond_loopback_with_a_loud_warning(demo_index_1, command):
    port = free_port()
    with funnel_process(command[0], demo_index_1, *command[1:], "--host", "0.0.0.0", "--port", str(port),
                        "--insecure") as (proc, output):
        wait_listening(proc, output, port, f"funnel {command[0]} --insecure")
        assert "INSECURE" in output() and "no authentication" in output()


@pytest.mark.parametrize("args, env, says", [
    (["--token", ""], {}, "--token is empty"),
    (["--token", "  "], {}, "--token is empty"),
    ([], {"FUNNEL_TOKEN": ""}, "FUNNEL_TOKEN is set but empty"),
])
def test_mcp_refuses_an_empty_token(demo_index_1, args, env, says):
    p = run_cli("mcp", demo_index_1, "--transport", "streamable-http", "--port", "0", *args, env=env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and says in p.stderr and "Traceback" not in p.stderr


# -- funnel mcp over streamable HTTP -------------------------------------------------------


def _initialize(port: int, headers: dict[str, str] | None = None, host: str | None = None) -> httpx.Response:
    """The first message of an MCP session, sent by hand (to see the HTTP status)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}
    h = {"Accept": "application/json, text/event-stream", **(headers or {})}
    if host:
        h["Host"] = host
    return httpx.post(f"http://127.0.0.1:{port}/mcp", json=body, headers=h, timeout=30)


def _mcp_search(port: int, token: str | None):
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        with anyio.fail_after(60):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as client, \
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=30) as s:
                await s.initialize()
                return await s.call_tool("search", {"query": QUERY, "k": 3})

    return anyio.run(main)


def test_mcp_over_http_takes_a_token_and_bounds_bodies(demo_index_1):
    port = free_port()
    with funnel_process("mcp", demo_index_1, "--transport", "streamable-http", "--port", str(port),
                        "--token", TOKEN) as (proc, output):
        wait_listening(proc, output, port, "funnel mcp")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = _initialize(port, headers)
            assert r.status_code == 401 and "Bearer" in r.json()["error"], r.text
            assert r.headers["www-authenticate"] == "Bearer"
        assert _initialize(port, AUTH).status_code == 200

        res = _mcp_search(port, TOKEN)
        assert not res.is_error and len(res.structured_content["hits"]) == 3

        before = peak_rss_kb(proc.pid)
        r = raw_request(port, post_head("/mcp", port, length=HUGE), [b"{}"])
        assert r.status == 413 and f"{MIB:,}" in r.json()["error"]
        r = raw_request(port, post_head("/mcp", port, token=TOKEN), chunked(HUGE), timeout=30)
        assert r.status == 413 and r.sent < HUGE // 4
        assert peak_rss_kb(proc.pid) - before < RSS_SLACK_KB

        # A lone surrogate in the JSON-RPC body is refused by the JSON parser: a 4xx.
        raw = ('{"jsonrpc": "2.0", "id": 2, "method": "tools/call", '
               '"params": {"name": "term_stats", "arguments": {"terms": ["\\ud800"]}}}')
        r = httpx.post(f"http://127.0.0.1:{port}/mcp", content=raw.encode(), timeout=30,
                       headers={**AUTH, "Content-Type": "application/json",
                                "Accept": "application/json, text/event-stream"})
        assert 400 <= r.status_code < 500, r.text


def test_mcp_on_all_interfaces_keeps_the_host_check(demo_index_1):
    port = free_port()
    # The token comes from $FUNNEL_TOKEN here; the Host header is checked on top of it.
    with funnel_process("mcp", demo_index_1, "--transport", "streamable-http", "--host", "0.0.0.0",
                        "--port", str(port), "--allow-host", "search.example.org",
                        env={"FUNNEL_TOKEN": TOKEN}) as (proc, output):
        wait_listening(proc, output, port, "funnel mcp --host 0.0.0.0")
        r = _initialize(port, AUTH, host=f"attacker.example:{port}")  # a DNS-rebinding request
        assert r.status_code == 421, r.text
        assert _initialize(port, AUTH, host=f"search.example.org:{port}").status_code == 200
        assert _initialize(port, AUTH, host=f"127.0.0.1:{port}").status_code == 200
        assert _initialize(port, host=f"127.0.0.1:{port}").status_code == 401


def test_http_api_checks_the_host_header(demo_index_1):
    """DNS rebinding: a page on attacker.example resolving its name to 127.0.0.1 must not
    reach the loopback API; the check comes before the token and any work (issue 16)."""
    port = free_port()
    with funnel_process("serve", demo_index_1, "--port", str(port), "--allow-host", "search.example.org") \
            as (proc, output):
        wait_listening(proc, output, port, "funnel serve")
        url = f"http://127.0.0.1:{port}/search"
        r = httpx.post(url, json={"query": QUERY}, headers={"Host": f"attacker.example:{port}"}, timeout=30)
        assert r.status_code == 421 and "--allow-host" in r.json()["error"], r.text
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Host": "attacker.example"}, timeout=30)
        assert r.status_code == 421
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"search.example.org:{port}"):
            r = httpx.post(url, json={"query": QUERY, "k": 2}, headers={"Host": host}, timeout=30)
            assert r.status_code == 200 and len(r.json()["hits"]) == 2, (host, r.text)
