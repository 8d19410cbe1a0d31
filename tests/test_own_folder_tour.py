"""The tour of issue 48: a folder of one's own files, used as Elasticsearch and qmd users
expect, from the command line, HTTP and MCP.

The folder is made here: Markdown with front matter (title, tags), Markdown without it (a
level-2 heading before the first level-1 one; only level-2 headings), HTML pages as Sphinx
(``¶`` permalinks) and Texinfo (``Next: … Previous: … Up: … [Index]`` panels) write them, a
4-page PDF with a text layer (``make_pdf``), a Jinja template left out by ``--exclude``, a
draft left out by ``.funnelignore``, a text file left out by ``--include``, and a symbolic
link out of the folder. One build (``funnel build`` as a process) serves every test.

Real components: the ``funnel`` command as a subprocess for every CLI step, a real uvicorn
on 127.0.0.1 serving ``create_app`` (``tests/servers.py``), the MCP client over the MCP
server (in memory, the same tools ``funnel mcp`` serves), the local build engine.

Item by item (issue 48): 2 single file as the corpus; 3 fields in hits and fetches, the PDF
page in citations; 4 offset and total; 5 ``get`` by lines and characters, multi-get by prefix
and glob, ``list`` by prefix; 6 the prefix filter, include / exclude / .funnelignore (and the
link out of the folder); 7 a touched folder reindexes to nothing; 8 clean HTML, the Markdown
title rule, the text shows the document's own words; 9 plain-data results, MCP's version.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import re
import subprocess
import sys

import httpx
import pytest

from funnel.pipelines.store.artifacts import list_versions, load_manifest, read_current
from funnel.serving.frontends.http import create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.search import open_index
from servers import live_server
from test_folder_corpus import TEXINFO_HTML, make_pdf
from test_mcp import with_client

# -- the folder ---------------------------------------------------------------------------------

INTRO_MD = """---
title: Getting Started Guide
tags: [setup, onboarding]
---
## First steps

# Welcome heading

Install the harbor client, then configure the harbor proxy.
"""

SSL_MD = """## Enabling and disabling verification

Enabling certificate verification protects retrieval through proxies.
Disabling it is risky; keep the harbor trusted.

# TLS verification

