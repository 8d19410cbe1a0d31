"""Readers' leases (issue 16): retention and gc never delete a version a searcher has open,
also when the searcher runs on another machine (a shared INDEX_ROOT), and stop protecting it
once the reader is gone (released, dead on this host, or expired elsewhere).

Real processes and files: the "reader" is a separate Python process holding a lease, killed
with SIGKILL; a reader on another machine is a lease file naming another host (no second
machine here, so that one is written by hand in the format the code writes).
"""

from __future__ import annotations

import gc as pygc
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

from funnel.pipelines.store.artifacts import (READERS, ReaderLease, gc, leased_versions, list_versions, new_staging_dir,
                                        publish)

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")
HOLD = textwrap.dedent("""
    import sys
    from funnel.pipelines.store.artifacts import ReaderLease
    lease = ReaderLease(sys.argv[1], sys.argv[2])
    print("held", flush=True)
    sys.stdin.readline()
""")


def _publish_one(root: str, keep: int | None = None) -> str:
    staging = new_staging_dir(root)
    with open(os.path.join(staging, "data.bin"), "wb") as f:
        f.write(os.urandom(1000))
    return publish(root, staging, {"kind": "test"}, keep=keep)


def _reader(root: str, version: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, root, version], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_retention_and_gc_keep_a_version_a_reader_holds_until_the_reader_dies(tmp_path):
    root = str(tmp_path / "ix")
    os.makedirs(root)
    _publish_one(root)
    _publish_one(root)
    p = _reader(root, "v000001")
    try:
        assert _publish_one(root, keep=1) == "v000003"
        assert list_versions(root) == ["v000001", "v000003"]  # v000002 retired, v000001 held
        rep = gc(root, keep=1)
        assert os.path.isdir(os.path.join(root, "v000001"))
        assert any("reader holds a lease" in why for path, why in rep.kept if path.endswith("v000001"))
    finally:
        p.kill()
        p.wait(30)
    # dead on this host: its lease protects nothing, and gc removes the lease with the version
    rep = gc(root, keep=1)
    assert list_versions(root) == ["v000003"]
    assert os.listdir(os.path.join(root, READERS)) == []


def test_a_lease_from_another_machine_protects_until_it_expires(tmp_path):
    root = str(tmp_path / "ix")
    os.makedirs(root)
    for _ in range(3):
        _publish_one(root)
    d = os.path.join(root, READERS)
    os.makedirs(d)
    other = "not-" + socket.gethostname()
    with open(os.path.join(d, f"{other}-1-aaaa.json"), "w") as f:  # pid 1 there means nothing here
        json.dump({"version": "v000001", "host": other, "pid": 1, "expires_at": time.time() + 600}, f)
    with open(os.path.join(d, f"{other}-2-bbbb.json"), "w") as f:
        json.dump({"version": "v000002", "host": other, "pid": 2, "expires_at": time.time() - 1}, f)
    assert leased_versions(root) == {"v000001"}
    gc(root, keep=1)
    assert list_versions(root) == ["v000001", "v000003"]
    assert sorted(os.listdir(d)) == [f"{other}-1-aaaa.json"]  # the expired lease is gone


def test_a_lease_is_renewed_while_held_and_gone_when_released(tmp_path):
    root = str(tmp_path / "ix")
    os.makedirs(root)
    _publish_one(root)
    lease = ReaderLease(root, "v000001", lease_s=0.3)
    time.sleep(1.0)  # three lease lengths: alive only because the background thread renews it
    assert leased_versions(root) == {"v000001"}
    lease.release()
    assert leased_versions(root) == set() and not os.path.exists(lease.path)


def test_an_open_index_holds_a_lease_on_its_version_and_drops_it_when_closed(tmp_path):
    from funnel.jobs.build_index import build
    from funnel.serving.search import open_index
    root = str(tmp_path / "ix")
    build(FIXTURE, root, engine="local")
    ix = open_index(root)
    assert ix.search("vitamin D", k=3).hits
    assert leased_versions(root) == {"v000001"}
    build(FIXTURE, root, engine="local", keep_versions=1)  # a new version; v000001 stays: it is open
    assert list_versions(root) == ["v000001", "v000002"]
    assert ix.search("vitamin D", k=3).hits
    del ix
    pygc.collect()
    assert leased_versions(root) == set()
    gc(root, keep=1)
    assert list_versions(root) == ["v000002"]


def test_closing_a_searcher_releases_its_version_at_once(tmp_path):
    """``Searcher.close()`` (and ``with``) drops the lease without waiting for garbage
    collection, so gc can delete the old version while the object still exists; searching a
    closed searcher is a clear error, and closing twice is harmless."""
    import pytest

    from funnel.jobs.build_index import build
    from funnel.serving.search import open_index
    root = str(tmp_path / "ix")
    build(FIXTURE, root, engine="local")
    ix = open_index(root)
    assert ix.search("vitamin D", k=3).hits
    build(FIXTURE, root, engine="local", keep_versions=1)
    assert leased_versions(root) == {"v000001"}
    ix.close()
    assert leased_versions(root) == set()
    gc(root, keep=1)
    assert list_versions(root) == ["v000002"]
    with pytest.raises(RuntimeError, match="closed; open the index again"):
        ix.search("vitamin D", k=3)
    assert ix.refresh() is False
    ix.close()
    with open_index(root) as ix2:
        assert ix2.search("vitamin D", k=3).hits
        assert leased_versions(root) == {"v000002"}
    assert leased_versions(root) == set()
