"""The BM25 retriever: analyzed (or explicitly weighted) terms in, ranked docnos out.

``search_weighted`` takes {term: weight}; plain BM25 uses the term's count in the query,
SIRA passes its own weights for expansion terms: one weighted BM25 call.
Ties are broken by doc_id, so a sharded index returns exactly an unsharded one's ranking.

Terms are scored in one canonical order (w·idf descending, then global term id), the same
on every path, so a document's score is the same float sum whichever path computes it:
the compiled kernel (``kernels.search_shards``: all shards in one call, MaxScore pruning
when every weight is positive and the bounds promise enough skipping, else exhaustive
scoring over the build's 16-bit impact levels with the candidates rescored exactly) or the NumPy
reference (``ShardScorer.top_candidates`` per shard, then a merge), which runs where numba
is absent or ``use_kernel`` is off.

``search_texts`` answers a batch of query texts (``Searcher.search_batch``): analysis into
global term ids per distinct whitespace chunk (cached), then every query in one compiled
call (``kernels.search_batch``), each exactly as ``search_arrays`` would answer it.

Damaged files: the kernels check every value they index with as they read it and return a
fault code where one is impossible (``kernels``, "Damaged files"); the NumPy path raises
``errors.ShardFault``. Either way the query fails with ``errors.IndexDamaged`` naming the
file (``fault_error``: ``IndexVersion.damaged`` records the version as damaged and stops
serving it), and every later query on that version fails the same way, never a crash.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...pipelines.lexical.postings import BLOCK_FILES
from .. import filters
from .bm25 import BM25Params, denominator_table, idf_lucene, term_impacts
from ..errors import IndexDamaged, ShardFault
from ..index import IndexVersion


class _Kernels:
    """Stands for ``serving.kernels`` until its first attribute is read, which imports it and
    puts the module itself in this name: importing it imports numba (~0.15 s a process), and
    a process that answers on the NumPy path (``Searcher(kernels=False)``: one query from the
    shell) never needs it."""

    def __getattr__(self, name: str):
        global kernels
        from .. import kernels as module
        kernels = module
        return getattr(module, name)


kernels = _Kernels()
_DEFAULT = BM25Params()
PRUNE_MIN_POSTINGS = 8_000  # see BM25Retriever.prune_min_postings
RESCORE_MIN_POSTINGS = 64  # see BM25Retriever.rescore_min_postings
DENSE_MIN_DOCS = 65_536  # see BM25Retriever.dense_min_docs
IMPACT_TFS = 32  # tfs below this read their impact from a per-(k1, b) grid (Lucene norms only)
#: Chunks of query text `query_gids` keeps analyzed (each at most 64 characters), cleared when
#: full. At 1M (before) a stream of distinct 64-character chunks of 8 known terms each grew a
#: server by ~550 MiB before the cache cleared (~170 MiB for single words); at 65,536 at most
#: ~36 MiB, and a workload's distinct chunks (a few thousand in bench_workloads) still fit.
CHUNK_CACHE_ENTRIES = 1 << 16
# An index with at most this many postings keeps each posting's impact (8 bytes a posting, so
# at most 64 MB per (k1, b), for the last two in use): the exhaustive kernels then read one
# float per posting instead of a tf, a length code and a grid cell. Larger indexes read the
# build's 16-bit impact levels for the default parameters (``_impacts32``: memory-mapped, rescored
# exactly), and the grid for others.
IMPACT_POSTINGS = 8_000_000


def impact_tables(params: BM25Params, avgdl: float, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(denominator per length code, impact grid ``t / (t + den[c])`` at ``t · len(den) + c``
    for t below IMPACT_TFS; none for exact lengths) for ``params`` and a collection's avgdl."""
    den = denominator_table(params, avgdl, max_len)
    # Lucene norms: 256 codes x 32 tfs = 64 KB, mostly the tf=1..3 rows in use.
    tf = np.arange(0 if params.length_norm == "exact" else IMPACT_TFS, dtype=np.float64)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):  # tf = 0 with k1 = 0: never read
        itab = np.ascontiguousarray(term_impacts(tf, den[None, :]).ravel())
    return den, itab


def block_maxima_key(avgdl: float) -> dict:
    """What stored block maxima were computed for: the default BM25 parameters, the
    collection's avgdl, the block size, the kept ranks and the arrays stored. Serving uses a
    shard's stored ones only when this matches exactly (otherwise it computes them: an index
    stored before ``block_last`` existed computes them at its first pruning query). ``dtype``:
    the bounds' float type, float32 rounded outward (`kernels.block_bounds32`); a key without
    it names the float64 of builds before issue 50, which serving still reads (`stored_blocks_usable`)."""
    return {"k1": _DEFAULT.k1, "b": _DEFAULT.b, "length_norm": _DEFAULT.length_norm, "avgdl": float(avgdl),
            "block": int(kernels.BLOCK), "kth": [int(x) for x in kernels.KTH_BLOCKS],
            "arrays": [name.removesuffix(".npy") for name in BLOCK_FILES], "dtype": "float32"}