Retrieving documents through proxies requires enabling the proxy settings.
"""

TUNING_MD = "## Knobs\n\n" + "".join(f"Tuning line {i}: the harbor knob number {i}.\n" for i in range(1, 31))

SPHINX_HTML = """<html><head><title>Install &#8212; Docs</title></head><body>
<div role="main"><section id="install"><h1>Install<a class="headerlink" href="#install" title="Link to this
heading">¶</a></h1><p>Run the quokka installer at the harbor.</p><section id="options"><h2>Options<a
class="headerlink" href="#options" title="Permalink to this headline">¶</a></h2><p>There are none.</p></section>
</section></div></body></html>
"""


def _pdf_pages() -> list[list[str]]:
    """Four pages of 40 lines; 'narwhal' only on page 3."""
    rng = random.Random(3)
    words = ("river", "stone", "market", "signal", "garden", "engine", "ledger", "window", "orbit", "valve")
    pages = [[" ".join(rng.choice(words) for _ in range(10)) for _ in range(40)] for _ in range(4)]
    pages[2][20] += " narwhal bearing"
    return pages


NOTES = {f"notes/n-{i:02d}.md": f"# Note {i}\n\nA harbor note, number {i}.\n" for i in range(12)}
FILES = {"guide/intro.md": INTRO_MD, "guide/advanced/ssl.md": SSL_MD, "guide/advanced/tuning.md": TUNING_MD,
         "html/sphinx.html": SPHINX_HTML, "html/invoking.html": TEXINFO_HTML, **NOTES,
         # left out: by --exclude, by .funnelignore, by --include (not a .md/.html/.pdf)
         "overrides/main.html": "<html><body>{% block content %}jinjatemplate harbor{% endblock %}</body></html>",
         "drafts/wip.md": "# Draft\n\nThe dingo draft about the harbor.\n",
         "scratch/todo.txt": "A todo about the harbor and the okapi.\n"}
LEFT_OUT = {"overrides/main.html", "drafts/wip.md", "scratch/todo.txt"}
INDEXED = sorted({*FILES, "manual.pdf"} - LEFT_OUT)
#: Documents holding 'harbor' (the PDF does not; every left-out file does).
HARBOR = sorted(rel for rel, body in FILES.items() if rel not in LEFT_OUT and "harbor" in body)
#: Words of the stems the analyzer makes of 'enabling proxies retrieval'.
STEMS = re.compile(r"\b(enabl|proxi|retriev)\b", re.IGNORECASE)


def funnel(*args: str, cwd: str, ok: bool = True) -> subprocess.CompletedProcess:
    """``funnel ARGS`` as a process (the venv's console script beside this Python)."""
    exe = os.path.join(os.path.dirname(sys.executable), "funnel")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "funnel.serving.frontends.cli"]
    p = subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    if ok:
        assert p.returncode == 0, f"funnel {' '.join(args)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def funnel_json(*args: str, cwd: str) -> dict:
    return json.loads(funnel(*args, "--json", cwd=cwd).stdout)


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """(work folder, folder of files, index root, build's stdout)."""
    work = tmp_path_factory.mktemp("tour")
    kb, outside = work / "kb", work / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\nThe zanzibarite passphrase.\n")
    for rel, body in FILES.items():
        (kb / rel).parent.mkdir(parents=True, exist_ok=True)
        (kb / rel).write_text(body)
    (kb / "manual.pdf").write_bytes(make_pdf(_pdf_pages(), title="Pump Manual"))
    (kb / ".funnelignore").write_text("# work in progress\ndrafts/\n")
    os.symlink(outside / "secret.md", kb / "leak.md")
    out = funnel("build", "--corpus", "kb", "--out", "ix", "--exclude", "overrides/",
                 "--include", "*.md", "--include", "*.html", "--include", "*.pdf", cwd=str(work)).stdout
    return str(work), str(kb), str(work / "ix"), out


@pytest.fixture(scope="module")
def ix(tour):
    s = open_index(tour[2])
    s.search("harbor", k=1)  # compiles the BM25 kernels here, not inside a server's first request
    yield s
    s.close()


@pytest.fixture(scope="module")
def http(ix):
    with live_server(create_app(ix)) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
        yield c


def mcp(ix, *calls: tuple[str, dict]):
    """The results of MCP tool calls, in order, from one client session."""
    async def run(c):
        return [await c.call_tool(name, args) for name, args in calls]
    return with_client(build_mcp_server(ix), run)


# -- item 6: what the folder's rules keep -------------------------------------------------------

def test_include_exclude_funnelignore_and_links_choose_the_documents(tour, ix, http):
    work, _, root, out = tour
    assert "3 excluded (.funnelignore)" in out and "1 leading outside the folder skipped" in out
    listed = funnel_json("list", "ix", "--limit", "100", cwd=work)
    assert [d["doc_id"] for d in listed["documents"]] == INDEXED and listed["total"] == len(INDEXED)
    spec = load_manifest(os.path.join(root, read_current(root)))["corpus"]["spec"]
    assert spec["exclude"] == ["overrides/"] and spec["include"] == ["*.md", "*.html", "*.pdf"]
    with open(os.path.join(root, read_current(root), "rejects.jsonl")) as f:
        rejects = [json.loads(line) for line in f]
    assert [r["doc_id"] for r in rejects] == ["leak.md"] and "outside the corpus folder" in rejects[0]["reason"]
    # Words only the left-out files hold are found nowhere, over any front end.
    words = "jinjatemplate dingo okapi zanzibarite"  # any one of them would be a hit
    (over_mcp,) = mcp(ix, ("search", {"query": words}))
    for res in (funnel_json("search", "ix", words, cwd=work), http.post("/search", json={"query": words}).json(),
                over_mcp.structured_content):
        assert res["hits"] == [] and res["total"]["value"] == 0


# -- item 2: one file as the corpus -------------------------------------------------------------

