"""Your own documents the way Elasticsearch and qmd users expect (issue 48): fields, line
ranges, listing and fetching by id prefix or glob, over Python, the CLI, HTTP and MCP.

Real components: an index built from a small corpus with folder-like ids, fields and ACLs; a
real uvicorn server on 127.0.0.1 (``create_app``, as ``funnel serve`` builds it) with an
administrator token and a tokens file; ``funnel mcp --transport streamable-http`` as a process
driven by the real MCP client, per caller; the in-process MCP client for argument checks; the
CLI through ``main``.
"""

from __future__ import annotations

import importlib.metadata
import json

import anyio
import httpx
import pytest

from funnel.serving.frontends.cli import main
from funnel.serving.documents import MAX_LIST_LIMIT
from funnel.serving.errors import SearchError
from funnel.serving.frontends.http import create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.principals import TokenFile, as_principal, principal, token_digest
from funnel.serving.search import MAX_DOCUMENT_IDS, open_index
from servers import free_port, live_server
from test_document_ranges import _mcp_calls
from test_e2e_processes import funnel_process, wait_until
from test_mcp import with_client

ADMIN_TOKEN = "own-docs-admin-0"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BOB = {"Authorization": "Bearer bob-own-docs-1"}
TOKENS = {"bob-own-docs-1": {"principal": "bob", "groups": ["sales"]}}
N_NOTES = 45


def _text(tag: str, n_lines: int) -> str:
    return "\n".join(f"{tag} line {i} river harbor" for i in range(1, n_lines + 1))


def _rows() -> list[dict]:
    rows = [
        {"_id": "guides/intro.md", "title": "Intro", "text": _text("intro", 12), "team": "platform",
         "tags": ["intro", "howto"]},
        {"_id": "guides/advanced/tuning.md", "title": "Tuning", "text": _text("tuning", 30), "team": "search"},
        {"_id": "guides/advanced/scaling.md", "title": "Scaling", "text": _text("scaling", 8) + "\n",
         "team": "search"},
        {"_id": "runbooks/disk-full.md", "title": "Disk full", "text": _text("disk", 5), "team": "platform"},
        {"_id": "runbooks/rotate-token.md", "title": "Rotate", "text": _text("rotate", 6), "team": "platform",
         "acl": ["eng"]},
        {"_id": "secret/payroll.md", "title": "Payroll", "text": "vexillar " + _text("payroll", 9), "team": "finance",
         "acl": ["finance"]},
    ]
    rows += [{"_id": f"notes/n-{i:03d}", "title": f"Note {i}", "text": _text(f"note{i}", 3 + i % 4),
              "team": "notes", **({"acl": ["eng"]} if i % 5 == 0 else {})} for i in range(N_NOTES)]
    return rows


ROWS = _rows()
TEXTS = {r["_id"]: r["text"] for r in ROWS}
HIDDEN_FROM_BOB = {r["_id"] for r in ROWS if "acl" in r}
ALL_IDS = sorted(TEXTS)
BOB_IDS = sorted(set(TEXTS) - HIDDEN_FROM_BOB)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from funnel.jobs.build_index import build
    d = tmp_path_factory.mktemp("own-docs")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    build(str(d / "c.jsonl"), str(d / "ix"), shards=2, engine="local")
    tokens = d / "tokens.json"
    tokens.write_text(json.dumps({token_digest(t): p for t, p in TOKENS.items()}))
    return str(d / "ix"), str(tokens)


@pytest.fixture(scope="module")
def ix(corpus):
    s = open_index(corpus[0])
    yield s
    s.close()


@pytest.fixture(scope="module")
def http(corpus, ix):
    with live_server(create_app(ix, token=ADMIN_TOKEN, tokens=TokenFile(corpus[1]))) as port, \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        yield c


def _lines(text: str, a: int, n: int | None) -> str:
    """Lines a .. a + n - 1 (1-based) of ``text``, each with its newline: the oracle."""
    parts = text.splitlines(keepends=True)
    return "".join(parts[a - 1:] if n is None else parts[a - 1:a - 1 + n])


