"""Stored documents for random access: what serving reads to quote, cite and fetch a hit.

A shard's ``docs/shard-NNNN.parquet`` is the columnar record every stage reads whole. Reading
*one* document from it means reading and decoding its 256-row group: about 1.1-1.6 ms, and a
default answer reads ten (a 1M-document BM25 answer spent more time there than ranking). So
the build writes beside it what Lucene calls stored fields:

* ``docs/shard-NNNN.store``: the shard's documents in local order, in blocks of
  ``STORE_BLOCK``; each block is LZ4-compressed (an Arrow codec call) and holds a header of
  ``rows * 5 + 1`` little-endian uint32 offsets, then per document ``doc_id``, ``title``,
  ``text``, ``content_hash`` and ``fields`` (the kept fields' JSON; empty: none) as UTF-8,
  value ``j`` lying at ``[offset j, offset j + 1)`` of what follows the header;
* ``docs/shard-NNNN.store.npy``: int64 ``[n_blocks + 1, 3]``, each block's start in the
  ``.store`` file and in the concatenated uncompressed blocks (the end row: the sizes), and
  the CRC-32 of its compressed bytes (checked at each read: ~2 us; a flipped bit in a served
  store is found by the query that reads it, as the postings' bounds checks find theirs).

Reading one document decompresses its block and decodes that document's values only: about
15 us for 16 documents of ~1 KB. LZ4, not zstd: Arrow's zstd call costs ~25 us before it
decompresses anything (a context each call), and a hit is read once per answer; Lucene's
default stored-fields mode makes the same choice. A shard's parquet file stays the record; an
index built before the store (or a shard a reindex carried from one) has no ``.store`` and is
read from parquet as before. The store is checked at open (offsets
increasing, ending at the file's size, as many blocks as the shard has documents) and a block
whose checksum or header does not fit is reported as damaged, never read past.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib

import numpy as np
import pyarrow as pa

STORE_BLOCK = 16  # documents a block: 16 x ~1 KB read in ~15 us; 1 document a block compresses worse
STORE_SUFFIX = ".store"
STORE_INDEX_SUFFIX = ".store.npy"
STORE_COLUMNS = ("doc_id", "title", "text", "content_hash", "fields")


def _codec() -> pa.Codec:
    return pa.Codec("lz4")


def store_paths(docs_dir: str, name: str) -> tuple[str, str]:
    """(the store, its block index) of shard ``name`` (``shard-NNNN``) under ``docs_dir``."""
    base = os.path.join(docs_dir, name)
    return base + STORE_SUFFIX, base + STORE_INDEX_SUFFIX


def _encode(cols: list[list], lo: int, hi: int) -> bytes:
    values = [(col[i] or "").encode("utf-8") for i in range(lo, hi) for col in cols]
    ends = np.zeros(len(values) + 1, dtype="<u4")
    np.cumsum([len(v) for v in values], out=ends[1:])
    return ends.tobytes() + b"".join(values)


def write_store(docs_dir: str, name: str, doc_ids: list[str], titles: list[str], texts: list[str],
                hashes: list[str], fields: list[str | None] | None = None) -> None:
    """Write shard ``name``'s store and block index (each through a temporary name and a rename,
    so a crash never leaves a half-written store under the final name)."""
    n = len(doc_ids)
    fields = fields if fields is not None else [None] * n
    _write_blocks(docs_dir, name, n, [[doc_ids, titles, texts, hashes, fields]])


def _write_blocks(docs_dir: str, name: str, n: int, slices) -> None:
    """``write_store`` of ``n`` documents given as ``slices``: consecutive column lists (in
    ``STORE_COLUMNS`` order), each a multiple of ``STORE_BLOCK`` documents but the last."""
    codec = _codec()
    store, index = store_paths(docs_dir, name)
    offsets = np.zeros((-(-n // STORE_BLOCK) + 1, 3), dtype=np.int64)
    b = 0
    with open(store + ".tmp", "wb") as f:
        for cols in slices:
            m = len(cols[0])
            for lo in range(0, m, STORE_BLOCK):
                raw = _encode(cols, lo, min(m, lo + STORE_BLOCK))
                z = codec.compress(raw, asbytes=True)
                f.write(z)
                offsets[b + 1, :2] = offsets[b, 0] + len(z), offsets[b, 1] + len(raw)
                offsets[b, 2] = zlib.crc32(z)
                b += 1
    with open(index + ".tmp", "wb") as f:
        np.save(f, offsets)
    os.replace(store + ".tmp", store)
    os.replace(index + ".tmp", index)


def write_store_table(docs_dir: str, name: str, table: pa.Table, slice_rows: int | None = None) -> None:
    """``write_store`` from a docs table (doc_id, title, text, content_hash and maybe fields),
    its values made Python strings ``slice_rows`` documents at a time (rounded up to whole
    blocks; None: all at once): the same bytes, with memory for a slice instead of the shard."""
    n = table.num_rows
    step = n if slice_rows is None else -(-max(1, slice_rows) // STORE_BLOCK) * STORE_BLOCK
    has_fields = "fields" in table.column_names

    def slices():
        for lo in range(0, n, max(1, step)):
            part = table.slice(lo, step)
            col = lambda c: part.column(c).to_pylist()  # noqa: E731
            yield [col("doc_id"), col("title"), col("text"), col("content_hash"),
                   col("fields") if has_fields else [None] * part.num_rows]

    _write_blocks(docs_dir, name, n, slices())


class StoreDamaged(ValueError):
    """A store or its index that does not hold what the shard says; the message says what, and
    the reader (``serving.index.DocStore``) names the store's path before it."""


