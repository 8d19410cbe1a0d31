"""The artifact contract: versioned index directories, manifest, checksums, atomic publish, gc.

    INDEX_ROOT/CURRENT                 names the live version; replaced atomically (write tmp, rename)
    INDEX_ROOT/.lock                   flock: publish, retention and gc hold it exclusively
    INDEX_ROOT/v000001/                immutable once published; manifest.json lists every file's sha256
    INDEX_ROOT/v000001/manifest.json.sha256   the manifest's own sha256 (``sha256sum -c`` format)
    INDEX_ROOT/.readers/<host>-<pid>-<id>.json   a reader's lease on the version it has open
    INDEX_ROOT/.verified/<version>.<host>.json   files this host hashed, by stat (``verify="cached"``)

A build writes into ``INDEX_ROOT/.staging-<id>/`` (holding a lock on its ``.build.lock``
while it lives), fsyncs every file, and ``publish`` then, under the root's lock, renames
the folder to the next free ``vNNNNNN`` and moves ``CURRENT``: readers never see a
half-written version, a failed build leaves the live one untouched, and two publishes at
once never leave CURRENT on a deleted or an older version. ``gc`` removes what killed
builds leave behind (their lock is gone) and versions beyond a retention count.

Readers may sit on other machines (an NFS or other shared INDEX_ROOT), where no lock or
process table tells a publisher what they hold open. Each open version therefore keeps a
`ReaderLease`: a small file naming the version and an expiry, renewed in the
background; retention and gc never remove a version with a live lease (expired ones, and
those of dead processes on this host, are cleaned up). A reader that dies without
releasing holds its version at most ``READER_LEASE_S`` longer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
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
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Iterator

log = logging.getLogger(__name__)

#: The index format this funnel writes. 2: BM25 impacts as uint16 levels and tfs as uint16
#: (issue 50); 1: float32 impacts, int32 tfs. Funnel before 2 refuses a version-2 index with
#: a message to rebuild (or upgrade), instead of reading the narrower arrays as damage.
FORMAT_VERSION = 2
#: The format of a version whose BM25 postings are packed (``funnel build --postings packed``,
#: ``serving/lexical/packed.py``): a funnel that reads only 1 and 2 refuses it with a message to
#: rebuild (or upgrade) instead of finding its ``docs.npy`` missing.
PACKED_FORMAT_VERSION = 3
#: The formats this funnel reads: version 1 indexes open and are scored exactly from their
#: tfs until rebuilt (docs/index-format.md, "Older indexes").
READ_FORMAT_VERSIONS = (1, 2, 3)

MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.sha256"   # the manifest's own checksum, next to it
CURRENT = "CURRENT"
LOCK = ".lock"                          # INDEX_ROOT/.lock
BUILD_LOCK = ".build.lock"              # inside a staging folder while its build lives
#: How a version is checked on open: nothing; the manifest's checksum and each file's size;
#: that and each file's sha256 (``full``); or ``cached``: as ``full``, except that a file this
#: host already hashed, and whose size, mtime, ctime, inode and device have not changed since,
#: is not hashed again (its record is in ``INDEX_ROOT/.verified/``).
VERIFY_MODES = ("none", "sizes", "cached", "full")
VERIFIED = ".verified"
#: A file changed less than this long before it was hashed gets no record: a file system's
#: timestamps can be coarse (a kernel tick, or seconds), so a write just after the stat could
#: leave mtime and ctime as they were. Such a file is hashed again at the next open.
STAMP_SETTLE_NS = 2_000_000_000
UNLOCKED_GRACE_S = 600                  # gc leaves a staging folder with no lock file this young
_VERSION_RE = re.compile(r"v[0-9]{6}")  # used with fullmatch: no trailing newline, ASCII digits
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_NOT_VERSION_FILES = {MANIFEST, MANIFEST_SUM, BUILD_LOCK}
# Rows per row group of docs/*.parquet. Serving decodes one group for each document it shows
# and keeps a bounded number of groups (``serving.index.DocStore``): at 1M synthetic documents
# of ~800 bytes a group of 256 took 0.9 ms to read where one of 8,192 took 20 ms; the file
# grew 3% (154 against 150 MiB a shard).
DOCS_ROW_GROUP = 256
READERS = ".readers"                    # INDEX_ROOT/.readers/: one lease file per open version
#: A reader's lease lasts this long unless renewed (every third of it, in the background).
READER_LEASE_S = float(os.environ.get("FUNNEL_READER_LEASE_S") or 300)


class IndexFormatError(ValueError):
    """The directory is not a funnel index, or not one this version can read, or it is damaged."""


def is_version_name(name: str) -> bool:
    """True for a version folder name (``v`` and six digits): never a path."""
    return bool(_VERSION_RE.fullmatch(name))


def version_parts(version_dir: str) -> tuple[str, str] | None:
    """(index root, version name) of a ``vNNNNNN`` folder; None for any other folder."""
    path = os.path.normpath(version_dir)
    name = os.path.basename(path)
    return (os.path.dirname(path), name) if is_version_name(name) else None


def sha256_file(path: str, bufsize: int = 1 << 20) -> str:
    """sha256 of a file, streamed in ``bufsize`` blocks (memory stays flat for any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def file_table(version_dir: str, stamps: dict | None = None) -> dict[str, dict]:
    """{relative path: {size, sha256}} of every file under ``version_dir`` but the manifest;
    with ``stamps``, also puts there each settled file's record (as ``verify_files`` returns)."""
    out = {}
    for root, _, files in os.walk(version_dir):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, version_dir)
            if rel in _NOT_VERSION_FILES or rel.endswith(".tmp"):
                continue
            t = time.time_ns()
            st = os.stat(full)
            out[rel] = {"size": st.st_size, "sha256": sha256_file(full)}
            stamp = _settled_stamp(st, t, out[rel]["sha256"])
            if stamps is not None and stamp is not None:
                stamps[rel] = stamp
    return dict(sorted(out.items()))