# -- lines --------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc_id", ["guides/advanced/tuning.md", "guides/advanced/scaling.md", "notes/n-001"])
def test_a_line_range_is_those_whole_lines(ix, http, doc_id):
    text = TEXTS[doc_id]
    n = len(text.splitlines())
    for a, m in [(1, 1), (2, 3), (n, 1), (n, 50), (1, None), (n - 1, None), (3, n)]:
        want = _lines(text, a, m)
        doc = ix.get_document(doc_id, from_line=a, max_lines=m)
        assert doc["text"] == want and text[doc["start"]:doc["end"]] == want, (a, m)
        assert doc["line_start"] == a and doc["line_end"] == a + want.rstrip("\n").count("\n")
        params = {"from_line": a, **({"max_lines": m} if m else {})}
        assert http.get(f"/documents/{doc_id}", params=params, headers=ADMIN).json() == doc
    # consecutive pages of lines rebuild the text
    pages, a = [], 1
    while a <= n:
        pages.append(ix.get_document(doc_id, from_line=a, max_lines=4)["text"])
        a += 4
    assert "".join(pages) == text


def test_line_range_errors_name_the_fix_and_come_before_the_lookup(ix, http):
    with pytest.raises(SearchError, match=r"from_line 13 is past the end of document 'guides/intro.md', which has "
                                          r"12 lines: pass from_line in 1\.\.12"):
        ix.get_document("guides/intro.md", from_line=13)
    with pytest.raises(SearchError, match="give a character range .* or a line range .*not both"):
        ix.get_document("guides/intro.md", start=0, from_line=2)
    for doc_id in ("guides/intro.md", "no-such-doc"):  # the same answer for any id
        for params, says in [({"from_line": 0}, "from_line must be in 1..2,147,483,647, got 0"),
                             ({"max_lines": "x"}, "max_lines must be a whole number, got 'x'"),
                             ({"from_line": 2, "end": 5}, "not both"),
                             ({"lines": 3}, "unknown query parameter(s) 'lines'; valid: start, end, from_line")]:
            r = http.get(f"/documents/{doc_id}", params=params, headers=ADMIN)
            assert r.status_code == 400 and says in r.json()["error"], r.text


def test_a_citation_s_lines_fetch_its_text(ix):
    """What a hit's citation shows (start/end, line_start/line_end) fetches its text both ways."""
    hit = ix.search("tuning line 17", mode="bm25", k=1).hits[0]
    cite = hit.passage
    by_chars = ix.get_document(hit.doc_id, cite.start, cite.end)
    by_lines = ix.get_document(hit.doc_id, from_line=cite.line_start, max_lines=cite.line_end - cite.line_start + 1)
    assert by_chars["text"] == cite.text and cite.text.strip() in by_lines["text"]
    assert (by_lines["line_start"], by_lines["line_end"]) == (cite.line_start, cite.line_end)


# -- fields -------------------------------------------------------------------------------------

def test_fields_are_returned_only_when_asked_and_as_asked(ix, http):
    assert "fields" not in ix.get_document("guides/intro.md")
    every = ix.get_document("guides/intro.md", fields="*")["fields"]
    assert every == {"team": "platform", "tags": ["intro", "howto"]}
    assert ix.get_document("guides/intro.md", fields=["tags"])["fields"] == {"tags": ["intro", "howto"]}
    assert ix.get_document("guides/advanced/tuning.md", fields=["tags", "team"])["fields"] == {"team": "search"}
    assert ix.get_document("runbooks/rotate-token.md", fields="*")["fields"] == {"team": "platform", "acl": ["eng"]}
    with pytest.raises(SearchError, match=r"unknown field\(s\) 'teams'; this index's fields: acl, tags, team"):
        ix.get_document("guides/intro.md", fields=["teams"])
    got = http.get("/documents/guides/intro.md", params={"fields": "team,tags"}, headers=ADMIN).json()
    assert got["fields"] == every
    r = http.get("/documents/no-such-doc", params={"fields": "nope"}, headers=ADMIN)
    assert r.status_code == 400 and "unknown field(s) 'nope'" in r.json()["error"]  # checked before the lookup


