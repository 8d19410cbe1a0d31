"""The MCP server (serving/frontends/mcp.py) through the real ``mcp`` client library.

Most tests spawn ``python -m funnel.serving.frontends.cli mcp INDEX`` and talk to it over stdio, as
an agent would; a few connect in-process (``mcp.Client(server)``) to check edge cases fast.
"""

from __future__ import annotations

import sys
import tempfile

import anyio
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client

from funnel.serving.frontends.http import MAX_TERM_CHARS, MAX_TERMS, term_stats
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.search import open_index

QUERY = "parse command line arguments"
TIMEOUT_S = 60


def with_stdio_session(index_root: str, fn):
    """Run ``await fn(session)`` against a freshly spawned stdio server; bounded by TIMEOUT_S."""
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "funnel.serving.frontends.cli", "mcp", index_root])

    async def main():
        with tempfile.TemporaryFile("w+") as errlog:
            try:
                with anyio.fail_after(TIMEOUT_S):
                    async with stdio_client(params, errlog=errlog) as (read, write):
                        async with ClientSession(read, write, read_timeout_seconds=TIMEOUT_S) as s:
                            await s.initialize()
                            return await fn(s)
            except BaseException:
                errlog.seek(0)
                sys.stderr.write("server stderr:\n" + errlog.read()[-4000:])
                raise

    return anyio.run(main)


def with_client(server, fn):
    async def main():
        with anyio.fail_after(TIMEOUT_S):
            async with Client(server) as c:
                return await fn(c)
    return anyio.run(main)


@pytest.fixture(scope="module")
def searcher(demo_index_1):
    return open_index(demo_index_1)


def test_stdio_list_tools_and_search(demo_index_1, searcher):
    async def calls(s):
        return await s.list_tools(), await s.call_tool("search", {"query": QUERY, "k": 5})

    tools, res = with_stdio_session(demo_index_1, calls)
    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == {"search", "get_document", "get_documents", "list_documents", "term_stats", "status"}
    schema = by_name["search"].input_schema
    assert schema["required"] == ["query"]
    assert schema["properties"]["k"]["maximum"] == 1000 and schema["properties"]["mode"].get("default") is None
    assert {"budget", "passages_per_hit"} <= set(schema["properties"])
    # The modes offered are the ones this index serves (as /health lists them): no vectors here,
    # so neither dense nor hybrid; without a mode, the index's default (bm25 here).
    from funnel.serving.frontends.http import servable_modes
    described = schema["properties"]["mode"]["description"]
    assert described.endswith("(default: hybrid where the index has vectors, else bm25)")
    offered = described.removeprefix("retrieval mode: ").split(" (default")[0].split(", ")
    assert offered == servable_modes(searcher) and offered[0] == "bm25" and not {"dense", "hybrid"} & set(offered)
    assert "hits" in by_name["search"].output_schema["properties"]
    assert all(t.annotations.read_only_hint for t in tools.tools)

    assert not res.is_error
    expected = searcher.search(QUERY, k=5)
    assert len(res.content) == 1 and res.content[0].type == "text"
    assert res.content[0].text == expected.summary  # the summary an LLM reads
    assert expected.mode == "bm25" and expected.summary.startswith(f"Found 5 documents for {QUERY!r} (bm25):")
    top = expected.hits[0].passage
    assert f"[{expected.hits[0].doc_id}]" in expected.summary and f"start={top.start}, end={top.end}" in expected.summary
    sc = res.structured_content
    assert set(sc) == {"query", "mode", "summary", "hits", "trace", "total", "offset"}
    assert sc["hits"] == [h.to_dict() for h in expected.hits]
    assert sc["hits"][0]["doc_id"].startswith("argparse") and sc["trace"]["version"] == searcher.version