def list_versions(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if _VERSION_RE.fullmatch(d))


def read_current(root: str) -> str | None:
    """The version CURRENT names; None without a CURRENT (or an empty one).

    Raises IndexFormatError when CURRENT holds anything but a version name (``vNNNNNN``):
    a path such as ``../elsewhere`` or ``/abs/path`` is refused, never followed.
    """
    p = os.path.join(root, CURRENT)
    try:
        with open(p, "rb") as f:
            raw = f.read(256)
    except FileNotFoundError:
        return None
    return parse_current(raw, p, lambda: list_versions(root)[-3:])


def parse_current(raw: bytes, where: str, versions: Callable[[], list[str]] = list) -> str | None:
    """The version name in CURRENT's bytes (None when empty); IndexFormatError for anything
    but ``vNNNNNN``. ``where`` names the file in the error, ``versions()`` some that exist."""
    name = raw.decode("utf-8", "replace").strip()
    if not name:
        return None
    if not is_version_name(name):
        raise IndexFormatError(
            f"{where} names {name[:80]!r}, which is not a version name (v and six digits, e.g. v000001); "
            "refusing to follow it: a version lives directly under the index root. Point CURRENT at "
            f"a published version ({', '.join(versions()) or 'none present'})")
    return name


def _current_or_none(root: str) -> str | None:
    try:
        return read_current(root)
    except IndexFormatError as e:
        log.warning("%s; publishing over it", e)
        return None


# -- locks ------------------------------------------------------------------------------


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def _flock(path: str, blocking: bool, create: bool = True) -> int | None:
    """An fd holding an exclusive flock on ``path``; None if ``blocking`` is False and it is taken.

    On a filesystem without locks a blocking caller (publish) goes on unlocked, with a
    warning: it publishes as before locks existed; gc (non-blocking) refuses instead.
    """
    fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError as e:
        if blocking and e.errno in _NO_LOCKS:
            log.warning("%s: this filesystem has no file locks (%s); concurrent publishes on this index "
                        "root are not serialized", path, e.strerror)
            return fd
        os.close(fd)
        if not blocking and e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


@contextmanager
def root_lock(root: str, blocking: bool = True) -> Iterator[bool]:
    """Hold ``root/.lock`` exclusively (publish, retention, gc, creating a staging folder).

    Yields True when held; with ``blocking=False`` yields False (and holds nothing) when
    another process has it. The lock is released when the block ends or the process dies.
    """
    os.makedirs(root, exist_ok=True)
    fd = _flock(os.path.join(root, LOCK), blocking)
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


