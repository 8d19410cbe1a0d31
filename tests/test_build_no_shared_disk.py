"""The Ray engine on a cluster whose workers share no disk with the driver.

The driver runs in a mount namespace of its own (unshare(1)), where INDEX_ROOT's folder is a
tmpfs that only it sees. The Ray it joins (RAY_ADDRESS: this session's local Ray, started
outside that namespace) runs the workers, and they see the real folder, in which a plain file
stands where INDEX_ROOT is: a worker that wrote anything under the driver's staging or work
folder would fail (NotADirectoryError) instead of writing to its own disk, as it would on
another machine. So a build passes only if the workers' files reach the driver through Ray.
What the driver publishes is copied out of its namespace and compared file by file with an
``--engine local`` build of the same corpus, rejects and vectors included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from funnel.jobs.build_index import FAULT_ENV, BuildError, build, choose_worker_files
from funnel.jobs import worker_files
from funnel.jobs.worker_files import FileReceiver, result_rows
from funnel.pipelines.store.artifacts import read_current
from funnel.serving.search import open_index

from conftest import write_jsonl
from test_build import QUERIES
from test_build_engines import assert_same_index, assert_same_results

BUILD_TIMEOUT_S = 400
SHARDS = 3
CHUNK_BYTES = 16 << 10
#: Ray's actors and the local engine batch documents differently (and a worker may answer from
#: its embedding cache), so vectors agree to float precision, not bit for bit (test_build_engines).
VECTOR_ATOL = 1e-6

# The driver, in its own mount namespace: mount a tmpfs over argv[1] (the folder holding
# INDEX_ROOT), build there on the Ray at RAY_ADDRESS, ask a worker what it sees at INDEX_ROOT,
# and copy the published index out to argv[3] (outside the tmpfs) for the test to compare.
_DRIVER = """
import json, os, shutil, subprocess, sys
disk, corpus, export, shards, chunk_bytes, dense = sys.argv[1:7]
subprocess.run(["mount", "-t", "tmpfs", "funnel-driver-disk", disk], check=True)
assert os.listdir(disk) == [], "the driver sees the workers' view of its folder"
from funnel.jobs.build_index import build
root = os.path.join(disk, "ix")
rep = build(corpus, root, shards=int(shards), engine="ray", chunk_bytes=int(chunk_bytes), dense=dense == "1",
            progress_seconds=0)
import ray
worker_view = ray.get(ray.remote(lambda p: "file" if os.path.isfile(p) else "missing" if not os.path.exists(p)
                                 else "folder").remote(root))
shutil.copytree(root, export, symlinks=True)
print("RESULT " + json.dumps({"version": rep.version, "n_docs": rep.n_docs, "n_rejects": rep.n_rejects,
                              "ray": rep.ray, "worker_view": worker_view}))