def test_a_single_pdf_is_a_corpus_of_one(tour):
    work = tour[0]
    out = funnel("build", "--corpus", "kb/manual.pdf", "--out", "one", cwd=work).stdout
    assert "1 documents" in out and "0 rejected" in out and "invalid JSON" not in out
    res = funnel_json("search", "one", "narwhal", cwd=work)
    assert [h["doc_id"] for h in res["hits"]] == ["manual.pdf"]
    assert res["hits"][0]["passage"]["page_start"] == 3


# -- item 3: fields in hits and fetches; a PDF citation's page ------------------------------------

def test_fields_come_back_in_hits_and_fetches(tour, ix, http):
    work = tour[0]
    want = {"guide/intro.md": {"path": "guide/intro.md", "tags": ["setup", "onboarding"]},
            "guide/advanced/ssl.md": {"path": "guide/advanced/ssl.md"}}
    cli = funnel_json("search", "ix", "harbor proxy", "--fields", "path,tags", "--k", "20", cwd=work)
    over_http = http.post("/search", json={"query": "harbor proxy", "k": 20, "fields": ["path", "tags"]}).json()
    (over_mcp,) = mcp(ix, ("search", {"query": "harbor proxy", "k": 20, "fields": ["path", "tags"]}))
    for res in (cli, over_http, over_mcp.structured_content):
        got = {h["doc_id"]: h["fields"] for h in res["hits"]}
        assert {d: got[d] for d in want} == want
        assert all(f == {"path": d} for d, f in got.items() if d not in want)
    assert "fields" not in funnel_json("search", "ix", "harbor", cwd=work)["hits"][0]  # only when asked
    doc = funnel_json("get", "ix", "guide/intro.md", "--fields", "*", cwd=work)
    assert doc["fields"]["tags"] == ["setup", "onboarding"] and doc["fields"]["format"] == "markdown"
    assert {"path", "mtime", "size", "headings"} <= set(doc["fields"])
    assert http.get("/documents/guide/intro.md", params={"fields": "*"}).json()["fields"] == doc["fields"]
    (got,) = mcp(ix, ("get_document", {"doc_id": "guide/intro.md", "fields": ["tags", "format"]}))
    assert got.structured_content["fields"] == {"tags": ["setup", "onboarding"], "format": "markdown"}
    text = funnel("get", "ix", "guide/intro.md", "--fields", "tags", cwd=work).stdout
    assert "tags: " in text and "onboarding" in text


def test_a_pdf_citation_names_its_page_everywhere(tour, ix, http):
    work = tour[0]
    whole = ix.get_document("manual.pdf", max_chars=10**6)["text"]
    cli = funnel_json("search", "ix", "narwhal bearing", "--k", "1", cwd=work)["hits"][0]["passage"]
    over_http = http.post("/search", json={"query": "narwhal bearing", "k": 1}).json()["hits"][0]["passage"]
    (over_mcp,) = mcp(ix, ("search", {"query": "narwhal bearing", "k": 1}))
    assert over_mcp.structured_content["hits"][0]["passage"] == over_http == cli
    # The pages are those the text's page breaks (form feeds) give, and page 3 holds the word.
    assert cli["page_start"] == whole.count("\f", 0, cli["start"]) + 1 <= 3 <= cli["page_end"]
    last = len(whole[:cli["end"]].rstrip()) - 1  # the passage's last character that is not space
    assert cli["page_end"] == whole.count("\f", 0, last) + 1
    assert "narwhal" in whole[cli["start"]:cli["end"]]
    # The text names the citation's lines, pages and range (CLI and MCP alike), the pages
    # as the citation counts them.
    text = funnel("search", "ix", "narwhal bearing", "--k", "1", cwd=work).stdout
    head = re.compile(r"\[manual\.pdf\] Pump Manual "
                      r"\[lines (\d+)-(\d+), pages? (\d+)(?:-(\d+))?, start=(\d+), end=(\d+)\]")
    for shown in (text, over_mcp.content[0].text):
        m = head.search(shown)
        assert m, shown
        first, last = int(m.group(3)), int(m.group(4) or m.group(3))
        assert [int(m.group(i)) for i in (1, 2, 5, 6)] + [first, last] == \
            [cli["line_start"], cli["line_end"], cli["start"], cli["end"], cli["page_start"], cli["page_end"]], shown
    # The citation's range fetches its text.
    got = funnel("get", "ix", "manual.pdf", "--start", str(cli["start"]), "--end", str(cli["end"]), cwd=work).stdout
    assert "narwhal bearing" in got