_staging_fds: dict[str, int] = {}
_staging_mutex = threading.Lock()


def new_staging_dir(root: str) -> str:
    """Create ``root/.staging-<id>/`` and hold its build lock until publish (or process exit).

    ``gc`` removes a staging folder only once its lock is free, i.e. its build has ended.
    """
    sid = uuid.uuid4().hex[:12]
    d = os.path.join(root, f".staging-{sid}")
    with root_lock(root):  # gc holds it too, so it sees a .new-* only if its creator died
        tmp = os.path.join(root, f".new-{sid}")
        os.makedirs(tmp)
        fd = _flock(os.path.join(tmp, BUILD_LOCK), blocking=True)
        os.rename(tmp, d)  # a .staging-* always has its lock file
    with _staging_mutex:
        _staging_fds[os.path.abspath(d)] = fd
    return d


def release_staging(staging: str, remove: bool = False) -> None:
    """Drop the build lock of ``staging`` (and, with ``remove``, the folder): a failed build's cleanup."""
    if remove:
        shutil.rmtree(staging, ignore_errors=True)
    with _staging_mutex:
        fd = _staging_fds.pop(os.path.abspath(staging), None)
    if fd is not None:
        os.close(fd)


# -- writing ----------------------------------------------------------------------------


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for root, dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def save_npy_atomic(path: str, array) -> None:
    """``np.save`` to a unique temporary name, fsync, rename: never a torn ``.npy``."""
    import numpy as np
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_npy_streamed(path: str, dtype, n: int, fill) -> None:
    """`save_npy_atomic` of a one-dimensional array of ``n`` items of ``dtype`` that is never
    whole in memory: ``fill(put)`` hands it over in pieces, in order (the temporary file is
    removed if it fails, or hands over other than ``n`` items)."""
    import numpy as np
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    got = 0
    try:
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (n,)})

            def put(v) -> None:
                nonlocal got
                f.write(np.ascontiguousarray(v, dtype=dtype).tobytes())
                got += len(v)

            fill(put)
            if got != n:
                raise RuntimeError(f"{path}: {got} items written of {n}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_arrow_atomic(path: str, table) -> None:
    """An Arrow table as one uncompressed IPC file (one record batch, so a reader memory-maps
    each column as one array) at a unique temporary name, fsynced, renamed over ``path``."""
    import pyarrow as pa
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(1, len(table)))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str, obj) -> None:
    _write_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def write_manifest(version_dir: str, manifest: dict) -> str:
    """Write ``manifest.json`` and its checksum file ``manifest.json.sha256``; returns the sha256.

    The manifest records that it has a checksum file, so a lost one is an error rather
    than an index from before manifest checksums.
    """
    manifest = {**manifest, "manifest_checksum": MANIFEST_SUM}
    data = (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode("utf-8")
    _write_atomic(os.path.join(version_dir, MANIFEST), data)
    digest = hashlib.sha256(data).hexdigest()
    _write_atomic(os.path.join(version_dir, MANIFEST_SUM), f"{digest}  {MANIFEST}\n".encode())
    return digest


def _write_current(root: str, name: str) -> None:
    _write_atomic(os.path.join(root, CURRENT), (name + "\n").encode())
    _fsync_dir(root)


def _retire(root: str, keep: int, protect: set[str]) -> list[str]:
    """Rename all but the newest ``keep`` versions (never those in ``protect``) to ``.trash-*``.

    Under the root lock; the renames are atomic, the slow deletes happen after it is released.
    """
    trash = []
    protect = protect | leased_versions(root)
    for old in list_versions(root)[:-keep]:
        if old in protect:
            continue
        dst = os.path.join(root, f".trash-{old}-{uuid.uuid4().hex[:8]}")
        os.rename(os.path.join(root, old), dst)
        trash.append(dst)
    return trash


def format_version_of(folder: str) -> int:
    """The format a version folder is published as: ``PACKED_FORMAT_VERSION`` where any
    shard's postings are packed, else ``FORMAT_VERSION``."""
    from ..lexical.postings import is_packed  # postings imports this module
    lex = os.path.join(folder, "lexical")
    names = os.listdir(lex) if os.path.isdir(lex) else []
    packed = any(is_packed(os.path.join(lex, n)) for n in names if n.startswith("shard-"))
    return PACKED_FORMAT_VERSION if packed else FORMAT_VERSION


def publish(root: str, staging: str, manifest: dict, keep: int | None = None) -> str:
    """Checksum, fsync and publish ``staging`` as the next version; move CURRENT to it.

    Returns the version name. The checksums are computed first; choosing the number, the
    rename, CURRENT and retention happen under ``root/.lock``, so concurrent publishes
    on one root serialize: each gets its own number and CURRENT ends on the newest.
    ``keep`` (if set, >= 1) removes all but the newest ``keep`` versions, never the live one.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (the live version is always kept), got {keep}")
    if not os.path.isdir(staging):
        raise FileNotFoundError(f"staging folder {staging!r} does not exist (removed by gc or a failed build?)")
    manifest = dict(manifest)
    manifest["format_version"] = format_version_of(staging)
    manifest["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stamps: dict[str, list] = {}  # what was hashed here: the first open on this host need not hash it again
    manifest["files"] = file_table(staging, stamps)
    _fsync_tree(staging)
    trash: list[str] = []
    with root_lock(root):
        manifest["parent"] = _current_or_none(root)
        write_manifest(staging, manifest)
        _fsync_dir(staging)
        existing = list_versions(root)
        name = f"v{int(existing[-1][1:]) + 1 if existing else 1:06d}"
        os.rename(staging, os.path.join(root, name))
        # The lock file goes only after the rename: a staging folder killed at any point
        # still has it, so gc sees its build is dead at once (a lock-less one waits out
        # UNLOCKED_GRACE_S). A version left holding it is fine: it is not a version file.
        try:
            os.unlink(os.path.join(root, name, BUILD_LOCK))
        except FileNotFoundError:
            pass
        _write_current(root, name)
        if keep:
            trash = _retire(root, keep, {name})
    if stamps:
        write_stamps(os.path.join(root, name), stamps)
    release_staging(staging)
    for t in trash:
        shutil.rmtree(t, ignore_errors=True)
    return name


# -- reading and verifying --------------------------------------------------------------

_legacy_logged: set[str] = set()
_DAMAGED_HINT = ("rebuild the index (funnel build ...) or point CURRENT at an intact version; "
                 "`funnel verify INDEX_ROOT` checks every file")


def _check_manifest_sum(version_dir: str, raw: bytes, manifest: dict) -> None:
    p = os.path.join(version_dir, MANIFEST_SUM)
    try:
        with open(p, "rb") as f:
            text = f.read(4096).decode("ascii", "replace")
    except FileNotFoundError:
        if manifest.get("manifest_checksum"):
            raise IndexFormatError(f"index version {version_dir} is damaged: {MANIFEST_SUM} is missing, so "
                                   f"{MANIFEST} cannot be checked; {_DAMAGED_HINT}") from None
        if version_dir not in _legacy_logged:
            _legacy_logged.add(version_dir)
            log.warning("%s has no %s (published before manifest checksums): its manifest is not checked; "
                        "rebuild it to get the check", version_dir, MANIFEST_SUM)
        return
    want = (text.split() or [""])[0]
    if not _SHA256_RE.fullmatch(want):
        raise IndexFormatError(f"index version {version_dir} is damaged: {MANIFEST_SUM} holds no sha256; "
                               f"{_DAMAGED_HINT}")
    if hashlib.sha256(raw).hexdigest() != want:
        raise IndexFormatError(
            f"index version {version_dir} is damaged: {MANIFEST} does not match its sha256 in {MANIFEST_SUM} "
            f"(edited or corrupted after publishing); {_DAMAGED_HINT}")


def load_manifest(version_dir: str, check: bool = True) -> dict:
    """Read ``manifest.json``; with ``check``, verify it against ``manifest.json.sha256``.

    Every problem (missing, torn, not JSON, edited, another format version) is an
    IndexFormatError that names the folder and says what to do.
    """
    p = os.path.join(version_dir, MANIFEST)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise IndexFormatError(
            f"{version_dir} has no {MANIFEST}: it is not a published funnel index version") from None
    except OSError as e:
        raise IndexFormatError(f"cannot read {p}: {e}; {_DAMAGED_HINT}") from e
    try:
        m = json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise IndexFormatError(f"index version {version_dir} is damaged: {MANIFEST} is not valid JSON "
                               f"({e}); it is torn or was edited. {_DAMAGED_HINT}") from None
    if not isinstance(m, dict):
        raise IndexFormatError(f"index version {version_dir} is damaged: {MANIFEST} holds a JSON "
                               f"{type(m).__name__}, not an object; {_DAMAGED_HINT}")
    if check:
        _check_manifest_sum(version_dir, raw, m)
    fv = m.get("format_version")
    if fv not in READ_FORMAT_VERSIONS:
        raise IndexFormatError(
            f"{version_dir} has index format version {fv}; this funnel reads versions "
            f"{', '.join(map(str, READ_FORMAT_VERSIONS))}. Rebuild the index with this funnel (funnel build ...)")
    return m


def _stat_stamp(st: os.stat_result, sha256: str) -> list:
    """What a record of a hashed file holds: the stat fields any change through the file
    system moves (ctime cannot be set back from user space), and the sha256 it matched."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, sha256]


def _settled_stamp(st: os.stat_result, stat_ns: int, sha256: str) -> list | None:
    """The record of a file stat'ed at ``stat_ns`` and then hashed to ``sha256``; None when
    it changed within ``STAMP_SETTLE_NS`` before the stat (no record: hashed again next time)."""
    if max(st.st_mtime_ns, st.st_ctime_ns) >= stat_ns - STAMP_SETTLE_NS:
        return None
    return _stat_stamp(st, sha256)


def _file_problem(version_dir: str, rel: str, meta: dict, full: bool,
                  stamps: dict | None = None) -> tuple[str | None, list | None]:
    """(what is wrong with ``rel``, or None; its record when it was hashed, or trusted by
    ``stamps``, and matched). Without ``full`` only the size is checked."""
    if os.path.isabs(rel) or ".." in rel.split(os.sep):
        return f"{rel} is not a path inside the version", None
    p = os.path.join(version_dir, rel)
    try:
        t = time.time_ns()
        st = os.stat(p)
        if st.st_size != meta["size"]:
            return f"{rel} has {st.st_size} bytes, manifest says {meta['size']}", None
        if not full:
            return None, None
        stamp = _stat_stamp(st, meta["sha256"])
        if stamps is not None and stamps.get(rel) == stamp:
            return None, stamp
        if sha256_file(p) != meta["sha256"]:
            return f"{rel} does not match its sha256 in the manifest (corrupted after publishing)", None
        return None, _settled_stamp(st, t, meta["sha256"])
    except FileNotFoundError:
        return f"missing {rel}", None
    except OSError as e:
        return f"{rel} cannot be read ({e.strerror or e})", None


def verify_files(version_dir: str, manifest: dict, full: bool = False, workers: int | None = None,
                 stamps: dict | None = None) -> dict[str, list]:
    """Check every listed file exists with its size (and, if ``full``, its sha256).

    ``full`` streams each file through sha256 on ``workers`` threads (hashlib releases
    the GIL; default: up to 8, one per CPU), except files whose record in ``stamps``
    (``{path: record}``, `read_stamps`) equals their stat now. Raises
    IndexFormatError naming the files. Returns the records of the files that were hashed
    (or trusted) and matched, for `write_stamps`.
    """
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise IndexFormatError(f"index version {version_dir} is damaged: its manifest lists no files; "
                               f"{_DAMAGED_HINT}")
    items = sorted(files.items(), key=lambda kv: -int(kv[1].get("size", 0)))  # big files start first
    n = workers or min(8, os.cpu_count() or 1)
    if full and n > 1 and len(items) > 1:
        with ThreadPoolExecutor(n, thread_name_prefix="funnel-verify") as ex:
            found = list(ex.map(lambda kv: _file_problem(version_dir, kv[0], kv[1], True, stamps), items))
    else:
        found = [_file_problem(version_dir, rel, meta, full, stamps) for rel, meta in items]
    problems = sorted(p for p, _ in found if p)
    if problems:
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise IndexFormatError(
            f"index version {version_dir} is damaged or partial ({'; '.join(problems[:5])}{more}); "
            f"{_DAMAGED_HINT}")
    return {rel: stamp for (rel, _), (_, stamp) in zip(items, found) if stamp is not None}


def _stamps_path(version_dir: str) -> str | None:
    """``INDEX_ROOT/.verified/<version>.<host>.json`` of a ``vNNNNNN`` folder, else None."""
    parts = version_parts(os.path.abspath(version_dir))
    if parts is None:
        return None
    return os.path.join(parts[0], VERIFIED, f"{parts[1]}.{socket.gethostname()}.json")


def read_stamps(version_dir: str) -> dict[str, list]:
    """This host's records of the files of ``version_dir`` it hashed; {} when there are none
    (or they cannot be read: then every file is hashed, as ``full`` does)."""
    p = _stamps_path(version_dir)
    if p is None:
        return {}
    try:
        with open(p, "rb") as f:
            got = json.loads(f.read(64 << 20))
        files = got.get("files") if isinstance(got, dict) else None
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def write_stamps(version_dir: str, stamps: dict[str, list]) -> None:
    """Keep ``stamps`` for the next ``cached`` open on this host; best effort (a read-only
    root keeps none, and every open there hashes every file)."""
    p = _stamps_path(version_dir)
    if p is None:
        return
    body = {"version": os.path.basename(os.path.normpath(version_dir)), "host": socket.gethostname(),
            "files": stamps}
    tmp = f"{p}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(tmp, "w") as f:  # not fsynced: a lost record only means hashing again
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, p)
    except OSError as e:
        log.debug("cannot keep the verification record %s (%s); the next open hashes every file again", p, e)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def verify_version(version_dir: str, mode: str = "cached") -> dict:
    """Load the manifest of ``version_dir`` and verify it by ``mode`` (`VERIFY_MODES`);
    returns the manifest.

    ``none``: parse only. ``sizes``: the manifest's checksum and every file's size.
    ``full``: that and every file's sha256. ``cached``: as ``full``, but a file whose stat
    equals this host's record of an earlier match is not hashed again. ``full`` and
    ``cached`` both leave the records of what they hashed for the next ``cached`` open.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"unknown verify mode {mode!r}; choose one of {', '.join(VERIFY_MODES)}")
    m = load_manifest(version_dir, check=(mode != "none"))
    if mode in ("cached", "full"):
        known = read_stamps(version_dir) if mode == "cached" else None
        stamps = verify_files(version_dir, m, full=True, stamps=known)
        if stamps != known:
            write_stamps(version_dir, stamps)
    elif mode == "sizes":
        verify_files(version_dir, m)
    return m


# -- readers' leases ---------------------------------------------------------------------


class ReaderLease:
    """A searcher's claim on ``root/version``: ``root/.readers/<host>-<pid>-<id>.json`` with
    the version and an expiry ``lease_s`` ahead, renewed every third of that by one
    background thread per process, removed by `release`. Writing it is best effort:
    on a read-only root the reader still works (and is unprotected; logged once).
    """

    _live: "weakref.WeakSet[ReaderLease]"
    _thread: threading.Thread | None = None
    _guard = threading.Lock()

    def __init__(self, root: str, version: str, lease_s: float | None = None):
        self.root, self.version = root, version
        self.lease_s = float(lease_s or READER_LEASE_S)
        self.path = os.path.join(root, READERS, f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json")
        self.released = False
        self.renew()
        with ReaderLease._guard:
            ReaderLease._live.add(self)
            if ReaderLease._thread is None or not ReaderLease._thread.is_alive():
                ReaderLease._thread = threading.Thread(target=ReaderLease._renew_all, name="funnel-reader-leases",
                                                       daemon=True)
                ReaderLease._thread.start()
        ReaderLease._wake.set()  # a shorter lease than the others: the renewer re-plans its sleep

    def renew(self) -> None:
        if self.released:
            return
        self.due = time.monotonic() + self.lease_s / 3
        body = {"version": self.version, "host": socket.gethostname(), "pid": os.getpid(),
                "expires_at": time.time() + self.lease_s}
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{uuid.uuid4().hex[:6]}.tmp"
            with open(tmp, "w") as f:
                json.dump(body, f)
            os.replace(tmp, self.path)
        except OSError as e:
            if not getattr(self, "_warned", False):
                self._warned = True
                log.warning("cannot write the reader lease %s (%s): retention and gc elsewhere may delete %s "
                            "while it is open", self.path, e, self.version)

    def release(self) -> None:
        self.released = True
        try:
            os.unlink(self.path)
        except OSError:
            pass

    @classmethod
    def _renew_all(cls) -> None:
        """Renew each lease a third of its length after its last renewal; sleeps until the
        next one is due, or until a new lease arrives."""
        while True:
            cls._wake.clear()  # before the snapshot: a lease added after it sets it again
            with cls._guard:
                leases = list(cls._live)
            now = time.monotonic()
            for x in leases:
                if x.due <= now:
                    x.renew()
            nxt = min((x.due for x in leases if not x.released), default=now + READER_LEASE_S / 3)
            del leases  # no strong references while asleep: a dropped reader's lease can go
            cls._wake.wait(timeout=max(0.01, nxt - time.monotonic()))


ReaderLease._live = weakref.WeakSet()
ReaderLease._wake = threading.Event()


def _lease_alive(body: dict, now: float) -> bool:
    if float(body.get("expires_at", 0)) <= now:
        return False
    if body.get("host") == socket.gethostname():  # same machine: a dead process holds nothing
        try:
            os.kill(int(body["pid"]), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, KeyError, ValueError, TypeError):
            pass
    return True


def leased_versions(root: str, report: "GcReport | None" = None) -> set[str]:
    """Versions under ``root`` that a live reader lease names; expired or dead leases (and
    unreadable ones older than a lease) are removed on the way."""
    d = os.path.join(root, READERS)
    out: set[str] = set()
    now = time.time()
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for name in names:
        path = os.path.join(d, name)
        try:
            with open(path) as f:
                body = json.load(f)
            alive = _lease_alive(body, now)
        except (OSError, ValueError, AttributeError):
            try:
                alive = now - os.lstat(path).st_mtime < READER_LEASE_S  # a lease being written
            except OSError:
                continue
            body = {}
        if alive:
            if is_version_name(str(body.get("version", ""))):
                out.add(body["version"])
            continue
        try:
            os.unlink(path)
            if report is not None:
                report.removed.append((path, 0))
        except OSError:
            pass
    return out


# -- garbage collection -----------------------------------------------------------------


@dataclass
class GcReport:
    """What ``gc`` removed (path, bytes) and what it left, with the reason.

    ``busy``: the root's lock was held (a publish or another gc), so nothing was touched.
    """

    removed: list[tuple[str, int]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    busy: bool = False

    @property
    def bytes_freed(self) -> int:
        return sum(b for _, b in self.removed)

    def to_dict(self) -> dict:
        return {"removed": [{"path": p, "bytes": b} for p, b in self.removed],
                "kept": [{"path": p, "reason": r} for p, r in self.kept], "bytes_freed": self.bytes_freed,
                "busy": self.busy}


def _tree_bytes(path: str) -> int:
    if os.path.islink(path) or not os.path.isdir(path):
        return os.lstat(path).st_size
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(d, name)).st_size
            except OSError:
                pass
    return total


def _remove(path: str, report: GcReport, shown_as: str | None = None) -> None:
    """Delete a file, link or tree (never following a link); recorded in ``report``."""
    try:
        size = _tree_bytes(path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)  # a publish may be deleting its .trash-* too
        else:
            os.unlink(path)
    except FileNotFoundError:
        return
    if os.path.lexists(path):
        report.kept.append((path, "could not be removed completely (permissions?)"))
    else:
        report.removed.append((shown_as or path, size))


def _staging_alive(path: str, now: float) -> str | None:
    """Why ``path`` (a staging folder) may belong to a live build, or None if its build is gone."""
    try:
        fd = _flock(os.path.join(path, BUILD_LOCK), blocking=False, create=False)
    except FileNotFoundError:
        # No lock file: a build from a funnel before build locks, or files an orphaned Ray
        # worker wrote after its build died. Only an old enough one is surely dead.
        age = now - os.lstat(path).st_mtime
        return None if age >= UNLOCKED_GRACE_S else f"no build lock and modified {age:.0f}s ago; left for now"
    if fd is None:
        return "a running build holds its lock"
    os.close(fd)  # free: its build has ended (a flock dies with its process)
    return None


def _gc_debris(root: str, report: GcReport) -> None:
    now = time.time()
    names = sorted(os.listdir(root))
    live: set[str] = set()
    for name in names:
        if name.startswith(".staging-"):
            path = os.path.join(root, name)
            why = _staging_alive(path, now)
            if why:
                live.add(name[len(".staging-"):])
                report.kept.append((path, why))
            else:
                _remove(path, report)
    for name in names:
        path = os.path.join(root, name)
        if name.startswith(".work-") and name[len(".work-"):] in live:
            report.kept.append((path, "its build is running"))
        elif name.startswith("rejects-") and name.endswith(".jsonl"):  # a failed build's reasons
            if name[len("rejects-"):-len(".jsonl")] in live:
                report.kept.append((path, "its build is running"))
            else:
                _remove(path, report)
        elif name.startswith((".work-", ".trash-", ".new-")) or (name.startswith(CURRENT + ".")
                                                                  and name.endswith(".tmp")):
            _remove(path, report)


def _gc_stamps(root: str, report: GcReport) -> None:
    """Remove verification records of versions that are gone (and stale temporary files)."""
    d = os.path.join(root, VERIFIED)
    if not os.path.isdir(d):
        return
    versions, now = set(list_versions(root)), time.time()
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > 60:  # a younger one may be a record being written
                    _remove(path, report)
        elif name.split(".", 1)[0] not in versions:
            _remove(path, report)


def _gc_versions(root: str, keep: int, report: GcReport) -> None:
    try:
        cur = read_current(root)
        why = "there is no CURRENT" if cur is None else f"CURRENT names {cur}, which does not exist"
    except IndexFormatError as e:
        cur, why = None, str(e)
    if cur is None or not os.path.isdir(os.path.join(root, cur)):
        report.kept.append((root, f"versions left as they are: {why}"))
        return
    leased = leased_versions(root, report)
    for old in list_versions(root)[:-keep]:
        if old in leased:
            report.kept.append((os.path.join(root, old), "a reader holds a lease on it (open in a searcher, "
                                                         f"here or on another machine; at most {READER_LEASE_S:g} s "
                                                         "after the reader is gone)"))
        elif old != cur:
            # Renamed first, so a crash mid-delete never leaves a partial vNNNNNN behind.
            dst = os.path.join(root, f".trash-{old}-{uuid.uuid4().hex[:8]}")
            os.rename(os.path.join(root, old), dst)
            _remove(dst, report, shown_as=os.path.join(root, old))


def gc(root: str, keep: int | None = None) -> GcReport:
    """Remove the debris of killed builds and, with ``keep``, versions beyond the newest ``keep``.

    Debris is ``.staging-*`` (and its ``.work-*``) whose build lock no process holds,
    ``.trash-*`` of interrupted deletes, ``.new-*``, stray ``CURRENT.*.tmp`` and the
    ``rejects-*.jsonl`` a build whose every row was rejected kept for its error message. The
    version CURRENT names is never removed, and no version is while CURRENT is missing
    or broken. Nothing at all is removed while a publish (or another gc) holds
    ``root/.lock``: gc does not wait for it, and the report says so.

    Returns
    -------
    GcReport
        ``removed``: (path, bytes) of each removed entry; ``kept``: (path, reason) of
        each one left, e.g. the folders of a running build.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be at least 1 (the live version is always kept), got {keep}")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"index root {root!r} does not exist")
    report = GcReport()
    with root_lock(root, blocking=False) as held:
        if not held:
            report.busy = True
            report.kept.append((root, f"{os.path.join(root, LOCK)} is held (a publish or another gc is "
                                      "running); nothing removed, run gc again"))
            return report
        _gc_debris(root, report)
        if keep:
            _gc_versions(root, keep, report)
        _gc_stamps(root, report)
    for path, size in report.removed:
        log.info("gc: removed %s (%d bytes)", path, size)
    return report
