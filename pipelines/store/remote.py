"""Index roots on object storage (``s3://`` first): publish by upload with CURRENT last; serve a local copy.

    s3://bucket/idx/CURRENT              one small object naming the live version; written last
    s3://bucket/idx/.lock                the root's lock: created with ``If-None-Match: *``, a lease
    s3://bucket/idx/v000001/...          write-once; manifest.json, then manifest.json.sha256, come last

Object stores have no rename, so a version is a write-once prefix. ``publish`` uploads a
version staged on local disk under the root's lock: every file (in parallel), then the
manifest and its checksum, checks every object's size in a listing, and only then writes
CURRENT; a failure before that leaves CURRENT where it was (and the partial prefix is
deleted, or, after a kill, left as debris that ``gc`` removes: a prefix without its
manifest checksum is never a version). A reader copies the version CURRENT names into
``$FUNNEL_CACHE/remote/<key>/vNNNNNN`` (a temporary folder, verified by sha256, then
renamed) and memory-maps it like any local version; a cached copy is reused while its
manifest checksum equals the remote one.

The lock is an S3 object created with a conditional write (boto3; pyarrow has none). It
holds a lease: the publisher renews it (``If-Match`` its own ETag) every third of the lease,
a lock older than its lease by the server's clock is taken over, and a publisher that lost
its lease stops before writing CURRENT. Reading works on any pyarrow filesystem
(``FileSystem.from_uri``); publishing and gc need the lock, so S3 (or an S3-compatible
store with conditional writes) only. Endpoint and credentials come from the standard
environment (``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_ACCESS_KEY_ID``,
``AWS_PROFILE``, ...), which pyarrow and boto3 both read, or from the URI's query
(``?endpoint_override=...&scheme=http``).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import parse_qs, urlsplit

import pyarrow.fs as pafs

from .artifacts import (BUILD_LOCK, CURRENT, LOCK, MANIFEST, MANIFEST_SUM, UNLOCKED_GRACE_S, GcReport,
                        IndexFormatError, _fsync_tree, file_table, format_version_of, is_version_name, load_manifest,
                        parse_current, release_staging, verify_files, verify_version, write_manifest)

log = logging.getLogger(__name__)

LEASE_S = 60.0              # a lock not renewed for this long (server clock) is taken over
LOCK_WAIT_S = 900.0         # a blocking publish waits this long for a live lock, then gives up
DEBRIS_GRACE_S = UNLOCKED_GRACE_S  # gc leaves a version prefix without its checksum this young
TRANSFER_THREADS = 8
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_AWS_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_REGION",
            "AWS_DEFAULT_REGION")


class RemoteRootError(ValueError):
    """An object-store index root that cannot be used as given (bucket, credentials, scheme, lock)."""


def is_remote(root: str) -> bool:
    """True for a filesystem URI other than ``file://`` (``s3://``, ``gs://``, ...)."""
    m = _SCHEME_RE.match(root)
    return bool(m) and m.group(1).lower() != "file"


@dataclass(frozen=True)
class RemoteRoot:
    """A resolved remote root: ``uri`` without query or trailing slash, its filesystem and base path."""

    uri: str
    fs: pafs.FileSystem
    base: str           # bucket/prefix, as the filesystem names it
    scheme: str
    query: dict

    def path(self, *parts: str) -> str:
        return "/".join([self.base, *parts])

    def name(self, *parts: str) -> str:
        """The URI of ``parts`` under the root, for messages."""
        return "/".join([self.uri, *parts])


_roots: dict[tuple, RemoteRoot] = {}
_roots_mutex = threading.Lock()


