"""Files that Ray workers write, sent back to the driver when the two share no disk.

On a multi-node Ray cluster without a shared filesystem (the usual case, say with an s3://
INDEX_ROOT), a file that a worker writes lands on the worker's own machine, never in the
driver's staging folder. So a build task that writes files (a lexical shard, a dense shard)
gives its results as rows of one schema, `ROW_COLUMNS`:

- with ``ship`` (no shared disk), it writes into a temporary folder of its own and yields
  each file there as rows of at most `PIECE_BYTES` (`file_rows`), then
- always, one summary row (`summary_row`): its summary and, when shipped, each file's
  size and sha256.

The driver passes every row to a `FileReceiver` as the rows arrive, which writes each
piece at its offset in the driver's folder and, at the end, checks every file against its
summary. Writing at an offset makes a retried task harmless: it sends the same bytes for the
same places again. Without ``ship`` the task writes in place and sends its summary row only,
and the driver's loop is the same. No Ray here: the build's stages call these functions
inside their Ray tasks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Iterator

import numpy as np

#: The columns of a row: the task's key (a shard), a shipped file's path (first component:
#: which driver folder), the piece's offset and bytes, and the summary row's JSON ("" in a piece).
ROW_COLUMNS = ("key", "path", "offset", "data", "summary")
#: The largest piece of a file in one row: rows stay well under Ray Data's 128 MiB blocks
#: and Arrow's 2 GiB binary arrays, and the driver holds a block at a time, not a shard.
PIECE_BYTES = 32 << 20


def _row(key: int, path: str = "", offset: int = 0, data: bytes = b"", summary: str = "") -> dict:
    return {"key": np.array([key], dtype=np.int64), "path": np.array([path], dtype=object),
            "offset": np.array([offset], dtype=np.int64), "data": np.array([data], dtype=object),
            "summary": np.array([summary], dtype=object)}


def file_rows(key: int, folder: str, piece_bytes: int | None = None) -> Iterator[dict]:
    """Yield every file under ``folder`` as one-row batches of pieces; returns the file list.

    The list (``[{"path", "size", "sha256"}]``, paths relative to ``folder`` with ``/``) goes
    into `summary_row`. An empty file is one empty piece, so it exists on the driver too.
    """
    piece_bytes = piece_bytes or PIECE_BYTES
    files = []
    for d, _, names in sorted(os.walk(folder)):
        for name in sorted(names):
            full = os.path.join(d, name)
            rel = os.path.relpath(full, folder).replace(os.sep, "/")
            digest, offset = hashlib.sha256(), 0
            with open(full, "rb") as f:
                while True:
                    piece = f.read(piece_bytes)
                    if piece or offset == 0:
                        yield _row(key, rel, offset, piece)
                    if not piece:
                        break
                    digest.update(piece)
                    offset += len(piece)
            files.append({"path": rel, "size": offset, "sha256": digest.hexdigest()})
    return files


def summary_row(key: int, summary: dict, files: list[dict] | None = None) -> dict:
    """The task's last row: its ``summary`` (JSON-able) and the files it shipped."""
    return _row(key, summary=json.dumps({"summary": summary, "files": files or []}, default=_plain))


def result_rows(key: int, summary: dict, folder: str | None = None) -> Iterator[dict]:
    """A task's rows: the files under ``folder`` (when it shipped them; the folder is removed
    after), then its summary row. ``folder`` None: the files were written in place."""
    files = None
    if folder is not None:
        try:
            files = yield from file_rows(key, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    yield summary_row(key, summary, files)


def _plain(v):
    """NumPy scalars in a summary, as Python numbers."""
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


class FileReceiver:
    """Writes shipped pieces into the driver's folders; collects the summary rows.

    ``roots`` maps a shipped path's first component to the driver folder it goes into
    (``{"out": staging, "work": work}``: ``out/lexical/shard-0001/docs.npy`` is written to
    ``staging/lexical/shard-0001/docs.npy``).
    """

    def __init__(self, roots: dict[str, str]):
        self.roots = roots
        self.summaries: dict[int, dict] = {}
        self.files: dict[int, list[dict]] = {}
        self.bytes = 0

    def _dest(self, rel: str) -> str:
        top, _, rest = rel.partition("/")
        if top not in self.roots or not rest or os.path.isabs(rest) or ".." in rest.split("/"):
            raise RuntimeError(f"a worker sent a file outside the build's folders: {rel!r}")
        return os.path.join(self.roots[top], *rest.split("/"))

    def add(self, batch) -> None:
        """One batch of rows (a pyarrow Table, as ``iter_batches(batch_format="pyarrow")`` gives)."""
        keys = batch.column("key").to_pylist()
        paths = batch.column("path").to_pylist()
        offsets = batch.column("offset").to_pylist()
        summaries = batch.column("summary").to_pylist()
        data = batch.column("data")
        for i, (key, rel, offset, summary) in enumerate(zip(keys, paths, offsets, summaries)):
            if summary:
                s = json.loads(summary)
                # A retried task sends the same summary again: the last one stands.
                self.summaries[key], self.files[key] = s["summary"], s["files"]
                continue
            piece = data[i].as_buffer()  # no copy: the block's own memory
            dest = self._dest(rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                if piece is not None and piece.size:
                    os.pwrite(fd, memoryview(piece), offset)
            finally:
                os.close(fd)
            self.bytes += piece.size if piece is not None else 0

    def finish(self) -> list[dict]:
        """The summaries, in key order, once every shipped file is on disk as its task described it."""
        for key, files in sorted(self.files.items()):
            for f in files:
                dest = self._dest(f["path"])
                size = os.path.getsize(dest) if os.path.exists(dest) else None
                if size != f["size"]:
                    raise RuntimeError(f"task {key}: {f['path']} arrived as {size} bytes, not the {f['size']} "
                                       f"bytes it wrote")
                if _sha256(dest) != f["sha256"]:
                    raise RuntimeError(f"task {key}: {f['path']} arrived with other bytes than it wrote "
                                       f"(sha256 {f['sha256'][:12]}...)")
        return [self.summaries[k] for k in sorted(self.summaries)]


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