def stored_blocks_usable(key, avgdl: float) -> bool:
    """Whether block maxima stored with ``key`` were computed for this collection as serving
    would: `block_maxima_key` exactly, or, from a build before issue 50, the same without
    ``dtype`` (float64 bounds, which `kernels.block_table` rounds outward to float32 in memory)."""
    want = block_maxima_key(avgdl)
    if isinstance(key, dict) and "dtype" not in key:
        want.pop("dtype")
    return key == want


def impacts_key(avgdl: float) -> dict:
    """What stored per-posting impacts were computed for: the default BM25 parameters, the
    collection's avgdl, the dtype and the quantization (each stored level q stands for
    q / levels, ``kernels.IMPACT_LEVELS``). Serving reads a shard's ``impacts.npy`` only when
    this matches exactly, and only for the default parameters (an override computes its own);
    an index built before the levels (float32 impacts) matches no longer and is served
    exactly from its tfs and length codes until rebuilt."""
    return {"k1": _DEFAULT.k1, "b": _DEFAULT.b, "length_norm": _DEFAULT.length_norm, "avgdl": float(avgdl),
            "dtype": np.dtype(kernels.IMPACT_DTYPE).name, "levels": int(kernels.IMPACT_LEVELS), "rounding": "up"}


def default_impacts(docs, tfs, norms, avgdl: float) -> np.ndarray:
    """``kernels.posting_levels`` of one shard for the default parameters, as the build
    stores them (``pipelines.lexical.postings.write_impacts``)."""
    den, itab = impact_tables(_DEFAULT, avgdl, 255)
    return kernels.posting_levels(docs, tfs, norms, den, itab)


def default_block_maxima(indptr, docs, tfs, norms, avgdl: float) -> tuple[np.ndarray, ...]:
    """``kernels.block_maxima`` of one shard for the default parameters, as serving computes
    them (the build stores these; see ``pipelines.lexical.postings.finalize_shard``)."""
    den, itab = impact_tables(_DEFAULT, avgdl, 255)
    return kernels.block_maxima(indptr, docs, tfs, norms, den, itab, kernels.BLOCK)


def _in_shard(shard, fn, *args):
    """``fn(*args)`` over one shard's arrays; a ``ShardFault`` it raises naming a file of the
    shard's folder (``kernels.block_maxima`` does not know the shard) names it in the version."""
    try:
        return fn(*args)
    except ShardFault as e:
        raise ShardFault(f"{shard.rel}/{e.file}", e.reason) from None


def _shown_df(ix: IndexVersion, g: int) -> int:
    """A term's df as an explanation shows it: global, or for a principal the documents it may
    read hold it (``filters.Mask.df``)."""
    mask = filters.restricted()
    return int(ix.df[g]) if mask is None else int(mask.df(ix, np.asarray([g]))[0])


def explainer(retriever, terms: dict[str, float], docnos, params: BM25Params | None = None
              ) -> Callable[[int], dict[str, dict]]:
    """``n -> retriever.explain(terms, n, params)`` for the hits ``docnos`` of one answer: the
    first call explains them all at once where the retriever can (``explain_many``); a docno
    outside ``docnos``, or a retriever without it (``passage_bm25``), is explained alone."""
    done: dict[int, dict[str, dict]] = {}
    many = getattr(retriever, "explain_many", None)

    def explain(n: int) -> dict[str, dict]:
        if not done and many is not None:
            done.update(many(terms, docnos, params))
        got = done.get(n)
        return got if got is not None else retriever.explain(terms, n, params)

    return explain


@dataclass(frozen=True)
class Scored:
    docno: int
    score: float