def resolve(uri: str) -> RemoteRoot:
    """The root at ``uri``, checked once per process (and per AWS environment): scheme, credentials, bucket."""
    key = (uri, tuple(os.environ.get(k) for k in _AWS_ENV))
    with _roots_mutex:
        if key in _roots:
            return _roots[key]
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    clean = f"{scheme}://{parts.netloc}{parts.path}".rstrip("/")
    if scheme == "s3":
        _check_credentials(clean, query)
    try:
        fs, base = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise RemoteRootError(f"cannot open index root {uri!r}: {e}") from None
    base = base.rstrip("/")
    bucket = base.split("/", 1)[0]
    if scheme in ("s3", "gs", "gcs") and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        where = _endpoint(query) or "the default endpoint"
        raise RemoteRootError(f"bucket {bucket!r} of index root {clean} does not exist at {where}; create it "
                              f"(aws s3 mb {scheme}://{bucket}) or check AWS_ENDPOINT_URL / the URI")
    rr = RemoteRoot(clean, fs, base, scheme, query)
    with _roots_mutex:
        _roots[key] = rr
    return rr


def _endpoint(query: dict) -> str | None:
    return query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _check_credentials(uri: str, query: dict) -> None:
    """A clear error when no AWS credentials are found (pyarrow would go on unsigned and fail later)."""
    if query.get("anonymous", "").lower() in ("1", "true", "yes") or query.get("access_key"):
        return
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return  # the common case, without botocore's 0.1 s import and credential chain
    try:
        import botocore.session
    except ImportError:
        return  # pyarrow's own error names the problem
    if botocore.session.get_session().get_credentials() is None:
        raise RemoteRootError(
            f"no AWS credentials for index root {uri}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE, or run where an instance role applies); for a public bucket add ?anonymous=true")


# -- reading the root -------------------------------------------------------------------------


def read_current(rr: RemoteRoot) -> str | None:
    """The version CURRENT names, None without one; IndexFormatError for anything but ``vNNNNNN``."""
    try:
        with rr.fs.open_input_stream(rr.path(CURRENT)) as f:
            raw = f.read(256)
    except FileNotFoundError:
        return None
    return parse_current(raw, rr.name(CURRENT))


def _listing(rr: RemoteRoot, only: str | None = None) -> dict[str, dict[str, pafs.FileInfo]]:
    """{version prefix: {relative path: FileInfo}} of every object under the root's ``vNNNNNN/``
    (``only``: under that one version)."""
    out: dict[str, dict[str, pafs.FileInfo]] = {}
    sel = pafs.FileSelector(rr.path(only) if only else rr.base, recursive=True, allow_not_found=True)
    if only:
        out[only] = {}
    for info in rr.fs.get_file_info(sel):
        rel = info.path[len(rr.base) + 1:]
        top, _, rest = rel.partition("/")
        if is_version_name(top):
            files = out.setdefault(top, {})
            if rest and info.type == pafs.FileType.File:
                files[rest] = info
    return out


def list_versions(rr: RemoteRoot, complete: bool = True) -> list[str]:
    """Version prefixes, oldest first; ``complete``: only those with their manifest checksum."""
    sel = pafs.FileSelector(rr.base, recursive=False, allow_not_found=True)
    names = sorted(i.base_name for i in rr.fs.get_file_info(sel)
                   if i.type == pafs.FileType.Directory and is_version_name(i.base_name))
    if not complete:
        return names
    return [n for n in names if rr.fs.get_file_info(rr.path(n, MANIFEST_SUM)).type == pafs.FileType.File]


def current_version(uri: str) -> str:
    """The version CURRENT names, with the errors a reader needs (no CURRENT, nothing built)."""
    rr = resolve(uri)
    cur = read_current(rr)
    if cur is None:
        found = list_versions(rr, complete=False)
        hint = f" (version prefixes present: {', '.join(found)}; is a build still publishing?)" if found else ""
        raise IndexFormatError(f"{rr.uri!r} is not a funnel index: no CURRENT object{hint}. Build one with "
                               f"`funnel build --corpus ... --out {rr.uri}`")
    return cur


def peek_current(uri: str) -> str | None:
    """What CURRENT holds (for status lines); None when it cannot be read."""
    try:
        rr = resolve(uri)
        with rr.fs.open_input_stream(rr.path(CURRENT)) as f:
            return f.read(200).decode("utf-8", "replace").strip() or None
    except (ValueError, OSError):
        return None


# -- the local cache --------------------------------------------------------------------------