class StoreReader:
    """One shard's store, memory-mapped (closed when dropped, as the parquet handles are);
    ``block(b)`` decompresses block ``b`` (a `StoreBlock`)."""

    def __init__(self, store: str, index: str, n_docs: int):
        try:
            offsets = np.load(index, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise StoreDamaged(f"its block index {os.path.basename(index)} cannot be read ({e})") from e
        n_blocks = -(-n_docs // STORE_BLOCK)
        size = os.path.getsize(store)
        if (offsets.dtype != np.int64 or offsets.shape != (n_blocks + 1, 3) or offsets[0, 0] != 0
                or offsets[0, 1] != 0 or np.any(np.diff(offsets[:, :2], axis=0) < 0) or offsets[-1, 0] != size):
            raise StoreDamaged(f"its block index {os.path.basename(index)} does not match {n_docs} documents in a "
                               f"{size}-byte store")
        self.offsets, self.n_docs, self.path = offsets, n_docs, store
        self._codec = _codec()
        with open(store, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def block(self, b: int) -> tuple[StoreBlock, int]:
        """Block ``b`` (its values decoded when asked for), and its uncompressed size."""
        (c0, r0, crc), (c1, r1, _) = self.offsets[b].tolist(), self.offsets[b + 1].tolist()
        rows = min(STORE_BLOCK, self.n_docs - b * STORE_BLOCK)
        head = 4 * (rows * len(STORE_COLUMNS) + 1)
        z = self._map[c0:c1]
        if zlib.crc32(z) != crc:
            raise StoreDamaged(f"block {b} (bytes {c0} to {c1}) does not match its checksum")
        try:
            raw = self._codec.decompress(z, decompressed_size=r1 - r0, asbytes=True)
        except pa.ArrowException as e:
            raise StoreDamaged(f"block {b} does not decompress ({e})") from e
        n = head // 4
        ends = list(struct.unpack_from(f"<{n}I", raw)) if len(raw) >= head else None
        if ends is None or ends[0] != 0 or ends[-1] != len(raw) - head:
            raise StoreDamaged(f"block {b}'s header does not fit its {len(raw)} bytes")
        return StoreBlock(raw, head, ends, self.path), len(raw)


class StoreBlock:
    """One decompressed block: ``value(column, row)`` decodes one document's value."""

    __slots__ = ("raw", "head", "ends", "path")

    def __init__(self, raw: bytes, head: int, ends: list[int], path: str):
        self.raw, self.head, self.ends, self.path = raw, head, ends, path

    def value(self, column: str, row: int) -> str | None:
        j = row * len(STORE_COLUMNS) + STORE_COLUMNS.index(column)
        a, b = self.ends[j], self.ends[j + 1]
        if not a <= b <= self.ends[-1]:  # each value is checked as it is read (a header check
            raise StoreDamaged(f"a stored {column} lies outside its block")  # costs 20 us)
        try:
            v = self.raw[self.head + a:self.head + b].decode("utf-8")
        except UnicodeDecodeError as e:
            raise StoreDamaged(f"a stored {column} is not UTF-8 ({e})") from e
        return v if v or column != "fields" else None