class BM25Retriever:
    name = "bm25"

    def __init__(self, index: IndexVersion):
        self.index = index
        # MaxScore in the kernel for a shard where the query has at least this many postings
        # (-1: never). Below that, exhaustive term-at-a-time is faster: on SciFact/NFCorpus
        # pruning's bookkeeping costs more than the postings it skips (there, 10K-100K made no
        # difference: no query reaches them). At 1M synthetic documents with block maxima, 30K
        # was the fastest threshold tried at k=10 (100K and 200K slower) and equal at k=100
        # (bench/RESULTS.md, "Notes: figures moved from code comments"). Since `_prune_pays`
        # estimates theta from the rarest terms' postings too (issue 50), 8K was ~10% faster
        # than 30K on the Zipf corpus's short questions at k=10 and within noise (1-3%) of it
        # on every other workload of both corpora at 1M, k=10 and 100; 2K was no better than
        # 8K. 0 prunes wherever the bounds allow (tests).
        self.prune_min_postings = PRUNE_MIN_POSTINGS
        # The exhaustive kernels read the stored impact levels (``_impacts32``) and rescore
        # their candidates exactly where a query has at least this many postings per (k, term)
        # pair: the rescoring looks up each term once per candidate, about k of them, which a
        # query with fewer postings does not repay. 0: wherever stored (tests); -1: never.
        self.rescore_min_postings = RESCORE_MIN_POSTINGS
        # The exhaustive kernels read a shard of at least this many documents back by one scan
        # of its accumulator where the query's postings there cover enough of it
        # (``kernels.DENSE_DIVISOR``), instead of through a list of the documents it touched:
        # keeping the list costs a store per posting that waits on the accumulator's load,
        # a cache miss once the accumulator (8 bytes a document) outgrows a core's cache.
        # On SciFact-sized shards the list is cheaper. 0: wherever dense enough (tests); -1: never.
        self.dense_min_docs = DENSE_MIN_DOCS
        # False: every query takes the NumPy reference path (same rankings and scores), as
        # where numba is absent; for a process that answers one query (``Searcher(kernels=)``).
        self.kernels = True
        # [shard-queries where pruning switched to candidates only, postings left unread there]
        self.prune_stats = np.zeros(2, dtype=np.int64)
        self._kernel_args: dict[str, tuple] = {}
        self._block_args = None  # (bmeta, arrays it points into): see _blocks
        self._tables: dict[BM25Params, np.ndarray] = {}
        self._impact_args: dict[BM25Params, tuple] = {}  # (imeta, arrays it points into): see _impacts
        self._impact32_args = None  # (imeta32, stored arrays it points into): see _impacts32
        self._packed_args = None  # (pmeta, arrays it points into, level grid): see _packed_pk
        self._doc_slots = None  # (largest shard's documents, the index's): see _buffers
        self._tls = threading.local()
        self._lock = threading.Lock()
        # Whitespace-delimited chunk of ASCII query text -> global ids of its analyzed terms
        # that the collection knows (see ``query_gids``); bounded, per opened version.
        self._chunk_gids: dict[str, tuple[int, ...]] = {}

    def _use_kernel(self) -> bool:
        return self.kernels and kernels.HAVE_NUMBA and all(s.use_kernel for s in self.index.shards)

    def _refuse_damaged(self) -> None:
        """Raise the version's ``IndexDamaged`` once a query found it damaged."""
        damage = getattr(self.index, "damage", None)  # tests build retrievers over plain namespaces
        if damage is not None:
            raise self.index.damaged(*damage)

    def fault_error(self, fault: int | ShardFault) -> IndexDamaged:
        """The ``IndexDamaged`` for a kernel's fault code (``kernels.fault_parts``) or a
        ``ShardFault``, after ``IndexVersion.damaged`` recorded it. This thread's accumulator
        is zeroed: a kernel that stops at a fault leaves partial sums in it."""
        bufs = getattr(self._tls, "buffers", None)
        if bufs is not None:
            bufs[0][:] = 0.0
        shards = self.index.shards
        if isinstance(fault, ShardFault):
            s = next((i for i, sh in enumerate(shards) if fault.file.startswith(sh.rel + "/")), None)
            return self.index.damaged(fault.file, fault.reason, shard=s)
        s, name, reason = kernels.fault_parts(fault)
        if s is None:  # not known (a term id of the forward index): the first shard the checks refuse
            for i in range(len(shards)):
                try:
                    self.index._check_shard(i)
                except (ValueError, OSError):
                    s = i
                    break
            else:
                s = 0
        return self.index.damaged(f"{shards[s].rel}/{name}", reason, shard=s)

    def _shard_args(self, length_norm: str) -> tuple:
        """(meta, code prototype, doc offsets, id ranks) for the kernel, built once per length
        encoding; the arrays ``meta`` points into stay referenced in ``_kernel_args``."""
        args = self._kernel_args.get(length_norm)
        if args is None:
            with self._lock:
                args = self._kernel_args.get(length_norm)
                if args is None:
                    exact = length_norm == "exact"
                    # Length codes index the tables: private checked copies (ShardScorer), not the maps.
                    shards = [{"indptr": s.indptr, "docs": s.docs, "tfs": s.tfs, "term_gid": s.term_gid,
                               "max_tf": s.bounds()[0],
                               "code": s.exact_codes() if exact else s.norms,
                               "min_code": s.exact_min_codes() if exact else s.min_norms()}
                              for s in self.index.shards]
                    meta, keep = kernels.shard_table(shards)
                    proto = (np.zeros(0, dtype=np.int32 if exact else np.uint8),  # see kernels.shard_table
                             np.zeros(0, dtype=kernels.tf_dtype(shards)))
                    doc_off = np.cumsum([0] + [s.n_docs for s in self.index.shards]).astype(np.int64)
                    # The store's one array of every rank (writable int64), not a copy of it.
                    args = (meta, proto, doc_off, self.index.docs.rank, keep)
                    self._kernel_args[length_norm] = args
        return args

    def _all_decoded(self) -> tuple:
        """The kernels' ``pk`` where every term a query reads is decoded (plain shards, or
        packed ones with the query's terms pinned: `_pinned`)."""
        return (kernels.NO_PACKED, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=kernels.IMPACT_DTYPE))

    def _packed_pk(self, params: BM25Params) -> tuple | None:
        """(pmeta, arrays it points into, level grid) where shards are packed and ``params``
        let the exhaustive approximate pass read their terms from their blocks (the default
        parameters, stored levels in use: `_impacts32`), else None."""
        cache = getattr(self.index, "postings_cache", None)
        if cache is None or params != _DEFAULT or self.rescore_min_postings < 0 or \
                self._impacts32(params).shape[0] == 0:
            return None
        if self._packed_args is None:
            with self._lock:
                if self._packed_args is None:
                    from ..kernels import packed as codec
                    _, itab = impact_tables(_DEFAULT, self.index.avgdl, 255)
                    pmeta, keep = kernels.packed_table([getattr(s, "packed", None) for s in self.index.shards])
                    self._packed_args = (pmeta, keep, codec.level_grid(itab))
        return self._packed_args

    def _run_packed(self, gids: np.ndarray, params: BM25Params, call: Callable) -> tuple:
        """``call(pk)``, a kernel over one query's terms ``gids``: where shards are packed,
        first with the terms that fit the postings cache pinned (``PostingsCache.fitting``)
        and the rest read from their blocks, again with every term pinned where the kernel
        answers ``NEED_DECODED``; elsewhere with the terms pinned (`_pinned`)."""
        got = self._packed_pk(params)
        if got is None:
            with self._pinned(gids):
                return call(self._all_decoded())
        with self.index.postings_cache.fitting(np.unique(gids)) as (poff, pids):
            out = call((got[0], poff, pids, got[2]))
        if out[2] != kernels.NEED_DECODED:
            return out
        with self._pinned(gids):
            return call(self._all_decoded())

    def _pinned(self, gids: np.ndarray):
        """A context in which every term of ``gids`` is readable by the kernels: decoded and
        kept where shards are packed (``serving.lexical.packed``), nothing to do otherwise."""
        cache = getattr(self.index, "postings_cache", None)  # tests build retrievers over namespaces
        return cache.pinned(gids) if cache is not None else contextlib.nullcontext()

    def _cuts(self, qptr: np.ndarray, qgids: np.ndarray) -> list[tuple[int, int]]:
        """The query ranges a batch is run in: all at once, or where shards are packed, parts
        whose terms fit the postings cache (``PostingsCache.batch_cuts``)."""
        cache = getattr(self.index, "postings_cache", None)
        if cache is None:
            return [(0, len(qptr) - 1)]
        return cache.batch_cuts(qptr, qgids, np.asarray(self.index.df, dtype=np.int64) * cache.posting_bytes)

    def _by_cuts(self, qptr: np.ndarray, qgids: np.ndarray, run: Callable, params: BM25Params) -> int:
        """A batch kernel over the batch's parts (`_cuts`), each part's terms pinned while it
        runs: ``run(i0, i1, qp, qg, prune, pk)`` gets queries [i0, i1) (their term pointers
        rebased, their term ids), whether their largest may reach the pruning threshold
        (`_batch_may_prune`) and the kernels' ``pk``, and returns the kernel's fault; the
        first fault stops the batch and is returned (0: none). Where shards are packed and
        the approximate pass may read their blocks: `_by_fitting` instead."""
        if self._packed_pk(params) is not None:
            return self._by_fitting(qptr, qgids, run, params)
        cuts = self._cuts(qptr, qgids)
        cache = getattr(self.index, "postings_cache", None)
        if cache is None or len(cuts) == 1:
            parts = contextlib.nullcontext(lambda i: self._pinned(qgids[qptr[cuts[i][0]]:qptr[cuts[i][1]]]))
        else:  # the cache learns which terms the later parts need, and keeps them longest
            parts = cache.batch([qgids[qptr[i0]:qptr[i1]] for i0, i1 in cuts])
        with parts as pinned:
            for i, (i0, i1) in enumerate(cuts):
                qp, qg = qptr[i0:i1 + 1] - qptr[i0], qgids[qptr[i0]:qptr[i1]]
                with pinned(i):
                    fault = run(i0, i1, qp, qg, self._batch_may_prune(qp, qg), self._all_decoded())
                if fault:
                    return fault
        return 0

    def _by_fitting(self, qptr: np.ndarray, qgids: np.ndarray, run: Callable, params: BM25Params) -> int:
        """`_by_cuts` over packed shards: the whole batch in one call with the terms that fit
        the postings cache pinned (``PostingsCache.fitting``: the most used first) and the
        rest read from their blocks by the approximate pass; a query that takes another path
        (pruning, few postings) and needs a term not pinned stops the call (``-(q + 1)``),
        is answered alone with all its terms pinned, and the batch goes on after it."""
        got = self._packed_pk(params)
        cache = self.index.postings_cache
        n = len(qptr) - 1
        # Each query's distinct terms: a repeat in ``fitting``'s input is one more query.
        uses = np.concatenate([np.unique(qgids[qptr[i]:qptr[i + 1]]) for i in range(n)] + [qgids[:0]])
        with cache.fitting(uses, batch=n > 1) as (poff, pids):
            pk = (got[0], poff, pids, got[2])
            i = 0
            while i < n:
                qp, qg = qptr[i:] - qptr[i], qgids[qptr[i]:]
                fault = run(i, n, qp, qg, self._batch_may_prune(qp, qg), pk)
                if fault >= 0:
                    return fault
                q = i - fault - 1
                qp, qg = qptr[q:q + 2] - qptr[q], qgids[qptr[q]:qptr[q + 1]]
                with cache.pinned(qg):
                    fault = run(q, q + 1, qp, qg, self._batch_may_prune(qp, qg), self._all_decoded())
                if fault:
                    return fault
                i = q + 1
        return 0

    def _may_prune(self, postings: int) -> bool:
        """Whether a query with at most ``postings`` postings over all shards (the sum of its
        terms' df, repeats counted: no shard holds more) can reach the pruning threshold. If
        not, the kernel's pruning-free entry points answer it (the same results; numba then
        never compiles pruning for a corpus whose queries stay below the threshold: ~6 s
        instead of ~16 s at the first query of a fresh install), and no block maxima are built."""
        return self.prune_min_postings >= 0 and postings >= self.prune_min_postings

    def _batch_may_prune(self, qptr: np.ndarray, qgids: np.ndarray) -> bool:
        """``_may_prune`` for the batch's largest query (its terms' df summed)."""
        sums = np.concatenate(([0], np.cumsum(np.asarray(self.index.df)[qgids]))) if len(qgids) else np.zeros(1)
        return self._may_prune(int((sums[qptr[1:]] - sums[qptr[:-1]]).max()))

    def _blocks(self, params: BM25Params) -> np.ndarray:
        """``bmeta`` for the kernel: each shard's block maxima (``kernels.block_maxima``) for
        the default (k1, b), computed at the first query that uses them (one pass over the
        postings; ~1/64 of the postings' size), else ``kernels.NO_BLOCKS``. Per-query (k1, b)
        overrides keep MaxScore over per-term bounds, which allocates nothing per posting."""
        if params != _DEFAULT or self.prune_min_postings < 0:
            return kernels.NO_BLOCKS
        if self._block_args is None:
            with self._lock:
                if self._block_args is None:
                    den, itab = self._table(params)
                    blocks = [s.stored_blocks[1] if s.stored_blocks is not None and
                              stored_blocks_usable(s.stored_blocks[0], self.index.avgdl)
                              else _in_shard(s, kernels.block_maxima, s.indptr, *s.all_postings(), s.norms, den,
                                             itab, kernels.BLOCK)
                              for s in self.index.shards]
                    self._block_args = kernels.block_table(blocks)
        return self._block_args[0]

    def _impacts(self, params: BM25Params) -> tuple[np.ndarray, list]:
        """(imeta, arrays it points into) for the exhaustive kernels: every shard's
        per-posting impacts for ``params`` (``kernels.posting_impacts``), computed at first
        use, where the index has at most IMPACT_POSTINGS postings; else
        ``kernels.NO_IMPACTS``. The caller holds the tuple while the kernel runs (a later
        override may evict it from the cache meanwhile)."""
        if sum(len(s.docs) for s in self.index.shards) > IMPACT_POSTINGS or \
                any(getattr(s, "packed", None) is not None for s in self.index.shards):
            return kernels.NO_IMPACTS, []  # (packed postings: 8 bytes a posting is what they save)
        got = self._impact_args.get(params)
        if got is None:
            with self._lock:
                got = self._impact_args.get(params)
                if got is None:
                    den, itab = self._table(params)
                    got = kernels.impact_table([_in_shard(s, kernels.posting_impacts, s.docs, s.tfs,
                                                          s.codes(params), den, itab)
                                                for s in self.index.shards])
                    if len(self._impact_args) >= 2:  # the default and the latest override
                        self._impact_args.pop(next(k for k in self._impact_args if k != _DEFAULT))
                    self._impact_args[params] = got
        return got

    def _plain_args(self, params: BM25Params) -> tuple:
        """(imeta, imeta32, rescore_min, dense_min, keep): what the kernels' exhaustive path
        takes after the shard table (``kernels.search_shards_plain``), and the arrays
        ``imeta`` points into, which the caller holds while the kernel runs."""
        imeta, keep = self._impacts(params)
        return imeta, self._impacts32(params), self.rescore_min_postings, self.dense_min_docs, keep

    def _keep_levels(self) -> None:
        """Packed shards store no impact levels: have the postings cache compute each decoded
        posting's as it decodes it (``PostingsCache.keep_levels``; the build's values, from the
        same function and inputs), so `_impacts32` reads them as a plain shard's ``impacts.npy``."""
        cache = getattr(self.index, "postings_cache", None)
        packed = {i: s for i, s in enumerate(self.index.shards) if getattr(s, "packed", None) is not None}
        if cache is None or not packed:
            return
        den, itab = impact_tables(_DEFAULT, self.index.avgdl, 255)
        cache.keep_levels({i: (s.norms, den, itab) for i, s in packed.items()})

    def _impacts32(self, params: BM25Params) -> np.ndarray:
        """``imeta32`` for the exhaustive kernels: every shard's stored impact levels
        (``impacts.npy``) where ``params`` are the default ones and every shard stored them for
        this collection's avgdl (``impacts_key``), else ``kernels.NO_IMPACTS``. Memory-mapped:
        their pages are the page cache's, shared by every process serving the index. A packed
        shard's are its decoded terms' (`_keep_levels`), which the kernels read only pinned."""
        if params != _DEFAULT:
            return kernels.NO_IMPACTS
        if self._impact32_args is None:
            with self._lock:
                if self._impact32_args is None:
                    want = impacts_key(self.index.avgdl)
                    self._keep_levels()
                    stored = [s.stored_impacts if getattr(s, "packed", None) is None else (want, s.packed.impacts)
                              for s in self.index.shards]
                    if stored and all(x is not None and x[0] == want for x in stored):
                        self._impact32_args = kernels.impact_table([x[1] for x in stored], kernels.IMPACT_DTYPE)
                    else:
                        self._impact32_args = (kernels.NO_IMPACTS, [])
        return self._impact32_args[0]

    def _table(self, params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
        """(denominator per length code, impact grid for tf < IMPACT_TFS) for ``params``."""
        t = self._tables.get(params)
        if t is None:
            exact = params.length_norm == "exact"
            max_len = max((int(s.exact_codes().max(initial=0)) for s in self.index.shards), default=0) if exact else 255
            t = impact_tables(params, self.index.avgdl, max_len)
            if len(self._tables) > 16:
                self._tables.clear()
            self._tables[params] = t
        return t

    def _buffers(self, whole: bool = False) -> tuple:
        """This thread's zeroed accumulator and touched-list (reused): one slot per document
        of the largest shard, which the kernels score one shard at a time in (``kernels/
        search.py``), or with ``whole`` one per document of the index (SIRA's batch kernel
        keeps every shard's scores). At 3M documents in 10 shards, 3.6 MiB a thread instead
        of 36."""
        if self._doc_slots is None:  # the version's shards never change: counted once
            sh = self.index.shards
            self._doc_slots = (max((s.n_docs for s in sh), default=0), sum(s.n_docs for s in sh))
        n = self._doc_slots[1 if whole else 0]
        b = getattr(self._tls, "buffers", None)
        if b is None or len(b[0]) < n:
            # touched gets one spare slot: the kernel writes one past the last seen document.
            b = self._tls.buffers = (np.zeros(n), np.zeros(n + 1, dtype=np.int32))
        return b

    def query_terms(self, query: str) -> Counter:
        return Counter(self.index.analyzer.analyze(query))

    def query_gids(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """(qptr, gids): the analyzed terms of each text that the collection knows, as global
        ids with repeats, text ``i``'s at ``gids[qptr[i]:qptr[i + 1]]`` (CSR).

        ``Counter(gids of text i)`` is ``weights(query_terms(text i))`` before idf. ASCII text
        is analyzed per whitespace-delimited chunk, each distinct chunk once (cached): ASCII
        whitespace is always a UAX#29 word boundary and never inside a token, so the stream
        of a text is the concatenation of its chunks' streams. Other text goes through the
        analyzer whole. The cache holds chunks of at most 64 characters, at most
        ``CHUNK_CACHE_ENTRIES`` of them.
        """
        cache = self._chunk_gids
        vocab = self.index.vocab
        analyze = self.index.analyzer.analyze
        flat: list[int] = []
        ptr = [0]
        for text in texts:
            if text.isascii():
                for c in text.split():
                    g = cache.get(c)
                    if g is None:
                        g = tuple(x for x in map(vocab.get, analyze(c)) if x is not None)
                        if len(c) <= 64:  # a word or a few; a huge chunk is analyzed, not kept
                            if len(cache) >= CHUNK_CACHE_ENTRIES:
                                cache.clear()
                            cache[c] = g
                    flat.extend(g)
            else:
                flat.extend(x for x in map(vocab.get, analyze(text)) if x is not None)
            ptr.append(len(flat))
        return np.asarray(ptr, dtype=np.int64), np.asarray(flat, dtype=np.int64)

    def doc_ids_at(self, pos: np.ndarray) -> np.ndarray:
        """Doc ids (object array) at global positions (shards concatenated in order)."""
        docs = self.index.docs
        if len(docs) == 0:  # an empty index: every row is padding
            return np.full(np.shape(pos), None, dtype=object)
        return docs.ids_at(pos)

    def search_texts(self, texts: list[str], k: int, params: BM25Params | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``k`` of many query texts: (positions [n, k], scores [n, k], counts [n]).

        Row ``i``'s first ``counts[i]`` entries are exactly what ``search_arrays(
        dict(query_terms(texts[i])), k, params)`` returns, as global document positions
        (``doc_ids_at`` names them). One compiled call for the whole batch where the kernel
        is in use; the reference path otherwise.
        """
        params = params or _DEFAULT
        n = len(texts)
        pos = np.zeros((n, k), dtype=np.int64)
        score = np.zeros((n, k))
        cnt = np.zeros(n, dtype=np.int64)
        if n == 0:
            return pos, score, cnt
        self._refuse_damaged()
        if self._use_kernel() and filters.active() is None:  # filtered: per query, through search_arrays
            qptr, qgids = self.query_gids(texts)
            try:
                meta, proto, doc_off, id_rank, _ = self._shard_args(params.length_norm)
                acc, touched = self._buffers()
                den, itab = self._table(params)
                ex = self._plain_args(params)  # held while the kernel runs

                def run(i0, i1, qp, qg, prune, pk):
                    if prune:
                        return kernels.search_batch(meta, self._blocks(params), *ex[:4], proto, doc_off, id_rank, acc,
                                                    touched, den, itab, self.index.idf, qp, qg, k,
                                                    self.prune_min_postings, self.prune_stats, pos[i0:i1],
                                                    score[i0:i1], cnt[i0:i1], pk)
                    return kernels.search_batch_plain(meta, *ex[:4], proto, doc_off, id_rank, acc, touched, den, itab,
                                                      self.index.idf, qp, qg, k, pos[i0:i1], score[i0:i1], cnt[i0:i1],
                                                      pk)
                fault = self._by_cuts(qptr, qgids, run, params)
            except ShardFault as e:
                raise self.fault_error(e) from None
            if fault:
                raise self.fault_error(fault)
            return pos, score, cnt
        return self._rows([(dict(self.query_terms(text)), None) for text in texts], k, params, (pos, score, cnt))

    def _rows(self, queries: list, k: int, params: BM25Params, out: tuple) -> tuple:
        """The batch outputs filled one ``search_arrays`` call per (terms, then) query."""
        pos, score, cnt = out
        offsets = np.cumsum([0] + [s.n_docs for s in self.index.shards]).astype(np.int64)
        for i, (terms, then) in enumerate(queries):
            dn, sc = self.search_arrays(terms, k, params, then)
            m = len(dn)
            pos[i, :m] = offsets[dn >> 32] + (dn & 0xFFFFFFFF)
            score[i, :m] = sc
            cnt[i] = m
        return pos, score, cnt

    def search_weighted_batch(self, queries: list[tuple[dict[str, float], dict[str, float] | None]], k: int,
                              params: BM25Params | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``k`` of many weighted queries ``(terms, then)``, as `search_texts`
        returns them: row ``i``'s first ``counts[i]`` entries are exactly ``search_arrays(
        terms, k, params, then)``. One compiled call for the whole batch where the kernel is
        in use (SIRA with a proposer that runs per query, e.g. the llm's, scores its chunk
        this way); the reference path otherwise."""
        params = params or _DEFAULT
        n = len(queries)
        out = (np.zeros((n, k), dtype=np.int64), np.zeros((n, k)), np.zeros(n, dtype=np.int64))
        if n == 0 or not self._use_kernel() or filters.active() is not None:
            return self._rows(queries, k, params, out)
        vocab = self.index.vocab
        ptr, split, gids, raw = [0], [], [], []

        def add(group: dict[str, float]) -> None:  # what ``weights`` keeps, before idf
            for t, w in group.items():
                g = vocab.get(t)
                if g is not None and w != 0:
                    gids.append(g)
                    raw.append(w)

        for terms, then in queries:
            add(terms)
            split.append(len(gids))
            if then:
                add(then)
            ptr.append(len(gids))
        qptr, qsplit = np.asarray(ptr, dtype=np.int64), np.asarray(split, dtype=np.int64)
        qgids, qraw = np.asarray(gids, dtype=np.int64), np.asarray(raw, dtype=np.float64)
        self._refuse_damaged()
        try:
            meta, proto, doc_off, id_rank, _ = self._shard_args(params.length_norm)
            acc, touched = self._buffers()
            den, itab = self._table(params)
            ex = self._plain_args(params)  # held while the kernel runs

            def run(i0, i1, qp, qg, prune, pk):
                o = qptr[i0]
                qs, qr, part = qsplit[i0:i1] - o, qraw[o:qptr[i1]], tuple(x[i0:i1] for x in out)
                if prune:
                    return kernels.search_batch_weighted(meta, self._blocks(params), *ex[:4], proto, doc_off, id_rank,
                                                         acc, touched, den, itab, self.index.idf, qp, qs, qg, qr, k,
                                                         self.prune_min_postings, self.prune_stats, *part, pk)
                return kernels.search_batch_weighted_plain(meta, *ex[:4], proto, doc_off, id_rank, acc, touched, den,
                                                           itab, self.index.idf, qp, qs, qg, qr, k, *part, pk)
            fault = self._by_cuts(qptr, qgids, run, params)
        except ShardFault as e:
            raise self.fault_error(e) from None
        if fault:
            raise self.fault_error(fault)
        return out

    def weights(self, terms: dict[str, float]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(global ids, w·idf, terms) for the terms the collection knows."""
        ix = self.index
        gids, ws, kept = [], [], []
        for t, w in terms.items():
            g = ix.vocab.get(t)
            if g is None or w == 0:
                continue
            gids.append(g)
            ws.append(w)
            kept.append(t)
        gids_a = np.asarray(gids, dtype=np.int64)
        return gids_a, np.asarray(ws, dtype=np.float64) * ix.idf[gids_a], kept

    def search_weighted(self, terms: dict[str, float], k: int, params: BM25Params | None = None,
                        then: dict[str, float] | None = None) -> list[Scored]:
        dn, sc = self.search_arrays(terms, k, params, then)
        return [Scored(int(n), float(v)) for n, v in zip(dn, sc)]

    def _canonical(self, terms: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        gids, ws, _ = self.weights(terms)
        if len(gids) > 1:  # the canonical term order (module docstring)
            order = np.lexsort((gids, -ws))
            gids, ws = gids[order], ws[order]
        return gids, ws

    def search_arrays(self, terms: dict[str, float], k: int, params: BM25Params | None = None,
                      then: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, scores) of the top ``k``, best first; ties by doc_id ascending.

        ``then`` (terms disjoint from ``terms``) is scored after all of ``terms``, each group
        in the canonical order: a document's score is the sum over ``terms`` plus the sum
        over ``then``, added in that order (SIRA's BM25(q) + λ·BM25(e), as its batch path
        computes it)."""
        params = params or _DEFAULT
        gids, ws = self._canonical(terms)
        if then:
            g2, w2 = self._canonical(then)
            gids, ws = np.concatenate([gids, g2]), np.concatenate([ws, w2])
        if len(gids) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        self._refuse_damaged()
        try:
            if (mask := filters.active()) is not None:  # a filtered search: allowed documents only
                from .masked import search_masked
                return search_masked(self, gids, ws, k, params, mask)
            return self.search_gids(gids, ws, k, params)
        except ShardFault as e:
            raise self.fault_error(e) from None

    def search_gids(self, gids: np.ndarray, ws: np.ndarray, k: int,
                    params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
        """`search_arrays` for canonical (global ids, w·idf), unfiltered (raises
        ``ShardFault`` or ``IndexDamaged`` where a file is damaged)."""
        if self._use_kernel():
            meta, proto, doc_off, id_rank, _ = self._shard_args(params.length_norm)
            acc, touched = self._buffers()
            den, itab = self._table(params)
            ex = self._plain_args(params)  # held while the kernel runs
            prune = self._may_prune(int(np.asarray(self.index.df)[gids].sum()))

            def call(pk):
                if not prune:
                    return kernels.search_shards_plain(meta, *ex[:4], proto, doc_off, id_rank, acc, touched, den,
                                                       itab, gids, ws, k, pk)
                return kernels.search_shards(meta, self._blocks(params), *ex[:4], proto, doc_off, id_rank, acc,
                                             touched, den, itab, gids, ws, k,
                                             self.prune_min_postings if ws.min() > 0 else -1, self.prune_stats, pk)
            dn, sc, fault = self._run_packed(gids, params, call)
            if fault:
                raise self.fault_error(fault)
            return dn, sc
        return self._search_reference(gids, ws, k, params)

    def _search_reference(self, gids: np.ndarray, ws: np.ndarray, k: int,
                          params: BM25Params) -> tuple[np.ndarray, np.ndarray]:
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
        ix = self.index
        scores_parts, docno_parts, tie_parts = [], [], []
        for s, shard in enumerate(ix.shards):
            nz, vals = shard.top_candidates(gids, ws, params, k)
            if len(nz) == 0:
                continue
            scores_parts.append(vals)
            docno_parts.append((np.int64(s) << 32) | nz.astype(np.int64))
            tie_parts.append(ix.docs.id_rank[s][nz])
        if not scores_parts:
            return empty
        sc = np.concatenate(scores_parts)
        order = np.lexsort((np.concatenate(tie_parts), -sc))[:k]
        return np.concatenate(docno_parts)[order], sc[order]

    def search(self, query: str, k: int = 10, params: BM25Params | None = None) -> list[Scored]:
        return self.search_weighted(dict(self.query_terms(query)), k, params)

    def explain(self, terms: dict[str, float], n: int, params: BM25Params | None = None) -> dict[str, dict]:
        """Per matched term: tf, df, idf and its contribution to the document's score. For a
        restricted caller (``filters.restricted``) df counts the documents it may read and idf,
        a function of the global df, is None (docs/filters-and-access.md, "The statistics side
        channel"), as ``Searcher.term_stats`` gives them."""
        return self.explain_many(terms, [n], params)[n]

    def explain_many(self, terms: dict[str, float], docnos, params: BM25Params | None = None
                     ) -> dict[int, dict[str, dict]]:
        """``explain`` of each of ``docnos`` at once: the query's weights, each term's df and idf
        and, per shard, each term's postings search are done once for all of them (an answer
        explains its ten hits: ten times the work before)."""
        params = params or BM25Params()
        ix = self.index
        gids, ws, kept = self.weights(terms)
        from ..result import split_docno
        self._refuse_damaged()
        docnos = [int(n) for n in docnos]
        by_shard: dict[int, list[int]] = {}
        for n in docnos:
            by_shard.setdefault(split_docno(n)[0], []).append(n)
        hide_idf = filters.restricted() is not None
        shown: dict[int, tuple] = {}  # term column -> (df shown, idf shown), found once
        out: dict[int, dict[str, dict]] = {}
        for s, ns in by_shard.items():
            shard = ix.shards[s]
            local = np.asarray([split_docno(n)[1] for n in ns], dtype=np.int64)
            try:
                tfs = shard.term_freqs(gids, local)
                dls = np.asarray(shard.lengths(params))[local].astype(np.float64)
            except ShardFault as e:
                raise self.fault_error(e) from None
            for c, (n, dl) in enumerate(zip(ns, dls.tolist())):
                denom = params.k1 * (1 - params.b + params.b * dl / ix.avgdl)
                got = {}
                for i, (t, g, w) in enumerate(zip(kept, gids, ws)):
                    tf = int(tfs[i, c])
                    if tf > 0:
                        if i not in shown:
                            shown[i] = (_shown_df(ix, g),
                                        None if hide_idf else float(idf_lucene(ix.df[g], ix.n_docs_nonempty)))
                        df, idf = shown[i]
                        got[t] = {"tf": tf, "df": df, "weight": float(terms[t]), "idf": idf,
                                  "contribution": float(w * tf / (tf + denom))}
                out[n] = got
        return out