def local_root(uri: str) -> str:
    """``$FUNNEL_CACHE/remote/<key>``: the cached versions of ``uri`` and the staging of builds to it.

    The key hashes the URI and the S3 endpoint, so two stores never share a folder.
    """
    base = os.environ.get("FUNNEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "funnel")
    parts = urlsplit(uri)
    clean = f"{parts.scheme.lower()}://{parts.netloc}{parts.path}".rstrip("/")
    endpoint = _endpoint({k: v[-1] for k, v in parse_qs(parts.query).items()}) or ""
    key = hashlib.sha256(f"{clean}|{endpoint}".encode()).hexdigest()[:16]
    d = os.path.join(base, "remote", key)
    os.makedirs(d, exist_ok=True)
    marker = os.path.join(d, "ROOT")
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(clean + "\n")
    return d


def _get_file(rr: RemoteRoot, src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with rr.fs.open_input_stream(src) as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)


def _read_sum(rr: RemoteRoot, version: str) -> bytes:
    try:
        with rr.fs.open_input_stream(rr.path(version, MANIFEST_SUM)) as f:
            return f.read(4096)
    except FileNotFoundError:
        if rr.fs.get_file_info(rr.path(version)).type == pafs.FileType.NotFound:
            raise IndexFormatError(f"{rr.name(version)} does not exist (versions: "
                                   f"{', '.join(list_versions(rr)) or 'none'})") from None
        raise IndexFormatError(
            f"index version {rr.name(version)} has no {MANIFEST_SUM}: its upload never finished (a publish was "
            f"killed) or it was damaged, so it is not a published version. Point CURRENT at a complete version "
            f"or rebuild (funnel build ... --out {rr.uri}); `funnel gc {rr.uri}` removes such debris") from None


def _download(rr: RemoteRoot, version: str, dest: str, remote_sum: bytes) -> dict:
    """Copy ``version`` into ``dest`` (a new folder) and verify every file's sha256; returns the manifest."""
    os.makedirs(dest)
    with open(os.path.join(dest, MANIFEST_SUM), "wb") as f:
        f.write(remote_sum)
    _get_file(rr, rr.path(version, MANIFEST), os.path.join(dest, MANIFEST))
    m = load_manifest(dest, check=True)
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    for rel in files:
        if os.path.isabs(rel) or ".." in rel.split("/") or rel in (MANIFEST, MANIFEST_SUM):
            raise IndexFormatError(f"{rr.name(version, MANIFEST)} lists {rel!r}, not a path inside the version")
    order = sorted(files, key=lambda r: -int(files[r].get("size", 0)))

    def get(rel: str) -> None:
        try:
            _get_file(rr, rr.path(version, rel), os.path.join(dest, rel))
        except FileNotFoundError:
            raise IndexFormatError(f"index version {rr.name(version)} is damaged or partial (missing {rel}); "
                                   "rebuild the index (funnel build ...) or point CURRENT at an intact version") from None

    with ThreadPoolExecutor(min(TRANSFER_THREADS, max(1, len(order))), thread_name_prefix="funnel-get") as ex:
        list(ex.map(get, order))
    verify_files(dest, m, full=True)
    return m


def _renamed_errors(e: IndexFormatError, tmp: str, rr: RemoteRoot, version: str) -> IndexFormatError:
    return IndexFormatError(str(e).replace(tmp, rr.name(version)))


def fetch_version(uri: str, version: str | None = None, verify: str = "cached") -> tuple[str, dict]:
    """(local folder, manifest) of ``version`` (default: CURRENT's) of the remote root ``uri``.

    A cached copy whose manifest checksum equals the remote one is reused after checking it
    by ``verify``; otherwise the version is downloaded into a temporary folder, verified in
    full (manifest checksum and every file's sha256) and renamed into the cache. Anything
    that fails verification is an IndexFormatError naming the remote version.
    """
    rr = resolve(uri)
    if version is None:
        version = current_version(uri)
    elif not is_version_name(version):
        raise IndexFormatError(f"{version!r} is not a version name (v and six digits, e.g. v000001); "
                               f"versions of {rr.uri}: {', '.join(list_versions(rr)) or 'none'}")
    remote_sum = _read_sum(rr, version)
    cache = local_root(uri)
    vdir = os.path.join(cache, version)
    if os.path.isdir(vdir):
        try:
            with open(os.path.join(vdir, MANIFEST_SUM), "rb") as f:
                same = f.read(4096) == remote_sum
            if same:
                return vdir, verify_version(vdir, verify)
            log.warning("%s: the cached copy is of another publication; downloading it again", rr.name(version))
        except (OSError, IndexFormatError) as e:
            log.warning("%s: the cached copy fails verification (%s); downloading it again", rr.name(version), e)
        _discard(vdir)
    tmp = os.path.join(cache, f".download-{version}-{uuid.uuid4().hex[:8]}")
    t = time.time()
    try:
        m = _download(rr, version, tmp, remote_sum)
        _fsync_tree(tmp)
        try:
            os.rename(tmp, vdir)
        except OSError:  # another process installed it first: use theirs, if it is the same publication
            shutil.rmtree(tmp, ignore_errors=True)
            return fetch_version(uri, version, verify)
    except IndexFormatError as e:
        raise _renamed_errors(e, tmp, rr, version) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("copied %s to %s (%d files, verified) in %.2fs", rr.name(version), vdir, len(m["files"]),
             time.time() - t)
    _prune_cache(rr, cache, keep={version})
    return vdir, m


def _prune_cache(rr: RemoteRoot, cache: str, keep: set[str], report: GcReport | None = None) -> None:
    """Remove cached copies of versions the store no longer has (retention or gc removed them)."""
    from .artifacts import _remove, leased_versions
    remaining = set(list_versions(rr, complete=False)) | keep | leased_versions(cache)
    report = report if report is not None else GcReport()
    for name in sorted(os.listdir(cache)):
        if is_version_name(name) and name not in remaining:
            _remove(os.path.join(cache, name), report)


def verify_remote(uri: str, version: str | None = None) -> tuple[str, dict]:
    """Download ``version`` afresh (never the cache) and verify every file; (version, manifest)."""
    rr = resolve(uri)
    version = version or current_version(uri)
    tmp = os.path.join(local_root(uri), f".download-{version}-{uuid.uuid4().hex[:8]}")
    try:
        return version, _download(rr, version, tmp, _read_sum(rr, version))
    except IndexFormatError as e:
        raise _renamed_errors(e, tmp, rr, version) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _discard(path: str) -> None:
    dst = os.path.join(os.path.dirname(path), f".trash-{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, dst)
    except FileNotFoundError:
        return
    shutil.rmtree(dst, ignore_errors=True)


# -- the lock ---------------------------------------------------------------------------------


class S3Lease:
    """``ROOT/.lock`` on S3: created only if absent (``If-None-Match: *``), renewed and deleted ``If-Match``.

    The lease is judged by the server's clock (``Date`` of the read minus the lock's
    ``Last-Modified``), so hosts need not agree on the time. Its weakness is a publisher
    that stalls for longer than the lease between its last renewal and its CURRENT write:
    another may then take the lock; ``confirm()`` just before CURRENT keeps that window to
    one request.
    """

    def __init__(self, rr: RemoteRoot, purpose: str, lease_s: float = LEASE_S):
        if rr.scheme != "s3":
            raise RemoteRootError(f"publishing to {rr.scheme}:// needs a lock by conditional write, which funnel "
                                  "implements for s3:// only; reading (search, serve) works on any pyarrow filesystem")
        self.rr, self.lease_s = rr, float(lease_s)
        self.bucket, _, self.key = rr.path(LOCK).partition("/")
        self.body = json.dumps({"owner": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                                "purpose": purpose, "lease_s": self.lease_s,
                                "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}).encode()
        self.client = _s3_client(rr)
        self.etag: str | None = None
        self.holder: dict | None = None      # who holds it, after a failed try
        self.lost: str | None = None         # why our lease was lost, if it was
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _code(self, e) -> tuple[str, int]:
        return e.response.get("Error", {}).get("Code", ""), e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)

    def try_acquire(self) -> bool:
        from botocore.exceptions import ClientError
        try:
            r = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self.body, IfNoneMatch="*")
        except ClientError as e:
            code, status = self._code(e)
            if code == "NoSuchBucket":
                raise RemoteRootError(f"bucket {self.bucket!r} of {self.rr.uri} does not exist") from None
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                self._take_over_if_expired()
                return False
            raise
        self.etag, self.holder = r["ETag"], None
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="funnel-lease", daemon=True)
        self._thread.start()
        return True

    def _take_over_if_expired(self) -> None:
        from botocore.exceptions import ClientError
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
            raw = r["Body"].read(4096)
        except ClientError as e:
            if self._code(e)[1] == 404:
                return  # released meanwhile
            raise
        try:
            self.holder = json.loads(raw)
        except ValueError:
            self.holder = {"raw": raw[:200].decode("utf-8", "replace")}
        date = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = email.utils.parsedate_to_datetime(date) if date else datetime.now(timezone.utc)
        age = (now - r["LastModified"]).total_seconds()
        lease = float(self.holder.get("lease_s", LEASE_S)) if isinstance(self.holder, dict) else LEASE_S
        if age > lease:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=r["ETag"])
                log.warning("%s: took over a lock not renewed for %.0fs (lease %.0fs): %s", self.rr.name(LOCK), age,
                            lease, self.holder)
            except ClientError as e:
                if self._code(e)[1] not in (404, 412):
                    raise

    def acquire(self, blocking: bool = True, timeout_s: float = LOCK_WAIT_S) -> bool:
        deadline, pause = time.monotonic() + timeout_s, 0.05
        while not self.try_acquire():
            if not blocking:
                return False
            if time.monotonic() > deadline:
                raise RemoteRootError(f"{self.rr.name(LOCK)} has been held for over {timeout_s:.0f}s by "
                                      f"{self.holder}; a publish or gc is running (a killed one's lease expires "
                                      f"after {LEASE_S:.0f}s)")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        return True

    def _renew(self) -> None:
        from botocore.exceptions import ClientError
        with self._mutex:
            if self.lost or self.etag is None:
                return
            try:
                r = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self.body, IfMatch=self.etag)
                self.etag = r["ETag"]
            except ClientError as e:
                if self._code(e)[1] in (404, 412):
                    self.lost = f"{self.rr.name(LOCK)} was taken over (our lease expired)"
                    return
                raise

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self._renew()
            except Exception as e:  # a network blip: the next renewal may still come in time
                log.warning("could not renew %s: %s", self.rr.name(LOCK), e)

    def confirm(self) -> None:
        """Renew now and raise if the lock is no longer ours (call just before writing CURRENT)."""
        self._renew()
        if self.lost:
            raise RemoteRootError(f"{self.lost}; nothing published")

    def release(self) -> None:
        from botocore.exceptions import ClientError
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._mutex:
            if self.etag is None or self.lost:
                return
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
            except ClientError as e:
                if self._code(e)[1] not in (404, 412):
                    raise
            self.etag = None

    def __enter__(self) -> "S3Lease":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_clients: dict[tuple, object] = {}


