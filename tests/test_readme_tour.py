"""Every command block of README.md and docs/*.md, run as written, in order, on a 40-document corpus.

Pages run in reading order: README.md, then the pages of ``mkdocs.yml``'s ``nav`` that are
files in ``docs/``. In each page every fenced ``bash`` block runs one logical command at a
time (backslash continuations joined, heredocs kept whole, comment lines dropped) through
``bash -c``, its text unchanged, and must exit 0; the environment is captured after each
command and carried to the next, across pages too, so ``source .venv/bin/activate`` and
``export FUNNEL_TOKEN=...`` act on what follows as in one shell. Every fenced ``python``
block runs as a script with the virtual environment's Python. ``text``, ``json``, ``yaml``
and ``cron`` blocks show output or configuration and do not run. One index is built by the
README's tour and reused by the pages after it.

A block that cannot run here (it needs a Ray cluster, S3, a GPU, a Kubernetes API, or it
would run this test suite itself) is preceded by ``<!-- not-run: REASON -->``. The marker
must carry a reason, and `NOT_RUN` lists how many each page has, so nothing is skipped
silently and a new one is a visible change to this file. Such blocks are still checked:
each ``funnel``, ``ray`` and ``python jobs/*.py`` command must name a subcommand that exists
and flags that its ``--help`` lists; ``make`` targets must exist in the Makefile, pip
extras in pyproject.toml, and test files named to pytest in tests/.

The scratch layout is the one the docs assume, ``main/`` beside ``shared/``:

- ``main/`` is the working directory, with ``main/.venv`` a link to this checkout's
  virtual environment and ``main/jobs`` a link to its ``jobs/`` (``python jobs/...``);
  everything the commands write (``.funnel/``, ``runs/``, ``data/``) goes there, never
  into the checkout.
- ``shared/data/beir/scifact/`` is ``tests/data/tiny-beir`` (40 documents in BEIR layout),
  so ``../shared/data/beir/scifact`` resolves to it with no change to the commands.
- ``main/tests/beir_matrix.yaml`` is ``tests/data/tiny-beir-matrix.yaml``: the real
  matrix's SciFact and NFCorpus figures cannot hold on the small corpus.

Servers run until Ctrl-C, so they are started in the background and stay up until the end
of their page, for the commands after them (``curl``, MCP clients): ``funnel serve`` must
answer ``GET /health``, an authorized ``POST /search`` and refuse one without the token;
``funnel mcp --transport streamable-http`` must list its tools to an authorized client. At
the page's end each gets SIGINT (Ctrl-C) and must exit. ``funnel mcp`` over stdio is driven
by the real MCP client (initialize, list tools, call ``search``), which then closes its
stdin. Only if a server's port is taken on this machine does the page get a free port
instead, in that command and those after it (the one change to a command).

After the last page, `EXPECT` checks what the commands printed and made: the runs,
the comparisons, the regression check, the rejects, the reindex, the refusals.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import unicodedata
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
FIXTURE = REPO / "tests" / "data" / "tiny-beir"
FIXTURE_MATRIX = REPO / "tests" / "data" / "tiny-beir-matrix.yaml"
STEP_TIMEOUT_S = 300
SHELL = ("bash", "sh", "shell")
SHOWN = ("text", "json", "yaml", "cron", "")  # output and configuration: never run
GENERATED = {"results.md", "infra.md"}  # nav pages made by docs/hooks/repo_pages.py
QUICKSTART = ("make demo   # venv + install, run the build job on a local Ray over the embedded demo corpus, answer a query\n"
              "make test   # venv + install, run the test suite\n")

#: page -> number of <!-- not-run: ... --> blocks it may have (see the module docstring).
NOT_RUN = {
    "README.md": 2,                  # make demo / make test: this suite itself; the SciFact download
    "docs/getting-started.md": 1,    # make install / pip install: changes this environment
    "docs/building-at-scale.md": 4,  # a Ray cluster, GPUs, S3, Kubernetes
    "docs/retrieval-modes.md": 3,    # a chat endpoint (twice), an LLM for enrichment
    "docs/bm25-lucene-parity.md": 1,  # Lucene's reference files in ../shared/data
}
NOT_RUN_MARK = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->\s*$")
NO_CHECK = {"kubectl", "docker", "export", "source", "cd", "aws", "mkdir", "curl", "unzip"}  # not here, or nothing to check


# -- reading the pages --------------------------------------------------------------------

@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    not_run: str | None = None  # the reason, for a block marked not-run


def nav_pages() -> list[str]:
    """docs/ pages in mkdocs.yml nav order (generated pages left out)."""
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)  # toc slugify
    cfg = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)

    def walk(items):
        for item in items:
            for v in (item.values() if isinstance(item, dict) else [item]):
                yield from (walk(v) if isinstance(v, list) else [v])
    return list(walk(cfg["nav"]))


def pages() -> list[str]:
    return ["README.md"] + [f"docs/{p}" for p in nav_pages() if p not in GENERATED]


def blocks(page: str) -> list[Block]:
    """The fenced blocks of a page, each with the not-run reason of a marker right before it."""
    lines = (REPO / page).read_text().splitlines()
    out, i, pending = [], 0, None
    while i < len(lines):
        line = lines[i]
        m = NOT_RUN_MARK.match(line)
        if m:
            assert m.group(1), f"{page}:{i + 1}: a not-run marker needs a reason: <!-- not-run: REASON -->"
            pending = (m.group(1), i + 1)
        elif line.startswith("```"):
            lang = line[3:].strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            assert end is not None, f"{page}:{i + 1}: unclosed code block"
            reason = pending[0] if pending else None
            assert not (reason and lang in SHOWN), f"{page}:{i + 1}: a not-run marker before a {lang!r} block"
            out.append(Block(page, i + 1, lang, "\n".join(lines[i + 1:end]) + "\n", reason))
            pending, i = None, end
        elif line.strip():
            assert pending is None, (f"{page}:{pending[1]}: a not-run marker must be the line right before "
                                     "the code block it marks")
        i += 1
    assert pending is None, f"{page}:{pending[1]}: a not-run marker with no code block after it"
    for b in out:
        assert b.lang in SHELL + ("python",) + SHOWN, f"{page}:{b.line}: unknown code block language {b.lang!r}"
    return out


def commands(block: str) -> list[str]:
    """Logical shell commands: continuation lines joined (as bash reads them), heredocs kept
    whole, comment and blank lines between commands dropped."""
    out, cur, heredoc = [], [], None
    for line in block.splitlines():
        if heredoc is not None:
            cur.append(line)
            if line.strip() == heredoc:
                out.append("\n".join(cur))
                cur, heredoc = [], None
            continue
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur.append(line)
        m = re.search(r"<<-?\s*(['\"]?)(\w+)\1", line)
        if m:
            heredoc = m.group(2)
        elif not line.endswith("\\"):
            out.append("\n".join(cur))
            cur = []
    assert heredoc is None, f"unterminated heredoc: {cur[:2]}"
    assert not cur, f"a command ends in a dangling backslash: {cur}"
    return out


def simple_commands(cmd: str) -> list[list[str]]:
    """The words of each simple command of a logical one (split at && || ; |), leading
    VAR=value assignments dropped."""
    words = shlex.split(cmd.replace("\\\n", " "), comments=True)
    out, cur = [], []
    for w in words + ["&&"]:
        if w in ("&&", "||", ";", "|"):
            while cur and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cur[0]):
                cur.pop(0)
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out


def server_kind(cmd: str) -> str | None:
    """'serve', 'mcp-http' or 'mcp-stdio' for a command that starts a server, else None."""
    argv = simple_commands(cmd)
    if len(argv) != 1 or argv[0][0] != "funnel" or len(argv[0]) < 2:
        return None
    if argv[0][1] == "serve":
        return "serve"
    if argv[0][1] == "mcp":
        return "mcp-http" if "streamable-http" in argv[0] else "mcp-stdio"
    return None


# -- GitHub heading anchors ---------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a heading (also the docs site's: pymdownx.slugs, case=lower)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = "".join(c for c in unicodedata.normalize("NFC", text)
                   if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6} (.+?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: str) -> list[tuple[int, str]]:
    text = (REPO / page).read_text()
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    return [(text[:m.start()].count("\n") + 1, m.group(1))
            for m in re.finditer(r"\]\(([^)\s]+)\)", text)]


# -- checking what cannot run -------------------------------------------------------------

def has_flag(help_text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def check_help(argv: list[str], sub: list[str], flags: list[str], env: dict, cwd: Path = REPO) -> None:
    p = subprocess.run([*argv, *sub, "--help"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"`{' '.join(argv + sub)} --help` failed:\n{p.stderr[-2000:]}"
    for flag in flags:
        assert has_flag(p.stdout, flag), f"`{' '.join(argv + sub)}` has no {flag}:\n{p.stdout}"


def check_not_run(cmd: str, env: dict) -> None:
    """A command that is not run here: its program, subcommand and flags exist."""
    venv_bin = REPO / ".venv" / "bin"
    for words in simple_commands(cmd):
        prog, args = words[0], words[1:]
        flags = [w.split("=")[0] for w in args if w.startswith("--")]
        if prog == "env":
            continue
        if prog == "funnel":
            sub = [w for w in args if not w.startswith("-")][:1]
            check_help([str(venv_bin / "funnel")], sub, flags, env)
        elif prog == "ray":
            head, job = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
            sub = [w for w in head if not w.startswith("-")][:2 if head[:1] == ["job"] else 1]
            check_help([str(venv_bin / "ray")], sub, [w.split("=")[0] for w in head if w.startswith("--")], env)
            if job:
                assert job[0] == "python" and job[1].startswith("jobs/"), f"unexpected job entrypoint {job}"
                check_help([str(venv_bin / "python"), job[1]], [], [w for w in job[2:] if w.startswith("--")], env)
        elif prog == "python" and args[:2] == ["-m", "pytest"]:
            for a in args[2:]:
                if not a.startswith("-"):
                    assert (REPO / a).exists(), f"{cmd!r} names {a}, which does not exist"
        elif prog == "python" and args and args[0].startswith("jobs/"):
            check_help([str(venv_bin / "python"), args[0]], [], [w for w in args[1:] if w.startswith("--")], env)
        elif prog == "make":
            targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
            for t in args:
                assert t in targets, f"{cmd!r}: the Makefile has no target {t!r}"
        elif prog == "pip":
            extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
            for a in args:
                for name in re.findall(r"\[([\w,-]+)\]", a):
                    for extra in name.split(","):
                        assert extra in extras, f"{cmd!r}: pyproject.toml has no extra {extra!r}"
        else:
            assert prog in NO_CHECK, f"{cmd!r}: {prog!r} in a not-run block: add a check, or to NO_CHECK"


# -- running ------------------------------------------------------------------------------

def run_step(cmd: str, env: dict[str, str], cwd: Path, state: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """Run one command in bash; return its result and the environment it leaves behind."""
    script = f"{cmd}\n__rc=$?\nenv -0 > {shlex.quote(str(state))}\nexit $__rc\n"
    p = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=STEP_TIMEOUT_S)
    after = dict(env)
    if state.exists():
        after = dict(kv.split("=", 1) for kv in state.read_text().split("\0") if "=" in kv)
        state.unlink()
    return p, after


def check_ok(where: str, cmd: str, p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, (f"{where}: command failed with exit {p.returncode}:\n{cmd}\n"
                               f"--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@dataclass
class Server:
    cmd: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text()[-3000:]


def start_server(cmd: str, env: dict[str, str], cwd: Path, log: Path) -> Server:
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Server(cmd, proc, log)


def wait_listening(server: Server, port: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert server.proc.poll() is None, f"{server.cmd!r} exited {server.proc.returncode}:\n{server.output()}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"{server.cmd!r} never listened:\n{server.output()}"
            time.sleep(0.5)


def stop_server(server: Server) -> None:
    """Ctrl-C; the server must exit."""
    try:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGINT)
            server.proc.wait(timeout=30)
    finally:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            pytest.fail(f"{server.cmd!r} did not stop on SIGINT (Ctrl-C):\n{server.output()}")


def port_of(cmd: str, default: int) -> int:
    m = re.search(r"--port (\d+)", cmd)
    return int(m.group(1)) if m else default


def exercise_serve(server: Server, port: int, env: dict[str, str]) -> None:
    """``funnel serve`` answers, with the token the page exported, and refuses without it."""
    wait_listening(server, port)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            status, health = http("GET", f"{base}/health")
            break
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"funnel serve never answered:\n{server.output()}"
            time.sleep(0.5)
    assert status == 200 and health["status"] == "ok" and health["n_docs"] == 40, health
    token = env.get("FUNNEL_TOKEN")
    assert token, "a page exports FUNNEL_TOKEN before serving"
    status, res = http("POST", f"{base}/search", {"query": "vitamin D and bone fractures", "k": 3}, token)
    assert status == 200 and len(res["hits"]) == 3, res
    status, _ = http("POST", f"{base}/search", {"query": "vitamin D", "k": 3})
    assert status == 401


def exercise_mcp_http(server: Server, port: int, env: dict[str, str]) -> None:
    """``funnel mcp --transport streamable-http`` lists its tools to a client with the token."""
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    wait_listening(server, port)
    headers = {"Authorization": f"Bearer {env['FUNNEL_TOKEN']}"} if env.get("FUNNEL_TOKEN") else {}

    async def session():
        with anyio.fail_after(120):
            async with httpx2.AsyncClient(headers=headers, timeout=60) as client, \
                    streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write), \
                    ClientSession(read, write) as s:
                await s.initialize()
                return {t.name for t in (await s.list_tools()).tools}

    assert anyio.run(session) == {"search", "get_document", "get_documents", "list_documents", "term_stats",
                                  "status"}


def exercise_mcp_stdio(cmd: str, env: dict[str, str], cwd: Path) -> None:
    """Drive the stdio MCP server with the real client: initialize, list tools, search, close."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command="bash", args=["-c", f"exec {cmd}"], env=env, cwd=str(cwd))

    async def session():
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    tools = {t.name for t in (await s.list_tools()).tools}
                    res = await s.call_tool("search", {"query": "vitamin D and bone fractures", "k": 3})
                    return tools, res

    tools, res = anyio.run(session)
    assert "search" in tools
    assert not res.is_error and "d02" in res.content[0].text, res


