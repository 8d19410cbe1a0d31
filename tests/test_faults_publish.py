"""Faults around publishing (issue 16): concurrent publishes, SIGKILL mid-publish, gc.

Real processes and real files: publishers are separate Python processes started with
``multiprocessing`` (spawn), a "killed build" is a process ended with SIGKILL.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from funnel.pipelines.store.artifacts import (IndexFormatError, list_versions, load_manifest, new_staging_dir,
                                        publish, read_current, release_staging, verify_files)

ROUNDS = 50
PUBLISHERS = 3
BARRIER_TIMEOUT_S = 60


def _publisher(root: str, keep: int | None, rounds: int, start, end) -> None:
    """One publishing process: per round, stage a small version, wait for the others, publish."""
    for i in range(rounds):
        staging = new_staging_dir(root)
        with open(os.path.join(staging, "data.bin"), "wb") as f:
            f.write(os.urandom(64 << 10))
        os.makedirs(os.path.join(staging, "lexical"))
        with open(os.path.join(staging, "lexical", "x.npy"), "wb") as f:
            f.write(os.urandom(4 << 10))
        start.wait(BARRIER_TIMEOUT_S)
        publish(root, staging, {"kind": "test", "round": i, "pid": os.getpid()}, keep=keep)
        end.wait(BARRIER_TIMEOUT_S)


def _check_round(root: str, rnd: int, keep: int | None) -> None:
    cur = read_current(root)
    versions = list_versions(root)
    where = f"round {rnd}: CURRENT={cur!r}, versions={versions[-5:]}"
    assert cur is not None, where
    assert os.path.isdir(os.path.join(root, cur)), f"dangling CURRENT; {where}"
    assert cur == versions[-1], f"CURRENT is not the newest version; {where}"
    vdir = os.path.join(root, cur)
    m = load_manifest(vdir)  # raises on a torn or edited manifest
    verify_files(vdir, m, full=True)
    if keep is not None:
        assert len(versions) <= keep, where


@pytest.mark.parametrize("keep", [1, None], ids=["keep1", "keepall"])
def test_concurrent_publishes_leave_current_on_the_newest_verified_version(tmp_path, keep):
    root = str(tmp_path / "ix")
    os.makedirs(root)
    ctx = mp.get_context("spawn")
    start, end = ctx.Barrier(PUBLISHERS + 1), ctx.Barrier(PUBLISHERS + 1)
    procs = [ctx.Process(target=_publisher, args=(root, keep, ROUNDS, start, end), daemon=True)
             for _ in range(PUBLISHERS)]
    for p in procs:
        p.start()
    try:
        for rnd in range(ROUNDS):
            start.wait(BARRIER_TIMEOUT_S)
            end.wait(BARRIER_TIMEOUT_S)
            _check_round(root, rnd, keep)
        for p in procs:
            p.join(BARRIER_TIMEOUT_S)
            assert p.exitcode == 0
    finally:
        start.abort()
        end.abort()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert list_versions(root)[-1] == f"v{ROUNDS * PUBLISHERS:06d}"


# -- gc -----------------------------------------------------------------------------------

_BUILD = textwrap.dedent("""
    import os, sys
    from funnel.pipelines.store.artifacts import new_staging_dir, publish
    root = sys.argv[1]
    staging = new_staging_dir(root)
    work = os.path.join(root, ".work-" + os.path.basename(staging).split("-", 1)[1])
    os.makedirs(work)
    for d in (staging, work):
        with open(os.path.join(d, "part.bin"), "wb") as f:
            f.write(os.urandom(100_000))
    print(staging, flush=True)
    sys.stdin.readline()                    # a build working until told to publish
    print(publish(root, staging, {"kind": "test"}), flush=True)
""")

_HOLD_ROOT_LOCK = textwrap.dedent("""
    import sys
    from funnel.pipelines.store.artifacts import root_lock
    with root_lock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.readline()