def _s3_client(rr: RemoteRoot):
    """One boto3 client per root (clients are thread-safe; creating them from one session is not)."""
    try:
        import boto3
    except ImportError:
        raise ImportError("publishing to s3:// takes its lock with boto3: pip install 'funnel[s3]'") from None
    key = (rr.uri, tuple(sorted(rr.query.items())), tuple(os.environ.get(k) for k in _AWS_ENV))
    with _roots_mutex:
        if key not in _clients:
            _clients[key] = boto3.session.Session().client("s3", **_client_args(rr))
        return _clients[key]


def _client_args(rr: RemoteRoot) -> dict:
    kw = {}
    if rr.query.get("endpoint_override"):
        ep = rr.query["endpoint_override"]
        kw["endpoint_url"] = ep if "://" in ep else f"{rr.query.get('scheme', 'https')}://{ep}"
    if rr.query.get("region"):
        kw["region_name"] = rr.query["region"]
    return kw


# -- publishing -------------------------------------------------------------------------------


def _put_file(rr: RemoteRoot, src: str, dst: str, lease: S3Lease | None) -> None:
    if lease is not None and lease.lost:
        raise RemoteRootError(f"{lease.lost}; nothing published")
    with open(src, "rb") as fin, rr.fs.open_output_stream(dst) as fout:
        shutil.copyfileobj(fin, fout, 8 << 20)