@dataclass
class Ran:
    page: str
    cmd: str
    out: str


@dataclass
class Expect:
    """After every page ran: some command of ``page`` matching ``cmd`` printed ``out``."""
    page: str
    cmd: str
    out: str
    flags: int = field(default=re.M)


#: What the commands must have printed (stdout and stderr together), beyond exiting 0.
EXPECT = [
    Expect("README.md", r"^funnel build --corpus docs ", r"^  dense: "),
    Expect("README.md", r"^funnel search \.funnel/indexes/docs ", r"operations\.md"),
    Expect("README.md", r"^funnel build --corpus \.\./shared\S* .* --dense$", r"^  dense: .*, 40 vectors\b"),
    Expect("README.md", r"^funnel search \S+ \"vitamin D deficiency", r"^Found 5 documents"),
    Expect("README.md", r"--mode hybrid --json", r'"mode": "hybrid"'),
    Expect("README.md", r"^funnel eval ", r"^\| hybrid +\| +0\.\d{4} \|"),
    Expect("README.md", r"^funnel compare ", r"^McNemar \(b=\d+, c=\d+\)"),
    Expect("README.md", r"^from funnel\.serving\.search import open_index", r"^Found 5 documents"),
    Expect("docs/getting-started.md", r"^funnel demo ", r"^Found \d+ documents"),
    Expect("docs/corpora-and-formats.md", r"rejects\.jsonl$",
           r"missing text field 'body'.*\n.*duplicate id 'n1' \(first seen at line 1\).*\n.*invalid JSON"),
    Expect("docs/corpora-and-formats.md", r"--strict", r"^refused: CURRENT still names v000001$"),
    Expect("docs/corpora-and-formats.md", r"^funnel search \.funnel/indexes/notes \"what happens", r"\[n3\]"),
    Expect("docs/corpora-and-formats.md", r"^funnel search \.funnel/indexes/parquet", r"\[p2\] Row groups"),
    Expect("docs/corpora-and-formats.md", r"--include 'runbooks/\*\*'", r"^  files: 2 read .*, 2 excluded \(\.funnelignore\)$"),
    Expect("docs/corpora-and-formats.md", r"^funnel search \.funnel/indexes/one-page", r"^1\. \[disk-full\.md\]"),
    Expect("docs/building-at-scale.md", r"^python -c .*\['build'\]", r"^ray 2$"),
    Expect("docs/retrieval-modes.md", r"--proposer prf --json", r"^\[.*'\w+'.*\]$"),
    Expect("docs/retrieval-modes.md", r"--context-tokens", r"^context \(\d+ passages, U-shaped\)"),
    Expect("docs/http-api.md", r"\"mode\": \"nope\"", r"unknown mode 'nope'; choose one of bm25, dense, hybrid, sira"),
    Expect("docs/http-api.md", r"/term_stats ", r'"note": ?"stopword'),
    Expect("docs/http-api.md", r"\?start=100&end=300", r'"start": ?100, ?"end": ?153, ?"length": ?153'),
    Expect("docs/http-api.md", r"/documents -H", r'"missing": ?\["nope"\]'),
    Expect("docs/http-api.md", r"/status -H", r'"access_control": ?false, ?"restricted": ?false'),
    Expect("docs/mcp-tools.md", r"^import asyncio\n\nfrom mcp import ClientSession, StdioServerParameters",
           r"\['search', 'get_document', 'get_documents', 'list_documents', 'term_stats', 'status'\]\nFound 3 documents"),
    Expect("docs/mcp-tools.md", r"streamable_http_client", r"^vitamin -> vitamin: df \d+"),
    Expect("docs/python-api.md", r"reindex\(", r"^False 3 0 0 0$"),
    Expect("docs/evaluation.md", r"^funnel compare ", r"^McNemar \(b=\d+, c=\d+\)"),
    Expect("docs/evaluation.md", r"^funnel eval --check", r"^5 OK, 0 FAIL, 0 MISSING$"),
    Expect("docs/operations.md", r"^funnel reindex .* --keep 3$", r"1 changed, 1 added, 1 deleted"),
    Expect("docs/operations.md", r"scifact-edited$", r"nothing (was )?published|no change"),
    Expect("docs/operations.md", r"^funnel verify ", r": OK \("),
    Expect("docs/operations.md", r"--host 0\.0\.0\.0", r"^refused: a server beyond loopback needs a token$"),
    Expect("docs/operations.md", r"--host 0\.0\.0\.0", r"refusing to serve .* on 0\.0\.0\.0 without a token"),
    Expect("docs/bm25-lucene-parity.md", r"Analyzer\(\)\.analyze", r"\['technolog', 'possibl', 'relat', 'fractur'\]"),
]