def test_a_restricted_caller_never_sees_acls(ix, http):
    bob = as_principal(ix, principal("bob", ["eng"]))  # may read rotate-token (acl eng)
    assert bob.get_document("runbooks/rotate-token.md", fields="*")["fields"] == {"team": "platform"}
    with pytest.raises(SearchError, match=r"unknown field\(s\) 'acl'; this index's fields: tags, team"):
        bob.get_document("runbooks/rotate-token.md", fields=["acl"])
    r = http.post("/documents", json={"prefix": "runbooks/", "fields": "*"}, headers=BOB).json()
    assert [d["fields"] for d in r["documents"]] == [{"team": "platform"}]  # rotate-token is eng-only


# -- listing ------------------------------------------------------------------------------------

def test_list_pages_through_every_id_in_order(ix, http):
    got, offset = [], 0
    while offset is not None:
        page = ix.list_documents(offset=offset, limit=7)
        assert page["total"] == len(ALL_IDS) and len(page["documents"]) <= 7
        got += [d["doc_id"] for d in page["documents"]]
        offset = page["next_offset"]
    assert got == ALL_IDS
    page = ix.list_documents("guides/", limit=2, fields=["team"])
    assert page["documents"] == [{"doc_id": "guides/advanced/scaling.md", "title": "Scaling",
                                  "length": len(TEXTS["guides/advanced/scaling.md"]), "fields": {"team": "search"}},
                                 {"doc_id": "guides/advanced/tuning.md", "title": "Tuning",
                                  "length": len(TEXTS["guides/advanced/tuning.md"]), "fields": {"team": "search"}}]
    assert (page["total"], page["next_offset"]) == (3, 2)
    assert ix.list_documents(glob="*/advanced/*.md")["total"] == 2
    assert [d["doc_id"] for d in ix.list_documents(glob="notes/n-00?")["documents"]] == \
        [f"notes/n-00{i}" for i in range(10)]
    assert ix.list_documents("nothing-here")["documents"] == [] and ix.list_documents("nothing-here")["total"] == 0
    assert ix.list_documents(offset=10_000)["documents"] == []
    over_http = http.get("/documents", params={"prefix": "guides/", "limit": 2, "fields": "team"}, headers=ADMIN)
    assert over_http.json() == page


def test_list_never_shows_or_counts_a_forbidden_id(ix, http):
    bob = as_principal(ix, principal("bob", ["sales"]))
    listed = bob.list_documents(limit=MAX_LIST_LIMIT)
    assert [d["doc_id"] for d in listed["documents"]] == BOB_IDS and listed["total"] == len(BOB_IDS)
    assert bob.list_documents("secret/") == dict(bob.list_documents("nothing/"), prefix="secret/")
    r = http.get("/documents", params={"limit": MAX_LIST_LIMIT}, headers=BOB)
    assert r.json()["total"] == len(BOB_IDS) and "secret" not in r.text and "vexillar" not in r.text
    assert http.get("/documents", params={"prefix": "secret/"}, headers=BOB).json()["total"] == 0
    assert http.get("/documents", params={"prefix": "secret/"}, headers=ADMIN).json()["total"] == 1


@pytest.mark.parametrize("params, says", [
    ({"limit": 0}, "limit must be in 1..1,000, got 0"),
    ({"limit": MAX_LIST_LIMIT + 1}, "limit must be in 1..1,000"),
    ({"offset": -1}, "offset must be a whole number, got '-1'"),
    ({"prefix": "a", "glob": "b*"}, "an id prefix or an id glob, not both"),
    ({"prefix": "x" * 2000}, "prefix has 2000 characters; at most 1024"),
    ({"start": 1}, "unknown query parameter(s) 'start'; valid: prefix, glob, offset, limit, fields"),
    ({"fields": ",".join(f"f{i}" for i in range(70))}, "at most 64"),
])
def test_list_errors_are_400s_naming_the_fix(http, params, says):
    r = http.get("/documents", params=params, headers=ADMIN)
    assert r.status_code == 400 and says in r.json()["error"], r.text
    assert http.get("/documents").status_code == 401


