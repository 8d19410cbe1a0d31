"""Fetching documents by range, several at once, and the index's status: HTTP and MCP.

``GET /documents/{id}?start=&end=`` and the MCP ``get_document`` return characters
``[start, end)`` of a document's text (the offsets a hit's citation gives), at most
``MAX_RANGE_CHARS`` per answer, the title included, with ``next_start`` to page on; ``POST /documents`` and the
MCP ``get_documents`` return up to ``MAX_DOCUMENT_IDS`` documents, ``MAX_RANGE_CHARS``
characters in all; the MCP ``status`` tool (and ``GET /status``) say what the index is.
A document the caller may not read answers exactly as one that does not exist.

Real components: an index built from a small corpus with ACLs and one document longer than
an answer's bound, a real uvicorn server on 127.0.0.1 (``create_app``, as ``funnel serve``
builds it) with an administrator token and a tokens file, ``funnel mcp --transport
streamable-http`` as a process driven by the real MCP client, and the in-process MCP
client for the argument checks.
"""

from __future__ import annotations

import json
import random

import anyio
import httpx
import pytest

from funnel.serving.answers.citations import MAX_RANGE_CHARS
from funnel.serving.frontends.http import MAX_OFFSET, create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.principals import TokenFile, token_digest
from funnel.serving.search import MAX_DOCUMENT_IDS, open_index
from servers import free_port, live_server
from test_e2e_processes import funnel_process, wait_until
from test_mcp import with_client
from test_server_limits import HUGE, post_head, raw_request

ADMIN_TOKEN = "ranges-admin-0"
TOKENS = {"bob-ranges-1": {"principal": "bob", "groups": ["sales"]}}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BOB = {"Authorization": "Bearer bob-ranges-1"}
WORDS = ("river", "stone", "market", "signal", "garden", "engine", "harbor", "ledger", "window", "orbit")
#: A word only in the long document, about 60% of the way in: its citation lies deep.
DEEP = "zanzibarite"
#: What bob may read: the documents without an ACL.
BOB_READS = {"long-0", "pub-0", "pub-1", "pub-2", "pub-3", "pub-4"}


def _lines(rng: random.Random, n: int) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(n))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(index root, {doc_id: text}, tokens file): 8 documents, ``long-0`` of ~240,000
    characters, ``secret-1`` readable by the finance group only, ``team-1`` by eng only."""
    from funnel.jobs.build_index import build

    rng = random.Random(39)
    long_text = _lines(rng, 1800) + f"\n{DEEP} harbor ledger\n" + _lines(rng, 1200)
    rows = [{"_id": "long-0", "title": "Long manual", "text": long_text, "cat": "manual", "year": 2024}]
    rows += [{"_id": f"pub-{i}", "title": f"Public {i}", "text": _lines(rng, 4 + i), "cat": "memo", "year": 2020 + i}
             for i in range(5)]
    rows.append({"_id": "secret-1", "title": "Ledger of the quarter", "text": "vexillar " + _lines(rng, 40),
                 "acl": ["finance"], "cat": "memo", "year": 2025})
    rows.append({"_id": "team-1", "title": "Team runbook", "text": _lines(rng, 20), "acl": ["eng"],
                 "cat": "runbook", "year": 2025})
    d = tmp_path_factory.mktemp("ranges")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build(str(d / "c.jsonl"), str(d / "ix"), engine="local")
    tokens = d / "tokens.json"
    tokens.write_text(json.dumps({token_digest(t): p for t, p in TOKENS.items()}))
    return str(d / "ix"), {r["_id"]: r["text"] for r in rows}, str(tokens)


@pytest.fixture(scope="module")
def searcher(corpus):
    ix = open_index(corpus[0])
    yield ix
    ix.close()


@pytest.fixture(scope="module")
def base(corpus, searcher):
    """A real uvicorn server on 127.0.0.1 in a background thread, with an administrator token
    and bob's token from a tokens file (as ``funnel serve --token T --tokens FILE``)."""
    with live_server(create_app(searcher, token=ADMIN_TOKEN, tokens=TokenFile(corpus[2]))) as port:
        yield port


@pytest.fixture
def http(base):
    with httpx.Client(base_url=f"http://127.0.0.1:{base}", timeout=60) as c:
        yield c


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    return r.json()["error"]


