"""SIGKILL of a Ray worker during the build's stages (issue 16): the task is retried and the
build publishes the same index as an undisturbed build.

Each build is a real ``--engine ray`` build in its own Python process, on a fresh local Ray
that the build starts (RAY_ADDRESS unset), bounded by ``BUILD_TIMEOUT_S``. The lexical stage
is a Ray task per chunk (``_read_chunk_task``: read, split by shard into the object store)
and a streaming-generator task per shard (``_shard_task``). Aim:

- at a known point: the test-only hook ``FUNNEL_FAULT_KILL=STAGE:N:MARKER``
  (``funnel.jobs.build_index.FAULT_ENV``) makes the worker running chunk N / shard N kill
  itself with SIGKILL, once (MARKER gets its pid), after its work is done;
- at no chosen point: a watcher here SIGKILLs the first descendant of the build process whose
  title is ``ray::_shard_task`` (a worker executing a shard task), wherever it is.

What retries them is Ray's default of 3 retries on a worker's death, which the build leaves
alone (streaming generators included); their results are owned by the driver, so a lost one
is rebuilt from lineage. With ``max_retries=0`` each of these kills fails the build.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from funnel.jobs.build_index import FAULT_ENV
from funnel.pipelines.sources.demo import demo_documents

from conftest import write_jsonl
from test_build_engines import assert_same_index, assert_same_results

BUILD_TIMEOUT_S = 240
SHARDS = 3
CHUNK_BYTES = 256 << 10
SHARD_TASK_TITLE = b"ray::_shard_task"

_BUILD = ("import sys\n"
          "from funnel.jobs.build_index import build\n"
          "rep = build(sys.argv[1], sys.argv[2], shards=int(sys.argv[3]), engine='ray', chunk_bytes=int(sys.argv[4]),"
          " num_cpus=2, progress_seconds=0)\n"
          "print('BUILT', rep.version, rep.n_docs, rep.n_rejects, rep.ray['cluster'])\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, int]:
    """(path, valid documents): ~4,100 documents (the demo corpus four times over, 2.3 MB: 10
    chunks), with bad rows and a duplicate id in different chunks, so that retried tasks also
    redo rejects."""
    docs = demo_documents(max_docs=None)
    rows: list = [dict(d, _id=f"{d['_id']}#{r}") for r in range(4) for d in docs]
    n_valid = len(rows)
    rows[5:5] = ['{"_id": "broken", "text": ', {"title": "no id", "text": "orphan"}]
    rows[3000:3000] = [dict(rows[0], title="a later duplicate"), {"_id": "blank", "text": "  "}]
    return write_jsonl(tmp_path_factory.mktemp("workers") / "corpus.jsonl", rows), n_valid


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _title(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0]
    except OSError:
        return b""


class _KillFirst(threading.Thread):
    """SIGKILLs the first descendant of ``root`` whose process title starts with ``title``."""

    def __init__(self, root: int, title: bytes):
        super().__init__(daemon=True)
        self.root, self.title, self.killed, self.stop = root, title, None, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for pid in _descendants(self.root):
                t = _title(pid)
                if t.startswith(self.title):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:  # the task ended first: wait for the next one
                        continue
                    self.killed = (pid, t.decode(errors="replace"))
                    return
            time.sleep(0.002)


def _run_build(corpus: tuple[str, int], root: str, env_extra: dict | None = None, kill_title: bytes | None = None):
    """One Ray build in a fresh process that must succeed; returns (its pid, what the watcher
    killed: (pid, title) or None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", FAULT_ENV)}
    env.update({"RAY_AUTH_MODE": "disabled", **(env_extra or {})})
    p = subprocess.Popen([sys.executable, "-c", _BUILD, corpus[0], root, str(SHARDS), str(CHUNK_BYTES)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    watcher = _KillFirst(p.pid, kill_title) if kill_title else None
    if watcher:
        watcher.start()
    try:
        out, _ = p.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the build and the Ray it started
        out, _ = p.communicate(timeout=30)
        pytest.fail(f"build did not finish in {BUILD_TIMEOUT_S}s:\n{out[-3000:]}")
    finally:
        if watcher:
            watcher.stop.set()
            watcher.join(10)
    assert p.returncode == 0, f"build failed (exit {p.returncode}):\n{out[-3000:]}"
    built = [line.split() for line in out.splitlines() if line.startswith("BUILT ")]
    assert built and built[0][4] == "local", out[-3000:]  # a fresh local Ray, started by the build
    # every valid document; broken JSON, no id, a duplicate id and blank text rejected
    assert built[0][2:4] == [str(corpus[1]), "4"], out[-3000:]
    return p.pid, (watcher.killed if watcher else None)


@pytest.fixture(scope="module")
def undisturbed(corpus, tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("undisturbed") / "ix")
    _run_build(corpus, root)
    return root


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] in "ZX"  # a zombie until the raylet reaps it
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("stage,item", [("parse", 3), ("shard", 1)],
                         ids=["parse", "shard"])
def test_worker_killed_in_stage_is_retried_and_the_index_is_the_same(corpus, undisturbed, tmp_path, stage, item):
    marker = str(tmp_path / "killed.pid")
    root = str(tmp_path / "ix")
    driver, _ = _run_build(corpus, root, {FAULT_ENV: f"{stage}:{item}:{marker}"})
    assert os.path.exists(marker), f"no worker ran {stage} item {item}: the fault was not injected"
    with open(marker) as f:
        pid = int(f.read())
    assert pid not in (driver, os.getpid()) and _dead(pid)  # a worker died; the build went on
    assert_same_index(root, undisturbed)
    assert_same_results(root, undisturbed)


def test_worker_killed_from_outside_in_a_shard_task_is_retried_and_the_index_is_the_same(corpus, undisturbed,
                                                                                         tmp_path):
    root = str(tmp_path / "ix")
    _, killed = _run_build(corpus, root, kill_title=SHARD_TASK_TITLE)
    assert killed is not None, "the watcher saw no worker executing a shard task"
    assert _dead(killed[0]), killed
    assert_same_index(root, undisturbed)
    assert_same_results(root, undisturbed)
