"""``verify="cached"`` (the default open): a file this host hashed before, whose size,
mtime, ctime, inode and device are unchanged, is not hashed again; anything written to a
file since is hashed and refused when it does not match; ``full`` and ``funnel verify``
always hash. Real index copies, real files; hashing is counted by wrapping the module's
``sha256_file``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

import pytest

from funnel.pipelines.store import artifacts
from funnel.pipelines.store.artifacts import (VERIFIED, IndexFormatError, gc, load_manifest, new_staging_dir, publish,
                                        read_current)
from funnel.serving.frontends.cli import main
from funnel.serving.index import IndexVersion


@pytest.fixture
def root(demo_index_1, tmp_path) -> str:
    r = str(tmp_path / "ix")  # without the leases and records other tests left on the shared index
    shutil.copytree(demo_index_1, r, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    return r


@pytest.fixture
def hashed(monkeypatch) -> list[str]:
    """The paths ``sha256_file`` reads, in call order."""
    calls: list[str] = []
    real = artifacts.sha256_file

    def counting(path, *a, **kw):
        calls.append(path)
        return real(path, *a, **kw)
    monkeypatch.setattr(artifacts, "sha256_file", counting)
    return calls


@pytest.fixture
def settled_now(monkeypatch):
    """Files count as settled at once (the index was copied a moment ago)."""
    monkeypatch.setattr(artifacts, "STAMP_SETTLE_NS", 0)


def _vdir(root: str) -> str:
    return os.path.join(root, read_current(root))


def _n_files(root: str) -> int:
    return len(load_manifest(_vdir(root))["files"])


def _record(root: str) -> str:
    return os.path.join(root, VERIFIED, f"{read_current(root)}.{socket.gethostname()}.json")


def test_a_second_cached_open_hashes_nothing(root, hashed, settled_now):
    IndexVersion(root).close()
    assert len(hashed) == _n_files(root)  # no record yet (the copy has new inodes): every file
    assert set(json.load(open(_record(root)))["files"]) == set(load_manifest(_vdir(root))["files"])
    hashed.clear()
    IndexVersion(root).close()
    assert hashed == []


def test_a_file_written_since_is_hashed_again_and_refused(root, hashed, settled_now):
    IndexVersion(root, verify="full").close()
    rel = "lexical/shard-0000/tfs.npy"
    path = os.path.join(_vdir(root), rel)
    st = os.stat(path)
    with open(path, "r+b") as f:  # one byte flipped in place, mtime put back: only ctime tells
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    hashed.clear()
    with pytest.raises(IndexFormatError) as e:
        IndexVersion(root)
    assert rel in str(e.value) and "sha256" in str(e.value)
    assert hashed == [path]  # the one file whose stat moved, nothing else


def test_full_and_funnel_verify_always_hash(root, hashed, settled_now, capsys):
    IndexVersion(root).close()
    hashed.clear()
    IndexVersion(root, verify="full").close()
    assert len(hashed) == _n_files(root)
    hashed.clear()
    assert main(["verify", root]) == 0
    assert len(hashed) == _n_files(root) and "OK" in capsys.readouterr().out


def test_files_changed_just_before_the_check_get_no_record(root, hashed, monkeypatch):
    """A file changed within the settle time before its check is hashed at every open (a
    coarse file-system clock could hide a write right after the stat). The settle time is
    made longer than any file's age here, so the test does not depend on the clock."""
    monkeypatch.setattr(artifacts, "STAMP_SETTLE_NS", 10 ** 18)
    for _ in range(2):
        hashed.clear()
        IndexVersion(root).close()
        assert len(hashed) == _n_files(root)
    assert artifacts.read_stamps(_vdir(root)) == {}


def test_publish_leaves_records_so_the_first_open_hashes_nothing(root, hashed, settled_now):
    staging = new_staging_dir(root)
    shutil.copytree(_vdir(root), staging, dirs_exist_ok=True)
    name = publish(root, staging, load_manifest(staging))
    hashed.clear()
    IndexVersion(root).close()
    assert read_current(root) == name and hashed == []


@pytest.mark.parametrize("garbage", [b"{not json", b"[]", b'{"files": [1, 2]}', b""])
def test_an_unreadable_record_means_hashing_everything(root, hashed, settled_now, garbage):
    IndexVersion(root).close()
    with open(_record(root), "wb") as f:
        f.write(garbage)
    hashed.clear()
    IndexVersion(root).close()
    assert len(hashed) == _n_files(root)
    assert json.load(open(_record(root)))["files"]  # rewritten whole


def test_gc_removes_the_records_of_versions_that_are_gone(root, settled_now):
    IndexVersion(root).close()
    old = _record(root)
    staging = new_staging_dir(root)
    shutil.copytree(_vdir(root), staging, dirs_exist_ok=True)
    publish(root, staging, load_manifest(staging))
    stale_tmp = os.path.join(root, VERIFIED, "v000001.host.json.abcd1234.tmp")
    open(stale_tmp, "w").close()
    os.utime(stale_tmp, (time.time() - 3600,) * 2)
    report = gc(root, keep=1)
    removed = {p for p, _ in report.removed}
    assert old in removed and stale_tmp in removed and os.path.exists(_record(root))
