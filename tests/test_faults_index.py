"""Damaged and hostile index versions (issue 16): corruption is refused with a clear error,
CURRENT never leads outside the root, and a server keeps its last good version.

Every test works on a copy of the session's demo index (``demo_index_1``) and damages
real files in it.
"""

from __future__ import annotations

import json
import glob
import logging
import os
import shutil
import subprocess
import sys

import pytest

from funnel.pipelines.store.artifacts import (MANIFEST_SUM, IndexFormatError, load_manifest, new_staging_dir, publish,
                                        read_current, write_manifest)
from funnel.serving.index import IndexVersion, VersionFollower
from funnel.serving.search import Searcher

QUERY = "parse command line arguments"


@pytest.fixture
def root(demo_index_1, tmp_path) -> str:
    r = str(tmp_path / "ix")
    shutil.copytree(demo_index_1, r)
    return r


def _vdir(root: str) -> str:
    return os.path.join(root, read_current(root))


def _flip(path: str, at: float = 0.6) -> None:
    """Flip one byte in place (same size): what bit rot or a bad copy does."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(int(size * at))
        b = f.read(1)
        f.seek(int(size * at))
        f.write(bytes([b[0] ^ 0xFF]))
    assert os.path.getsize(path) == size


def _republish(root: str) -> str:
    """Publish a copy of the CURRENT version as a new version (what a rebuild produces)."""
    staging = new_staging_dir(root)
    shutil.copytree(_vdir(root), staging, dirs_exist_ok=True)
    return publish(root, staging, load_manifest(staging))


@pytest.mark.parametrize("rel", ["lexical/shard-0000/tfs.npy", "lexical/shard-0000/doclen.npy",
                                 "lexical/shard-0000/docs.npy", "docs/shard-0000.parquet"])
def test_flipped_byte_is_refused_on_open_naming_the_file(root, rel):
    _flip(os.path.join(_vdir(root), rel))
    with pytest.raises(IndexFormatError) as e:
        IndexVersion(root)  # the default verification
    msg = str(e.value)
    assert rel in msg and "sha256" in msg and "funnel verify" in msg and "rebuild" in msg


def test_edited_manifest_is_refused_and_funnel_verify_fails(root):
    p = os.path.join(_vdir(root), "manifest.json")
    m = json.load(open(p))
    m["collection"]["avgdl"] *= 2
    with open(p, "w") as f:
        json.dump(m, f, indent=2)
    for mode in ("sizes", "full"):
        with pytest.raises(IndexFormatError, match="manifest.json does not match its sha256"):
            IndexVersion(root, verify=mode)
    r = subprocess.run([sys.executable, "-m", "funnel.serving.frontends.cli", "verify", root], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "manifest.json does not match its sha256" in r.stderr, r.stderr


def test_torn_manifest_is_an_index_format_error(root):
    p = os.path.join(_vdir(root), "manifest.json")
    data = open(p, "rb").read()
    with open(p, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        IndexVersion(root, verify="none")


def test_lost_manifest_checksum_is_refused(root):
    os.unlink(os.path.join(_vdir(root), MANIFEST_SUM))
    with pytest.raises(IndexFormatError, match=f"{MANIFEST_SUM} is missing"):
        IndexVersion(root)


def test_index_from_before_manifest_checksums_still_opens(root, caplog):
    v = _vdir(root)
    m = json.load(open(os.path.join(v, "manifest.json")))
    m.pop("manifest_checksum")
    with open(os.path.join(v, "manifest.json"), "w") as f:  # as an older funnel wrote it
        json.dump(m, f, indent=2)
    os.unlink(os.path.join(v, MANIFEST_SUM))
    with caplog.at_level(logging.WARNING, logger="funnel.pipelines.store.artifacts"):
        ix = IndexVersion(root)
    assert ix.n_docs == 400
    assert any("published before manifest checksums" in r.getMessage() for r in caplog.records)


def test_write_manifest_makes_an_edit_deliberate(root):
    """An edit through write_manifest (a tool, not bit rot) keeps the version openable."""
    v = _vdir(root)
    m = load_manifest(v)
    write_manifest(v, {**m, "note": "edited"})
    assert IndexVersion(root).manifest["note"] == "edited"


@pytest.mark.parametrize("rel", [os.path.join("docs", "shard-0000.store"), os.path.join("docs", "shard-0000.parquet")])
def test_corrupt_docs_at_read_time_names_the_file(root, rel):
    """With verification off, a damaged document file still fails clearly when it is read:
    the store documents are read from, or the parquet record of an index without stores
    (a build before them, here the stores removed)."""
    if rel.endswith(".parquet"):
        for p in glob.glob(os.path.join(_vdir(root), "docs", "*.store*")):
            os.remove(p)
    ix = IndexVersion(root, verify="none")
    doc = ix.docs.shard_size(0) // 2  # shard 0's middle document: in the bytes overwritten below
    path = os.path.join(_vdir(root), rel)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # overwrite the middle, where the text pages are
        f.seek(size // 4)
        f.write(b"\x00" * (size // 2))
    with pytest.raises(IndexFormatError) as e:
        ix.docs.get(doc)
    assert rel in str(e.value) and "funnel verify" in str(e.value)


@pytest.mark.parametrize("target", ["../elsewhere", "ABSOLUTE", "v000001/../../elsewhere", "v1"])
def test_current_outside_the_root_is_refused(root, tmp_path, target):
    elsewhere = str(tmp_path / "elsewhere")
    shutil.copytree(_vdir(root), elsewhere)  # a perfectly good version, outside the root
    target = elsewhere if target == "ABSOLUTE" else target
    with open(os.path.join(root, "CURRENT"), "w") as f:
        f.write(target + "\n")
    with pytest.raises(IndexFormatError, match="not a version name"):
        IndexVersion(root)
    with pytest.raises(IndexFormatError, match="not a version name"):
        IndexVersion(root, version=target)


def _refused(s: Searcher) -> str:
    """Searcher.refresh() on a version it must not serve: it keeps its version, and says why
    (by raising IndexFormatError, or in ``status()`` once it follows CURRENT through
    VersionFollower)."""
    try:
        assert s.refresh() is False
    except IndexFormatError as e:
        return str(e)
    st = s.status()
    assert st["state"] == "degraded"
    return st["reason"]


def test_searcher_refresh_keeps_serving_on_a_torn_manifest(root):
    s = Searcher(root)
    v1 = s.version
    v2 = _republish(root)
    p = os.path.join(root, v2, "manifest.json")
    data = open(p, "rb").read()
    with open(p, "wb") as f:
        f.write(data[:100])
    assert "not valid JSON" in _refused(s)
    assert s.version == v1 and s.search(QUERY, k=3).hits


def test_searcher_never_follows_current_outside_the_root(root, tmp_path):
    s = Searcher(root)
    v1 = s.version
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(_vdir(root), elsewhere / "v000009")
    with open(os.path.join(root, "CURRENT"), "w") as f:
        f.write("../elsewhere/v000009\n")
    assert "not a version name" in _refused(s)
    assert s.version == v1 and s.index.dir == os.path.join(root, v1)


def test_follower_degrades_keeps_serving_and_recovers(root):
    opened = []

    def open_version(name: str) -> IndexVersion:
        opened.append(name)
        return IndexVersion(root, name)

    f = VersionFollower(root, open_version)
    v1 = f.version
    assert f.status()["state"] == "ok" and f.status()["serving_version"] == v1

    # A new version with a flipped byte: refused, still serving v1, status says why.
    v2 = _republish(root)
    _flip(os.path.join(root, v2, "lexical", "shard-0000", "tfs.npy"))
    assert f.refresh() is False
    st = f.status()
    assert st["state"] == "degraded" and st["serving_version"] == v1 and st["current"] == v2
    assert "tfs.npy" in st["reason"] and st["since"]
    assert f.current.version == v1 and f.current.docs.get(0)["doc_id"]
    n = len(opened)
    assert f.refresh() is False and len(opened) == n  # not re-verified on every call

    # CURRENT outside the root: refused, still v1.
    with open(os.path.join(root, "CURRENT"), "w") as fh:
        fh.write("../../etc\n")
    assert f.refresh() is False
    assert f.status()["state"] == "degraded" and "not a version name" in f.status()["reason"]

    # CURRENT back on the served version: ok again.
    with open(os.path.join(root, "CURRENT"), "w") as fh:
        fh.write(v1 + "\n")
    assert f.refresh() is False and f.status()["state"] == "ok"

    # A good new version: switched, ok.
    shutil.rmtree(os.path.join(root, v2))
    v3 = _republish(root)
    assert f.refresh() is True
    assert f.version == v3 and f.current.version == v3 and f.status() == {
        "state": "ok", "serving_version": v3, "current": v3, "pinned": False, "reason": None, "since": None}


def test_pinned_follower_does_not_move(root):
    f = VersionFollower(root, lambda name: IndexVersion(root, name), version=read_current(root))
    _republish(root)
    assert f.refresh() is False and f.status()["pinned"] is True
