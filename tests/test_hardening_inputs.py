"""Serving inputs that outside probes found unbounded (issue 37, items 1, 5, 6 and 7).

- Every numeric search option is a finite number in range, or an error naming it, through
  every front end: Python ``search()`` (SearchError), HTTP ``/search`` (400), the MCP
  ``search`` tool (a tool error), the CLI (exit 2). ``k1`` = inf or nan used to give an
  empty success with a false note, ``context_tokens`` = inf an HTTP 500.
- MCP over stdio answers a line that is not a JSON-RPC message with a JSON-RPC error
  (the SDK dropped it, so the caller hung), bounds the line length, and keeps serving.
- The MCP ``search`` tool refuses an argument it does not take, as HTTP does (422).
- An HTTP request body that never arrives in full is a 408 after the body timeout.

Real components throughout: the 400-document demo index, uvicorn on 127.0.0.1, raw
sockets where a client library would not misbehave, ``funnel mcp`` as a subprocess
spoken to line by line, and the ``mcp`` client library in-process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import socket
import subprocess
import sys
import time

import anyio
import httpx
import pytest
from mcp import Client

from funnel.serving.frontends.cli import main
from funnel.serving.frontends.http import DEFAULT_BODY_TIMEOUT_S, create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.options import NUMBERS, check_option_values
from funnel.serving.search import SearchError, open_index
from servers import live_server

QUERY = "parse command line arguments"
TIMEOUT_S = 60

#: Values that must never pass as a number: non-finite as floats, as JSON-ish text, and bools.
NOT_NUMBERS = [math.inf, -math.inf, math.nan, "inf", "nan", "Infinity", "-inf", "1e999", True, False, None,
               "high", [1.0]]


@pytest.fixture(scope="module")
def searcher(demo_index_1):
    with open_index(demo_index_1) as s:
        yield s


@pytest.fixture(scope="module")
def http_port(searcher):
    with live_server(create_app(searcher)) as port:
        yield port


@pytest.fixture(scope="module")
def impatient_port(searcher):
    """A server whose request bodies must arrive within 1 s."""
    with live_server(create_app(searcher, body_timeout_s=1.0)) as port:
        yield port


def post_raw(port: int, body: str) -> httpx.Response:
    """POST /search with ``body`` as written: JSON's Infinity and NaN literals included."""
    return httpx.post(f"http://127.0.0.1:{port}/search", content=body.encode(), timeout=30,
                      headers={"Content-Type": "application/json"})


def call_tool(searcher, name: str, args: dict):
    async def main_():
        with anyio.fail_after(TIMEOUT_S):
            async with Client(build_mcp_server(searcher)) as c:
                return await c.call_tool(name, args)
    return anyio.run(main_)


# -- 1. numeric options: finite and in range, at the one check every front end reaches -----


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_every_numeric_option_refuses_non_numbers_and_out_of_range(name):
    spec = NUMBERS[name]
    for bad in NOT_NUMBERS + [spec.lo - 1, spec.hi * 2 + 1]:
        with pytest.raises(SearchError, match=f"^{name} must be") as e:
            check_option_values({name: bad})
        assert "got" in str(e.value), str(e.value)
    assert check_option_values({name: spec.lo}) == {name: spec.lo}
    assert check_option_values({name: str(spec.hi)}) == {name: spec.hi}  # numbers as text stay fine


@pytest.mark.parametrize("options, names", [
    ({"top_rank_bonus": [0.05, math.inf]}, "top_rank_bonus[1]"),
    ({"top_rank_bonus": ["nan", 0.02]}, "top_rank_bonus[0]"),
    ({"blend_tiers": [[3, math.nan], [None, 0.4]]}, "blend_tiers[0] weight"),
    ({"blend_tiers": [[math.inf, 0.5], [None, 0.4]]}, "blend_tiers[0] rank"),
    ({"rerank": "false"}, "rerank must be true or false"),
])
def test_nested_and_switch_options_are_checked_too(options, names):
    with pytest.raises(SearchError, match=r"^" + names.replace("[", r"\[").replace("]", r"\]")):
        check_option_values(options)