# -- several by prefix or glob ------------------------------------------------------------------

def test_multi_get_by_prefix_or_glob_is_bounded_and_in_id_order(ix, http):
    got = ix.get_documents(prefix="guides/", from_line=1, max_lines=1, fields=["team"])
    assert [d["doc_id"] for d in got["documents"]] == ["guides/advanced/scaling.md", "guides/advanced/tuning.md",
                                                       "guides/intro.md"]
    assert [d["text"] for d in got["documents"]] == [_lines(TEXTS[d["doc_id"]], 1, 1) for d in got["documents"]]
    assert got["matched"] == 3 and got["missing"] == [] and got["documents"][2]["fields"] == {"team": "platform"}
    notes = ix.get_documents(prefix="notes/")
    assert [d["doc_id"] for d in notes["documents"]] == [f"notes/n-{i:03d}" for i in range(MAX_DOCUMENT_IDS)]
    assert notes["matched"] == N_NOTES
    assert [d["doc_id"] for d in ix.get_documents(glob="*/advanced/t*")["documents"]] == ["guides/advanced/tuning.md"]
    body = http.post("/documents", json={"glob": "runbooks/*.md", "end": 4}, headers=ADMIN).json()
    assert [d["text"] for d in body["documents"]] == ["disk", "rota"] and body["matched"] == 2
    with pytest.raises(SearchError, match="name the documents one way: doc_ids .*; got doc_ids and prefix"):
        ix.get_documents(["guides/intro.md"], prefix="guides/")
    for body in ({}, {"ids": ["a"], "glob": "*"}):
        r = http.post("/documents", json=body, headers=ADMIN)
        assert r.status_code == 400 and "name the documents one way" in r.json()["error"]


def test_multi_get_by_prefix_sees_only_what_the_caller_may_read(http):
    bob = http.post("/documents", json={"prefix": "secret/"}, headers=BOB).json()
    nothing = http.post("/documents", json={"prefix": "nothing/"}, headers=BOB).json()
    assert bob["documents"] == [] and bob["matched"] == 0 and bob == nothing
    notes = http.post("/documents", json={"prefix": "notes/"}, headers=BOB).json()
    visible = [i for i in BOB_IDS if i.startswith("notes/")]
    assert [d["doc_id"] for d in notes["documents"]] == visible[:MAX_DOCUMENT_IDS]
    assert notes["matched"] == len(visible) < N_NOTES


# -- the CLI ------------------------------------------------------------------------------------