def _upload(rr: RemoteRoot, staging: str, name: str, files: dict, lease: S3Lease) -> None:
    """Every file of the version, big ones first and in parallel; then the manifest, then its checksum."""
    order = sorted(files, key=lambda r: -int(files[r]["size"]))
    with ThreadPoolExecutor(min(TRANSFER_THREADS, max(1, len(order))), thread_name_prefix="funnel-put") as ex:
        list(ex.map(lambda rel: _put_file(rr, os.path.join(staging, rel), rr.path(name, rel), lease), order))
    for rel in (MANIFEST, MANIFEST_SUM):
        _put_file(rr, os.path.join(staging, rel), rr.path(name, rel), lease)


def _check_uploaded(rr: RemoteRoot, name: str, staging: str, files: dict) -> None:
    """Every object of the version is there with its size (listed, not assumed)."""
    want = {rel: int(meta["size"]) for rel, meta in files.items()}
    for rel in (MANIFEST, MANIFEST_SUM):
        want[rel] = os.path.getsize(os.path.join(staging, rel))
    have = _listing(rr, only=name)[name]
    bad = [f"{rel}: {have[rel].size if rel in have else 'missing'} bytes, expected {size}"
           for rel, size in sorted(want.items()) if rel not in have or have[rel].size != size]
    if bad:
        raise OSError(f"the upload of {rr.name(name)} is incomplete ({'; '.join(bad[:5])}); nothing published")