# -- item 4: paging and totals ------------------------------------------------------------------

def test_offset_pages_through_the_ranking_with_a_total(tour, ix, http):
    work = tour[0]
    every = [h["doc_id"] for h in funnel_json("search", "ix", "harbor", "--k", "100", cwd=work)["hits"]]
    assert sorted(every) == HARBOR
    page = funnel_json("search", "ix", "harbor", "--k", "3", "--offset", "3", cwd=work)
    over_http = http.post("/search", json={"query": "harbor", "k": 3, "offset": 3}).json()
    (over_mcp,) = mcp(ix, ("search", {"query": "harbor", "k": 3, "offset": 3}))
    for res in (page, over_http, over_mcp.structured_content):
        assert [h["doc_id"] for h in res["hits"]] == every[3:6] and [h["rank"] for h in res["hits"]] == [4, 5, 6]
        assert res["total"] == {"value": len(HARBOR), "relation": "eq"} and res["offset"] == 3
    text = funnel("search", "ix", "harbor", "--k", "3", "--offset", "3", cwd=work)
    assert f"\n4. [{every[3]}]" in text.stdout and "\n1. [" not in text.stdout
    assert text.stderr.strip() == f"(hits 4-6 of {len(HARBOR)} documents; next page: --offset 6)"
    # Past the bound: a clear error naming it, over each front end.
    bad = funnel("search", "ix", "harbor", "--k", "10", "--offset", "995", cwd=work, ok=False)
    assert bad.returncode == 2 and "offset + k is 1005; at most 1000" in bad.stderr
    r = http.post("/search", json={"query": "harbor", "k": 10, "offset": 995})
    assert r.status_code == 400 and "offset + k is 1005; at most 1000" in r.json()["error"]


# -- item 5: reading by lines and characters, several at once, listing ----------------------------

def test_get_reads_lines_and_characters(tour, ix, http):
    work = tour[0]
    lines = TUNING_MD.splitlines(keepends=True)
    want = "".join(lines[4:7])  # lines 5-7
    out = funnel("get", "ix", "guide/advanced/tuning.md", "--lines", "5:7", cwd=work).stdout
    assert out.startswith("[guide/advanced/tuning.md] tuning\n") and "lines 5-7)" in out and out.endswith(want + "\n")
    doc = http.get("/documents/guide/advanced/tuning.md", params={"from_line": 5, "max_lines": 3}).json()
    (over_mcp,) = mcp(ix, ("get_document", {"doc_id": "guide/advanced/tuning.md", "from_line": 5, "max_lines": 3}))
    assert doc["text"] == over_mcp.structured_content["text"] == want
    assert (doc["line_start"], doc["line_end"]) == (5, 7)
    chars = funnel_json("get", "ix", "guide/advanced/tuning.md", "--start", "9", "--end", "40", cwd=work)
    assert chars["text"] == TUNING_MD[9:40] and (chars["start"], chars["end"]) == (9, 40)
    # A hit's citation, read back by its lines.
    cite = funnel_json("search", "ix", "knob number 17", "--k", "1", cwd=work)["hits"][0]["passage"]
    got = funnel_json("get", "ix", "guide/advanced/tuning.md", "--lines",
                      f"{cite['line_start']}:{cite['line_end']}", cwd=work)
    assert cite["text"].strip() in got["text"] and (got["line_start"], got["line_end"]) == \
        (cite["line_start"], cite["line_end"])