# -- GET /documents/{id}?start=&end= ------------------------------------------------------------

def test_a_range_is_the_slice_of_the_text(http, corpus):
    _, texts, _ = corpus
    text = texts["long-0"]
    n = len(text)
    assert n > 2 * MAX_RANGE_CHARS
    for start, end in [(0, 10), (12_345, 23_456), (n - 5, None), (n, None), (7, 7), (None, 40), (n - 3, n + 1000)]:
        params = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
        doc = http.get("/documents/long-0", params=params, headers=ADMIN).json()
        a, b = start or 0, min(n if end is None else end, n)
        assert doc["text"] == text[a:b], (start, end)
        assert (doc["start"], doc["end"], doc["length"], doc["truncated"]) == (a, b, n, False)
        assert doc["next_start"] == (b if b < n else None)
        assert doc["line_start"] == text.count("\n", 0, a) + 1
    # Paging from next_start rebuilds the whole text, each answer at most the bound.
    got, start = [], 0
    while start is not None:
        doc = http.get("/documents/long-0", params={"start": start}, headers=ADMIN).json()
        assert len(doc["text"]) <= MAX_RANGE_CHARS and doc["truncated"] == (doc["next_start"] is not None)
        got.append(doc["text"])
        start = doc["next_start"]
    assert "".join(got) == text and len(got) == -(-n // MAX_RANGE_CHARS)


def test_without_a_range_the_answer_is_as_before_and_bounded(http, corpus, searcher):
    _, texts, _ = corpus
    short = http.get("/documents/pub-2", headers=ADMIN).json()
    assert short == searcher.get_document("pub-2")
    assert short["text"] == texts["pub-2"] and not short["truncated"] and short["next_start"] is None
    whole = http.get("/documents/long-0", headers=ADMIN).json()
    page = MAX_RANGE_CHARS - len(whole["title"])  # the title counts in the answer's bound (serving.answers.bounds)
    assert whole["text"] == texts["long-0"][:page]
    assert whole["truncated"] and whole["next_start"] == page and whole["length"] == len(texts["long-0"])


def test_a_citation_fetches_the_text_it_quotes(http, corpus):
    _, texts, _ = corpus
    hit = http.post("/search", json={"query": DEEP, "k": 1}, headers=ADMIN).json()["hits"][0]
    cite = hit["passage"]
    assert hit["doc_id"] == "long-0" and cite["start"] > MAX_RANGE_CHARS  # past the first page
    doc = http.get("/documents/long-0", params={"start": cite["start"], "end": cite["end"]}, headers=ADMIN).json()
    assert doc["text"] == cite["text"] == texts["long-0"][cite["start"]:cite["end"]] and DEEP in doc["text"]
    assert (doc["line_start"], doc["line_end"]) == (cite["line_start"], cite["line_end"])


@pytest.mark.parametrize("query, says", [
    ("start=abc", "start must be a whole number of characters, got 'abc'"),
    ("start=1.5", "start must be a whole number"),
    ("start=", "start must be a whole number"),
    ("start=-1", "start is '-1': offsets count characters from 0; pass start >= 0"),
    ("end=-7", "pass end >= 0"),
    ("start=10&end=5", "end 5 is before start 10: pass end >= start"),
    ("end=99999999999999999999999", f"end is '99999999999999999999999', over {MAX_OFFSET:,}"),
    ("end=" + "9" * 5000, f"over {MAX_OFFSET:,}"),
    ("strat=5", "unknown query parameter(s) 'strat'; valid: start, end"),
    ("start=1&start=2", "start is given more than once"),
])
def test_a_bad_range_is_a_400_naming_the_parameter_and_the_fix(http, query, says):
    for doc_id in ("long-0", "no-such-doc"):  # checked before the lookup: the same for any id
        msg = _error(http.get(f"/documents/{doc_id}?{query}", headers=ADMIN), 400)
        assert says in msg, msg


def test_a_start_past_the_end_names_the_length(http, corpus):
    n = len(corpus[1]["pub-0"])
    msg = _error(http.get("/documents/pub-0", params={"start": n + 1}, headers=ADMIN), 400)
    assert f"start {n + 1} is past the end of document 'pub-0', which has {n} characters" in msg
    assert f"0..{n}" in msg


def test_a_document_the_caller_may_not_read_answers_as_a_missing_one(http):
    for params in ({}, {"start": 0, "end": 5}, {"start": 999_999}):  # no length leaks either
        hidden = http.get("/documents/secret-1", params=params, headers=BOB)
        missing = http.get("/documents/no-such-doc", params=params, headers=BOB)
        assert hidden.status_code == missing.status_code == 404
        assert hidden.json()["error"] == missing.json()["error"].replace("no-such-doc", "secret-1")
    assert http.get("/documents/secret-1", params={"end": 8}, headers=ADMIN).json()["text"] == "vexillar"


# -- POST /documents ----------------------------------------------------------------------------

def test_multi_get_collapses_duplicates_and_keeps_the_order(http, corpus):
    _, texts, _ = corpus
    r = http.post("/documents", json={"ids": ["pub-3", "pub-1", "pub-3", "pub-1"]}, headers=ADMIN).json()
    assert [d["doc_id"] for d in r["documents"]] == ["pub-3", "pub-1"]
    assert [d["text"] for d in r["documents"]] == [texts["pub-3"], texts["pub-1"]]
    assert (r["missing"], r["deferred"], r["max_chars"]) == ([], [], MAX_RANGE_CHARS)
    cut = http.post("/documents", json={"ids": ["pub-0", "long-0"], "start": 3, "end": 40}, headers=ADMIN).json()
    assert [d["text"] for d in cut["documents"]] == [texts["pub-0"][3:40], texts["long-0"][3:40]]
    assert (cut["start"], cut["end"]) == (3, 40)


def test_multi_get_bounds_the_characters_of_the_whole_answer(http, corpus):
    _, texts, _ = corpus
    r = http.post("/documents", json={"ids": ["pub-1", "long-0", "pub-2", "no-such-doc"]}, headers=ADMIN).json()
    first, long_doc = r["documents"]
    assert first["text"] == texts["pub-1"] and not first["truncated"]
    assert sum(len(d["title"]) + len(d["text"]) for d in r["documents"]) == MAX_RANGE_CHARS
    assert long_doc["text"] == texts["long-0"][:MAX_RANGE_CHARS - len(texts["pub-1"]) - len(first["title"])
                                               - len(long_doc["title"])]
    assert long_doc["truncated"] and long_doc["next_start"] == len(long_doc["text"])
    assert r["deferred"] == ["pub-2", "no-such-doc"] and r["missing"] == []  # not looked up
    # paging the cut document on from next_start over the single get continues the text
    more = http.get("/documents/long-0", params={"start": long_doc["next_start"], "end": long_doc["next_start"] + 50},
                    headers=ADMIN).json()
    assert long_doc["text"] + more["text"] == texts["long-0"][:long_doc["next_start"] + 50]


def test_multi_get_caps_ids_and_checks_ranges_before_any_lookup(http, base):
    too_many = [f"pub-{i % 5}" for i in range(MAX_DOCUMENT_IDS + 1)]
    msg = _error(http.post("/documents", json={"ids": too_many}, headers=ADMIN), 422)
    assert "ids" in msg and str(MAX_DOCUMENT_IDS) in msg
    assert http.post("/documents", json={"ids": too_many[:MAX_DOCUMENT_IDS]}, headers=ADMIN).status_code == 200
    assert "ids" in _error(http.post("/documents", json={"ids": []}, headers=ADMIN), 422)
    assert "unknown field" in _error(http.post("/documents", json={"ids": ["pub-1"], "full": True}, headers=ADMIN), 422)
    for body, says in [({"start": -1}, "start is -1"), ({"start": 9, "end": 2}, "end 2 is before start 9"),
                       ({"end": 10 ** 30}, f"over {MAX_OFFSET:,}")]:
        assert says in _error(http.post("/documents", json={"ids": ["no-such-doc"], **body}, headers=ADMIN), 400)
    # the body bound and the token come before any of it, as for every endpoint
    assert http.post("/documents", json={"ids": too_many}).status_code == 401
    r = raw_request(base, post_head("/documents", base, length=HUGE), [b'{"ids": ["pub-1"]}'])
    assert r.status == 413 and "--max-body-bytes" in r.json()["error"]


def test_multi_get_forbidden_is_missing(http, corpus):
    _, texts, _ = corpus
    as_bob = http.post("/documents", json={"ids": ["secret-1", "pub-0", "team-1", "no-such-doc"]}, headers=BOB)
    body = as_bob.json()
    assert [d["doc_id"] for d in body["documents"]] == ["pub-0"]
    assert body["missing"] == ["secret-1", "team-1", "no-such-doc"]
    assert "vexillar" not in as_bob.text and texts["team-1"][:40] not in as_bob.text
    hidden = http.post("/documents", json={"ids": ["secret-1"], "start": 10_000}, headers=BOB)
    missing = http.post("/documents", json={"ids": ["no-such-doc"], "start": 10_000}, headers=BOB)
    assert hidden.status_code == missing.status_code == 200
    assert hidden.json() == dict(missing.json(), missing=["secret-1"])
    admin = http.post("/documents", json={"ids": ["secret-1", "team-1"]}, headers=ADMIN).json()
    assert [d["doc_id"] for d in admin["documents"]] == ["secret-1", "team-1"] and admin["missing"] == []


def test_status_counts_only_what_the_caller_may_read(http):
    admin = http.get("/status", headers=ADMIN).json()
    bob = http.get("/status", headers=BOB).json()
    assert (admin["n_docs"], admin["restricted"], admin["access_control"]) == (8, False, True)
    assert (bob["n_docs"], bob["restricted"], bob["n_passages"]) == (len(BOB_READS), True, None)
    assert admin["fields"] == bob["fields"] == {"cat": "keyword", "year": "number"}  # acl is not a filter field
    health = http.get("/health").json()
    assert {k: admin[k] for k in health} == health  # /health's answer, and more
    assert http.get("/status").status_code == 401


# -- MCP ----------------------------------------------------------------------------------------

def _mcp_calls(port: int, token: str, calls):
    """Run ``calls`` (tool, arguments) over streamable HTTP as the caller ``token`` names."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        with anyio.fail_after(120):
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client, \
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=60) as s:
                await s.initialize()
                tools = {t.name: t for t in (await s.list_tools()).tools}
                return tools, [await s.call_tool(name, args) for name, args in calls]
    return anyio.run(main)


def test_mcp_ranges_multi_get_and_status_per_caller(corpus):
    root, texts, tokens = corpus
    text = texts["long-0"]
    port = free_port()

    def listening() -> bool:
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    calls = [("get_document", {"doc_id": "long-0", "start": 150_000, "end": 150_080}),
             ("get_document", {"doc_id": "long-0", "start": 200_000}),
             ("get_document", {"doc_id": "long-0", "start": 5, "end": 2}),
             ("get_document", {"doc_id": "long-0", "start": -4}),
             ("get_documents", {"doc_ids": ["pub-1", "secret-1", "pub-1", "long-0", "pub-2", "no-such-doc"]}),
             ("get_documents", {"doc_ids": ["pub-0"] * (MAX_DOCUMENT_IDS + 1)}),
             ("get_document", {"doc_id": "secret-1", "end": 5}),
             ("get_document", {"doc_id": "no-such-doc", "end": 5}),
             ("status", {})]
    with funnel_process("mcp", root, "--transport", "streamable-http", "--port", str(port), "--token", ADMIN_TOKEN,
                        "--tokens", tokens) as (proc, output):
        wait_until(listening, proc, output, "funnel mcp")
        tools, admin = _mcp_calls(port, ADMIN_TOKEN, calls)
        _, bob = _mcp_calls(port, "bob-ranges-1", calls)

    assert set(tools) == {"search", "get_document", "get_documents", "list_documents", "term_stats", "status"}
    assert set(tools["get_document"].input_schema["properties"]) == {"doc_id", "start", "end", "from_line",
                                                                     "max_lines", "fields"}
    doc_ids = tools["get_documents"].input_schema["properties"]["doc_ids"]  # a list, or null (a prefix or glob instead)
    assert [t["maxItems"] for t in doc_ids["anyOf"] if t.get("type") == "array"] == [MAX_DOCUMENT_IDS]
    assert "n_docs counts those" in tools["status"].description

    ranged, tail, inverted, negative, multi, too_many, hidden, missing, status = admin
    assert ranged.structured_content["text"] == text[150_000:150_080]
    assert ranged.content[0].text.endswith(text[150_000:150_080])
    assert f"(characters 150000-150080 of {len(text)}; continue with start=150080)" in ranged.content[0].text
    assert tail.structured_content["text"] == text[200_000:] and tail.structured_content["next_start"] is None
    assert inverted.is_error and "end 2 is before start 5: pass end >= start" in inverted.content[0].text
    assert negative.is_error and "start is -4: offsets count characters from 0; pass start >= 0" \
        in negative.content[0].text
    got = multi.structured_content
    assert [d["doc_id"] for d in got["documents"]] == ["pub-1", "secret-1", "long-0"]
    assert sum(len(d["title"]) + len(d["text"]) for d in got["documents"]) == MAX_RANGE_CHARS
    assert (got["missing"], got["deferred"]) == ([], ["pub-2", "no-such-doc"])
    assert "deferred" in multi.content[0].text and texts["pub-1"] in multi.content[0].text
    assert too_many.is_error and "doc_ids" in too_many.content[0].text
    assert str(MAX_DOCUMENT_IDS) in too_many.content[0].text
    assert not hidden.is_error and hidden.structured_content["text"] == "vexil" and missing.is_error
    sc = status.structured_content
    assert (sc["n_docs"], sc["dense"], sc["n_passages"], sc["access_control"], sc["restricted"]) == \
        (8, False, None, True, False)
    assert sc["modes"] == ["bm25", "sira"] and sc["fields"] == {"cat": "keyword", "year": "number"}
    assert "8 documents" in status.content[0].text and "access control: on" in status.content[0].text

    ranged, _, inverted, _, multi, too_many, hidden, missing, status = bob
    assert ranged.structured_content["text"] == text[150_000:150_080]  # long-0 is public
    assert inverted.is_error and too_many.is_error
    got = multi.structured_content
    assert [d["doc_id"] for d in got["documents"]] == ["pub-1", "long-0"]
    assert got["missing"] == ["secret-1"] and got["deferred"] == ["pub-2", "no-such-doc"]
    assert hidden.is_error and missing.is_error
    assert hidden.content[0].text == missing.content[0].text.replace("no-such-doc", "secret-1")
    sc = status.structured_content
    assert (sc["n_docs"], sc["n_passages"], sc["restricted"]) == (len(BOB_READS), None, True)
    assert f"{len(BOB_READS)} documents you may read" in status.content[0].text
    for res in bob:
        assert "vexillar" not in json.dumps(res.structured_content or {}) + res.content[0].text


@pytest.mark.parametrize("args, says", [
    ({"doc_id": "pub-1", "start": "abc"}, "start"),
    ({"doc_id": "pub-1", "start": 1.5}, "start"),
    ({"doc_id": "pub-1", "end": 10 ** 12}, f"over {MAX_OFFSET:,}"),
    ({"doc_id": "pub-1", "start": 10 ** 6}, "past the end of document 'pub-1'"),
    ({"doc_id": "pub-1", "stop": 3}, "unknown argument(s) 'stop'"),
])
def test_mcp_get_document_range_errors_are_tool_errors(searcher, args, says):
    res = with_client(build_mcp_server(searcher), lambda c: c.call_tool("get_document", args))
    assert res.is_error and says in res.content[0].text, res.content[0].text


def test_mcp_status_of_an_index_with_passages(tmp_path):
    """An index with vectors: status lists dense and hybrid, and counts the stored passages."""
    from funnel.jobs.build_index import build

    rng = random.Random(7)
    rows = [{"_id": "long", "title": "Long", "text": _lines(rng, 150)}]
    rows += [{"_id": f"s{i}", "title": f"Short {i}", "text": _lines(rng, 3)} for i in range(4)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build(str(tmp_path / "c.jsonl"), str(tmp_path / "ix"), engine="local", dense=True)
    ix = open_index(str(tmp_path / "ix"))
    try:
        res = with_client(build_mcp_server(ix), lambda c: c.call_tool("status", {}))
        sc = res.structured_content
        assert sc["dense"] and {"bm25", "dense", "hybrid", "sira"} <= set(sc["modes"])
        dense = ix.index.manifest["dense"]
        assert sc["n_passages"] == sum(int(s["count"]) for s in dense["shards"]) > sc["n_docs"] == len(rows)
        assert (sc["access_control"], sc["restricted"], sc["fields"]) == (False, False, {})
    finally:
        ix.close()