def test_cli_get_and_list(corpus, capsys):
    root = corpus[0]
    assert main(["get", root, "guides/advanced/tuning.md", "--lines", "3:5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[guides/advanced/tuning.md] Tuning\n(characters ")
    assert "lines 3-5" in out and out.endswith(_lines(TEXTS["guides/advanced/tuning.md"], 3, 3) + "\n")
    assert main(["get", root, "guides/intro.md", "--start", "6", "--end", "20", "--fields", "team", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["text"] == TEXTS["guides/intro.md"][6:20] and doc["fields"] == {"team": "platform"}
    assert main(["get", root, "guides/intro.md", "--lines", "2-2"]) == 0  # as a citation prints it
    assert capsys.readouterr().out.endswith("\n" + _lines(TEXTS["guides/intro.md"], 2, 1) + "\n")
    assert main(["get", root, "--prefix", "runbooks/", "--end", "4", "--json"]) == 0
    assert [d["text"] for d in json.loads(capsys.readouterr().out)["documents"]] == ["disk", "rota"]
    assert main(["get", root, "no-such-doc"]) == 2
    assert "no document with doc_id 'no-such-doc'" in capsys.readouterr().err
    assert main(["get", root, "guides/intro.md", "--lines", "99"]) == 2
    assert "which has 12 lines" in capsys.readouterr().err
    assert main(["list", root, "--prefix", "notes/", "--offset", "40", "--limit", "3"]) == 0
    cap = capsys.readouterr()
    assert cap.out == "".join(f"notes/n-{i:03d}\tNote {i}\n" for i in range(40, 43))
    assert cap.err.strip() == f"(41-43 of {N_NOTES} documents; next page: --offset 43)"
    assert main(["list", root, "--glob", "guides/*", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 3


# -- MCP ----------------------------------------------------------------------------------------

def test_mcp_lists_and_reads_lines_fields_and_reports_its_version(ix):
    async def calls(c):
        return (c.server_info, await c.call_tool("list_documents", {"prefix": "guides/", "limit": 2}),
                await c.call_tool("get_document", {"doc_id": "guides/intro.md", "from_line": 2, "max_lines": 2,
                                                   "fields": ["team"]}),
                await c.call_tool("get_documents", {"glob": "notes/n-04?", "end": 6}),
                await c.call_tool("list_documents", {"limit": MAX_LIST_LIMIT + 1}),
                await c.call_tool("get_document", {"doc_id": "guides/intro.md", "fields": ["nope"]}))

    info, listed, lines, multi, too_many, bad_field = with_client(build_mcp_server(ix), calls)
    assert info.version == importlib.metadata.version("funnel") != ""
    sc = listed.structured_content
    assert [d["doc_id"] for d in sc["documents"]] == ["guides/advanced/scaling.md", "guides/advanced/tuning.md"]
    assert (sc["total"], sc["next_offset"]) == (3, 2)
    assert "(1-2 of 3 documents; next page: offset=2)" in listed.content[0].text
    assert lines.structured_content["text"] == _lines(TEXTS["guides/intro.md"], 2, 2)
    assert lines.structured_content["fields"] == {"team": "platform"}
    assert [d["text"] for d in multi.structured_content["documents"]] == ["note40", "note41", "note42", "note43",
                                                                          "note44"]
    assert too_many.is_error and "limit" in too_many.content[0].text
    assert bad_field.is_error and "unknown field(s) 'nope'" in bad_field.content[0].text


def test_mcp_list_and_get_per_caller_over_streamable_http(corpus):
    root, tokens = corpus
    port = free_port()

    def listening() -> bool:
        import socket
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    calls = [("list_documents", {"limit": MAX_LIST_LIMIT}), ("list_documents", {"prefix": "secret/"}),
             ("get_documents", {"prefix": "secret/", "fields": "*"}),
             ("get_document", {"doc_id": "secret/payroll.md", "from_line": 99}),
             ("get_document", {"doc_id": "no-such-doc", "from_line": 99})]
    with funnel_process("mcp", root, "--transport", "streamable-http", "--port", str(port), "--token", ADMIN_TOKEN,
                        "--tokens", tokens) as (proc, output):
        wait_until(listening, proc, output, "funnel mcp")
        _, admin = _mcp_calls(port, ADMIN_TOKEN, calls)
        _, bob = _mcp_calls(port, "bob-own-docs-1", calls)

    every, secret, multi, past_end, _ = admin
    assert [d["doc_id"] for d in every.structured_content["documents"]] == ALL_IDS
    assert secret.structured_content["total"] == 1 and multi.structured_content["matched"] == 1
    assert multi.structured_content["documents"][0]["fields"] == {"team": "finance", "acl": ["finance"]}
    assert past_end.is_error and "which has 9 lines" in past_end.content[0].text
    every, secret, multi, hidden, missing = bob
    assert [d["doc_id"] for d in every.structured_content["documents"]] == BOB_IDS
    assert every.structured_content["total"] == len(BOB_IDS)
    assert secret.structured_content["total"] == 0 and multi.structured_content["matched"] == 0
    assert hidden.is_error and missing.is_error  # forbidden answers as missing, before any line check
    assert hidden.content[0].text == missing.content[0].text.replace("no-such-doc", "secret/payroll.md")
    for res in bob:
        assert "vexillar" not in json.dumps(res.structured_content or {}) + res.content[0].text


# -- pages of a PDF's citations -----------------------------------------------------------------

def test_a_pdf_citation_names_its_pages(tmp_path):
    """A folder with a 4-page PDF (pypdf reads it, as a build does): a hit's citations carry the
    pages they span, the same as ``page_of`` over the stored ``page_starts``; a Markdown
    file's citations have none. Over Python, HTTP and MCP."""
    import random

    from funnel.jobs.build_index import build
    from funnel.pipelines.formats.pdf import page_of
    from test_folder_corpus import make_pdf

    rng = random.Random(3)
    words = ("river", "stone", "market", "signal", "garden", "engine", "harbor", "ledger", "window", "orbit")
    pages = [[" ".join(rng.choice(words) for _ in range(10)) for _ in range(40)] for _ in range(4)]
    pages[2][20] += " narwhal"  # only on page 3
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "report.pdf").write_bytes(make_pdf(pages, title="Survey"))
    (kb / "notes.md").write_text("# Notes\n\nA narwhal was seen near the harbor.\n")
    build(str(kb), str(tmp_path / "ix"), engine="local")
    ix = open_index(str(tmp_path / "ix"))
    try:
        starts = ix.get_document("report.pdf", fields=["page_starts"])["fields"]["page_starts"]
        assert len(starts) == 4
        res = ix.search("narwhal harbor", mode="bm25", k=2, passages_per_hit=3)
        by_id = {h.doc_id: h for h in res.hits}
        pdf, md = by_id["report.pdf"], by_id["notes.md"]
        text = ix.get_document("report.pdf", max_chars=10**6)["text"]
        assert "narwhal" in pdf.passage.text and pdf.passage.page_start <= 3 <= pdf.passage.page_end
        for c in pdf.passages:
            last = len(text[:c.end].rstrip()) - 1
            assert (c.page_start, c.page_end) == (page_of(starts, c.start), page_of(starts, max(last, c.start)))
            assert c.page_start == text.count("\f", 0, c.start) + 1
        assert (md.passage.page_start, md.passage.page_end) == (None, None)
        with live_server(create_app(ix)) as port:
            got = httpx.post(f"http://127.0.0.1:{port}/search", timeout=60,
                             json={"query": "narwhal harbor", "mode": "bm25", "k": 2}).json()
        assert {h["doc_id"]: h["passage"]["page_start"] for h in got["hits"]} == \
            {"report.pdf": pdf.passage.page_start, "notes.md": None}
        mcp = with_client(build_mcp_server(ix), lambda c: c.call_tool("search", {"query": "narwhal", "mode": "bm25"}))
        hit = next(h for h in mcp.structured_content["hits"] if h["doc_id"] == "report.pdf")
        assert (hit["passage"]["page_start"], hit["passage"]["page_end"]) == (3, 3)
    finally:
        ix.close()


def test_results_are_plain_data_at_every_level(ix):
    """A result, its hits and their citations read by attribute or by key, and ``to_dict()``
    at every level is the JSON form (what HTTP and MCP send)."""
    res = ix.search("tuning line 17", mode="bm25", k=3, fields=["team"])
    hit, cite = res.hits[0], res.hits[0].passage
    assert res["hits"][0]["passage"]["start"] == cite.start == cite["start"] and hit["doc_id"] == hit.doc_id
    assert cite.to_dict() == res.to_dict()["hits"][0]["passage"] == {k: cite[k] for k in cite.keys()}
    assert hit.to_dict() == res.to_dict()["hits"][0] and hit.to_dict()["fields"] == {"team": "search"}
    assert "start" in cite and "nope" not in cite and res["total"] == res.total
    with pytest.raises(KeyError):
        cite["nope"]
    assert json.loads(json.dumps(res.to_dict())) == res.to_dict()