@pytest.mark.parametrize("mode, options, name", [
    ("bm25", {"k1": math.inf}, "k1"),
    ("bm25", {"k1": math.nan}, "k1"),
    ("bm25", {"k1": "inf"}, "k1"),
    ("bm25", {"k1": "nan"}, "k1"),
    ("bm25", {"k1": True}, "k1"),
    ("bm25", {"b": math.nan}, "b"),
    ("bm25", {"context_tokens": math.inf}, "context_tokens"),
    ("bm25", {"context_tokens": 1e300}, "context_tokens"),
    ("sira", {"k1": "inf"}, "k1"),
    ("sira", {"lambda": math.nan}, "lambda"),
    ("hybrid", {"alpha": math.inf}, "alpha"),    # checked before the mode says it needs vectors
    ("hybrid", {"candidates": math.nan}, "candidates"),
    ("dense", {"nprobe": True}, "nprobe"),
])
def test_python_search_refuses_non_finite_values_naming_the_option(searcher, mode, options, name):
    with pytest.raises(SearchError, match=f"^{name} must be"):
        searcher.search(QUERY, mode=mode, **options)
    with pytest.raises(SearchError, match=f"^{name} must be"):
        searcher.search_batch({"q1": QUERY}, mode=mode, k=5, **options)


def test_python_search_refuses_a_bool_k(searcher):
    with pytest.raises(SearchError, match="k must be an integer"):
        searcher.search(QUERY, k=True)
    with pytest.raises(SearchError, match="k must be an integer"):
        searcher.search_batch({"q1": QUERY}, k=True)


def test_valid_numbers_still_reach_the_scorer(searcher):
    res = searcher.search(QUERY, k=3, k1="1.2", b=0.75, context_tokens=100.0)
    assert res.trace["bm25"]["k1"] == 1.2 and res.trace["bm25"]["b"] == 0.75
    assert res.hits and res.trace["context"]


