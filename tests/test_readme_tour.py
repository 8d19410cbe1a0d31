"""The README's tour and worked example, run as written, in order, on a 40-document corpus.

The commands are read from README.md: every ```bash block under "## A tour" and
"## Proving a change: a worked example", and the ```python block of the tour. Each logical
command (backslash continuations joined, comment lines dropped) runs through ``bash -c``,
its text unchanged, and must exit 0. Environment changes carry from one command to the
next (the environment is captured after each), so ``export FUNNEL_TOKEN=...`` and
``source .venv/bin/activate`` act on the commands after them as they would in one shell.

The scratch layout is the one the README assumes, ``main/`` beside ``shared/``:

- ``main/`` is the working directory, with ``main/.venv`` a link to this checkout's
  virtual environment; the tour's ``.funnel/`` and ``runs/`` are written there, never
  into the checkout.
- ``shared/data/beir/scifact/`` is ``tests/data/tiny-beir`` (40 documents in BEIR layout),
  so ``../shared/data/beir/scifact`` resolves to it with no change to the commands; its
  dense build takes seconds, not the minutes of SciFact's 5,183 documents.
- ``main/tests/beir_matrix.yaml`` is ``tests/data/tiny-beir-matrix.yaml``: the figures of
  the real matrix (SciFact and NFCorpus) cannot hold on the small corpus, so
  ``funnel eval --check tests/beir_matrix.yaml`` checks that corpus's own figures.

The two servers run until Ctrl-C, so they are started, made to answer, and stopped:
``funnel serve`` must answer ``GET /health`` and an authorized ``POST /search`` with the
token the tour exported (and refuse a request without it), then stop on SIGINT (Ctrl-C);
``funnel mcp`` (stdio) is driven by the real MCP client, which initializes, lists the tools
and calls ``search``, then closes its stdin. Only if port 8765 is already taken on this
machine does the serve command get a free port instead (the one change to a command).

Not run: ``ray start``, ``ray job submit`` and ``ray stop``. ``ray stop`` takes no address:
it kills every Ray process of the user on the machine, which would take down the Ray
session this very pytest process may hold (tests/conftest.py ``ray_session``) and any other
local Ray job; ``ray start --head`` also wants the fixed ports 6379 and 8265 that the
submit line names. For those three lines the test checks instead that each ``ray``
subcommand exists and accepts every flag the line passes, and that the job's entrypoint
(``python jobs/build_index.py``, run from the repository root as ``--working-dir .``
uploads it) accepts its flags.
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
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
FIXTURE = REPO / "tests" / "data" / "tiny-beir"
FIXTURE_MATRIX = REPO / "tests" / "data" / "tiny-beir-matrix.yaml"
TOUR, WORKED = "A tour", "Proving a change: a worked example"
NOT_RUN = ("ray start", "ray job submit", "ray stop")  # see the module docstring
SERVE_PORT = 8765
STEP_TIMEOUT_S = 300


# -- reading the README -------------------------------------------------------------------

def section(text: str, title: str) -> str:
    """The body of ``## title`` up to the next level-2 heading."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def fences(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[str]:
    """Logical shell commands: continuation lines joined (as bash reads them), comments dropped."""
    out, cur = [], []
    for line in block.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur.append(line)
        if not line.endswith("\\"):
            out.append("\n".join(cur))
            cur = []
    assert not cur, f"README command ends in a dangling backslash: {cur}"
    return out


def readme_steps() -> tuple[list[str], str, list[str]]:
    text = README.read_text()
    tour, worked = section(text, TOUR), section(text, WORKED)
    tour_cmds = [c for b in fences(tour, "bash") for c in commands(b)]
    python_blocks = fences(tour, "python")
    worked_cmds = [c for b in fences(worked, "bash") for c in commands(b)]
    assert tour_cmds and worked_cmds and len(python_blocks) == 1
    return tour_cmds, python_blocks[0], worked_cmds


def words(cmd: str) -> list[str]:
    return shlex.split(cmd.replace("\\\n", " "), comments=True)


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


