"""Opening a published index version: verify the manifest and checksums, memory-map the shards.

``IndexVersion`` is read-only and safe to share between threads once opened (the only
mutable state is caches that tolerate races). ``VersionFollower`` keeps a long-lived
server on the version CURRENT names, and on its last good version when a newly named
one fails to open. Serving imports ``funnel.pipelines`` only for the artifact contract
(manifest, stats) and the query-time analyzer.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Callable, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from funnel.pipelines.store import remote
from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
from funnel.pipelines.store.docstore import STORE_BLOCK, StoreBlock, StoreDamaged, StoreReader, store_paths
from funnel.pipelines.store.docorder import DOC_IDS, id_ranks, open_doc_ids, read_doc_ids
from funnel.pipelines.store.artifacts import (CURRENT, MANIFEST, VERIFY_MODES, IndexFormatError, ReaderLease,
                                        is_version_name, list_versions, read_current, read_stamps, verify_version,
                                        version_parts, write_stamps)
from funnel.pipelines.lexical.postings import load_block_maxima, load_impacts, load_shard
from funnel.serving.lexical.packed import PackedShard, PostingsCache, cache_budget, load_postings, own_copy, shared_tf_dtype
from funnel.pipelines.lexical.shard import shard_name
from funnel.pipelines.lexical.stats import Vocabulary, read_terms

from .lexical.bm25 import ShardScorer, idf_lucene
from .errors import IndexDamaged
from .result import split_docno
from .structure import check_doc_ids, check_shard

log = logging.getLogger(__name__)


def resolve_version_dir(root: str, version: str | None = None) -> str:
    """The directory of ``version`` (default: the one CURRENT names), with clear errors.

    For a remote root (``s3://...``) it is the version's URI: nothing is copied here.
    """
    if remote.is_remote(root):
        return f"{root.rstrip('/')}/{version or remote.current_version(root)}"
    if not os.path.exists(root):
        raise FileNotFoundError(f"index path {root!r} does not exist; build one with `funnel build --corpus ... --out {root}`")
    if os.path.exists(os.path.join(root, "manifest.json")):
        return root  # a version directory given directly
    named_by = "CURRENT names"
    if version is None:
        version = read_current(root)  # refuses anything but a version name
        if version is None:
            found = list_versions(root)
            hint = f" (versions present: {', '.join(found)}; is a build still running?)" if found else ""
            raise IndexFormatError(f"{root!r} is not a funnel index: no CURRENT file{hint}. "
                                   f"Build one with `funnel build --corpus ... --out {root}`")
    else:
        named_by = "version"
        if not is_version_name(version):
            raise IndexFormatError(f"{version!r} is not a version name (v and six digits, e.g. v000001); "
                                   f"versions of {root!r}: {', '.join(list_versions(root)) or 'none'}")
    vdir = os.path.join(root, version)
    if not os.path.isdir(vdir):
        raise IndexFormatError(f"{root!r}: {named_by} {version!r}, which does not exist")
    return vdir


def forget_verification(version_dir: str, rel: str) -> None:
    """Drop this host's record that ``rel`` of ``version_dir`` was hashed and matched, so the
    next cached open here hashes it again (and refuses the version while it is damaged),
    a restart included."""
    stamps = read_stamps(version_dir)
    if rel in stamps:
        del stamps[rel]
        write_stamps(version_dir, stamps)


def _damaged(path: str, e: BaseException) -> IndexFormatError:
    return IndexFormatError(
        f"{path} cannot be read ({type(e).__name__}: {e}): the index version is damaged. Run "
        "`funnel verify INDEX_ROOT` to find every damaged file, and rebuild the index (funnel build ...)")


def _read_parquet(path: str, columns: list[str], **kw) -> pa.Table:
    """One file's ``columns``, failures (corrupt pages, truncated files) naming the file.
    ``ParquetFile.read``, not ``pq.read_table``: the latter goes through ``pyarrow.dataset``,
    whose import pulls in pandas (~0.2 s of every `funnel search` process)."""
    try:
        with pq.ParquetFile(path) as f:
            return f.read(columns=columns, **kw)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise _damaged(path, e) from e


#: Bytes of decoded document text a ``DocStore`` keeps (``FUNNEL_DOC_CACHE_MIB``, default 1024).
DOC_CACHE_BYTES = int(float(os.environ.get("FUNNEL_DOC_CACHE_MIB") or 1024) * 2 ** 20)
_TEXT_COLUMNS = ("doc_id", "title", "text", "content_hash")
#: Read with them where the file has it: each document's fields as JSON (``pipelines/sources/fields.py``).
_FIELDS_COLUMN = "fields"


_SURROGATE = re.compile("[\ud800-\udfff]")


class DocStore:
    """Documents by docno, from ``docs/shard-NNNN.store`` (or ``.parquet``).

    Ids load at open; a document's text is read with its stored block (``STORE_BLOCK``
    documents, ~40 us; pipelines.store.docstore) the first time it is asked for, or, for a shard
    built before the store, with its parquet row group (``DOCS_ROW_GROUP`` rows, ~1.3 ms).
    Decoded blocks and groups stay in an LRU bounded by
    ``cache_bytes`` of their text, so memory does not grow with the corpus (keeping a whole
    shard's text as Python strings once one of its documents is shown would). A miss reads
    its group only
    (an index built before ``DOCS_ROW_GROUP`` has groups of 8,192 rows or one per shard; it
    still works, with larger reads).
    """

    def __init__(self, version_dir: str, n_shards: int, cache_bytes: int | None = None,
                 damaged: Callable[[str, str], Exception] | None = None):
        self.dir = os.path.join(version_dir, "docs")
        # A store found damaged by a read: recorded as a query's finding (``IndexVersion.damaged``:
        # the version stops being served) where the version gives a recorder. Held weakly: the
        # version holds this store, and a cycle would keep a replaced version (and its reader
        # lease) alive until a garbage collection.
        self._on_damage = weakref.WeakMethod(damaged) if hasattr(damaged, "__self__") else \
            (lambda: damaged)
        self.n_shards = n_shards
        self.cache_bytes = DOC_CACHE_BYTES if cache_bytes is None else int(cache_bytes)
        self._files: dict[int, tuple[pq.ParquetFile, np.ndarray]] = {}  # shard: (file, group starts)
        # Idle read handles per shard. Reads run outside the lock, each on a handle no other
        # thread is using (one ParquetFile is not documented as safe to read from two threads
        # at once); a request thread takes one, or opens one when all are busy, and puts it back.
        self._idle: dict[int, list[pq.ParquetFile]] = {}
        self._stores: dict[int, StoreReader | None] = {}  # shard: its store (None: it has none)
        self._groups: OrderedDict[tuple[int, int], tuple[dict[str, list], int]] = OrderedDict()
        self._cached = 0  # text bytes in self._groups
        self._lock = threading.Lock()
        with self._lock:  # each file's row count, from its footer
            bounds = np.cumsum([0] + [int(self._file(s)[1][-1]) for s in range(n_shards)])
        self._bounds = bounds
        # Position of each document's id in the sorted list of all ids: score ties are broken
        # by doc_id ascending (as Anserini does) with integer compares. The build stores the
        # ids and their ranks in one memory-mapped file (pipelines.store.docorder); an index built
        # before that reads every doc_id column and sorts them here.
        self._arrow: pa.ChunkedArray | None = None  # every id, in docno order, once read
        stored = os.path.join(version_dir, DOC_IDS)
        if os.path.exists(stored):
            try:
                self._arrow, rank = open_doc_ids(stored, int(bounds[-1]))
            except (OSError, ValueError, pa.ArrowException) as e:
                raise _damaged(stored, e) from e
            check_doc_ids(version_dir, DOC_IDS, self._arrow, rank, int(bounds[-1]))
        else:
            rank = id_ranks(self._ids_arrow())
        #: Every document's rank by doc_id, in docno order: one writable int64 array (as the
        #: kernels take it), and `id_rank` its per-shard views.
        self.rank = rank
        self.id_rank = [rank[bounds[s]:bounds[s + 1]] for s in range(n_shards)]
        # No id is made a Python str until asked for: ids by position are cut from Arrow's
        # buffers (`ids_at`), which the index memory-maps, and a lookup by id searches them
        # in sorted order (`docno_of`).
        self._id_bufs: tuple | None = None  # (Arrow array, offsets, data), at the first `ids_at`
        self._ids_lock = threading.Lock()
        self._id_table: object = None  # runbytes.IdTable, False where it cannot be used; built on first use
        self._order: np.ndarray | None = None  # global positions sorted by doc_id, built on first use
        self._last_positions: tuple | None = None  # (ids, their positions): `positions_of`'s last

    def _ids_arrow(self) -> pa.ChunkedArray:
        """Every doc_id as one Arrow array (docno order), read at the first call."""
        if self._arrow is None:
            self._arrow = read_doc_ids(os.path.dirname(self.dir), self.n_shards, _read_parquet)
        return self._arrow

    #: Above this many ids, `ids_at` asks Arrow's take (one vectorized call: ~0.6 ms for 10,000
    #: ids at 3M documents); below, it cuts each id from the buffers (~0.35 us an id).
    TAKE_ABOVE = 128

    def _id_buffers(self) -> tuple:
        """(the ids as one Arrow array, its offsets as a memoryview of ints, its data as a
        memoryview): views of the ids' file where the index stores one (`open_doc_ids`: one
        chunk), else of the one array the docs files' columns are combined into."""
        b = self._id_bufs
        if b is None:
            with self._ids_lock:
                if self._id_bufs is None:
                    arr = self._ids_arrow()
                    arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
                    if arr.null_count or not len(arr):
                        self._id_bufs = (arr, None, None)
                    else:
                        _, offsets, data = arr.buffers()
                        wide = pa.types.is_large_string(arr.type)
                        off = memoryview(offsets).cast("q" if wide else "i")
                        self._id_bufs = (arr, off[arr.offset:arr.offset + len(arr) + 1], memoryview(data))
                b = self._id_bufs
        return b

    def ids_at(self, pos) -> np.ndarray:
        """The doc_ids (object array, ``pos``'s shape) at global positions (shards concatenated
        in docno order; negative ones count from the end, as NumPy indexes), without making
        every id a Python str: a 3M-document index's server stays ~200 MiB smaller."""
        pos = np.asarray(pos, dtype=np.int64)
        arr, off, data = self._id_buffers()
        n = len(arr)
        if off is None or pos.size > self.TAKE_ABOVE:
            flat = pos.ravel()
            if flat.size and (flat.min() < -n or flat.max() >= n):
                raise IndexError(f"a position out of range for {n} documents")
            out = arr.take(pa.array(np.where(flat < 0, flat + n, flat))).to_numpy(zero_copy_only=False)
            return out.reshape(pos.shape)
        ids = []
        for p in pos.ravel().tolist():
            if not -n <= p < n:
                raise IndexError(f"position {p} is out of range for {n} documents")
            if p < 0:
                p += n
            ids.append(str(data[off[p]:off[p + 1]], "utf-8"))
        out = np.empty(len(ids), dtype=object)
        out[:] = ids
        return out.reshape(pos.shape)

    def id_at(self, position: int) -> str:
        """The doc_id at one global position (`ids_at`)."""
        return self.ids_at(np.array([position]))[0]

    def __len__(self) -> int:
        return int(self._bounds[-1])

    def shard_size(self, shard: int) -> int:
        """Documents in ``shard``."""
        return int(self._bounds[shard + 1] - self._bounds[shard])

    def doc_id(self, n: int) -> str:
        s, i = split_docno(n)
        if not 0 <= i < self.shard_size(s):
            raise IndexError(f"shard {s} has {self.shard_size(s)} documents, no document {i}")
        return self.id_at(self._bounds[s] + i)

    def doc_ids_of(self, docnos: np.ndarray) -> list[str]:
        """Vectorized ``doc_id`` for an array of docnos."""
        docnos = np.asarray(docnos, dtype=np.int64)
        return self.ids_at(self._bounds[docnos >> 32] + (docnos & 0xFFFFFFFF)).tolist()

    def id_table(self):
        """Every id as one byte buffer with offsets and str-order ranks (``runbytes.IdTable``,
        what the run writer formats lines from), or None where some id is not plain ASCII
        without whitespace. Built at the first call (Arrow's buffers, one check pass)."""
        if self._id_table is None:
            from funnel.evaluation import runbytes
            with self._lock:
                if self._id_table is None:
                    arr = self._ids_arrow().cast(pa.large_string()).combine_chunks()
                    raw, off = np.zeros(0, np.uint8), np.zeros(1, np.int64)
                    if len(arr):
                        _, offsets, data = arr.buffers()
                        off = np.frombuffer(offsets, dtype=np.int64)[arr.offset:arr.offset + len(arr) + 1]
                        raw = np.frombuffer(data, dtype=np.uint8)[off[0]:off[-1]]
                        off = off - off[0]
                    table = runbytes.id_table(raw, off, self.rank) if arr.null_count == 0 else None
                    self._id_table = table if table is not None else False
        return self._id_table or None

    def docno_of(self, doc_id: str) -> int | None:
        """The docno of ``doc_id``, or None where no document has it: a binary search of the
        ids in sorted order (`sorted_positions`), each probe's id cut from the ids' buffers
        (22 probes at 3M documents: 11.5 us a lookup there). The map of every id it replaces
        was 415 MiB of Python objects at 3M documents, made at the first lookup (2 s) and kept."""
        pos = self._position_of_id(doc_id)
        return None if pos is None else int(self.docnos_at(np.array([pos]))[0])

    def _position_of_id(self, doc_id: str) -> int | None:
        if not isinstance(doc_id, str):
            return None
        arr, off, data = self._id_buffers()
        if off is None:  # no ids, or an id missing (an index the checks would not open)
            hit = np.flatnonzero(arr.to_numpy(zero_copy_only=False) == doc_id) if len(arr) else []
            return int(hit[0]) if len(hit) else None
        want = doc_id.encode("utf-8", "surrogatepass")  # UTF-8 byte order is code point order
        order = self.sorted_positions()
        lo = self._first_rank(want, 0, False)
        if lo < len(order):
            p = int(order[lo])
            if bytes(data[off[p]:off[p + 1]]) == want:
                return p
        return None

    def _first_rank(self, want: bytes, lo: int, past: bool) -> int:
        """The first rank in `sorted_positions` from ``lo`` on whose id's first ``len(want)``
        bytes are at least ``want`` (or, with ``past``, above it): a binary search, each
        probe's bytes cut from the ids' buffers (the caller checked they exist). Those heads
        sort as the whole ids do where ``want`` is a whole id, so the first id at least
        ``want`` is found the same way."""
        _, off, data = self._id_buffers()
        order = self.sorted_positions()
        n = len(want)
        hi = len(order)
        while lo < hi:
            mid = (lo + hi) >> 1
            p = int(order[mid])
            a = off[p]
            head = bytes(data[a:min(a + n, off[p + 1])])
            if head < want or (past and head == want):
                lo = mid + 1
            else:
                hi = mid
        return lo

    #: Above this many ids, `positions_of` scans every id once (Arrow's ``is_in``: ~40 ms at
    #: 3M documents) instead of one binary search an id (~11 us each there).
    SCAN_ABOVE = 1024

    def positions_of(self, doc_ids, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The global positions in [``lo``, ``hi``) (one shard's, say) of the documents whose
        ids are among ``doc_ids`` (ascending; ids no document has are left out). The last
        list asked for is remembered, so a filter evaluated shard by shard looks it up once."""
        key = tuple(doc_ids)
        last = self._last_positions
        if last is not None and last[0] == key:
            pos = last[1]
        else:
            pos = self._positions(key)
            self._last_positions = (key, pos)
        hi = len(self) if hi is None else hi
        return pos[np.searchsorted(pos, lo):np.searchsorted(pos, hi)]

    def _positions(self, doc_ids: tuple) -> np.ndarray:
        wanted = [d for d in doc_ids if isinstance(d, str) and not _SURROGATE.search(d)]  # else no id is one
        if len(wanted) <= self.SCAN_ABOVE:
            found = (self._position_of_id(d) for d in wanted)
            return np.unique(np.asarray([p for p in found if p is not None], dtype=np.int64))
        import pyarrow.compute as pc
        ids = self._ids_arrow()
        hit = pc.is_in(ids, value_set=pa.array(wanted, type=ids.type))
        return np.flatnonzero(hit.to_numpy(zero_copy_only=False)).astype(np.int64)

    # -- ids in sorted order (listing, prefixes) -------------------------------------------
    def sorted_positions(self) -> np.ndarray:
        """Every document's global position (shards concatenated in docno order, as filter
        masks index them), sorted by doc_id (code point order); from the stored ranks, so
        nothing is sorted here."""
        order = self._order
        if order is None:
            order = np.empty(len(self.rank), dtype=np.int64)
            order[np.asarray(self.rank)] = np.arange(len(self.rank), dtype=np.int64)
            self._order = order
        return order

    def id_range(self, prefix: str) -> tuple[int, int]:
        """``[lo, hi)``: where the doc_ids starting with ``prefix`` lie in
        `sorted_positions` (two binary searches; an id's first ``len(prefix)``
        characters sort as the ids do, and so do their UTF-8 bytes: each probe's bytes are
        cut from the ids' buffers, as `docno_of`'s are)."""
        order = self.sorted_positions()
        arr, off, data = self._id_buffers()
        if off is None:  # no ids, or an id missing (an index the checks would not open)
            import bisect
            n = len(prefix)

            def head(j: int) -> str:
                return self.id_at(order[j])[:n]

            lo = bisect.bisect_left(range(len(order)), prefix, key=head)
            return lo, bisect.bisect_right(range(lo, len(order)), prefix, key=head) + lo
        want = prefix.encode("utf-8", "surrogatepass")
        lo = self._first_rank(want, 0, False)
        return lo, self._first_rank(want, lo, True)

    def docnos_at(self, positions: np.ndarray) -> np.ndarray:
        """The docnos (``shard << 32 | local_id``) of global positions."""
        positions = np.asarray(positions, dtype=np.int64)
        shard = np.searchsorted(self._bounds, positions, side="right") - 1
        return (shard.astype(np.int64) << 32) | (positions - self._bounds[shard])

    def position_of(self, docno: int) -> int:
        """The global position of ``docno``."""
        s, i = split_docno(docno)
        return int(self._bounds[s]) + i

    def _file(self, shard: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """The shard's docs file and the first row of each of its row groups (+ the row
        count); call with the lock held."""
        got = self._files.get(shard)
        if got is None:
            path = os.path.join(self.dir, f"{shard_name(shard)}.parquet")
            try:
                pf = pq.ParquetFile(path, memory_map=True)
                md = pf.metadata
                starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
            except (OSError, ValueError, pa.ArrowException) as e:
                raise _damaged(path, e) from e
            got = self._files[shard] = (pf, starts)
            self._idle[shard] = [pf]
        return got

    def _read(self, shard: int, group: int) -> pa.Table:
        """The text columns of one row group, read without the lock on a handle of this
        call's own."""
        path = os.path.join(self.dir, f"{shard_name(shard)}.parquet")
        with self._lock:
            idle = self._idle[shard]
            pf = idle.pop() if idle else None
        try:
            if pf is None:
                pf = pq.ParquetFile(path, memory_map=True)
            extra = [_FIELDS_COLUMN] if _FIELDS_COLUMN in pf.schema_arrow.names else []
            # One thread: a group is a few hundred rows, and Arrow's pool costs more than it saves.
            t = pf.read_row_group(group, columns=list(_TEXT_COLUMNS) + extra, use_threads=False)
        except (OSError, ValueError, pa.ArrowException) as e:
            raise _damaged(path, e) from e
        with self._lock:
            self._idle[shard].append(pf)
        return t

    @staticmethod
    def _decode(t: pa.Table) -> tuple[dict[str, list], int]:
        """A row group's text columns (and fields) as Python lists, and its size (what the bound
        counts)."""
        return {c: t.column(c).to_pylist() for c in t.column_names}, t.nbytes

    def _keep(self, key: tuple[int, int], hit: tuple[dict[str, list], int]) -> tuple[dict[str, list], int]:
        """Cache a decoded row group (lock held), evicting the least recently used beyond the
        bound; a group another thread cached meanwhile is kept as it is."""
        got = self._groups.get(key)
        if got is not None:
            return got
        self._groups[key] = hit
        self._cached += hit[1]
        while self._cached > self.cache_bytes and len(self._groups) > 1:
            self._cached -= self._groups.popitem(last=False)[1][1]
        return hit

    def _row(self, shard: int, i: int) -> tuple[StoreBlock | dict[str, list], int]:
        """(the stored block, or the decoded text columns of the row group, holding the shard's
        row ``i``; i's row there).

        A miss reads that one block (``STORE_BLOCK`` documents) or, for a shard without a store,
        that one group (``DOCS_ROW_GROUP`` rows, ~1 ms), never the whole shard: reading a
        whole 250K-document shard for one snippet costs about a second. The read and the
        decoding run outside the lock, so concurrent requests wait for each other only to look up and update the cache; two
        threads missing the same group at once may both read it, and the first to finish
        caches it."""
        with self._lock:
            _, starts = self._file(shard)
            if not 0 <= i < starts[-1]:
                raise IndexError(f"shard {shard} has {starts[-1]} documents, no document {i}")
            store = self._store(shard, int(starts[-1]))
            if store is not None:
                g, r = divmod(i, STORE_BLOCK)
            else:
                g = int(np.searchsorted(starts, i, side="right")) - 1
                r = i - int(starts[g])
            key = (shard, g)
            hit = self._groups.get(key)
            if hit is not None:
                self._groups.move_to_end(key)
                return hit[0], r
        if store is not None:
            try:
                hit = store.block(g)
            except StoreDamaged as e:
                raise self._store_damaged(store.path, e) from e
        else:
            hit = self._decode(self._read(shard, g))
        with self._lock:
            return self._keep(key, hit)[0], r

    def _store(self, shard: int, n_docs: int) -> StoreReader | None:
        """The shard's store, opened and checked at its first use (lock held); None where the
        shard has none (built before the store: its parquet groups are read instead)."""
        if shard in self._stores:
            return self._stores[shard]
        store, index = store_paths(self.dir, shard_name(shard))
        got = None
        if os.path.exists(store) or os.path.exists(index):
            try:
                got = StoreReader(store, index, n_docs)
            except (OSError, StoreDamaged) as e:
                raise self._store_damaged(store, e) from e
        self._stores[shard] = got
        return got

    def _values(self, n: int, columns: tuple[str, ...]) -> list:
        """Document ``n``'s ``columns``, from its stored block or its parquet row group."""
        s, i = split_docno(n)
        block, r = self._row(s, i)
        if isinstance(block, StoreBlock):
            try:
                return [block.value(c, r) for c in columns]
            except StoreDamaged as e:
                raise self._store_damaged(block.path, e) from e
        return [block[c][r] if c in block else None for c in columns]

    def _store_damaged(self, path: str, e: Exception) -> Exception:
        """The error for a store that does not read as its index says (``StoreDamaged``)."""
        record = self._on_damage()
        if record is None:
            return _damaged(path, e)
        rel = os.path.relpath(path, os.path.dirname(self.dir))
        return record(rel, str(e))

    def get(self, n: int) -> dict:
        doc_id, title, text, content_hash = self._values(n, _TEXT_COLUMNS)
        s, i = split_docno(n)
        return {"doc_id": doc_id, "title": title, "text": text, "content_hash": content_hash, "shard": s,
                "local_id": i}

    def fields_json(self, n: int) -> str | None:
        """Document ``n``'s fields as the JSON text the build stored (None: it has none, or the
        index was built before documents kept fields); read with its block, as ``get``."""
        return self._values(n, (_FIELDS_COLUMN,))[0]