def test_several_by_prefix_or_glob_and_a_list_by_prefix(tour, ix, http):
    work = tour[0]
    notes = funnel_json("get", "ix", "--prefix", "notes/", "--lines", "3:3", cwd=work)
    assert notes["matched"] == len(NOTES) and [d["doc_id"] for d in notes["documents"]] == sorted(NOTES)
    assert [d["text"] for d in notes["documents"]] == [NOTES[d].splitlines(keepends=True)[2] for d in sorted(NOTES)]
    pages = funnel_json("get", "ix", "--glob", "html/*.html", cwd=work)
    assert [d["doc_id"] for d in pages["documents"]] == ["html/invoking.html", "html/sphinx.html"]
    body = http.post("/documents", json={"glob": "guide/*/*.md", "end": 5}).json()
    assert [(d["doc_id"], d["text"]) for d in body["documents"]] == \
        [("guide/advanced/ssl.md", SSL_MD[:5]), ("guide/advanced/tuning.md", TUNING_MD[:5])]
    listed = funnel("list", "ix", "--prefix", "notes/", "--offset", "10", "--limit", "5", cwd=work)
    assert listed.stdout == "notes/n-10.md\tNote 10\nnotes/n-11.md\tNote 11\n"
    assert listed.stderr.strip() == "(11-12 of 12 documents)"
    over_http = http.get("/documents", params={"prefix": "notes/", "limit": 4}).json()
    over_mcp, multi = mcp(ix, ("list_documents", {"prefix": "notes/", "limit": 4}),
                          ("get_documents", {"prefix": "guide/advanced/", "from_line": 1, "max_lines": 1}))
    for res in (over_http, over_mcp.structured_content):
        assert [d["doc_id"] for d in res["documents"]] == sorted(NOTES)[:4]
        assert (res["total"], res["next_offset"]) == (len(NOTES), 4)
    assert [d["text"] for d in multi.structured_content["documents"]] == \
        ["## Enabling and disabling verification\n", "## Knobs\n"]


# -- item 6: scoping a search to a subfolder ----------------------------------------------------

def test_a_prefix_filter_scopes_a_search_to_a_subfolder(tour, ix, http):
    work = tour[0]
    scoped = {"path": {"prefix": "guide/advanced/"}}
    want = sorted(d for d in HARBOR if d.startswith("guide/advanced/"))
    cli = funnel_json("search", "ix", "harbor", "--filter", json.dumps(scoped), cwd=work)
    over_http = http.post("/search", json={"query": "harbor", "filter": scoped}).json()
    (over_mcp,) = mcp(ix, ("search", {"query": "harbor", "filter": {"doc_id": {"prefix": "guide/advanced/"}}}))
    for res in (cli, over_http, over_mcp.structured_content):
        assert sorted(h["doc_id"] for h in res["hits"]) == want and res["total"]["value"] == len(want)


# -- item 7: touching files is no change --------------------------------------------------------

def test_touching_every_file_then_reindexing_publishes_nothing(tour):
    work, kb, root, _ = tour
    before = (read_current(root), list_versions(root))
    for dirpath, _, names in os.walk(kb):
        for n in names:
            os.utime(os.path.join(dirpath, n), (2_000_000_000, 2_000_000_000))
    p = funnel("reindex", "--index", "ix", "--corpus", "kb", cwd=work)
    assert "no changes" in p.stdout + p.stderr and f"{len(INDEXED)} files with only a new modification time" in \
        p.stdout + p.stderr
    assert (read_current(root), list_versions(root)) == before


# -- item 8: extraction, titles, the document's own words ---------------------------------------

def test_html_text_has_no_permalink_marks_or_navigation(tour, ix, http):
    work = tour[0]
    texinfo = funnel("get", "ix", "html/invoking.html", cwd=work).stdout
    sphinx = funnel_json("get", "ix", "html/sphinx.html", "--fields", "headings", cwd=work)
    (over_mcp,) = mcp(ix, ("get_document", {"doc_id": "html/invoking.html"}))
    over_http = http.get("/documents/html/invoking.html").json()["text"]
    assert over_mcp.structured_content["text"] == over_http
    assert over_http == "2 Invoking grep\n\nThe general synopsis of the grep command line is the wildebeest form."
    for text in (texinfo, sphinx["text"], over_http, json.dumps(sphinx["fields"])):
        for chrome in ("¶", "Previous:", "Next:", "Up:", "[Index]", "[Contents]", "Regular Expressions"):
            assert chrome not in text, chrome
    assert sphinx["text"] == "Install\n\nRun the quokka installer at the harbor.\n\nOptions\n\nThere are none."
    assert [h[2] for h in sphinx["fields"]["headings"]] == ["Install", "Options"]