@pytest.fixture
def layout(tmp_path) -> Path:
    venv = REPO / ".venv"
    if not (venv / "bin" / "funnel").exists() or not (venv / "bin" / "activate").exists():
        pytest.skip(f"{venv} with funnel installed is needed (`make install`): the pages run .venv/bin/funnel")
    main = tmp_path / "main"
    (main / "tests").mkdir(parents=True)
    (main / ".venv").symlink_to(venv)
    (main / "jobs").symlink_to(REPO / "jobs")
    # The README's tour starts with a folder of the reader's own files: this checkout's docs/.
    shutil.copytree(DOCS, main / "docs")
    shutil.copy(FIXTURE_MATRIX, main / "tests" / "beir_matrix.yaml")
    shutil.copytree(FIXTURE, tmp_path / "shared" / "data" / "beir" / "scifact")
    return main


# -- the tests ----------------------------------------------------------------------------

def test_readme_is_a_product_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md is the product page: about 200 lines; move the rest to docs/"
    quick = [b for b in blocks("README.md") if b.lang == "bash" and b.text.startswith("make demo")]
    assert [b.text for b in quick] == [QUICKSTART], "the two Quickstart commands stay exactly as they are"
    # Headline figures are copied from bench/RESULTS.md, never invented: every number in the
    # table is there, and each row links to a section of it.
    table = re.search(r"^## Headline figures\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    results = (REPO / "bench" / "RESULTS.md").read_text()
    rows = [r for r in table.splitlines() if r.startswith("| [")]
    assert len(rows) >= 5
    for row in rows:
        assert "](bench/RESULTS.md#" in row, row
        label, figures = row.split("|")[1], "|".join(row.split("|")[2:])
        for num in re.findall(r"(?<![\w.])\d[\d,]*\.\d+|(?<![\w.])\d{1,3}(?:,\d{3})+", figures):
            assert num in results, f"{num} in the README's headline figures is not in bench/RESULTS.md"


def test_every_page_is_in_the_site_and_every_block_is_known():
    in_nav = set(nav_pages())
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk - in_nav == set(), "pages missing from mkdocs.yml nav"
    assert in_nav - on_disk - GENERATED == set(), "nav pages missing from docs/"
    found = {}
    for page in pages():
        bs = blocks(page)
        found[page] = sum(1 for b in bs if b.not_run)
        for b in bs:
            if b.not_run:
                assert len(b.not_run.split()) >= 3, f"{page}:{b.line}: say why it cannot run here"
    assert {p: n for p, n in found.items() if n} == NOT_RUN


def test_links_resolve():
    """Every relative link of README.md and docs/ names a file of the repository, and an
    anchor a heading of it, as GitHub resolves them (the site checks the same, strictly)."""
    for page in pages() + sorted(str(p.relative_to(REPO)) for p in (DOCS / "reference").glob("*.md")):
        base = (REPO / page).parent
        for line, target in links(page):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (base / path).resolve() if path else REPO / page
            assert dest.exists(), f"{page}:{line}: {target} does not exist"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest), f"{page}:{line}: {dest.name} has no heading #{anchor}"