""")


def _start(script: str, root: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", script, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    return p, p.stdout.readline().strip()


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(30)


def _publish_one(root: str) -> str:
    staging = new_staging_dir(root)
    with open(os.path.join(staging, "data.bin"), "wb") as f:
        f.write(os.urandom(10_000))
    return publish(root, staging, {"kind": "test"})


def test_gc_removes_what_killed_builds_left_and_nothing_a_live_build_needs(tmp_path):
    from funnel.pipelines.store.artifacts import gc
    root = str(tmp_path / "ix")
    for _ in range(4):
        _publish_one(root)
    with open(os.path.join(root, "CURRENT"), "w") as f:
        f.write("v000002\n")  # rolled back by hand: CURRENT is not the newest
    live, live_staging = _start(_BUILD, root)
    killed, killed_staging = _start(_BUILD, root)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        old = os.path.join(root, ".staging-0ld0ld0ld0ld")  # from a funnel without build locks, an hour old
        os.makedirs(os.path.join(old, "lexical"))
        with open(os.path.join(old, "lexical", "x.npy"), "wb") as f:
            f.write(b"x" * 5000)
        os.utime(old, (os.path.getmtime(old) - 3600,) * 2)
        young = os.path.join(root, ".staging-y0ungy0ungy0")  # unlocked but fresh: cannot tell yet
        os.makedirs(young)
        trash = os.path.join(root, ".trash-v000000-deadbeef")
        os.makedirs(trash)
        stray = os.path.join(root, "CURRENT.0badc0de.tmp")
        open(stray, "w").close()
        work = lambda st: os.path.join(root, ".work-" + os.path.basename(st).split("-", 1)[1])  # noqa: E731

        rep = gc(root, keep=1)

        removed = {p for p, _ in rep.removed}
        assert removed == {killed_staging, work(killed_staging), old, trash, stray,
                           os.path.join(root, "v000001"), os.path.join(root, "v000003")}
        sizes = dict(rep.removed)
        assert sizes[killed_staging] >= 100_000 and sizes[old] == 5000
        assert rep.bytes_freed == sum(sizes.values())
        kept = dict(rep.kept)
        assert "running build" in kept[live_staging] and work(live_staging) in kept and young in kept
        assert sorted(d for d in os.listdir(root) if d.startswith("v")) == ["v000002", "v000004"]
        assert read_current(root) == "v000002"
        # The live build was not disturbed: it publishes.
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.stdout.readline().strip() == "v000005"
        assert read_current(root) == "v000005"
    finally:
        _stop(live)
        _stop(killed)


def test_gc_waits_for_no_publish_and_refuses_bad_keep(tmp_path):
    from funnel.pipelines.store.artifacts import gc
    root = str(tmp_path / "ix")
    _publish_one(root)
    dead = os.path.join(root, ".trash-v000000-0000")
    os.makedirs(dead)
    holder, line = _start(_HOLD_ROOT_LOCK, root)
    try:
        assert line == "held"
        rep = gc(root, keep=1)
        assert rep.busy and rep.removed == [] and ".lock is held" in rep.kept[0][1] and os.path.isdir(dead)
    finally:
        _stop(holder)
    rep = gc(root)
    assert not rep.busy and [p for p, _ in rep.removed] == [dead]
    with pytest.raises(ValueError, match="keep must be at least 1"):
        gc(root, keep=0)
    with pytest.raises(FileNotFoundError):
        gc(str(tmp_path / "nope"))


def test_gc_keeps_versions_when_current_is_broken(tmp_path):
    from funnel.pipelines.store.artifacts import gc
    root = str(tmp_path / "ix")
    for _ in range(3):
        _publish_one(root)
    with open(os.path.join(root, "CURRENT"), "w") as f:
        f.write("../elsewhere\n")
    rep = gc(root, keep=1)
    assert rep.removed == [] and "not a version name" in rep.kept[0][1]
    assert len([d for d in os.listdir(root) if d.startswith("v")]) == 3


def test_publish_refuses_keep_zero_and_replaces_a_bad_current(tmp_path):
    root = str(tmp_path / "ix")
    _publish_one(root)
    staging = new_staging_dir(root)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        publish(root, staging, {"kind": "test"}, keep=0)
    release_staging(staging, remove=True)
    with open(os.path.join(root, "CURRENT"), "w") as f:
        f.write("../elsewhere\n")
    with pytest.raises(IndexFormatError, match="not a version name"):
        read_current(root)
    v = _publish_one(root)
    assert read_current(root) == v == "v000002"
    assert load_manifest(os.path.join(root, v))["parent"] is None


_PUBLISH_FOREVER = textwrap.dedent("""
    import os, sys
    from funnel.pipelines.store.artifacts import new_staging_dir, publish
    root = sys.argv[1]
    print("started", flush=True)
    while True:
        staging = new_staging_dir(root)
        for i in range(20):
            with open(os.path.join(staging, f"part-{i}.bin"), "wb") as f:
                f.write(os.urandom(50_000))
        publish(root, staging, {"kind": "test"}, keep=2)
""")


def test_sigkill_while_publishing_leaves_current_verified_and_gc_cleans_up(tmp_path):
    import random
    import time
    from funnel.pipelines.store.artifacts import gc
    root = str(tmp_path / "ix")
    _publish_one(root)
    rng = random.Random(16)
    for _ in range(15):
        p, line = _start(_PUBLISH_FOREVER, root)
        assert line == "started"
        time.sleep(rng.uniform(0.0, 0.3))
        _stop(p)  # SIGKILL, anywhere in publish
        cur = read_current(root)
        vdir = os.path.join(root, cur)
        verify_files(vdir, load_manifest(vdir), full=True)
    gc(root, keep=2)
    assert not [d for d in os.listdir(root) if d.startswith((".staging-", ".work-", ".trash-", ".new-"))]
    assert os.path.isdir(os.path.join(root, read_current(root)))