def _write_current(rr: RemoteRoot, name: str) -> None:
    with rr.fs.open_output_stream(rr.path(CURRENT)) as f:
        f.write((name + "\n").encode())


def _remove_version(rr: RemoteRoot, name: str, objects: dict | None = None) -> int:
    """Delete a version prefix, its manifest checksum first (a half-deleted prefix is debris, never
    a version); returns the bytes removed."""
    objects = objects if objects is not None else _listing(rr, only=name)[name]
    try:
        rr.fs.delete_file(rr.path(name, MANIFEST_SUM))
    except FileNotFoundError:
        pass
    rr.fs.delete_dir(rr.path(name))
    return sum(int(i.size or 0) for i in objects.values())


def _retire(rr: RemoteRoot, keep: int, protect: set[str]) -> list[tuple[str, int]]:
    listing = _listing(rr)
    complete = sorted(v for v, objs in listing.items() if MANIFEST_SUM in objs)
    return [(rr.name(old), _remove_version(rr, old, listing[old])) for old in complete[:-keep] if old not in protect]


def publish(uri: str, staging: str, manifest: dict, keep: int | None = None, lease_s: float = LEASE_S) -> str:
    """Upload ``staging`` as the next version of the remote root ``uri`` and move CURRENT to it.

    Under the root's lock: the number (one past every prefix present, debris included), the
    manifest (parent: CURRENT's version), the upload (manifest and checksum last), a size
    check of every object, then CURRENT, then retention (``keep``: the newest complete
    versions, never the new one). A failure before CURRENT deletes the new prefix and leaves
    CURRENT as it was. The staging folder becomes the local cache's copy of the version.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (the live version is always kept), got {keep}")
    if not os.path.isdir(staging):
        raise FileNotFoundError(f"staging folder {staging!r} does not exist (removed by gc or a failed build?)")
    rr = resolve(uri)
    manifest = dict(manifest)
    manifest["format_version"] = format_version_of(staging)
    manifest["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["files"] = file_table(staging)
    t = time.time()
    with S3Lease(rr, "publish", lease_s) as lease:
        try:
            manifest["parent"] = read_current(rr)
        except IndexFormatError as e:
            log.warning("%s; publishing over it", e)
            manifest["parent"] = None
        write_manifest(staging, manifest)
        existing = list_versions(rr, complete=False)
        name = f"v{int(existing[-1][1:]) + 1 if existing else 1:06d}"
        try:
            _upload(rr, staging, name, manifest["files"], lease)
            _check_uploaded(rr, name, staging, manifest["files"])
            lease.confirm()
        except BaseException:
            try:
                _remove_version(rr, name)
            except Exception as e:  # what is left has no checksum: gc's debris
                log.warning("could not delete the partial upload %s (%s); `funnel gc %s` removes it",
                            rr.name(name), e, rr.uri)
            raise
        _write_current(rr, name)
        retired = _retire(rr, keep, {name}) if keep else []
    for path, size in retired:
        log.info("retired %s (%d bytes)", path, size)
    _install_staging(uri, staging, name)
    log.info("published %s (%d files, %.2fs upload and publish)", rr.name(name), len(manifest["files"]),
             time.time() - t)
    return name


def _install_staging(uri: str, staging: str, name: str) -> None:
    """The published staging folder becomes the cache's copy of the version (no download to serve it here)."""
    try:
        os.unlink(os.path.join(staging, BUILD_LOCK))
    except FileNotFoundError:
        pass
    vdir = os.path.join(local_root(uri), name)
    try:
        if os.path.exists(vdir):
            _discard(vdir)  # a stale copy of an older publication under the same number
        os.rename(staging, vdir)
    except OSError:
        release_staging(staging, remove=True)
        return
    release_staging(staging)