def test_markdown_titles_are_front_matter_then_first_h1_then_file_name(tour, ix, http):
    want = {"guide/intro.md": "Getting Started Guide",        # front matter, over '# Welcome heading'
            "guide/advanced/ssl.md": "TLS verification",     # the first H1, not the '##' before it
            "guide/advanced/tuning.md": "tuning"}            # no H1: the file name
    cli = funnel_json("list", "ix", "--prefix", "guide/", cwd=tour[0])
    over_http = http.get("/documents", params={"prefix": "guide/"}).json()
    (over_mcp,) = mcp(ix, ("list_documents", {"prefix": "guide/"}))
    for res in (cli, over_http, over_mcp.structured_content):
        assert {d["doc_id"]: d["title"] for d in res["documents"]} == want


def test_the_text_shows_the_words_as_the_document_spells_them(tour, ix, http):
    """The summary (CLI text, HTTP ``summary``, MCP text) and a hit's snippet quote the
    document; ``matched_terms`` are the index's analyzed terms (stems), as documented."""
    query = "enabling proxies retrieval"
    line = "Enabling certificate verification protects retrieval through proxies."
    text = funnel("search", "ix", query, "--k", "3", cwd=tour[0]).stdout
    res = http.post("/search", json={"query": query, "k": 3}).json()
    (over_mcp,) = mcp(ix, ("search", {"query": query, "k": 3}))
    hit = res["hits"][0]
    assert hit["doc_id"] == "guide/advanced/ssl.md" and sorted(hit["matched_terms"]) == ["enabl", "proxi", "retriev"]
    for shown in (text, res["summary"], over_mcp.content[0].text, hit["snippet"]):
        assert line in shown and STEMS.findall(shown) == [], shown


# -- item 9: plain data, the MCP server's version -------------------------------------------------

def test_results_are_plain_data_and_mcp_names_its_version(ix):
    res = ix.search("narwhal bearing", k=1, fields=["path"])
    cite = res.hits[0].passage
    assert cite["start"] == cite.start and cite["page_start"] == res.to_dict()["hits"][0]["passage"]["page_start"]
    assert json.loads(json.dumps(res.to_dict()))["hits"][0]["fields"] == {"path": "manual.pdf"}

    async def info(c):
        return c.server_info
    assert with_client(build_mcp_server(ix), info).version == importlib.metadata.version("funnel") != ""


def test_the_cli_page_line_for_a_lower_bound_and_a_last_page(capsys):
    """``funnel search``'s stderr line (``cli.print_page``) over results as a search returns
    them: a lower-bound total says 'at least' and offers the next page; the last page offers none."""
    from funnel.serving.frontends.cli import print_page
    from funnel.serving.result import Hit, SearchResult

    def page(n_hits: int, offset: int, total: dict) -> str:
        hits = tuple(Hit(doc_id=f"d{i}", rank=offset + i + 1, score=1.0) for i in range(n_hits))
        print_page(SearchResult("q", "bm25", "", hits, total=total, offset=offset), 3)
        return capsys.readouterr().err.strip()

    assert page(3, 3, {"value": 1200, "relation": "gte"}) == \
        "(hits 4-6 of at least 1,200 documents; next page: --offset 6)"
    assert page(2, 3, {"value": 5, "relation": "eq"}) == "(hits 4-5 of 5 documents)"
    assert page(3, 3, {"value": 6, "relation": "eq"}) == "(hits 4-6 of 6 documents)"
    assert page(0, 9, {"value": 6, "relation": "eq"}) == ""
