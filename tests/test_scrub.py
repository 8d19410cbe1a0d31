"""The background scrub (issue 37, item 3): damage that leaves a file's stat unchanged is
served silently under ``verify="cached"``; a scrub pass finds it, the server stops serving
that version, falls back to the last good one or answers 503, and ``/health`` says so.

Real index copies, real files, a real uvicorn server on 127.0.0.1. A failing disk is
played by changing bytes in place, putting the mtime back and bringing this host's
verification record to the file's new stat (ctime cannot be set back from user space;
decay below the file system would not have moved it).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time

import httpx
import pytest

from funnel.pipelines.store import artifacts
from funnel.pipelines.store.artifacts import (VERIFIED, IndexFormatError, load_manifest, new_staging_dir, publish,
                                        read_current, read_stamps)
from funnel.serving.frontends.http import create_app
from funnel.serving.index import IndexVersion
from funnel.serving.frontends.scrub import ScrubConfig, Scrubber, start_scrub
from funnel.serving.search import Searcher

QUERY = "parse command line arguments"
TOP_ID = "argparse"  # the demo corpus's best answer to QUERY


@pytest.fixture
def root(demo_index_1, tmp_path) -> str:
    r = str(tmp_path / "ix")
    shutil.copytree(demo_index_1, r, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    return r


def _vdir(root: str, version: str | None = None) -> str:
    return os.path.join(root, version or read_current(root))


def trust_as_hashed(vdir: str) -> None:
    """Record every file of ``vdir`` as hashed on this host and matching: what an earlier
    cached open leaves, so the next one hashes nothing."""
    stamps = {}
    for rel, meta in load_manifest(vdir)["files"].items():
        st = os.stat(os.path.join(vdir, rel))
        stamps[rel] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, meta["sha256"]]
    artifacts.write_stamps(vdir, stamps)


def rot(vdir: str, rel: str, old: bytes | None = None, new: bytes | None = None) -> None:
    """Damage ``rel`` in place keeping its size and mtime: replace the first ``old`` by
    ``new`` (same length), or flip one byte in the middle; then re-record its stat."""
    path = os.path.join(vdir, rel)
    st = os.stat(path)
    raw = bytearray(open(path, "rb").read())
    if old is None:
        raw[len(raw) // 2] ^= 0xFF
    else:
        at = raw.find(old)
        assert at >= 0 and len(old) == len(new)
        raw[at:at + len(old)] = new
    with open(path, "r+b") as f:
        f.write(raw)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size
    if rel != artifacts.MANIFEST:  # the manifest is checked against its own checksum file
        trust_as_hashed(vdir)


def republish(root: str) -> str:
    """Publish a copy of the CURRENT version as the next version (what a rebuild publishes)."""
    staging = new_staging_dir(root)
    shutil.copytree(_vdir(root), staging, dirs_exist_ok=True)
    return publish(root, staging, load_manifest(staging))


def fast(searcher: Searcher) -> Scrubber:
    return Scrubber(searcher.follower, rate_mb_s=10_000)


@pytest.mark.parametrize("rel", ["docs/ids.arrow", "lexical/shard-0000/docs.npy", "lexical/shard-0000/tfs.npy",
                                 "lexical/vocab.arrow", "docs/shard-0000.parquet", "manifest.json"])
def test_a_pass_finds_a_stat_preserving_flip_and_stops_serving(root, rel):
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        rot(_vdir(root), rel)
        res = fast(s).run_once()
        assert res.damaged == rel and not res.complete
        assert "sha256" in res.reason or rel == "manifest.json"  # a torn manifest may not parse
        st = s.status()
        assert st["state"] == "unavailable" and st["serving_version"] is None and rel in st["reason"]
        with pytest.raises(IndexFormatError, match=rel):  # one version, nothing to fall back to
            s.search(QUERY)
        assert [d["file"] for d in s.follower.damaged()] == [rel]
    # The record of the file is gone: a restart's cached open hashes it and refuses the version.
    assert rel not in read_stamps(_vdir(root))
    if rel != "manifest.json":
        with pytest.raises(IndexFormatError, match=rel):
            IndexVersion(root)


def test_a_sound_version_passes_every_file(root):
    with Searcher(root) as s:
        res = fast(s).run_once()
        files = load_manifest(_vdir(root))["files"]
        assert res.complete and res.damaged is None and res.version == s.version
        assert res.files == len(files) and res.bytes == sum(m["size"] for m in files.values())
        assert s.status()["state"] == "ok" and s.search(QUERY).hits[0].doc_id == TOP_ID


def test_reads_are_paced_to_the_rate(root):
    """With a clock that moves only when the pass sleeps (reading takes no time), the pass
    sleeps bytes / rate in all, each step as long as its own bytes take at the rate."""
    now, slept = [100.0], []

    def sleep(d: float) -> None:
        slept.append(d)
        now[0] += d
    with Searcher(root) as s:
        res = Scrubber(s.follower, rate_mb_s=2.0, clock=lambda: now[0], sleep=sleep).run_once()
    assert res.complete and sum(slept) == pytest.approx(res.bytes / (2.0 * 2 ** 20))
    assert max(slept) <= 0.5 + 1e-9  # no step longer than one 1 MiB chunk takes at 2 MiB/s


@pytest.mark.parametrize("kw, flag", [({"interval_s": -1}, "--scrub-interval"), ({"rate_mb_s": 0}, "--scrub-rate"),
                                      ({"rate_mb_s": float("nan")}, "--scrub-rate"),
                                      ({"interval_s": float("inf")}, "--scrub-interval")])
def test_bad_settings_are_refused_naming_the_flag(kw, flag):
    with pytest.raises(ValueError, match=flag):
        ScrubConfig(**kw)


def test_the_background_thread_finds_damage_on_its_own(root):
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        rot(_vdir(root), "docs/ids.arrow")
        thread = start_scrub(s.follower, ScrubConfig(interval_s=3600, rate_mb_s=10_000, first_delay_s=0))
        try:
            deadline = time.monotonic() + 60
            while s.status()["state"] == "ok" and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            thread.close()
        assert s.status()["state"] == "unavailable"
    assert start_scrub(s.follower, ScrubConfig(interval_s=0)) is None  # 0 turns it off


# -- a real HTTP server ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Live:
    """``create_app(searcher)`` served by uvicorn on 127.0.0.1 in a thread, until closed."""

    def __init__(self, searcher: Searcher):
        import uvicorn
        port = _free_port()
        # refresh_interval 0: every request first checks CURRENT (it must not lead back to a
        # quarantined version)
        self.server = uvicorn.Server(uvicorn.Config(create_app(searcher, refresh_interval=0.0), host="127.0.0.1",
                                                    port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def close(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live():
    opened: list[Live] = []

    def start(searcher: Searcher) -> Live:
        opened.append(Live(searcher))
        return opened[-1]
    yield start
    for x in opened:
        x.close()


def _top(live: Live) -> tuple[str, str]:
    r = live.http.post("/search", json={"query": QUERY, "k": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["hits"][0]["doc_id"], body["trace"]["version"]


def test_http_falls_back_to_the_last_good_version(root, live):
    v1 = read_current(root)
    v2 = republish(root)
    trust_as_hashed(_vdir(root, v1))
    trust_as_hashed(_vdir(root, v2))
    # v2's id list decays: the best hit's id there now reads "argpXrse". The cached open hashes nothing.
    rot(_vdir(root, v2), "docs/ids.arrow", TOP_ID.encode(), b"argpXrse")
    with Searcher(root) as s:
        srv = live(s)
        assert srv.http.get(f"/documents/{TOP_ID}").status_code == 404  # served silently: a wrong answer
        res = fast(s).run_once()
        assert res.damaged == "docs/ids.arrow"
        h = srv.http.get("/health")
        assert h.status_code == 200
        health = h.json()
        assert health["status"] == "degraded" and health["version"] == v1 and health["current"] == v2
        assert v2 in health["refresh_error"] and "docs/ids.arrow" in health["refresh_error"]
        [d] = health["damaged"]
        assert d["version"] == v2 and d["file"] == "docs/ids.arrow" and "sha256" in d["reason"]
        assert _top(srv) == (TOP_ID, v1)  # the right answer, from the last good version
        assert srv.http.get(f"/documents/{TOP_ID}").json()["doc_id"] == TOP_ID
        # CURRENT still names v2: following it must not lead back to the damaged version.
        assert _top(srv) == (TOP_ID, v1) and srv.http.get("/health").json()["version"] == v1
        # A good version published later is served, and the state is ok again.
        v3 = republish_from(root, v1)
        assert _top(srv) == (TOP_ID, v3) and srv.http.get("/health").json()["status"] == "ok"


def republish_from(root: str, version: str) -> str:
    staging = new_staging_dir(root)
    shutil.copytree(_vdir(root, version), staging, dirs_exist_ok=True)
    return publish(root, staging, load_manifest(staging))


def test_http_answers_503_when_no_good_version_is_left(root, live):
    v1 = read_current(root)
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        srv = live(s)
        assert _top(srv) == (TOP_ID, v1)
        rot(_vdir(root), "lexical/shard-0000/docs.npy")
        assert fast(s).run_once().damaged == "lexical/shard-0000/docs.npy"
        h = srv.http.get("/health")
        assert h.status_code == 503
        health = h.json()
        assert health["status"] == "unavailable" and health["version"] is None
        assert health["damaged"][0]["file"] == "lexical/shard-0000/docs.npy"
        for r in (srv.http.post("/search", json={"query": QUERY}), srv.http.get(f"/documents/{TOP_ID}"),
                  srv.http.post("/term_stats", json={"terms": ["parse"]})):
            assert r.status_code == 503, r.text
            msg = r.json()["error"]
            assert v1 in msg and "lexical/shard-0000/docs.npy" in msg and "sha256" in msg


@pytest.fixture(scope="module")
def dense_root(ray_session, demo_corpus, tmp_path_factory) -> str:
    """A small index with dense vectors (MiniLM into FAISS), built for this module."""
    from funnel.jobs.build_index import build
    small = tmp_path_factory.mktemp("scrub-dense") / "c.jsonl"
    with open(demo_corpus) as f, open(small, "w") as g:
        for _, line in zip(range(40), f):
            g.write(line)
    root = str(tmp_path_factory.mktemp("scrub-dix"))
    build(str(small), root, shards=1, dense=True)
    return root


def test_a_flip_in_the_faiss_file_is_found(dense_root, tmp_path):
    root = str(tmp_path / "dix")
    shutil.copytree(dense_root, root, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    rel = "dense/ivf-0000.faiss"
    assert rel in load_manifest(_vdir(root))["files"]
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        assert s.search(QUERY, mode="dense", k=5).hits
        rot(_vdir(root), rel)
        assert fast(s).run_once().damaged == rel
        assert s.status()["state"] == "unavailable"
        with pytest.raises(IndexFormatError, match=rel):
            s.search(QUERY, mode="dense", k=5)


def test_mcp_tools_answer_with_the_reason_when_no_good_version_is_left(root):
    import anyio
    from mcp import Client

    from funnel.serving.frontends.mcp import build_mcp_server
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        server = build_mcp_server(s)
        rot(_vdir(root), "docs/ids.arrow")
        assert fast(s).run_once().damaged == "docs/ids.arrow"

        async def calls():
            with anyio.fail_after(60):
                async with Client(server) as c:
                    return [await c.call_tool("search", {"query": QUERY}),
                            await c.call_tool("get_document", {"doc_id": TOP_ID}),
                            await c.call_tool("term_stats", {"terms": ["parse"]})]
        for res in anyio.run(calls):
            assert res.is_error
            assert "docs/ids.arrow" in res.content[0].text and "sha256" in res.content[0].text