def test_commands_run_as_written(layout, tmp_path):
    t0 = time.monotonic()
    env = {k: v for k, v in os.environ.items()
           if k not in ("FUNNEL_TOKEN", "RAY_ADDRESS", "FUNNEL_BEIR", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    state = tmp_path / "env.state"
    ran: list[Ran] = []
    python = str(layout / ".venv" / "bin" / "python")
    for page in pages():
        servers: list[Server] = []
        ports: dict[int, int] = {}  # a taken port -> the free one this page uses instead
        try:
            for n, b in enumerate(blocks(page)):
                where = f"{page}:{b.line}"
                if b.lang in SHOWN:
                    continue
                if b.not_run:
                    for cmd in (commands(b.text) if b.lang in SHELL else []):
                        check_not_run(cmd, env)
                    continue
                print(f"[{time.monotonic() - t0:6.1f}s] {where}")  # shown on failure, or with -s
                if b.lang == "python":
                    script = tmp_path / f"block-{len(ran)}.py"
                    script.write_text(b.text)
                    p = subprocess.run([python, str(script)], cwd=layout, env=env, capture_output=True,
                                       text=True, timeout=STEP_TIMEOUT_S)
                    check_ok(where, b.text, p)
                    ran.append(Ran(page, b.text, p.stdout + p.stderr))
                    continue
                for cmd in commands(b.text):
                    for taken, free in ports.items():
                        cmd = re.sub(rf"(?<=[:\s]){taken}\b", str(free), cmd)
                    kind = server_kind(cmd)
                    print(f"[{time.monotonic() - t0:6.1f}s]   {cmd.splitlines()[0][:100]}")
                    if kind == "mcp-stdio":
                        exercise_mcp_stdio(cmd, env, layout)
                    elif kind:
                        port = port_of(cmd, 8765 if kind == "serve" else 8766)
                        if not port_free(port):  # someone else's server here: the one allowed change
                            ports[port] = free_port()
                            cmd = re.sub(rf"--port {port}\b", f"--port {ports[port]}", cmd)
                            port = ports[port]
                        server = start_server(cmd, env, layout, tmp_path / f"server-{len(ran)}.log")
                        servers.append(server)
                        (exercise_serve if kind == "serve" else exercise_mcp_http)(server, port, env)
                        ran.append(Ran(page, cmd, ""))
                    else:
                        p, env = run_step(cmd, env, layout, state)
                        check_ok(where, cmd, p)
                        ran.append(Ran(page, cmd, p.stdout + p.stderr))
        finally:
            for server in servers:
                stop_server(server)

    missed = []
    for e in EXPECT:
        matching = [r for r in ran if r.page == e.page and re.search(e.cmd, r.cmd, re.M)]
        if not matching:
            missed.append(f"no command of {e.page} matches {e.cmd!r}: update EXPECT with the page")
        elif not any(re.search(e.out, r.out, e.flags) for r in matching):
            missed.append(f"{e.page}: no output of {e.cmd!r} matches {e.out!r}:\n"
                          + "\n---\n".join(r.out[-1500:] for r in matching))
    assert not missed, "\n\n".join(missed)

    # What the pages made: runs with every query in queries.jsonl, the Spark statistics.
    for run in ("scifact.bm25.trec", "scifact.hybrid.trec", "a.trec", "b.trec", "first.trec", "python.bm25.trec"):
        lines = (layout / "runs" / run).read_text().splitlines()
        assert len({line.split()[0] for line in lines}) == 18, run
    assert (layout / ".funnel" / "scifact-stats.duckdb").stat().st_size > 0