def _in_memory(arrays: dict, impacts: tuple | None) -> tuple[dict, tuple | None]:
    """A plain shard's postings (document ids, tfs, stored impact levels) read into the
    process's memory (``FUNNEL_LOAD_POSTINGS``, ``packed.load_postings``), read-only as the
    mapped arrays are (so the kernels compiled for those serve them), checked as they were."""
    arrays = {**arrays, "docs": own_copy(arrays["docs"]), "tfs": own_copy(arrays["tfs"])}
    if impacts is not None:
        impacts = (impacts[0], own_copy(impacts[1]))
    return arrays, impacts


class IndexVersion:
    """One opened, verified, immutable index version.

    ``verify``: ``full`` checks the manifest against its own sha256 and every file against
    the manifest's sha256, streamed on a few threads (SciFact, 43 files and 27 MB, page
    cache warm: 13-20 ms on two cores; 1M synthetic documents, 1.6 GB: ~0.6 s warm, seconds
    cold); ``cached`` (default) does the same but skips a file this host already hashed
    (at publish, or an earlier open) whose size, mtime, ctime, inode and device are
    unchanged since (``pipelines.store.artifacts.verify_version``); ``sizes`` checks the
    manifest's sha256 and every file's size; ``none`` nothing. What fails at open, or when
    a document file is read later, is an IndexFormatError naming the file. With ``sizes``
    or ``none`` a flipped byte in a postings array goes unseen until it changes or breaks
    results; with ``cached``, a flip that leaves the file's stat as it was (the disk's own
    decay, not a write) goes unseen until ``funnel verify`` (``full``) or a server's
    background scrub (``serving.frontends.scrub``) hashes it again. Whatever the mode, every open
    checks the invariants the compiled kernels index by (``serving.structure``: ids
    within their arrays, offsets in order), so no file's content makes a kernel read
    outside an array; a violation is an IndexFormatError naming the file.

    Bytes that change after the open are read as they are (the arrays are memory-mapped):
    the kernels check every value they index with as they read it, and a query that meets
    an impossible one calls `damaged`, which records this version as damaged (it
    answers no more BM25 queries; ``on_damage``, set by a ``VersionFollower``, stops
    serving it) and gives the `IndexDamaged` to raise.
    """

    #: Called with (file relative to this version, reason) the first time a query finds a
    #: file damaged (`damaged`); a ``VersionFollower`` sets it to its quarantine.
    on_damage: Callable[[str, str], None] | None = None
    #: (file, reason) of the damage a query found; None while none was found.
    damage: tuple[str, str] | None = None

    def __init__(self, root: str, version: str | None = None, verify: str = "cached"):
        if verify not in VERIFY_MODES:
            raise ValueError(f"unknown verify mode {verify!r}; choose one of {', '.join(VERIFY_MODES)}")
        if remote.is_remote(root):  # a verified copy in the local cache, opened as any local version
            self.dir, self.manifest = remote.fetch_version(root, version, verify)
            self._lease = _lease(self.dir)
        else:
            self.dir = resolve_version_dir(root, version)
            self._lease = _lease(self.dir)  # before reading: retention and gc now leave it alone
            self.manifest = verify_version(self.dir, verify)
        # Released by close(), or when this object goes (a follower's switch drops it).
        self._release = weakref.finalize(self, self._lease.release) if self._lease is not None else None
        self._damage_lock = threading.Lock()
        self.root = root
        self.version = os.path.basename(os.path.normpath(self.dir))
        self._cache_budget = cache_budget()  # a bad FUNNEL_POSTINGS_CACHE_MB: its own clear error, not "damaged"
        self._load_postings = load_postings()  # the same for FUNNEL_LOAD_POSTINGS
        try:
            self._load()
        except IndexFormatError:
            raise
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise IndexFormatError(
                f"index version {self.dir} cannot be opened ({type(e).__name__}: {e}); it is damaged or was "
                "written by another funnel. Run `funnel verify INDEX_ROOT` and rebuild the index "
                "(funnel build ...)") from e
        log.info("opened %s (%d docs, %d shards, %d terms, verify=%s)", self.dir, self.n_docs, self.n_shards,
                 len(self.vocab), verify)

    def close(self) -> None:
        """Release the reader lease on this version now (retention and gc may then delete it);
        idempotent. Arrays already handed out stay readable until they are dropped."""
        if self._release is not None:
            self._release()

    def _load(self) -> None:
        acfg = self.manifest["analyzer"]
        self.analyzer = Analyzer(AnalyzerConfig(stopwords=acfg["stopwords"], stemmer=acfg["stemmer"]))
        if self.analyzer.fingerprint() != acfg["fingerprint"]:
            raise IndexFormatError(
                f"analyzer mismatch: the index was built with analyzer fingerprint {acfg['fingerprint']}, "
                f"this funnel's query analyzer has {self.analyzer.fingerprint()}. Queries would not match "
                "the indexed terms; rebuild the index with this funnel version")
        coll = self.manifest["collection"]
        self.n_docs = int(coll["n_docs"])
        self.n_docs_nonempty = int(coll["n_docs_nonempty"])
        self.avgdl = float(coll["avgdl"])
        self.n_shards = int(coll["n_shards"])
        terms, df, cf = read_terms(self.dir, int(coll["n_terms"]) if "n_terms" in coll else None)
        self.vocab = Vocabulary(terms)  # term -> global id, no Python object per term
        self._n_terms = len(terms)
        self.df = df
        self.cf = cf
        self.idf = idf_lucene(df, self.n_docs_nonempty)
        self.docs = DocStore(self.dir, self.n_shards, damaged=self.damaged)
        if len(self.docs) != self.n_docs:
            raise IndexFormatError(f"index version {self.dir} is damaged: its documents files hold {len(self.docs)} "
                                   f"documents, its manifest says {self.n_docs}; run `funnel verify INDEX_ROOT` "
                                   "and rebuild the index (funnel build ...)")
        self.shards = []
        tf_dtype = shared_tf_dtype([os.path.join(self.dir, "lexical", shard_name(s)) for s in range(self.n_shards)])
        for s in range(self.n_shards):  # each checked before a kernel may read it (serving.structure)
            rel = f"lexical/{shard_name(s)}"
            arrays, blocks, impacts = self._check_shard(s)
            packed = None
            if self._load_postings and "docs" in arrays:
                arrays, impacts = _in_memory(arrays, impacts)
            if "docs" not in arrays:  # packed postings: decoded on demand (serving.lexical.packed)
                packed = PackedShard(os.path.join(self.dir, rel), np.asarray(arrays["indptr"]),
                                     len(arrays["doclen"]), rel, tf_dtype, load=self._load_postings)
                # Every reader of this shard's term ranges reads the packed shard's own copy,
                # so the mapped file is let go: one copy in memory instead of two (23 MiB at
                # 3M documents, Zipf corpus).
                arrays = {**arrays, "indptr": packed.indptr}
                impacts = None  # none stored: decoded terms get theirs (BM25Retriever._keep_levels)
            self.shards.append(ShardScorer(arrays, self.avgdl, blocks, impacts, rel=rel, packed=packed))
        # The decoded terms of packed shards, bounded (serving.lexical.packed); None: no shard is packed.
        self.postings_cache = (PostingsCache(self.shards, self._cache_budget)
                               if any(sh.packed is not None for sh in self.shards) else None)

    def _check_shard(self, s: int) -> tuple:
        """Shard ``s``'s arrays (``load_shard``, block maxima, impacts), mapped now, after the
        structure checks (``serving.structure.check_shard``; IndexFormatError)."""
        rel = f"lexical/{shard_name(s)}"
        d = os.path.join(self.dir, rel)
        arrays, blocks, impacts = load_shard(d, decode=False), load_block_maxima(d), load_impacts(d)
        check_shard(self.dir, rel, arrays, self.docs.shard_size(s), self._n_terms, blocks, impacts)
        return arrays, blocks, impacts

    def damaged(self, file: str, reason: str, shard: int | None = None) -> IndexDamaged:
        """Record that a query found ``file`` (relative to this version) holding an impossible
        value, for ``reason``; returns the `IndexDamaged` to raise.

        With ``shard``, the open's structure checks run again on that shard first, and the
        first broken invariant they name (file, value, position) is what is recorded. The
        first time: logged (ERROR), this host's verification record of the file dropped
        (``forget_verification``: the next cached open hashes it, and refuses the version),
        and ``on_damage`` called (a ``VersionFollower`` stops serving the version, as the
        background scrub's finding does). Later calls return the first finding's error.
        """
        if shard is not None and self.damage is None:
            try:
                self._check_shard(shard)
            except IndexFormatError as e:
                file, reason = getattr(e, "file", file), getattr(e, "reason", reason)
            except (OSError, ValueError) as e:  # the file no longer opens at all
                reason = f"{reason} (and it cannot be read again: {type(e).__name__}: {e})"
        first = False
        with self._damage_lock:
            if self.damage is None:
                self.damage, first = (file, reason), True
        file, reason = self.damage
        path = os.path.join(self.dir, file)
        if first:
            log.error("%s %s: found while answering a query; version %s is damaged and answers no more "
                      "BM25 queries", path, reason, self.version)
            forget_verification(self.dir, file)
            if self.on_damage is not None:
                self.on_damage(file, reason)
        return IndexDamaged(
            f"{path} {reason}: index version {self.version} is damaged (its bytes changed while it was served; "
            "found while answering a query) and is no longer served. Run `funnel verify INDEX_ROOT` to find "
            "every damaged file; restore the file or rebuild the index (funnel build ...)", file=path)


