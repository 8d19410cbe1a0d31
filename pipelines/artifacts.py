"""The artifact contract: versioned index directories, manifest, checksums, atomic publish.

    INDEX_ROOT/CURRENT        names the live version; replaced atomically (write tmp, rename)
    INDEX_ROOT/v000001/       immutable once published; manifest.json lists every file's sha256

A build writes into ``INDEX_ROOT/.staging-<id>/``, fsyncs every file, renames the folder to
the next free ``vNNNNNN`` and only then moves ``CURRENT``: readers never see a half-written
version, and a failed build leaves the live one untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from datetime import datetime, timezone

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CURRENT = "CURRENT"
_VERSION_RE = re.compile(r"^v(\d{6})$")


class IndexFormatError(ValueError):
    """The directory is not a funnel index, or not one this version can read."""


def sha256_file(path: str, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def file_table(version_dir: str) -> dict[str, dict]:
    """{relative path: {size, sha256}} of every file under ``version_dir`` but the manifest."""
    out = {}
    for root, _, files in os.walk(version_dir):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, version_dir)
            if rel == MANIFEST or rel.endswith(".tmp"):
                continue
            out[rel] = {"size": os.path.getsize(full), "sha256": sha256_file(full)}
    return dict(sorted(out.items()))


def list_versions(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if _VERSION_RE.match(d))


def read_current(root: str) -> str | None:
    p = os.path.join(root, CURRENT)
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return f.read().strip() or None


def new_staging_dir(root: str) -> str:
    os.makedirs(root, exist_ok=True)
    d = os.path.join(root, f".staging-{uuid.uuid4().hex[:12]}")
    os.makedirs(d)
    return d


def _fsync_tree(path: str) -> None:
    for root, dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_npy_atomic(path: str, array) -> None:
    """``np.save`` to a unique temporary name, fsync, rename: never a torn ``.npy``."""
    import numpy as np
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def publish(root: str, staging: str, manifest: dict, keep: int | None = None) -> str:
    """Checksum, fsync and publish ``staging`` as the next version; move CURRENT to it.

    Returns the version name. ``keep`` (if set) removes all but the newest ``keep``
    versions, never the live one.
    """
    manifest = dict(manifest)
    manifest["format_version"] = FORMAT_VERSION
    manifest["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["parent"] = read_current(root)
    manifest["files"] = file_table(staging)
    write_json_atomic(os.path.join(staging, MANIFEST), manifest)
    _fsync_tree(staging)
    while True:
        existing = list_versions(root)
        nxt = int(existing[-1][1:]) + 1 if existing else 1
        name = f"v{nxt:06d}"
        try:
            os.rename(staging, os.path.join(root, name))
            break
        except OSError:
            if not os.path.exists(os.path.join(root, name)):
                raise  # a real error, not a race with another publisher
    tmp = os.path.join(root, f"{CURRENT}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, CURRENT))
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep:
        for old in list_versions(root)[:-keep]:
            if old != name:
                shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return name


def load_manifest(version_dir: str) -> dict:
    p = os.path.join(version_dir, MANIFEST)
    if not os.path.exists(p):
        raise IndexFormatError(f"{version_dir} has no {MANIFEST}: it is not a published funnel index version")
    with open(p) as f:
        m = json.load(f)
    fv = m.get("format_version")
    if fv != FORMAT_VERSION:
        raise IndexFormatError(
            f"{version_dir} has index format version {fv}; this funnel reads version {FORMAT_VERSION}. "
            "Rebuild the index with this funnel (funnel build ...)")
    return m


def verify_files(version_dir: str, manifest: dict, full: bool = False) -> None:
    """Check every listed file exists with its size (and, if ``full``, its sha256)."""
    problems = []
    for rel, meta in manifest.get("files", {}).items():
        p = os.path.join(version_dir, rel)
        if not os.path.exists(p):
            problems.append(f"missing {rel}")
        elif os.path.getsize(p) != meta["size"]:
            problems.append(f"{rel} has {os.path.getsize(p)} bytes, manifest says {meta['size']}")
        elif full and sha256_file(p) != meta["sha256"]:
            problems.append(f"{rel} checksum differs from the manifest")
    if problems:
        raise IndexFormatError(
            f"index version {version_dir} is damaged or partial ({'; '.join(problems[:5])}); "
            "rebuild it or point CURRENT at an intact version")