def test_stdio_get_document_and_term_stats(demo_index_1, searcher):
    async def calls(s):
        return (await s.call_tool("get_document", {"doc_id": "argparse"}),
                await s.call_tool("term_stats", {"terms": ["parse", "the"]}))

    doc, stats = with_stdio_session(demo_index_1, calls)
    assert not doc.is_error
    expected = searcher.get_document("argparse")
    assert doc.structured_content == expected
    assert doc.content[0].text.startswith("[argparse] ") and expected["text"] in doc.content[0].text

    assert not stats.is_error
    # The same answer as POST /term_stats: each term once, with its analysed forms.
    assert stats.structured_content == term_stats(searcher, ["parse", "the"])
    rows = stats.structured_content["stats"]
    assert [r["term"] for r in rows] == ["parse", "the"]
    assert rows[0]["forms"][0]["analyzed"] == "pars" and rows[0]["forms"][0]["df"] > 0 and rows[1]["forms"] == []
    assert "df" in stats.content[0].text and "not searchable" in stats.content[0].text


def test_stdio_errors_are_tool_errors(demo_index_1, searcher):
    async def calls(s):
        return (await s.call_tool("search", {"query": QUERY, "mode": "nope"}),
                await s.call_tool("get_document", {"doc_id": "no.such.module"}),
                await s.call_tool("search", {"query": QUERY, "k": 5}))  # the session survives errors

    bad_mode, missing, ok = with_stdio_session(demo_index_1, calls)
    assert bad_mode.is_error
    assert f"unknown mode 'nope'; choose one of {', '.join(searcher.modes())}" in bad_mode.content[0].text
    assert missing.is_error and "no.such.module" in missing.content[0].text
    assert not ok.is_error and ok.structured_content["hits"]


@pytest.mark.parametrize("args, says", [
    ({"query": ""}, "query"),
    ({"query": "   "}, "empty query"),
    ({"query": QUERY, "k": 0}, "k"),
    ({"query": QUERY, "k": 1001}, "k"),
])
def test_bad_search_arguments_explain_themselves(searcher, args, says):
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("search", args))
    assert res.is_error and says in res.content[0].text
    assert res.structured_content is None


def test_unavailable_mode_says_why(searcher):
    res = with_client(build_mcp_server(searcher),
                      lambda c: c.call_tool("search", {"query": QUERY, "mode": "dense"}))
    if not res.is_error:
        pytest.skip("this index serves dense retrieval")
    assert "dense" in res.content[0].text


def test_term_stats_needs_terms(searcher):
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("term_stats", {"terms": []}))
    assert res.is_error and "terms" in res.content[0].text


@pytest.mark.parametrize("args, says", [
    ({"terms": [f"w{i}" for i in range(MAX_TERMS + 1)]}, f"at most {MAX_TERMS}"),
    ({"terms": ["ok", "x" * (MAX_TERM_CHARS + 1)]}, f"at most {MAX_TERM_CHARS}"),
    ({"terms": ["ok", "a\ud800"]}, "lone surrogate"),
])
def test_term_stats_is_bounded(searcher, args, says):
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("term_stats", args))
    assert res.is_error and "terms" in res.content[0].text and says in res.content[0].text


@pytest.mark.parametrize("args", [{"query": "x\ud800"}, {"query": QUERY, "mode": "\udc00"}])
def test_search_refuses_lone_surrogates(searcher, args):
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("search", args))
    assert res.is_error and "lone surrogate" in res.content[0].text


def test_term_stats_names_each_term_once(searcher):
    terms = [" ".join(f"t{i}w{j}" for j in range(40))[:MAX_TERM_CHARS] for i in range(MAX_TERMS)]
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("term_stats", {"terms": terms}))
    assert not res.is_error
    assert [r["term"] for r in res.structured_content["stats"]] == terms
    assert all(res.content[0].text.count(t) == 1 for t in terms)


def test_a_token_over_stdio_is_refused(demo_index_1):
    import subprocess
    p = subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", "mcp", demo_index_1, "--token", "T"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "streamable-http" in p.stderr