def _lease(version_dir: str) -> ReaderLease | None:
    """A reader lease on ``version_dir`` when it is a ``vNNNNNN`` folder of an index root."""
    parts = version_parts(version_dir)
    return ReaderLease(*parts) if parts is not None else None


T = TypeVar("T")


def _stat_key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _file_key(path: str) -> tuple | None:
    """What any change to a file through the file system moves (``_stat_key`` and ctime)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, st.st_size)


def _peek_current(root: str) -> str | None:
    if remote.is_remote(root):
        return remote.peek_current(root)
    try:
        with open(os.path.join(root, CURRENT), "rb") as f:
            return f.read(200).decode("utf-8", "replace").strip() or None
    except OSError:
        return None


class VersionFollower(Generic[T]):
    """Follows CURRENT for a long-lived server; keeps the last good version when CURRENT breaks.

    ``open_version(name)`` opens one version (an `IndexVersion`, or a searcher built
    on one) and raises IndexFormatError or OSError when it cannot. ``current`` is what the
    server answers from. ``refresh()`` opens the version CURRENT now names; when that
    fails (torn manifest, bad checksum, missing files, CURRENT naming something outside
    the root) it keeps ``current``, records why in ``status()`` and returns False. It
    tries a failed version again when CURRENT or its manifest changes, or after ``retry_s``
    seconds (so a broken version is not re-hashed on every request).

    ``quarantine(version_dir, file, reason)`` (the background scrub, ``serving.frontends.scrub``,
    found a file that no longer matches its checksum, or a query found one holding an
    impossible value: ``IndexVersion.damaged``, which each opened version reports to its
    follower through ``on_damage``) stops serving that version at once:
    ``current`` raises IndexFormatError (HTTP 503) and ``status()`` says "unavailable"
    until the newest older version of the root that passes a full verification is
    opened, which is then served ("degraded"). A pinned follower, or a remote root, has
    no fallback. ``refresh()`` never goes back to a quarantined version while the damaged
    file's stat is unchanged (a repaired file is tried again); ``damaged()`` lists them.
    """

    def __init__(self, root: str, open_version: Callable[[str], T], version: str | None = None,
                 retry_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.root = root
        self._open = open_version
        self._retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._dir = resolve_version_dir(root, version)
        # Pinned: an explicit version, or a version folder given as the root.
        self._pinned = version is not None or os.path.normpath(self._dir) == os.path.normpath(root)
        self._current: T | None = open_version(version if version is not None else os.path.basename(self._dir))
        self._watch(self._dir, self._current)
        self._failed: tuple[tuple, float] | None = None
        self._status = self._ok_status()
        # version dir -> {"version", "file", "reason", "since"} and the file's key when found
        self._damaged: dict[str, tuple[dict, tuple | None]] = {}
        self.closed = False
        #: Called with each version `refresh` (or a fallback) opened, before it serves: a
        #: server's warm-up (``serving.frontends.warmup.follow``). What it raises is logged; the version
        #: serves anyway. ``warmed``: version name -> seconds its warm-up took.
        self.prepare: Callable[[T], object] | None = None
        self.warmed: dict[str, float] = {}

    @property
    def current(self) -> T:
        """What the server answers from; IndexFormatError when nothing verified is left to
        serve (a quarantined version and no good one to fall back to)."""
        got = self._current
        if got is None:
            raise IndexFormatError(f"no index version of {self.root} can be served: {self._status['reason']}")
        return got

    @current.setter
    def current(self, value: T) -> None:
        self._current = value

    @property
    def version(self) -> str:
        return os.path.basename(os.path.normpath(self._dir))

    @property
    def version_dir(self) -> str:
        """The folder of the version being served (or, when unavailable, of the one that failed)."""
        return self._dir

    def serving(self) -> tuple[str, T] | None:
        """(version folder, what answers from it), or None when nothing is served."""
        with self._lock:
            return None if self._current is None else (self._dir, self._current)

    def damaged(self) -> list[dict]:
        """``{"version", "file", "reason", "since"}`` of each version quarantined so far."""
        with self._lock:
            return [dict(rec) for rec, _ in self._damaged.values()]

    def _ok_status(self) -> dict:
        return {"state": "ok", "serving_version": self.version,
                "current": self.version if self._pinned else _peek_current(self.root),
                "pinned": self._pinned, "reason": None, "since": None}

    def _degrade(self, reason: str) -> None:
        if self._status["state"] == "degraded" and self._status["reason"] == reason:
            return
        if self._current is None:  # nothing is served: the state stays "unavailable", as it says why
            log.error("could not open the version CURRENT names either: %s", reason)
            return
        log.error("could not open the version CURRENT names; still serving %s: %s", self.version, reason)
        self._status = {"state": "degraded", "serving_version": self.version,
                        "current": _peek_current(self.root), "pinned": False, "reason": reason,
                        "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def status(self) -> dict:
        """``{"state": "ok" | "degraded" | "unavailable", "serving_version", "current", "pinned",
        "reason", "since"}``.

        ``current`` is what CURRENT holds (its first 200 characters); ``reason`` says why
        the version it names is not served; ``since`` (UTC) when that started.
        "unavailable" (``serving_version`` None): a served version was quarantined and no
        older one verifies; every search is refused until one is published.
        """
        return dict(self._status)

    def close(self) -> None:
        """Close what is being served (its ``close()``, when it has one) and follow nothing more;
        idempotent."""
        with self._lock:
            self.closed = True
            close = getattr(self._current, "close", None)
        if close is not None:
            close()

    def _watch(self, version_dir: str, opened) -> None:
        """Have the IndexVersion behind ``opened`` (itself, or its ``index``) report damage a
        query finds (``IndexVersion.damaged``) to `quarantine`, as the scrub does."""
        ix = opened if isinstance(opened, IndexVersion) else getattr(opened, "index", None)
        if isinstance(ix, IndexVersion):
            me = weakref.ref(self)
            vdir = os.path.normpath(version_dir)

            def report(file: str, reason: str) -> None:
                follower = me()
                if follower is not None:
                    follower.quarantine(vdir, file, f"{file} {reason} (found by a query)")
            ix.on_damage = report

    def _still_damaged(self, version_dir: str) -> bool:
        """Whether ``version_dir`` was quarantined and its damaged file has not changed since
        (a changed one, say restored from a backup, is verified again by the next open)."""
        got = self._damaged.get(version_dir)
        if got is None:
            return False
        rec, key = got
        if rec["file"] is None or _file_key(os.path.join(version_dir, rec["file"])) == key:
            return True
        del self._damaged[version_dir]
        return False

    def quarantine(self, version_dir: str, file: str, reason: str) -> bool:
        """Stop serving ``version_dir``: its ``file`` (relative) failed, for ``reason``.

        When it is the version being served, searches are refused at once; then the newest
        older version of the root that opens and passes a full verification (every file
        hashed) is served instead, with ``status()`` "degraded", or none is and the state
        stays "unavailable". Returns True when ``version_dir`` was being served.
        """
        version_dir = os.path.normpath(version_dir)
        name = os.path.basename(version_dir)
        rec = {"version": name, "file": file, "reason": reason,
               "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with self._lock:
            self._damaged[version_dir] = (rec, _file_key(os.path.join(version_dir, file)))
            if self.closed or self._current is None or os.path.normpath(self._dir) != version_dir:
                return False
            why = f"version {name} is damaged: {reason}"
            log.error("stopped serving %s: %s", name, why)
            self._current = None
            self._status = {"state": "unavailable", "serving_version": None,
                            "current": name if self._pinned else _peek_current(self.root), "pinned": self._pinned,
                            "reason": why + "; no verified earlier version to serve. Publish a good version "
                                            "(funnel build ...) or restore the file",
                            "since": rec["since"]}
        found = None if self._pinned or remote.is_remote(self.root) else self._fallback(version_dir)
        with self._lock:
            if found is None or self._current is not None or self.closed:
                if found is not None:  # refresh() put a newer version in place meanwhile
                    getattr(found[1], "close", lambda: None)()
                return True
            self._dir, self._current = found
            self._status = {"state": "degraded", "serving_version": self.version,
                            "current": _peek_current(self.root), "pinned": False,
                            "reason": f"{why}; serving the last good version, {self.version}",
                            "since": rec["since"]}
            log.error("serving %s instead of %s: %s", self.version, name, why)
        return True

    def _fallback(self, failed_dir: str) -> tuple[str, T] | None:
        """(folder, opened) of the newest version older than ``failed_dir`` that opens and
        whose every file matches its checksum; None when none does."""
        failed = os.path.basename(failed_dir)
        for name in reversed(list_versions(self.root)):
            vdir = os.path.join(self.root, name)  # as resolve_version_dir spells it (refresh compares)
            if name >= failed or os.path.normpath(vdir) in self._damaged:
                continue
            opened = None
            try:
                opened = self._open(name)  # leased from here on: gc leaves it alone
                verify_version(vdir, "full")
                damage = self._prepare(name, opened)
                if damage is not None:
                    raise IndexFormatError(f"{damage[0]} {damage[1]} (found by its warm-up)")
                self._watch(vdir, opened)
                return vdir, opened
            except (IndexFormatError, OSError) as e:
                log.error("cannot fall back to %s: %s", name, e)
                with self._lock:
                    self._damaged[os.path.normpath(vdir)] = ({"version": name, "file": None, "reason": str(e),
                                            "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}, None)
                if opened is not None:
                    getattr(opened, "close", lambda: None)()
        return None

    def _prepare(self, name: str, opened: T) -> tuple[str, str] | None:
        """Run `prepare` on a version about to serve (its seconds go to ``warmed``); the
        (file, reason) of damage its queries found (``IndexVersion.damage``), else None."""
        prepare = self.prepare
        if prepare is None:
            return None
        t = time.perf_counter()
        try:
            prepare(opened)
        except Exception as e:  # noqa: BLE001 - a cold version still answers correctly
            log.warning("warming version %s failed (%s: %s); it serves cold", name, type(e).__name__, e)
        else:
            self.warmed[name] = round(time.perf_counter() - t, 3)
            while len(self.warmed) > 16:  # the latest versions only: a long-lived server publishes many
                del self.warmed[next(iter(self.warmed))]
            log.info("warmed version %s in %.2fs before serving it", name, self.warmed[name])
        ix = opened if isinstance(opened, IndexVersion) else getattr(opened, "index", None)
        return ix.damage if isinstance(ix, IndexVersion) else None

    def refresh(self) -> bool:
        """Switch to the version CURRENT names if it opens (and, with `prepare`, once it is
        warm); True when it switched."""
        if self._pinned or self.closed:
            return False
        with self._lock:
            try:
                target = resolve_version_dir(self.root)
            except (IndexFormatError, OSError) as e:
                self._degrade(str(e))
                return False
            if self._still_damaged(os.path.normpath(target)):
                return False  # quarantined: keep the fallback (or nothing), and status says why
            if target == self._dir and self._current is not None:
                if self._status["state"] != "ok":
                    log.info("CURRENT names %s again, the version being served", self.version)
                    self._status = self._ok_status()
                return False
            key = (target, _stat_key(os.path.join(self.root, CURRENT)), _stat_key(os.path.join(target, MANIFEST)))
            if self._failed and self._failed[0] == key and self._clock() - self._failed[1] < self._retry_s:
                return False
            try:
                opened = self._open(os.path.basename(target))
            except (IndexFormatError, OSError) as e:
                self._failed = (key, self._clock())
                self._degrade(str(e))
                return False
            # Warmed before it serves, and before _watch: a warm-up query that finds damage must
            # not call quarantine() under this lock; the damage it found is read from the version.
            damage = self._prepare(os.path.basename(target), opened)
            if damage is not None:
                file, reason = damage
                self._damaged[os.path.normpath(target)] = (
                    {"version": os.path.basename(target), "file": file, "reason": reason,
                     "since": datetime.now(timezone.utc).isoformat(timespec="seconds")},
                    _file_key(os.path.join(target, file)))
                self._degrade(f"version {os.path.basename(target)} is damaged: {file} {reason} (found by its warm-up)")
                getattr(opened, "close", lambda: None)()
                return False
            self._watch(target, opened)
            old = self.version
            self.current, self._dir, self._failed = opened, target, None
            self._status = self._ok_status()
            log.info("switched from %s to %s", old, self.version)
            return True