def check_ok(cmd: str, p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, (f"README command failed with exit {p.returncode}:\n{cmd}\n"
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


def exercise_serve(cmd: str, env: dict[str, str], cwd: Path, log: Path) -> None:
    """Start ``funnel serve``, check it answers with and without the token, stop it with Ctrl-C."""
    port = SERVE_PORT
    if not port_free(port):  # someone else's server on this machine: the one allowed change
        port = free_port()
        assert f"--port {SERVE_PORT}" in cmd
        cmd = cmd.replace(f"--port {SERVE_PORT}", f"--port {port}")
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"funnel serve exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                status, health = http("GET", f"{base}/health")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, f"funnel serve never answered:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        assert status == 200 and health["status"] == "ok" and health["n_docs"] == 40, health
        token = env["FUNNEL_TOKEN"]
        assert token, "the tour exports FUNNEL_TOKEN before serving"
        status, res = http("POST", f"{base}/search", {"query": "vitamin D and bone fractures", "k": 3}, token)
        assert status == 200 and len(res["hits"]) == 3, res
        status, _ = http("POST", f"{base}/search", {"query": "vitamin D", "k": 3})
        assert status == 401
        os.killpg(proc.pid, signal.SIGINT)  # "runs until Ctrl-C"
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def exercise_mcp(cmd: str, env: dict[str, str], cwd: Path) -> None:
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


def has_flag(help_text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


def check_ray_line(cmd: str, env: dict[str, str]) -> None:
    """Not run (see the module docstring): the subcommand exists and takes every flag given."""
    argv = words(cmd)
    ray_args, job = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    sub = [w for w in ray_args[1:] if not w.startswith("-")][:2 if ray_args[1:2] == ["job"] else 1]
    ray = shutil.which("ray", path=env["PATH"])
    assert ray, "the tour's `source .venv/bin/activate` should put `ray` on PATH"
    p = subprocess.run([ray, *sub, "--help"], env=env, capture_output=True, text=True, timeout=120)
    check_ok(f"ray {' '.join(sub)} --help", p)
    for flag in (w.split("=")[0] for w in ray_args if w.startswith("--")):
        assert has_flag(p.stdout, flag), f"`ray {' '.join(sub)}` has no {flag}:\n{p.stdout}"
    if job:  # the entrypoint, from the repository root that --working-dir . uploads
        python = shutil.which(job[0], path=env["PATH"])
        p = subprocess.run([python, job[1], "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120)
        check_ok(f"{job[0]} {job[1]} --help", p)
        for flag in (w for w in job[2:] if w.startswith("--")):
            assert has_flag(p.stdout, flag), f"{job[1]} has no {flag}:\n{p.stdout}"


# -- the test -----------------------------------------------------------------------------

@pytest.fixture
def layout(tmp_path) -> Path:
    venv = REPO / ".venv"
    if not (venv / "bin" / "funnel").exists() or not (venv / "bin" / "activate").exists():
        pytest.skip(f"{venv} with funnel installed is needed (`make install`): the tour runs .venv/bin/funnel")
    main = tmp_path / "main"
    (main / "tests").mkdir(parents=True)
    (main / ".venv").symlink_to(venv)
    shutil.copy(FIXTURE_MATRIX, main / "tests" / "beir_matrix.yaml")
    shutil.copytree(FIXTURE, tmp_path / "shared" / "data" / "beir" / "scifact")
    return main


def test_readme_parses_into_the_tour():
    tour, python_block, worked = readme_steps()
    assert [c for c in tour if c.startswith(NOT_RUN)] == [c for c in tour if c.startswith("ray ")]
    assert len([c for c in tour if c.startswith(NOT_RUN)]) == len(NOT_RUN)
    assert any(" serve " in c for c in tour) and any(" mcp " in c for c in tour)
    assert "open_index(" in python_block
    assert any(" compare " in c for c in worked)


def test_readme_tour_runs_as_written(layout, tmp_path):
    T0 = time.monotonic()
    tour, python_block, worked = readme_steps()
    env = {k: v for k, v in os.environ.items()
           if k not in ("FUNNEL_TOKEN", "RAY_ADDRESS", "FUNNEL_BEIR", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    state = tmp_path / "env.state"
    outputs = {}
    for cmd in tour:
        print(f"[{time.monotonic() - T0:6.1f}s] {cmd.splitlines()[0]}")  # shown on failure, or with -s
        if cmd.startswith(NOT_RUN):
            check_ray_line(cmd, env)
        elif " serve " in cmd:
            exercise_serve(cmd, env, layout, tmp_path / "serve.log")
        elif " mcp " in cmd:
            exercise_mcp(cmd, env, layout)
        else:
            p, env = run_step(cmd, env, layout, state)
            check_ok(cmd, p)
            outputs[cmd] = p.stdout

    script = tmp_path / "tour.py"
    script.write_text(python_block)
    p = subprocess.run([str(layout / ".venv" / "bin" / "python"), str(script)], cwd=layout, env=env,
                       capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    check_ok(python_block, p)
    assert "Found 5 documents" in p.stdout

    for cmd in worked:
        print(f"[{time.monotonic() - T0:6.1f}s] {cmd.splitlines()[0]}")
        p, env = run_step(cmd, env, layout, state)
        check_ok(cmd, p)
        outputs[cmd] = p.stdout

    # What the steps made: one index with vectors, the runs the comparisons read.
    manifest = layout / ".funnel" / "indexes" / "scifact"
    manifest = manifest / (manifest / "CURRENT").read_text().strip() / "manifest.json"
    assert json.loads(manifest.read_text())["dense"]["ntotal"] == 40
    for run in ("scifact.bm25.trec", "scifact.hybrid.trec", "a.trec", "b.trec"):
        lines = (layout / "runs" / run).read_text().splitlines()
        assert len({line.split()[0] for line in lines}) == 18  # every query in queries.jsonl
    compares = [out for cmd, out in outputs.items() if " compare " in cmd]
    assert len(compares) == 2 and all(re.search(r"^McNemar \(b=\d+, c=\d+\)", o, re.M) for o in compares)
    check = next(out for cmd, out in outputs.items() if "eval --check" in cmd)
    assert re.findall(r"\| (OK|FAIL|MISSING) +\|$", check, re.M) == ["OK"] * 5, check