"""


def _unshare_cmd() -> list[str]:
    """A private mount namespace: as root directly, otherwise inside a user namespace."""
    if os.geteuid() == 0:
        return ["unshare", "--mount", "--propagation", "private", "--"]
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--"]


@pytest.fixture(scope="module")
def unshare(tmp_path_factory) -> list[str]:
    cmd = _unshare_cmd()
    probe = tmp_path_factory.mktemp("probe")
    p = subprocess.run([*cmd, "mount", "-t", "tmpfs", "probe", str(probe)], capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        pytest.fail(f"this test runs the build's driver in a mount namespace of its own, which needs unshare(1) "
                    f"and either root or unprivileged user namespaces: {' '.join(cmd)} failed: {p.stderr.strip()}")
    return cmd


@pytest.fixture(scope="module")
def ray_address(ray_session) -> str:
    import ray
    return ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def messy_corpus(demo_corpus, tmp_path_factory) -> str:
    """150 demo documents with broken JSON, a row without id, blank text and a duplicate id in a
    later chunk than its first copy (a shard-stage reject), over several 16 KiB chunks."""
    rows: list = [json.loads(line) for _, line in zip(range(150), open(demo_corpus))]
    rows[10:10] = ['{"_id": "broken", "text": ', {"title": "no id", "text": "orphan"}]
    rows[120:120] = [dict(rows[0], title="a later duplicate"), {"_id": "blank", "text": "  "}]
    return write_jsonl(tmp_path_factory.mktemp("messy") / "corpus.jsonl", rows)


def _build_without_shared_disk(unshare: list[str], ray_address: str, tmp_path, corpus: str, dense: bool = False,
                               env_extra: dict | None = None) -> tuple[dict, str]:
    """A Ray build whose driver's folders the workers cannot see; (its result, the published copy)."""
    disk = tmp_path / "driver-disk"
    disk.mkdir(parents=True)
    (disk / "ix").write_text("what a worker finds at the driver's INDEX_ROOT: a file, no folder\n")
    export = tmp_path / "published"
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    env.update({"RAY_ADDRESS": ray_address, "RAY_AUTH_MODE": "disabled", "FUNNEL_CACHE": str(tmp_path / "cache"),
                **(env_extra or {})})
    p = subprocess.run([*unshare, sys.executable, "-c", _DRIVER, str(disk), corpus, str(export), str(SHARDS),
                        str(CHUNK_BYTES), "1" if dense else "0"],
                       env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert p.returncode == 0, f"build failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    res = json.loads([line for line in p.stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])
    # The workers saw a file at INDEX_ROOT all along, and nothing of the build reached their disk.
    assert res["worker_view"] == "file"
    assert sorted(os.listdir(disk)) == ["ix"] and (disk / "ix").is_file()
    return res, str(export)


def test_ray_build_without_a_shared_disk_publishes_what_the_local_engine_does(unshare, ray_address, messy_corpus,
                                                                              tmp_path, monkeypatch):
    res, shipped = _build_without_shared_disk(unshare, ray_address, tmp_path / "ray", messy_corpus, dense=True)
    assert res["ray"]["cluster"] == "cluster" and res["ray"]["worker_files"]["shipped"] is True
    assert res["ray"]["worker_files"]["reason"].startswith(f"auto: the Ray cluster at {ray_address} ")
    # broken JSON, no id, blank text (read stage) and the later duplicate (shard stage)
    assert (res["n_docs"], res["n_rejects"]) == (150, 4)
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "local-cache"))  # the local build embeds for real
    local = str(tmp_path / "local")
    build(messy_corpus, local, shards=SHARDS, engine="local", chunk_bytes=CHUNK_BYTES, dense=True,
          progress_seconds=0)
    assert_same_index(shipped, local, vector_atol=VECTOR_ATOL)
    assert_same_results(shipped, local)
    # Vectors within VECTOR_ATOL per component move a cosine score by at most sqrt(dim) times it.
    a, b = open_index(shipped), open_index(local)
    dim = json.load(open(os.path.join(shipped, res["version"], "manifest.json")))["dense"]["dim"]
    for mode in ("dense", "hybrid"):
        for q in QUERIES:
            ha, hb = a.search(q, mode=mode, k=20).hits, b.search(q, mode=mode, k=20).hits
            assert [h.doc_id for h in ha] == [h.doc_id for h in hb], (mode, q)
            np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], rtol=0,
                                       atol=np.sqrt(dim) * VECTOR_ATOL, err_msg=f"{mode}: {q}")
    with open(os.path.join(shipped, res["version"], "rejects.jsonl")) as f:
        reasons = [json.loads(line)["reason"] for line in f]
    assert len(reasons) == 4 and any(r.startswith("duplicate id") for r in reasons)


def test_a_killed_shard_task_is_retried_without_a_shared_disk(unshare, ray_address, messy_corpus, tmp_path):
    marker = tmp_path / "killed.pid"
    res, shipped = _build_without_shared_disk(unshare, ray_address, tmp_path / "ray", messy_corpus,
                                              env_extra={FAULT_ENV: f"shard:1:{marker}"})
    assert marker.exists(), "no worker built shard 1: the fault was not injected"
    assert res["ray"]["worker_files"]["shipped"] is True and (res["n_docs"], res["n_rejects"]) == (150, 4)
    local = str(tmp_path / "local")
    build(messy_corpus, local, shards=SHARDS, engine="local", chunk_bytes=CHUNK_BYTES, progress_seconds=0)
    assert_same_index(shipped, local)
    assert_same_results(shipped, local)


def test_an_all_rejected_corpus_keeps_its_reasons_when_files_are_shipped(ray_session, tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]", '{"_id": "x"}', '{"text": "no id"}'])
    with pytest.raises(BuildError, match="no valid documents.*all 3 rows were rejected"):
        build(bad, str(tmp_path / "ix"), shards=2, engine="ray", shared_disk=False, progress_seconds=0)
    assert read_current(str(tmp_path / "ix")) is None
    kept = [f for f in os.listdir(tmp_path / "ix") if f.startswith("rejects-")]
    assert len(kept) == 1 and len(open(tmp_path / "ix" / kept[0]).readlines()) == 3


# -- when files are shipped -----------------------------------------------------------------------