@pytest.mark.parametrize("options, name", [
    ('{"k1": Infinity}', "k1"),
    ('{"k1": NaN}', "k1"),
    ('{"k1": -Infinity}', "k1"),
    ('{"k1": "inf"}', "k1"),
    ('{"k1": "nan"}', "k1"),
    ('{"k1": true}', "k1"),
    ('{"b": "NaN"}', "b"),
    ('{"k1": 1e999}', "k1"),
])
def test_http_refuses_non_finite_options_with_400(http_port, options, name):
    r = post_raw(http_port, f'{{"query": "{QUERY}", "options": {options}}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(f"{name} must be a finite number")


def test_http_context_tokens_infinity_is_400_not_500(http_port):
    r = post_raw(http_port, f'{{"query": "{QUERY}", "options": {{"context_tokens": Infinity}}}}')
    assert r.status_code == 400, r.text
    assert "context_tokens must be an integer" in r.json()["error"]
    # the server still answers
    r = post_raw(http_port, f'{{"query": "{QUERY}", "k": 2, "options": {{"context_tokens": 50}}}}')
    assert r.status_code == 200 and len(r.json()["hits"]) == 2 and r.json()["trace"]["context"]


@pytest.mark.parametrize("options, name", [
    ({"k1": math.inf}, "k1"),
    ({"k1": "nan"}, "k1"),
    ({"context_tokens": math.inf}, "context_tokens"),
])
def test_mcp_refuses_non_finite_options_naming_them(searcher, options, name):
    res = call_tool(searcher, "search", {"query": QUERY, "options": options})
    assert res.is_error and f"{name} must be" in res.content[0].text, res.content
    assert "Error executing tool search" != res.content[0].text.strip()


def test_mcp_refuses_a_bool_k(searcher):
    res = call_tool(searcher, "search", {"query": QUERY, "k": True})
    assert res.is_error and "k" in res.content[0].text


@pytest.mark.parametrize("flag, value", [("--k1", "inf"), ("--k1", "nan"), ("--b", "nan"), ("--alpha", "inf"),
                                         ("--lambda", "nan"), ("--tau", "inf")])
def test_cli_refuses_non_finite_flags(demo_index_1, capsys, flag, value):
    assert main(["search", demo_index_1, QUERY, flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "finite" in err and "Traceback" not in err


def test_cli_context_tokens_beyond_range_names_the_option(demo_index_1, capsys):
    assert main(["search", demo_index_1, QUERY, "--context-tokens", str(10 ** 30)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: context_tokens must be in") and "Traceback" not in err


# -- 6. MCP over stdio: every line gets an answer ------------------------------------------


class StdioPeer:
    """``funnel mcp INDEX`` as a subprocess, spoken to one line at a time."""

    def __init__(self, *args: str):
        self.err = open(os.devnull, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "funnel.serving.frontends.cli", "mcp", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.buf = b""

    def send(self, line: bytes) -> None:
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def send_json(self, obj) -> None:
        self.send(json.dumps(obj).encode())

    def recv(self, timeout: float = 30) -> dict:
        """The next line the server writes, as JSON; fails (rather than hangs) after ``timeout``."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                pytest.fail(f"no answer from the MCP server within {timeout:.0f} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                pytest.fail(f"the MCP server closed its output (exit code {self.proc.poll()})")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self.err.close()


@pytest.fixture(scope="module")
def stdio(demo_index_1):
    peer = StdioPeer(demo_index_1, "--max-body-bytes", "100000")
    try:
        peer.send_json({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                   "clientInfo": {"name": "test", "version": "0"}}})
        assert peer.recv(timeout=TIMEOUT_S)["result"]["serverInfo"]["name"] == "funnel"
        peer.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield peer
    finally:
        peer.close()


def search_call(rid: int, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "search", "arguments": arguments}}


@pytest.mark.parametrize("what, line", [
    ("invalid JSON", b'{"jsonrpc": "2.0", "id": 2, "method": '),
    ("a lone surrogate", b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"q": "\\ud800"}}'),
    ("10,000-deep nesting", b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"a": '
                            + b"[" * 10_000 + b"]" * 10_000 + b"}}"),
    ("a 5,000-digit id", b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "ping"}'),
    ("bytes that are not UTF-8", b'{"jsonrpc": "2.0", "id": 5, "method": "\xff\xfe"}'),
])
def test_stdio_answers_an_unparsable_line_with_a_parse_error(stdio, what, line):
    stdio.send(line)
    answer = stdio.recv()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None, (what, answer)
    assert answer["error"]["code"] == -32700 and answer["error"]["message"].startswith("Parse error"), answer
    # and the session goes on
    stdio.send_json(search_call(10, {"query": QUERY, "k": 2}))
    ok = stdio.recv()
    assert ok["id"] == 10 and not ok["result"]["isError"] and len(ok["result"]["structuredContent"]["hits"]) == 2


def test_stdio_answers_json_that_is_no_request_with_invalid_request(stdio):
    stdio.send(b'{"id": "q7", "hello": "world"}')
    answer = stdio.recv()
    assert answer["id"] == "q7" and answer["error"]["code"] == -32600, answer


def test_stdio_bounds_the_line_length(stdio):
    stdio.send_json(search_call(11, {"query": "x " * 60_000}))  # 120 kB: over the 100,000 set above
    answer = stdio.recv()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert "100,000 bytes" in answer["error"]["message"] and "--max-body-bytes" in answer["error"]["message"]
    stdio.send_json(search_call(12, {"query": QUERY, "k": 1}))
    ok = stdio.recv()
    assert ok["id"] == 12 and len(ok["result"]["structuredContent"]["hits"]) == 1


def test_stdio_tool_errors_name_the_problem(stdio):
    stdio.send_json(search_call(13, {"query": QUERY, "options": {"context_tokens": 1e999}}))  # Infinity
    answer = stdio.recv()
    assert answer["id"] == 13 and answer["result"]["isError"], answer
    assert "context_tokens must be an integer" in answer["result"]["content"][0]["text"]
    stdio.send_json(search_call(14, {"query": QUERY, "optoins": {"k1": 0.5}}))
    answer = stdio.recv()
    assert answer["id"] == 14 and answer["result"]["isError"], answer
    assert "'optoins'" in answer["result"]["content"][0]["text"]


# -- 7a. MCP refuses unknown arguments, as HTTP does ---------------------------------------


SEARCH_ARGS = "query, mode, k, budget, passages_per_hit, options, filter, offset, fields"


@pytest.mark.parametrize("tool, args, unknown, valid", [
    ("search", {"query": QUERY, "optoins": {"k1": 0.5}}, "'optoins'", SEARCH_ARGS),
    ("search", {"query": QUERY, "k1": 0.5, "top_k": 3}, "'k1', 'top_k'", SEARCH_ARGS),
    ("get_document", {"doc_id": "argparse", "full": True}, "'full'", "doc_id"),
    ("term_stats", {"terms": ["parse"], "lang": "en"}, "'lang'", "terms"),
])
def test_mcp_refuses_unknown_arguments_naming_them_and_the_valid_ones(searcher, tool, args, unknown, valid):
    res = call_tool(searcher, tool, args)
    assert res.is_error, res.content
    text = res.content[0].text
    assert f"unknown argument(s) {unknown} for tool {tool!r}" in text and f"valid: {valid}" in text


def test_http_refuses_the_same_unknown_field(http_port):
    r = post_raw(http_port, json.dumps({"query": QUERY, "optoins": {"k1": 0.5}}))
    assert r.status_code == 422 and "optoins: unknown field" in r.json()["error"]


# -- 7b. a body that never arrives in full is a 408 ----------------------------------------


def test_a_stalled_body_is_408_after_the_body_timeout(impatient_port):
    """Headers declare 200 bytes, 20 come, and the server gives up after its 1 s."""
    with socket.create_connection(("127.0.0.1", impatient_port), timeout=30) as sock:
        sock.sendall((f"POST /search HTTP/1.1\r\nHost: 127.0.0.1:{impatient_port}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n").encode()
                     + b'{"query": "parse com')
        t = time.monotonic()
        data = b""
        while True:
            try:
                part = sock.recv(65536)
            except TimeoutError:
                pytest.fail("no answer within 30 s to a body that stalled")
            if not part:
                break
            data += part
        waited = time.monotonic() - t
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data[:300]
    assert b"connection: close" in head.lower()
    msg = json.loads(body)["error"]
    assert "Content-Length 200" in msg and "20 bytes" in msg and "--body-timeout" in msg
    assert waited >= 0.9  # it waited for the body, up to the timeout
    # other clients are served as before
    r = post_raw(impatient_port, json.dumps({"query": QUERY, "k": 2}))
    assert r.status_code == 200 and len(r.json()["hits"]) == 2


def test_a_whole_body_sent_slowly_within_the_timeout_is_served(impatient_port):
    body = json.dumps({"query": QUERY, "k": 2}).encode()
    with socket.create_connection(("127.0.0.1", impatient_port), timeout=30) as sock:
        sock.sendall((f"POST /search HTTP/1.1\r\nHost: 127.0.0.1:{impatient_port}\r\nConnection: close\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode())
        sock.sendall(body[:10])
        time.sleep(0.3)
        sock.sendall(body[10:])
        data = b""
        while part := sock.recv(65536):
            data += part
    assert data.startswith(b"HTTP/1.1 200"), data[:300]


def test_the_body_timeout_has_a_bounded_default_and_refuses_nonsense(demo_index_1, searcher, capsys):
    assert 10 <= DEFAULT_BODY_TIMEOUT_S <= 30
    for bad in (0, -1, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="body_timeout_s"):
            create_app(searcher, body_timeout_s=bad)
    for command in ("serve", "mcp"):
        for value in ("0", "inf", "nan"):
            assert main([command, demo_index_1, "--body-timeout", value]) == 2
            assert "--body-timeout" in capsys.readouterr().err
