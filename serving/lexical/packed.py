"""Serving packed postings (``funnel build --postings packed``): a bounded cache of terms
decoded into the kernels' plain arrays, and every other term read from its blocks.

A packed shard stores its postings bit-packed (``kernels/packed.py``: about a fifth of the
plain ``docs.npy`` + ``tfs.npy`` + ``impacts.npy``). Each packed shard gets the plain arrays
the kernels read, as large as its postings, in anonymous memory that costs nothing until
written (``PackedShard.docs``, ``.tfs``, ``.impacts``: once the exhaustive path asks for
them, each posting's impact level for the default parameters, computed as the build
computes a plain shard's), and decodes terms into their own places in them.

With the default parameters (stored levels in use), a query or batch pins the terms that
fit the budget (`PostingsCache.fitting`: those decoded already, then the most asked for)
and the exhaustive approximate pass reads the rest straight from their blocks
(``kernels.accumulate_packed``, rescored through ``kernels.packed_tfs``), so a workload
whose terms outgrow the budget neither grows the process nor decodes them again and again.
What may give its place to a term being decoded: for a batch of queries, any unpinned term
the batch does not use (least recently used first); for one query, only terms asked for
less than half as often (TinyLFU's admission, with a margin). Every other path (pruning,
other ``k1``/``b``, filtered search) reads decoded postings: its terms are decoded and
pinned (`PostingsCache.pinned`, or the kernel answers ``NEED_DECODED`` and the query is
answered again that way), and
after it the least recently used terms beyond the budget give their pages back to the
system (``madvise(MADV_DONTNEED)``, a page shared with a neighbouring term once neither is
decoded). So a process holds the packed files plus at most about the budget of decoded
postings, plus the terms one query is reading at once. The budget is
``FUNNEL_POSTINGS_CACHE_MB`` (default ``DEFAULT_CACHE_MB``). A batch on those other paths
runs in parts (`PostingsCache.batch`): the terms its later parts need go last, and of the
rest those it used most recently go first, so a batch whose terms outgrow the budget, run
again, keeps its earliest parts' terms instead of decoding every term again on every run
(`PostingsCache._trim`; segmented and random eviction were tried too and did worse on some
workload of ``bench_workloads``).

Nothing else reads the shared arrays: the NumPy paths (explanations, filters' counts,
paging) decode a term into arrays of their own (`PackedShard.term`), and SIRA's batch kernel,
which chooses its expansion terms inside the kernel, decodes every term once and keeps them
(`PostingsCache.pin_all`: SIRA's forward index already holds every posting in memory).

Every value is checked as it is decoded or read from its block (``kernels/packed.py``); a
damaged block raises ``ShardFault`` (or the kernel's ``FAULT_PACKED``) naming ``packed.npy``,
and the open checks the block table itself (`check_packed`).
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections import Counter, OrderedDict
from contextlib import contextmanager

import numpy as np

from ..errors import ShardFault

# The codec (``kernels/packed.py``) is imported where a packed shard is opened, not here: a
# process that opens a plain index (one CLI query, say) never imports the kernels or numba.

PACKED_WORDS = "packed.npy"
PACKED_FILES = (PACKED_WORDS, "packed_boff.npy", "packed_first.npy", "packed_width.npy")
PACKED_KEY = "packed.json"
PACKED_FORMAT = 1
#: The decoded postings a process keeps by default, in MiB (``FUNNEL_POSTINGS_CACHE_MB``): at 3M
#: documents (bench_workloads' topical corpus) a server answering every workload then holds
#: about 1.9 GiB in all; 768 took it past 2 GiB, 512 decoded the SciFact-like claims' terms
#: again for every batch (8 bytes a decoded posting: id, tf, impact level).
DEFAULT_CACHE_MB = 640
_PAGE = mmap.PAGESIZE
#: Counts of terms asked for (`PostingsCache._count`) added between two halvings of them all.
FREQ_HALVING = 1 << 20


def shared_tf_dtype(shard_dirs: list[str]) -> np.dtype:
    """The dtype every packed shard of ``shard_dirs`` decodes its tfs as: the widest stored
    one (uint16, or int32 where a shard holds a tf above 65,535)."""
    out = np.dtype(np.uint16)
    for d in shard_dirs:
        try:
            with open(os.path.join(d, PACKED_KEY), encoding="utf-8") as f:
                out = np.result_type(out, np.dtype(json.load(f)["tfs_dtype"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not packed, or unreadable: the shard's own open says what is wrong
    return out


def cache_budget() -> int:
    """The decoded postings' budget in bytes (``FUNNEL_POSTINGS_CACHE_MB``)."""
    raw = os.environ.get("FUNNEL_POSTINGS_CACHE_MB", "")
    try:
        mb = float(raw) if raw else DEFAULT_CACHE_MB
    except ValueError:
        raise ValueError(f"FUNNEL_POSTINGS_CACHE_MB={raw!r} is not a number; set it to the MiB of decoded "
                         f"postings to keep (default {DEFAULT_CACHE_MB})") from None
    if mb < 0:
        raise ValueError(f"FUNNEL_POSTINGS_CACHE_MB={raw!r} is negative; set it to 0 or more MiB")
    return int(mb * (1 << 20))