def test_files_are_shipped_unless_every_worker_is_on_this_machine():
    local, existing = {"cluster": "local"}, {"cluster": "existing", "nodes": 1}
    cluster = {"cluster": "cluster", "address": "head:6379", "nodes": 1}
    assert choose_worker_files(None, local)[0] is False
    assert choose_worker_files(None, existing, nodes_here=True)[0] is False
    assert choose_worker_files(None, existing, nodes_here=False)[0] is True
    ship, why = choose_worker_files(None, cluster, nodes_here=True)  # a cluster may add nodes while it builds
    assert ship is True and why.startswith("auto: the Ray cluster at head:6379 ")
    assert choose_worker_files(False, local) == (True, choose_worker_files(False, local)[1])
    assert choose_worker_files(False, local)[1].startswith("set by --no-shared-disk")
    assert choose_worker_files(True, cluster)[0] is False
    assert choose_worker_files(True, cluster)[1].startswith("set by --shared-disk")


# -- the rows and the receiver, without Ray -------------------------------------------------------


def _table(batches: list[dict]) -> pa.Table:
    return pa.concat_tables([pa.table({k: pa.array(list(v)) for k, v in b.items()}) for b in batches])


@pytest.fixture
def task_folder(tmp_path) -> str:
    """What a shard task leaves in its temporary folder: a large file, an empty one, a nested one."""
    src = tmp_path / "task"
    (src / "out" / "lexical" / "shard-0002").mkdir(parents=True)
    (src / "work" / "rejects").mkdir(parents=True)
    (src / "out" / "lexical" / "shard-0002" / "docs.npy").write_bytes(np.arange(10_000, dtype=np.int64).tobytes())
    (src / "out" / "lexical" / "shard-0002" / "empty.npy").write_bytes(b"")
    (src / "work" / "rejects" / "shard-0002.json").write_text("[]")
    return str(src)


def _sent(task_folder: str, tmp_path, monkeypatch) -> list[dict]:
    """The rows of a task that shipped ``task_folder`` (a copy: the task removes its folder)."""
    monkeypatch.setattr(worker_files, "PIECE_BYTES", 30_000)  # docs.npy: 80,000 bytes in three pieces
    copy = shutil.copytree(task_folder, tmp_path / "sent")
    rows = list(result_rows(2, {"shard": np.int64(2), "n_docs": 7}, str(copy)))
    assert not os.path.exists(copy)
    return rows


def _tree(root: str) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, fs in os.walk(root) for f in fs}


def test_shipped_files_arrive_whole_in_any_order_and_twice(task_folder, tmp_path, monkeypatch):
    rows = _sent(task_folder, tmp_path, monkeypatch)
    assert sum(1 for r in rows if r["path"][0] == "out/lexical/shard-0002/docs.npy") == 3
    # A retried task sends everything again; Ray may deliver the two attempts' rows interleaved.
    again = rows[::-1] + rows
    recv = FileReceiver({"out": str(tmp_path / "staging"), "work": str(tmp_path / "work")})
    for i in range(0, len(again), 2):
        recv.add(_table(again[i:i + 2]))
    assert recv.finish() == [{"shard": 2, "n_docs": 7}]
    want = _tree(task_folder)
    got = {os.path.join("out", k): v for k, v in _tree(str(tmp_path / "staging")).items()}
    got |= {os.path.join("work", k): v for k, v in _tree(str(tmp_path / "work")).items()}
    assert got == want and want[os.path.join("out", "lexical", "shard-0002", "empty.npy")] == b""


def test_a_missing_or_changed_piece_fails_the_build(task_folder, tmp_path, monkeypatch):
    rows = _sent(task_folder, tmp_path, monkeypatch)
    recv = FileReceiver({"out": str(tmp_path / "a"), "work": str(tmp_path / "b")})
    recv.add(_table([r for r in rows if int(r["offset"][0]) != 30_000]))  # the middle piece lost
    with pytest.raises(RuntimeError, match="docs.npy arrived with other bytes than it wrote"):
        recv.finish()
    recv = FileReceiver({"out": str(tmp_path / "c"), "work": str(tmp_path / "d")})
    recv.add(_table([r for r in rows if int(r["offset"][0]) != 60_000]))  # the last piece lost
    with pytest.raises(RuntimeError, match="docs.npy arrived as 60000 bytes, not the 80000"):
        recv.finish()


def test_a_path_outside_the_build_folders_is_refused(tmp_path):
    recv = FileReceiver({"out": str(tmp_path / "staging")})
    for rel in ("out/../../etc/x", "elsewhere/x", "out/", "/out/x"):
        bad = {"key": np.array([0]), "path": np.array([rel], dtype=object), "offset": np.array([0]),
               "data": np.array([b"x"], dtype=object), "summary": np.array([""], dtype=object)}
        with pytest.raises(RuntimeError, match="outside the build's folders"):
            recv.add(_table([bad]))
    assert not os.path.exists(tmp_path / "staging")
