"""Indexes on object storage: build, publish, open, search, reindex and gc against a real S3 server.

moto's server runs on 127.0.0.1 (a thread of this process, real HTTP); funnel reaches it as it
would reach S3, through ``AWS_ENDPOINT_URL`` (pyarrow's S3FileSystem for the data, boto3 for the
lock's conditional writes). Each test gets its own bucket and its own ``$FUNNEL_CACHE``, and a
"fresh machine" is a new cache folder: opening then downloads and verifies the version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid

import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.store import remote
from funnel.pipelines.store.artifacts import MANIFEST, MANIFEST_SUM, IndexFormatError, load_manifest
from funnel.serving.frontends.cli import main
from funnel.serving.search import open_index

from conftest import write_jsonl

moto_server = pytest.importorskip("moto.server", reason="pip install 'moto[server]' boto3 (the dev extra)")
boto3 = pytest.importorskip("boto3")

TINY = os.path.join(os.path.dirname(__file__), "data", "tiny-beir")
QUERIES = os.path.join(TINY, "queries.jsonl")


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 on 127.0.0.1 and the AWS environment that points funnel at it."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    mp = pytest.MonkeyPatch()
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_ACCESS_KEY_ID", "testing")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield f"http://{host}:{port}"
    mp.undo()
    server.stop()


@pytest.fixture
def s3(s3_endpoint):
    return boto3.client("s3")


@pytest.fixture
def root(s3, tmp_path, monkeypatch) -> str:
    """A new bucket's ``s3://bucket/idx``, with this test's own local cache."""
    bucket = f"funnel-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))
    return f"s3://{bucket}/idx"


def fresh_cache(monkeypatch, tmp_path) -> str:
    """Another machine: an empty $FUNNEL_CACHE, so the next open downloads the version."""
    d = str(tmp_path / f"cache-{uuid.uuid4().hex[:6]}")
    monkeypatch.setenv("FUNNEL_CACHE", d)
    return d


def keys(s3, uri: str) -> list[str]:
    bucket, prefix = uri[len("s3://"):].split("/", 1)
    objs = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return sorted(o["Key"][len(prefix) + 1:] for o in objs if not o["Key"].endswith("/"))


def get(s3, uri: str, key: str) -> bytes:
    bucket, prefix = uri[len("s3://"):].split("/", 1)
    return s3.get_object(Bucket=bucket, Key=f"{prefix}/{key}")["Body"].read()


def put(s3, uri: str, key: str, body: bytes) -> None:
    bucket, prefix = uri[len("s3://"):].split("/", 1)
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)


def run_bytes(index: str, path) -> bytes:
    """The TREC run `funnel search INDEX --queries ... --run` writes, as bytes."""
    assert main(["search", index, "--queries", QUERIES, "--k", "20", "--run", str(path)]) == 0
    with open(path, "rb") as f:
        return f.read()


def tiny_docs() -> list[dict]:
    with open(os.path.join(TINY, "corpus.jsonl")) as f:
        return [json.loads(line) for line in f]


# -- build, search, reindex: the same bytes as on local disk ------------------------------------


def test_build_and_search_equal_a_local_build(root, s3, tmp_path, monkeypatch, capsys):
    local = str(tmp_path / "local")
    build(TINY, local)
    assert main(["build", "--corpus", TINY, "--out", root]) == 0
    assert f"published {root}/v000001" in capsys.readouterr().out
    names = keys(s3, root)
    assert "CURRENT" in names and ".lock" not in names
    assert get(s3, root, "CURRENT") == b"v000001\n"
    m = json.loads(get(s3, root, f"v000001/{MANIFEST}"))
    assert {f"v000001/{rel}" for rel in m["files"]} | {f"v000001/{MANIFEST}", f"v000001/{MANIFEST_SUM}"} \
        == set(names) - {"CURRENT"}
    assert m["parent"] is None and m["corpus"]["n_docs"] == 40

    fresh_cache(monkeypatch, tmp_path)  # another machine: the search downloads and verifies v000001
    assert run_bytes(root, tmp_path / "s3.trec") == run_bytes(local, tmp_path / "local.trec")
    ix = open_index(root)
    assert ix.index.dir.startswith(os.environ["FUNNEL_CACHE"]) and ix.index.version == "v000001"
    assert ix.search("vitamin D and fractures", k=3).hits[0].doc_id == \
        open_index(local).search("vitamin D and fractures", k=3).hits[0].doc_id
    capsys.readouterr()
    assert main(["verify", root]) == 0
    assert f"{root}/v000001: OK" in capsys.readouterr().out


def test_reindex_equals_a_full_build_and_serving_follows(root, tmp_path, monkeypatch, capsys):
    docs = tiny_docs()
    a_docs, extra = docs[:36], docs[36:]
    changed, deleted = {a_docs[2]["_id"], a_docs[20]["_id"]}, {a_docs[5]["_id"], a_docs[30]["_id"]}
    rows_b = [{**d, "text": d["text"] + " Revised in a later edition."} if d["_id"] in changed else d
              for d in a_docs if d["_id"] not in deleted] + extra[:2]
    a = write_jsonl(tmp_path / "a.jsonl", a_docs)
    b = write_jsonl(tmp_path / "b.jsonl", rows_b)
    build(a, root)
    serving = open_index(root)  # a long-lived server on v000001
    assert serving.status()["current"] == "v000001"

    fresh_cache(monkeypatch, tmp_path)  # the reindex runs on another machine: it downloads the live version
    assert main(["reindex", "--index", root, "--corpus", b, "--executor", "local"]) == 0
    out = capsys.readouterr().out
    assert f"published {root}/v000002 (parent v000001)" in out and "2 changed, 2 added, 2 deleted" in out
    full = str(tmp_path / "full")
    build(b, full)
    fresh_cache(monkeypatch, tmp_path)
    assert run_bytes(root, tmp_path / "re.trec") == run_bytes(full, tmp_path / "full.trec")
    live = open_index(root).index
    assert live.manifest["parent"] == "v000001" and live.manifest["reindex"]["base"] == "v000001"
    assert live.manifest["collection"] == load_manifest(os.path.join(full, "v000001"))["collection"]

    assert serving.refresh() and serving.index.version == "v000002"
    assert serving.status()["state"] == "ok" and serving.status()["current"] == "v000002"
    assert all(serving.index.docs.docno_of(d) is None for d in deleted)
    assert not serving.refresh()  # nothing new


# -- failures never leave a dangling CURRENT --------------------------------------------------------


def test_a_failed_publish_leaves_current_and_gc_removes_debris(root, s3, tmp_path, monkeypatch, capsys):
    build(TINY, root)
    n_files = len(json.loads(get(s3, root, f"v000001/{MANIFEST}"))["files"])

    def incomplete(*args, **kwargs):
        raise OSError("injected: an object is missing")

    # Fails after every object is uploaded, before CURRENT: the new prefix is deleted again.
    with monkeypatch.context() as m:
        m.setattr(remote, "_check_uploaded", incomplete)
        with pytest.raises(OSError, match="injected"):
            build(TINY, root)
    fresh_cache(monkeypatch, tmp_path)
    assert get(s3, root, "CURRENT") == b"v000001\n"
    assert not any(k.startswith("v000002/") for k in keys(s3, root)) and ".lock" not in keys(s3, root)
    assert open_index(root).index.version == "v000001"  # still opens and verifies

    # Killed mid-upload (no clean-up ran): a prefix without its manifest checksum is debris.
    real_put, count, mutex = remote._put_file, [0], threading.Lock()

    def dies_after_three(*args, **kwargs):
        with mutex:
            count[0] += 1
            if count[0] > 3:
                raise KeyboardInterrupt("killed")
        return real_put(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(remote, "_put_file", dies_after_three)
        m.setattr(remote, "_remove_version", lambda *a, **k: 0)
        with pytest.raises(KeyboardInterrupt):
            build(TINY, root)
    fresh_cache(monkeypatch, tmp_path)
    debris = [k for k in keys(s3, root) if k.startswith("v000002/")]
    assert len(debris) == 3 < n_files and f"v000002/{MANIFEST_SUM}" not in debris
    assert get(s3, root, "CURRENT") == b"v000001\n" and open_index(root).index.version == "v000001"
    with pytest.raises(IndexFormatError, match=f"v000002 has no {MANIFEST_SUM}: its upload never finished"):
        open_index(root, version="v000002")

    assert build(TINY, root).version == "v000003"  # never reuses the debris's number
    build(TINY, root)                                # v000004
    rep = remote.gc(root)                            # the debris is young: left for now
    assert not rep.removed and any("without its" in why for _, why in rep.kept)
    debris_bytes = sum(len(get(s3, root, k)) for k in debris)
    assert remote.gc(root, grace_s=0).removed == [(f"{root}/v000002", debris_bytes)]
    capsys.readouterr()
    import gc as pygc
    pygc.collect()  # the searchers opened above are gone: their reader leases with them
    assert main(["gc", root, "--keep", "1"]) == 0
    assert f"removed {root}/v000001" in capsys.readouterr().out
    assert {k.split("/")[0] for k in keys(s3, root)} == {"CURRENT", "v000004"}
    cache = remote.local_root(root)
    assert sorted(n for n in os.listdir(cache) if n.startswith("v")) == ["v000004"]  # the cache follows
    assert run_bytes(root, tmp_path / "after-gc.trec")


def test_concurrent_publishes_end_on_the_newest(root, s3, tmp_path):
    build(TINY, root)
    vdir, m = remote.fetch_version(root)
    manifest = {k: v for k, v in m.items() if k not in ("files", "created_at", "parent", "format_version",
                                                         "manifest_checksum")}
    stagings = []
    for i in range(2):
        d = str(tmp_path / f"staging-{i}")
        shutil.copytree(vdir, d, ignore=shutil.ignore_patterns(MANIFEST, MANIFEST_SUM))
        stagings.append(d)
    start, results, errors = threading.Barrier(2), [], []

    def publish(d):
        start.wait()
        try:
            results.append(remote.publish(root, d, manifest))
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=publish, args=(d,)) for d in stagings]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(results) == ["v000002", "v000003"]
    assert get(s3, root, "CURRENT") == b"v000003\n" and ".lock" not in keys(s3, root)
    parents = {v: json.loads(get(s3, root, f"{v}/{MANIFEST}"))["parent"] for v in results}
    assert parents == {"v000002": "v000001", "v000003": "v000002"}
    assert open_index(root).index.version == "v000003"


def test_the_lock_blocks_and_a_dead_holders_lease_expires(root, s3, capsys):
    build(TINY, root)
    other = json.dumps({"owner": "someone-else", "purpose": "publish", "lease_s": 60}).encode()
    put(s3, root, ".lock", other)
    assert main(["gc", root, "--keep", "1"]) == 1
    assert "holds the lock" in capsys.readouterr().err
    lease = remote.S3Lease(remote.resolve(root), "test")
    assert not lease.acquire(blocking=False) and lease.holder["owner"] == "someone-else"
    # A killed publisher's lock: not renewed for longer than its lease, by the server's clock.
    put(s3, root, ".lock", json.dumps({"owner": "killed", "purpose": "publish", "lease_s": 1}).encode())
    time.sleep(2.2)
    assert build(TINY, root).version == "v000002"
    assert ".lock" not in keys(s3, root) and get(s3, root, "CURRENT") == b"v000002\n"


# -- damage and bad roots are clear errors -----------------------------------------------------------


def test_a_corrupted_object_is_refused_at_open_and_by_a_server(root, s3, tmp_path, monkeypatch, capsys):
    build(TINY, root)
    serving = open_index(root)  # a long-lived server on v000001
    build(TINY, root)
    key = "v000002/lexical/shard-0000/tfs.npy"
    data = bytearray(get(s3, root, key))
    data[-1] ^= 1
    put(s3, root, key, bytes(data))  # same size: only the sha256 can tell
    cache = fresh_cache(monkeypatch, tmp_path)  # machines that have no copy of v000002 yet
    with pytest.raises(IndexFormatError, match=rf"{root}/v000002 is damaged.*tfs.npy does not match its sha256"):
        open_index(root)
    assert remote.local_root(root).startswith(cache)
    assert os.listdir(remote.local_root(root)) == ["ROOT"]  # nothing was cached
    capsys.readouterr()
    assert main(["verify", root]) == 2
    assert "tfs.npy does not match its sha256" in capsys.readouterr().err
    assert main(["search", root, "vitamin"]) == 2
    assert not serving.refresh() and serving.index.version == "v000001"  # keeps answering from v000001
    st = serving.status()
    assert st["state"] == "degraded" and st["current"] == "v000002" and "does not match its sha256" in st["reason"]
    assert serving.search("vitamin D", k=1).hits


def test_clear_errors(root, s3, tmp_path, monkeypatch, capsys):
    missing_bucket = f"s3://funnel-nope-{uuid.uuid4().hex[:8]}/idx"
    with pytest.raises(remote.RemoteRootError, match="bucket .* does not exist"):
        build(TINY, missing_bucket)
    assert main(["search", missing_bucket, "vitamin"]) == 2
    assert "does not exist" in capsys.readouterr().err

    with pytest.raises(IndexFormatError, match="not a funnel index: no CURRENT object.*funnel build"):
        open_index(root)
    assert main(["reindex", "--index", root, "--corpus", TINY]) == 2
    assert "no CURRENT object" in capsys.readouterr().err

    build(TINY, root)
    bucket, prefix = root[len("s3://"):].split("/", 1)
    s3.delete_object(Bucket=bucket, Key=f"{prefix}/v000001/{MANIFEST_SUM}")
    fresh_cache(monkeypatch, tmp_path)
    with pytest.raises(IndexFormatError, match=f"v000001 has no {MANIFEST_SUM}"):
        open_index(root)

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(remote.RemoteRootError, match="no AWS credentials .* AWS_ACCESS_KEY_ID"):
        open_index(root)
    assert main(["gc", root]) == 2
    assert "no AWS credentials" in capsys.readouterr().err