def load_postings() -> bool:
    """``FUNNEL_LOAD_POSTINGS``: read a plain index's postings (document ids, tfs, impact
    levels), or a packed one's blocks (``packed*.npy``), into the process's own memory at
    open instead of mapping their files (default 0).

    Why: here (Linux 6.18 in a VM) anonymous memory gets transparent huge pages and the
    mapped files' page cache few, and the exhaustive pass over the same arrays took ~1.5×
    longer mapped (``bench/RESULTS.md``, 3M topical corpus: long questions 1.12-1.37 s a
    batch of 100 loaded against 1.60-2.40 mapped, one process, alternated). The cost: the
    open reads every posting (seconds at millions of documents), and processes serving
    one index no longer share its pages. A one-query CLI process keeps the default."""
    raw = os.environ.get("FUNNEL_LOAD_POSTINGS", "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise ValueError(f"FUNNEL_LOAD_POSTINGS={raw!r}: set it to 1 (read a plain index's postings into memory "
                     "at open) or 0 (map them; the default)")


def own_copy(a: np.ndarray) -> np.ndarray:
    """A read-only copy of mapped ``a`` in the process's own memory (`load_postings`; NumPy
    asks for transparent huge pages for an array of 4 MiB or more), read-only as the mapped
    one is, so the kernels compiled for those serve it."""
    out = np.array(a)
    out.setflags(write=False)
    return out


def _anon(n: int, dtype) -> tuple[mmap.mmap, np.ndarray]:
    """An anonymous map of ``n`` items of ``dtype`` (zero pages: no memory until written)."""
    dtype = np.dtype(dtype)
    # Private: the process's own memory (RssAnon), given back page by page (MADV_DONTNEED).
    mm = mmap.mmap(-1, max(n * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mm, np.frombuffer(mm, dtype=dtype, count=n)


class PackedShard:
    """One packed shard: its packed arrays (memory-mapped, or with ``load`` read into the
    process's memory: `load_postings`) and the plain arrays the kernels read, filled term by
    term (module docstring)."""

    def __init__(self, shard_dir: str, indptr: np.ndarray, n_docs: int, rel: str, tf_dtype=None,
                 load: bool = False):
        from ..kernels import packed as codec
        from ..kernels.layout import IMPACT_DTYPE
        self._codec = codec
        self.imp_dtype = np.dtype(IMPACT_DTYPE)
        with open(os.path.join(shard_dir, PACKED_KEY), encoding="utf-8") as f:
            key = json.load(f)
        if key.get("format") != PACKED_FORMAT or key.get("block") != codec.PACK_BLOCK:
            raise ValueError(f"{rel}/{PACKED_KEY} names packed format {key.get('format')} with blocks of "
                             f"{key.get('block')}; this funnel reads format {PACKED_FORMAT} with blocks of "
                             f"{codec.PACK_BLOCK}: rebuild the index with this funnel (funnel build ...)")
        self.rel = rel
        stored = np.dtype(key["tfs_dtype"])
        if stored not in (np.dtype(np.uint16), np.dtype(np.int32)):
            raise ValueError(f"{rel}/{PACKED_KEY} names tfs dtype {stored}; expected uint16 or int32")
        self.max_tf = int(np.iinfo(stored).max)  # what the build could store: a larger tf is damage
        # The dtype tfs are decoded as: ``tf_dtype`` when given, the one every shard of the
        # version shares (the kernels read one dtype; a wider copy of these arrays would be a
        # copy of what happened to be decoded when it was made), else the shard's own.
        self.tf_dtype = np.dtype(tf_dtype) if tf_dtype is not None else stored
        self.words, self.boff, self.first, self.width = (
            np.asarray(np.load(os.path.join(shard_dir, n), mmap_mode="r")) for n in PACKED_FILES)
        if load:  # FUNNEL_LOAD_POSTINGS=1: the blocks in the process's own memory (`load_postings`)
            self.words, self.boff, self.first, self.width = (own_copy(a) for a in (self.words, self.boff,
                                                                                   self.first, self.width))
        # The term ranges: one private read-only copy, read once the open's checks passed, which
        # the decoder, `release` (``_ends``) and the kernels all read, so a later write to
        # indptr.npy cannot move a term onto another's blocks, and the file need not stay mapped.
        self._ends = np.array(indptr, dtype=np.int64)
        self._ends.setflags(write=False)
        self.indptr = indptr = self._ends
        self.n_docs = n_docs
        self.n_postings = int(indptr[-1]) if len(indptr) else 0
        tblock = codec.term_blocks(indptr)  # each term's first block: int32 (half the bytes a term)
        if len(tblock) and int(tblock[-1]) >= 1 << 31:
            raise ValueError(f"{rel} holds {int(tblock[-1])} packed blocks, more than 2**31; build the index "
                             "with more shards (funnel build --shards N)")
        self.tblock = tblock.astype(np.int32)
        self._mm_docs, self.docs = _anon(max(self.n_postings, 0), np.int32)
        self._mm_tfs, self.tfs = _anon(max(self.n_postings, 0), self.tf_dtype)
        # Each decoded posting's impact level for the default parameters, once `keep_levels`
        # is called (the exhaustive kernels then read them as a plain shard's impacts.npy).
        self._mm_imp, self.impacts = _anon(max(self.n_postings, 0), self.imp_dtype)
        self.levels = None  # (length codes, denominators, impact grid) of the default parameters
        self.decoded = np.zeros(max(len(indptr) - 1, 0), dtype=bool)
        # Times asked for (`PostingsCache.fitting`): int32, halved every FREQ_HALVING counts.
        self.freq = np.zeros(max(len(indptr) - 1, 0), dtype=np.int32)

    @property
    def posting_bytes(self) -> int:
        """Decoded bytes a posting: its id, its tf, and its level where levels are kept."""
        return 4 + self.tf_dtype.itemsize + (self.imp_dtype.itemsize if self.levels is not None else 0)

    def term_bytes(self, a: int, e: int) -> int:
        """Decoded bytes of postings [a, e)."""
        return (e - a) * self.posting_bytes

    def keep_levels(self, code: np.ndarray, table: np.ndarray, itab: np.ndarray) -> None:
        """From now on, give every decoded term its postings' impact levels too (``code``,
        ``table``, ``itab``: the default parameters', as ``lexical.retriever.default_impacts`` takes
        them), starting with the terms decoded already (the caller holds the cache's lock)."""
        self.levels = (code, table, itab, self._codec.level_grid(itab))
        # Again, with their levels (once): the same ids and tfs over themselves, so a kernel
        # reading one of them meanwhile reads what it read before.
        self.decode(np.flatnonzero(self.decoded))

    def _fault(self, code: int, what: str) -> ShardFault:
        from ..kernels.layout import FAULT_DOCS
        if code == FAULT_DOCS:
            return ShardFault(f"{self.rel}/{PACKED_WORDS}", f"holds a damaged block of {what} (a width, size, "
                                                            "or document id the shard cannot have)")
        return ShardFault(f"{self.rel}/indptr.npy", f"gives {what} a range outside the postings")

    def decode(self, terms: np.ndarray) -> None:
        """Decode local ``terms`` into `docs` / `tfs` (the caller holds the cache's lock)."""
        terms = np.asarray(terms, dtype=np.int64)
        if len(terms) == 0:
            return
        args = (self.words, self.boff, self.first, self.width, self.indptr, self.tblock, self.n_docs, self.max_tf,
                terms, self.docs, self.tfs)
        if self.levels is None:
            f = self._codec.unpack_terms(*args)
        else:
            f = self._codec.unpack_terms_levels(*args, *self.levels, self.impacts)
        if f:
            raise self._fault(f, f"one of the terms {terms[:8].tolist()}")
        self.decoded[terms] = True

    def term(self, li: int) -> tuple[np.ndarray, np.ndarray]:
        """(document ids, tfs) of local term ``li``, decoded into new arrays."""
        a, e = int(self.indptr[li]), int(self.indptr[li + 1])
        if not 0 <= a <= e <= self.n_postings:
            raise self._fault(0, f"term {li}")
        d = np.empty(e - a, dtype=np.int32)
        t = np.empty(e - a, dtype=self.tf_dtype)
        f = self._codec._unpack_range(self.words, self.boff, self.first, self.width, int(self.tblock[li]), 0,
                                      e - a, self.n_docs, self.max_tf, d, t)
        if f:
            raise self._fault(f, f"term {li}")
        return d, t

    def all(self) -> tuple[np.ndarray, np.ndarray]:
        """Every posting, decoded into new arrays (docs, tfs)."""
        d = np.empty(self.n_postings, dtype=np.int32)
        t = np.empty(self.n_postings, dtype=self.tf_dtype)
        f = self._codec.unpack_terms(self.words, self.boff, self.first, self.width, self.indptr, self.tblock,
                                     self.n_docs, self.max_tf, np.arange(len(self.indptr) - 1, dtype=np.int64), d, t)
        if f:
            raise self._fault(f, "a term")
        return d, t

    def span(self, li: int) -> tuple[int, int]:
        """Term ``li``'s postings [a, e), as `decode` checked them (held by the cache, so a
        later write to indptr.npy cannot point `release` outside the arrays)."""
        return int(self.indptr[li]), int(self.indptr[li + 1])

    def release(self, spans: list[tuple[int, int, int]]) -> None:
        """Give the decoded pages of terms ``spans`` (rows: local term, and its postings [a, e)
        as `span` gave them) back: those wholly inside them, and a page they share with a
        neighbour that is not decoded either (`codec.free_pages`; the caller holds the
        cache's lock, under which every decode runs). Without the shared pages, a process
        answering many short terms kept up to two pages a term and array."""
        if not spans:
            return
        rows = np.array(sorted(spans, key=lambda x: x[1]), dtype=np.int64).reshape(-1, 3)
        self.decoded[rows[:, 0]] = False
        out = np.empty((len(rows), 2), dtype=np.int64)
        for mm, size in ((self._mm_docs, 4), (self._mm_tfs, self.tf_dtype.itemsize),
                         (self._mm_imp, self.imp_dtype.itemsize)):
            n = self._codec.free_pages(self._ends, self.decoded, rows[:, 1:], size, _PAGE, out)
            for lo, hi in out[:n].tolist():
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


class PostingsCache:
    """The decoded terms of one index version's packed shards, bounded by ``budget`` bytes
    beyond the terms pinned, given back in the order `_trim` gives (module docstring)."""

    def __init__(self, shards: list, budget: int | None = None):
        self.shards = shards  # ShardScorer, each with .packed (a PackedShard or None)
        self.budget = cache_budget() if budget is None else budget
        self._lock = threading.Lock()
        self._lru: OrderedDict[tuple[int, int], tuple[int, int, int]] = OrderedDict()  # (bytes, a, e)
        self._pins: dict[tuple[int, int], int] = {}
        self._tick = 0  # one per pin; _used_at: each key's last (`_trim`)
        self._used_at: dict[tuple[int, int], int] = {}
        self._ahead: Counter = Counter()  # keys later parts of the running batches will pin
        self._next: dict[tuple[int, int], int] = {}  # the part (numbered across batches) pinning each next
        self._parts = 0  # parts numbered so far
        self._starts: list[int] = []  # the tick each running batch began at
        self.used = 0
        self._all = False
        self.decoded_bytes = 0  # over the cache's life (tests, benchmarks)
        self._added = 0  # counts added since the last halving (`_count`)

    def _local(self, gids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        out = []
        for s, sh in enumerate(self.shards):
            if sh.packed is not None:
                li = sh.local_terms(gids)
                li = np.unique(li[li >= 0])
                if len(li):
                    out.append((s, li))
        return out

    def _take(self, wanted: list[tuple[int, np.ndarray]]) -> list[tuple[int, int]]:
        """Decode what ``wanted`` lacks, pin all of it; returns the pinned keys (none left
        pinned where a damaged block stops it)."""
        keys: list[tuple[int, int]] = []
        with self._lock:
            self._tick += 1
            try:
                for s, li in wanted:
                    self._decode(s, li[~self.shards[s].packed.decoded[li]])
                    for t in li.tolist():
                        self._pin((s, t))
                        keys.append((s, t))
            except BaseException:
                self._unpin(keys)
                raise
        return keys

    def _pin(self, key: tuple[int, int]) -> None:
        """Pin decoded term ``key`` as used now (the caller holds the lock)."""
        self._lru.move_to_end(key)
        self._used_at[key] = self._tick
        self._pins[key] = self._pins.get(key, 0) + 1

    def _forget(self, key: tuple[int, int], out: dict[int, list]) -> None:
        """Drop unpinned term ``key`` from the cache, its span added to ``out`` (per shard)
        for `_release` (the caller holds the lock)."""
        n, a, e = self._lru.pop(key)
        self._used_at.pop(key, None)
        self._next.pop(key, None)
        self.used -= n
        out.setdefault(key[0], []).append((key[1], a, e))

    def _release(self, out: dict[int, list]) -> None:
        """Give the pages of the terms `_forget` collected back to the system."""
        for s, spans in out.items():
            self.shards[s].packed.release(spans)

    def _unpin(self, keys: list[tuple[int, int]]) -> None:
        for key in keys:
            c = self._pins[key] - 1
            if c:
                self._pins[key] = c
            else:
                del self._pins[key]

    def _decode(self, s: int, todo: np.ndarray) -> None:
        """Decode shard ``s``'s local terms ``todo`` (none decoded) and list them as the most
        recently used (the caller holds the lock)."""
        if len(todo) == 0:
            return
        p = self.shards[s].packed
        spans = [p.span(t) for t in todo.tolist()]  # read before the decode checks them
        p.decode(todo)
        for t, (a, e) in zip(todo.tolist(), spans):
            if p.span(t) != (a, e):  # indptr.npy changed while it was decoded
                raise p._fault(0, f"term {t}")
            n = p.term_bytes(a, e)
            self._lru[(s, t)] = (n, a, e)
            self.used += n
            self.decoded_bytes += n

    def _give(self, keys: list[tuple[int, int]]) -> None:
        with self._lock:
            self._unpin(keys)
            self._trim()

    def _trim(self) -> None:
        """Give back unpinned terms until the cache is within its budget, in this order:
        those no running batch will pin again and last pinned before the oldest running
        batch began, least recently used first (with no batch running: plain LRU); then
        those pinned since and not needed again, most recently used first; then those a
        later part of a running batch needs, the one needed last first.

        The middle rule is for a batch whose terms outgrow the budget, run again (the
        same queries, or one stream of them): least recently used first would give back
        its first part's terms to make room for its last, then its second part's to make
        room for its first, and so decode every term again on every run, where keeping
        the earliest parts' terms and giving back the latest decodes only what did not
        fit (Belady's choice for a repeated sequence)."""
        if self._all or self.used <= self.budget:
            return
        start = min(self._starts) if self._starts else self._tick + 1
        out: dict[int, list] = {}
        keys = list(self._lru)
        for rule in range(3):  # each list built only where the ones before did not suffice
            if rule == 0:
                order = (k for k in keys if k not in self._ahead and self._used_at.get(k, 0) < start)
            elif rule == 1:
                order = (k for k in reversed(keys) if k in self._lru and k not in self._ahead)
            else:
                order = iter(sorted((k for k in keys if k in self._lru), key=lambda k: -self._next.get(k, 0)))
            for key in order:
                if self.used <= self.budget:
                    break
                if key in self._pins:
                    continue
                self._forget(key, out)
            if self.used <= self.budget:
                break
        self._release(out)

    @contextmanager
    def batch(self, parts: list[np.ndarray]):
        """A batch run as ``parts`` (each its global term ids), one after another: yields a
        function ``pinned(i)`` that pins part i's terms as `pinned` does, while the terms
        of the parts not yet run are known to `_trim`, which gives them back last."""
        keyed = [self._local(np.asarray(g, dtype=np.int64)) for g in parts]
        per = [[(s, t) for s, li in w for t in li.tolist()] for w in keyed]
        needs: dict[tuple[int, int], list[int]] = {}  # the parts not yet run that pin each key
        for i, keys in enumerate(per):
            for key in keys:
                needs.setdefault(key, []).append(i)
        with self._lock:
            self._ahead.update({key: len(ps) for key, ps in needs.items()})
            base = self._parts
            self._parts += len(parts)
            for key, ps in needs.items():
                self._next[key] = base + ps[0]
            start = self._tick + 1
            self._starts.append(start)

        @contextmanager
        def pinned(i: int):
            keys = self._take(keyed[i])
            with self._lock:
                for key in per[i]:
                    self._ahead[key] -= 1
                    if self._ahead[key] <= 0:
                        del self._ahead[key]
                    ps = needs[key]
                    ps.pop(0)
                    if ps:
                        self._next[key] = base + ps[0]
                    else:
                        self._next.pop(key, None)
            try:
                yield
            finally:
                self._give(keys)
        try:
            yield pinned
        finally:
            with self._lock:
                for key, ps in needs.items():  # parts left unrun (a fault stopped the batch)
                    if ps:
                        self._ahead[key] -= len(ps)
                        if self._ahead[key] <= 0:
                            del self._ahead[key]
                        self._next.pop(key, None)
                self._starts.remove(start)

    @property
    def posting_bytes(self) -> int:
        """Decoded bytes a posting, the most of any packed shard (`PackedShard.posting_bytes`)."""
        return max((sh.packed.posting_bytes for sh in self.shards if sh.packed is not None), default=0)

    def keep_levels(self, levels: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """`PackedShard.keep_levels` for each shard ``s`` of ``levels`` (its length codes, the
        default parameters' denominators and impact grid), the terms decoded already included,
        their bytes counted again."""
        with self._lock:
            try:
                for s, args in levels.items():
                    p = self.shards[s].packed
                    if p.levels is None:
                        p.keep_levels(*args)
            finally:
                self.used = 0
                for (s, t), (_, a, e) in self._lru.items():
                    n = self.shards[s].packed.term_bytes(a, e)
                    self._lru[(s, t)] = (n, a, e)
                    self.used += n
            self._trim()

    @contextmanager
    def pinned(self, gids: np.ndarray):
        """Every term of ``gids`` (global ids) decoded and kept while the block runs."""
        keys = self._take(self._local(np.asarray(gids, dtype=np.int64)))
        try:
            yield
        finally:
            self._give(keys)

    @contextmanager
    def fitting(self, gids: np.ndarray, batch: bool = False):
        """Pin the terms of ``gids`` (global ids; a repeat is one more query using the term)
        that fit the budget, for the exhaustive approximate pass, which reads every other
        term from its packed blocks (``kernels.accumulate_packed``). Each call counts how
        often each term was asked for (`PackedShard.freq`, halved now and then: `_count`);
        the terms decoded already are pinned, and those not, most asked for first, are
        decoded where they fit beside them, making room by giving back unpinned terms that
        ``gids`` does not use, least recently used first: any of them for a ``batch`` of
        queries (it is run as a whole, and a workload run in batches runs again: what it
        decodes it reads many times), else only terms asked for less than half as often as
        the one decoded (TinyLFU's admission with a margin, for one query at a time): reading
        a term from its blocks costs about twice reading it decoded and decoding it about five
        times, so decoding a term that is read once in place of one other queries keep
        reading only loses (a server answering one long question at a time at 3M decoded most
        of every query's terms, least recently used first, at more CPU than reading them all
        from their blocks), while a workload run again, or a new one, earns its terms their
        place. Without the margin, terms asked for about as often as each other took turns:
        at 3M, one long question at a time after every workload's batches, 21.8-33.2 ms of
        CPU a question (p50), 17.4-19.4 with it, 15.1-15.3 never giving anything back (but a
        server answering one query at a time would then keep its first terms for good).
        Nothing outgrows the budget, and no term of this batch is given back to make room
        for another of it. Yields (``poff``, ``pids``): per shard, the local terms pinned,
        ascending (``pids[poff[s]:poff[s + 1]]``, the kernels' ``pk``)."""
        g, uses = np.unique(np.asarray(gids, dtype=np.int64), return_counts=True)
        local = []
        for s, sh in enumerate(self.shards):
            if sh.packed is not None:
                li = sh.local_terms(g)
                ok = li >= 0
                local.append((s, li[ok], uses[ok]))
        keys: list[tuple[int, int]] = []
        with self._lock:
            self._tick += 1
            wanted = []  # (-times asked for, shard, local term)
            for s, li, us in local:
                f = self._count(s, li, us)
                wanted += zip((-f).tolist(), [s] * len(li), li.tolist())
            wanted.sort()
            want = {(s, t) for _, s, t in wanted}
            victims = None  # unpinned terms outside ``want``, least recently used first
            vi = 0
            out: dict[int, list] = {}
            todo: dict[int, list[int]] = {}
            reserved = 0
            for negf, s, t in wanted:
                if (s, t) in self._lru:
                    keys.append((s, t))
                    continue
                p = self.shards[s].packed
                n = p.term_bytes(*p.span(t))
                if self.used + reserved + n > self.budget:
                    if victims is None:
                        victims = [k for k in self._lru if k not in self._pins and k not in want]
                    while self.used + reserved + n > self.budget and vi < len(victims):
                        v = victims[vi]
                        vi += 1
                        if not batch and 2 * self.shards[v[0]].packed.freq[v[1]] >= -negf:
                            continue  # asked for at least half as often: it stays
                        self._forget(v, out)
                    if self.used + reserved + n > self.budget:
                        continue
                todo.setdefault(s, []).append(t)
                reserved += n
            self._release(out)
            for s, ts in todo.items():  # a damaged block raises here, before any pin
                self._decode(s, np.array(sorted(ts), dtype=np.int64))
                keys += [(s, t) for t in ts]
            for key in keys:
                self._pin(key)
        by = sorted(keys)
        poff = np.zeros(len(self.shards) + 1, dtype=np.int64)
        for s, _ in by:
            poff[s + 1] += 1
        poff = np.cumsum(poff)
        pids = np.array([t for _, t in by], dtype=np.int64)
        try:
            yield poff, pids
        finally:
            self._give(keys)

    def _count(self, s: int, li: np.ndarray, uses: np.ndarray) -> np.ndarray:
        """Add ``uses`` to shard ``s``'s counts of local terms ``li``; returns their counts.
        Every ``FREQ_HALVING`` counts added, every count is halved, so what a workload asked
        for long ago fades (the caller holds the lock)."""
        f = self.shards[s].packed.freq
        f[li] = np.minimum(f[li] + np.asarray(uses, dtype=np.int64), np.iinfo(f.dtype).max)
        self._added += int(uses.sum())
        if self._added >= FREQ_HALVING:
            self._added = 0
            for sh in self.shards:
                if sh.packed is not None:
                    sh.packed.freq >>= 1
        return f[li]

    def pin_all(self) -> None:
        """Decode every term of every packed shard and keep them all (SIRA's batch kernel)."""
        if self._all:
            return
        with self._lock:
            for s, sh in enumerate(self.shards):
                if sh.packed is not None:
                    self._decode(s, np.flatnonzero(~sh.packed.decoded))
            self._all = True

    def batch_cuts(self, qptr: np.ndarray, qgids: np.ndarray, df_bytes: np.ndarray) -> list[tuple[int, int]]:
        """Query ranges [i0, i1) of a batch whose distinct terms' decoded postings (``df_bytes``
        per global term, an upper bound over shards) stay within half the budget, each
        range at least one query: a long batch then never holds more than that decoded at once."""
        n = len(qptr) - 1
        if self._all or n <= 1:
            return [(0, n)]
        cap = max(self.budget // 2, 1)
        cuts, i0, seen, size = [], 0, set(), 0
        for i in range(n):
            new = [g for g in qgids[qptr[i]:qptr[i + 1]].tolist() if g not in seen]
            add = int(df_bytes[new].sum()) if new else 0
            if i > i0 and size + add > cap:
                cuts.append((i0, i))
                i0, seen, size = i, set(), 0
                new = list(dict.fromkeys(qgids[qptr[i]:qptr[i + 1]].tolist()))
                add = int(df_bytes[new].sum()) if new else 0
            seen.update(new)
            size += add
        cuts.append((i0, n))
        return cuts


def check_packed(shard_dir: str, rel: str, indptr: np.ndarray, n_docs: int) -> tuple[str, str] | None:
    """(file, what is wrong) of a packed shard's block table (None when sound): its files, its
    block count against ``indptr``, each block's start inside the stream and after the
    previous one, its widths, its first document inside the shard. The blocks' contents are
    checked as they are decoded."""
    from ..kernels.packed import PACK_BLOCK, term_blocks
    try:
        words, boff, first, width = (np.load(os.path.join(shard_dir, n), mmap_mode="r") for n in PACKED_FILES)
    except (OSError, ValueError) as e:
        return f"{rel}/{PACKED_WORDS}", f"cannot be read ({type(e).__name__}: {e})"
    nb = int(term_blocks(indptr)[-1]) if len(indptr) else 0
    if words.dtype != np.uint32 or boff.dtype != np.int64 or first.dtype != np.int32 or width.dtype != np.uint8:
        return f"{rel}/packed_*.npy", f"unexpected dtypes ({words.dtype}, {boff.dtype}, {first.dtype}, {width.dtype})"
    if len(first) != nb or len(boff) != nb + 1 or width.shape != (nb, 2):
        return (f"{rel}/packed_first.npy",
                f"{len(first)} blocks, indptr.npy's postings need {nb} (blocks of {PACK_BLOCK})")
    b = np.asarray(boff)
    if nb and (int(b[0]) != 0 or int(np.diff(b).min()) < 0 or int(b[-1]) != len(words) - 1):
        return f"{rel}/packed_boff.npy", "block offsets that do not run from 0 to the stream's end in order"
    w = np.asarray(width)
    if nb and int(w.max()) > 31:
        return f"{rel}/packed_width.npy", "a width above 31 bits"
    f = np.asarray(first)
    if nb and (int(f.min()) < 0 or int(f.max()) >= n_docs):
        return f"{rel}/packed_first.npy", f"a first document id outside [0, {n_docs})"
    return None