# -- gc ---------------------------------------------------------------------------------------


def gc(uri: str, keep: int | None = None, grace_s: float = DEBRIS_GRACE_S) -> GcReport:
    """Remove debris (version prefixes without their manifest checksum, older than ``grace_s``)
    and, with ``keep``, complete versions beyond the newest ``keep``; never CURRENT's.

    Under the root's lock, not waiting for it (``busy`` when held). Also tidies the local
    cache: copies of versions no longer in the store, and what killed builds and downloads left.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (the live version is always kept), got {keep}")
    rr = resolve(uri)
    report = GcReport()
    lease = S3Lease(rr, "gc")
    if not lease.acquire(blocking=False):
        report.busy = True
        report.kept.append((rr.name(LOCK), f"held by {lease.holder} (a publish or another gc); nothing removed, "
                                           "run gc again"))
        return report
    try:
        try:
            cur, why = read_current(rr), None
        except IndexFormatError as e:
            cur, why = None, str(e)
        listing = _listing(rr)
        now = time.time()
        for name, objs in sorted(listing.items()):
            if name == cur or MANIFEST_SUM in objs:
                continue
            age = now - max((i.mtime.timestamp() for i in objs.values() if i.mtime), default=0.0)
            if age >= grace_s:
                report.removed.append((rr.name(name), _remove_version(rr, name, objs)))
            else:
                report.kept.append((rr.name(name), f"an upload without its {MANIFEST_SUM}, modified {age:.0f}s "
                                                   "ago; left for now"))
        if keep:
            if cur is None or MANIFEST_SUM not in listing.get(cur, {}):
                why = why or ("there is no CURRENT" if cur is None else f"CURRENT names {cur}, which is not complete")
                report.kept.append((rr.uri, f"versions left as they are: {why}"))
            else:
                report.removed.extend(_retire(rr, keep, {cur}))
    finally:
        lease.release()
    _gc_cache(rr, report, grace_s)
    for path, size in report.removed:
        log.info("gc: removed %s (%d bytes)", path, size)
    return report


def _gc_cache(rr: RemoteRoot, report: GcReport, grace_s: float) -> None:
    """The local cache of ``rr``: stale version copies, killed builds' staging, killed downloads."""
    from .artifacts import _remove
    from .artifacts import gc as local_gc
    cache = local_root(rr.uri)
    _prune_cache(rr, cache, set(), report)
    sub = local_gc(cache)  # killed builds' .staging-* and .work-* (only once their build lock is free)
    report.removed.extend(sub.removed)
    report.kept.extend(sub.kept)
    now = time.time()
    for name in sorted(os.listdir(cache)):
        path = os.path.join(cache, name)
        if name.startswith(".download-") and now - os.lstat(path).st_mtime >= grace_s:
            _remove(path, report)
