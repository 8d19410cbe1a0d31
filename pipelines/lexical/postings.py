"""Per-shard lexical postings: term-major CSR arrays, memory-mappable ``.npy`` files.

A shard directory ``lexical/shard-NNNN/`` holds

    terms.parquet   term, df, cf      the shard's vocabulary in sorted order (code point order)
    indptr.npy      int64 [V+1]       postings of local term i are docs[indptr[i]:indptr[i+1]]
    docs.npy        int32 [P]         local document ids, ascending within a term
    tfs.npy         uint16 [P]        term frequencies (int32 where one is above 65,535, and in
                                      builds before uint16: ``narrow_tfs``)
    doclen.npy      int32 [n_docs]    exact document lengths (indexed tokens)
    term_gid.npy    int32 [V]         global term id of each local term (written at finalize)
    term_max_tf.npy int32 [V]         largest tf in each term's postings (written at finalize)
    term_min_dl.npy int32 [V]         shortest document length in each term's postings (finalize)
    block_*.npy, term_max.npy, term_kth.npy, block_maxima.json
                                      exact block maxima for the default BM25 parameters and the
                                      collection's avgdl, and each block's last document
                                      (finalize; serving's pruning reads them)
    impacts.npy     uint16 [P]        each posting's ``tf / (tf + denom)`` for the default BM25
    impacts.json                      parameters and the collection's avgdl as a level q, the
                                      least with q / 65535 >= it (finalize; serving's exhaustive
                                      scoring sums them, and rescores its candidates exactly).
                                      Builds before the levels stored float32 (4 bytes a
                                      posting): serving then scores those indexes from tfs and
                                      length codes, exactly, until they are rebuilt

The last two bound every posting's BM25 factor ``tf/(tf + k1·(1 - b + b·dl/avgdl))`` for
any (k1, b) and either length encoding (it grows with tf and shrinks with dl), so serving
can prune (MaxScore) without knowing the parameters at build time. Indexes written before
they existed stay readable: serving computes them on first use.

Global term ids are positions in the globally sorted vocabulary, so ``term_gid`` is
increasing and serving finds a global term in a shard with one binary search. Ascending
doc ids inside each term's list keep the layout ready for block-max / MaxScore pruning.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .analysis import WORD_CACHE_SIZE
from ..store.artifacts import save_npy_atomic, save_npy_streamed, write_json_atomic

POSTING_FILES = ("indptr.npy", "docs.npy", "tfs.npy", "doclen.npy")
#: The posting files a packed shard holds in packed form instead (`pack_shard`).
PACKED_REPLACES = ("docs.npy", "tfs.npy")
BOUND_FILES = ("term_max_tf.npy", "term_min_dl.npy")  # optional: absent in older indexes
# Block maxima for the default BM25 parameters (optional; write_block_maxima).
BLOCK_FILES = ("block_start.npy", "block_max.npy", "term_max.npy", "term_kth.npy", "block_last.npy")
BLOCK_KEY_FILE = "block_maxima.json"
# Per-posting 16-bit impact levels for the default BM25 parameters (optional; write_impacts).
IMPACT_FILE = "impacts.npy"
IMPACT_KEY_FILE = "impacts.json"


@dataclass(frozen=True)
class ShardPostings:
    terms: list[str]
    df: np.ndarray
    cf: np.ndarray
    indptr: np.ndarray
    docs: np.ndarray
    tfs: np.ndarray
    doclen: np.ndarray

    @property
    def n_docs(self) -> int:
        return len(self.doclen)

    @property
    def total_terms(self) -> int:
        return int(self.doclen.sum())


def add_document(vocab: dict[str, int], doc: int, tokens: Sequence[str],
                 tids: list[int], dids: list[int], tfs: list[int]) -> None:
    """Append one document's (term id, doc, tf) postings, giving new terms first-seen ids in ``vocab``."""
    counts: dict[str, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        tid = vocab.get(t)
        if tid is None:
            tid = vocab[t] = len(vocab)
        tids.append(tid)
        dids.append(doc)
        tfs.append(c)


#: Postings `_Placement.place` hands over at a time (8 bytes of positions each).
PLACE_POSTINGS = 1 << 20


class PostingsBuilder:
    """Inverts documents one at a time (local id = order added) into a `ShardPostings`.

    Nothing per token outlives `add`: the postings so far are typed arrays (no Python int
    objects): 4-byte documents, 2-byte tfs, and the term ids as runs, a few per 100 postings,
    so a shard holds ~6 bytes a posting while it is built instead of ~100 for lists of every
    document's tokens and Python ints, and the peak follows the shard's postings, not its
    token stream. The result equals `build_postings` of the same token lists.

    `add_text` analyzes and adds in one step without a Python step per token: each
    distinct word maps (once) to its terms' ids, a document's ids are appended to a
    pending int32 stream, and every STREAM_TOKENS tokens the stream becomes postings in
    one NumPy sort (1M synthetic documents: the build's analysis and inversion ~1/3
    cheaper). The result equals ``add(analyzer.analyze(text))``'s.
    """

    #: Pending tokens (4 bytes each, 8 while sorted) turned into postings at a time.
    STREAM_TOKENS = 1 << 22

    def __init__(self):
        self.vocab: dict[str, int] = {}
        # The postings so far: documents and tfs, one each a posting, in the order added; the
        # term ids as runs (a term and how many postings in a row are its): a stream chunk's
        # postings come sorted by term, so its runs are its distinct terms, a few per 100
        # postings, where one id a posting held 4 bytes of each (~1/3 of the build's peak).
        self.rterms, self.rcounts = array("i"), array("i")
        # tfs as uint16 (as tfs.npy stores them), int32 once a tf above 65,535 arrives
        self.dids, self.tfs = array("i"), array("H")
        self.doclen = array("i")
        self._word_ids: dict[str, tuple[int, ...]] = {}  # word -> its terms' ids (add_text)
        self._stream, self._lens = array("i"), array("i")  # pending documents of add_text

    def add(self, tokens: Sequence[str]) -> None:
        """One analyzed document, through the pending stream as `add_text`'s."""
        vocab = self.vocab
        self._stream.extend([vocab.setdefault(t, len(vocab)) for t in tokens])
        self._lens.append(len(tokens))
        if len(self._stream) >= self.STREAM_TOKENS:
            self._flush()

    def add_text(self, text: str, analyzer) -> None:
        """``add(analyzer.analyze(text))``, faster (see the class docstring)."""
        words = analyzer.split_words(text)
        if words is None:
            return self.add(analyzer.analyze(text))
        cache = self._word_ids
        got = list(map(cache.get, words))
        if None in got:
            vocab = self.vocab
            for i, g in enumerate(got):
                if g is None:
                    w = words[i]
                    g = got[i] = tuple([vocab.setdefault(t, len(vocab)) for t in analyzer.word_terms(w)])
                    if len(cache) < WORD_CACHE_SIZE:
                        cache[w] = g
        n0 = len(self._stream)
        self._stream.extend(chain.from_iterable(got))
        self._lens.append(len(self._stream) - n0)
        if len(self._stream) >= self.STREAM_TOKENS:
            self._flush()

    def _flush(self) -> None:
        """The pending stream's documents as postings (sorted (term, doc) pairs and counts)."""
        if not len(self._lens):
            return
        lens = np.frombuffer(self._lens, dtype=np.int32)
        n, first = len(lens), len(self.doclen)
        key = np.frombuffer(self._stream, dtype=np.int32).astype(np.int64) * n
        key += np.repeat(np.arange(n, dtype=np.int64), lens)
        key.sort()
        if len(key):
            starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
            tfs = np.diff(np.append(starts, len(key)))
            if self.tfs.typecode == "H" and tfs.max() > np.iinfo(np.uint16).max:
                self.tfs = array("i", self.tfs)  # widened once (a document repeating a word 65,536 times)
            self.tfs.frombytes(tfs.astype(np.uint16 if self.tfs.typecode == "H" else np.int32).tobytes())
            del tfs
            key = key[starts]
            self.dids.frombytes((key % n + first).astype(np.int32).tobytes())
            tids = (key // n).astype(np.int32)
            del key
            runs = np.flatnonzero(np.concatenate(([True], tids[1:] != tids[:-1])))
            self.rterms.frombytes(tids[runs].tobytes())
            self.rcounts.frombytes(np.diff(np.append(runs, len(tids))).astype(np.int32).tobytes())
        self.doclen.frombytes(lens.tobytes())
        self._stream, self._lens = array("i"), array("i")

    def finish(self) -> ShardPostings:
        """The shard's postings, in memory."""
        plan = self._plan()
        docs = np.empty(plan.n, dtype=np.int32)
        plan.place(plan.dids, lambda a, e, v: docs.__setitem__(slice(a, e), v))
        plan.dids = None
        self.dids = array("i")  # the documents in arrival order are gone
        tfs = np.empty(plan.n, dtype=plan.tfs.dtype)
        plan.place(plan.tfs, lambda a, e, v: tfs.__setitem__(slice(a, e), v))
        return plan.postings(docs, tfs)

    def finish_to(self, shard_dir: str) -> ShardPostings:
        """`finish`, and `write_shard` of it, the documents and tfs written as they are
        placed, a million at a time: the placed arrays are never whole in memory (the peak
        holds the arriving ones, ~6 bytes a posting, not ~10). The returned postings'
        documents and tfs are the written files, memory-mapped."""
        plan = self._plan()
        os.makedirs(shard_dir, exist_ok=True)
        save_npy_streamed(os.path.join(shard_dir, "docs.npy"), np.int32, plan.n,
                          lambda put: plan.place(plan.dids, lambda a, e, v: put(v)))
        plan.dids = None
        self.dids = array("i")  # the documents in arrival order are gone
        save_npy_streamed(os.path.join(shard_dir, "tfs.npy"), plan.tfs.dtype, plan.n,
                          lambda put: plan.place(plan.tfs, lambda a, e, v: put(v)))
        post = plan.postings(np.load(os.path.join(shard_dir, "docs.npy"), mmap_mode="r"),
                             np.load(os.path.join(shard_dir, "tfs.npy"), mmap_mode="r"))
        _write_shard_rest(shard_dir, post)
        return post

    def _plan(self) -> "_Placement":
        """Everything `finish` needs but the placed arrays: the terms in order, df, cf, indptr,
        the documents and tfs in arrival order, and where each run of them goes."""
        self._flush()
        self._word_ids = {}  # add_text's cache is done with: freed before the sort's peak
        vocab = self.vocab
        terms = sorted(vocab)
        # Remap first-seen ids to sorted order: the runs' ids, a few per 100 postings.
        remap = np.empty(len(vocab), dtype=np.int32)
        for new, t in enumerate(terms):
            remap[vocab[t]] = new
        rterm = remap[np.frombuffer(self.rterms, dtype=np.int32)] if len(self.rterms) else np.zeros(0, np.int32)
        del remap
        rcount = np.frombuffer(self.rcounts, dtype=np.int32) if len(self.rcounts) else np.zeros(0, np.int32)
        self.rterms = self.rcounts = array("i")  # the views hold what they need
        did_arr = np.frombuffer(self.dids, dtype=np.int32) if len(self.dids) else np.zeros(0, np.int32)
        tf_arr = (np.frombuffer(self.tfs, dtype=np.uint16 if self.tfs.typecode == "H" else np.int32)
                  if len(self.tfs) else np.zeros(0, np.uint16))
        tf_arr = narrow_tfs(tf_arr)  # where widened: uint16 again unless a tf above 65,535 is left
        self.tfs = array("H")  # the view holds what it needs (else the int32 tfs outlive the narrowing)
        src = np.zeros(len(rcount) + 1, dtype=np.int64)  # each run's first posting, in arrival order
        np.cumsum(rcount, out=src[1:])
        # float64 sums of int32 counts and of a run's tfs: exact (a shard holds below 2**53 postings)
        df = np.bincount(rterm, weights=rcount, minlength=len(terms)).astype(np.int64)
        run_tf = _run_sums(tf_arr, src)
        cf = np.bincount(rterm, weights=run_tf, minlength=len(terms)).astype(np.int64)
        del run_tf
        indptr = np.zeros(len(terms) + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        # Postings arrive in document order for every term (documents are added in order;
        # a stream chunk's pairs are sorted by (term, doc)), so each term's postings are its
        # runs in arrival order, one after the other: the runs put in term order (a stable
        # sort of the runs, not of the postings) are the postings' final order, without
        # NumPy's sort of the postings or numba (a Ray shard worker that never imports numba
        # holds ~160 MiB less; ``finalize_shard``, in the driver, runs the kernels).
        order = np.argsort(rterm, kind="stable")
        del rterm
        doclen = np.frombuffer(self.doclen, dtype=np.int32).copy()
        return _Placement(terms, df, cf, indptr, doclen, did_arr, tf_arr, src[:-1][order], rcount[order])


def _batches(bounds: np.ndarray):
    """Consecutive run ranges [r0, r1) of runs [bounds[i], bounds[i + 1]) (ascending, none
    empty) holding about `PLACE_POSTINGS` postings each (one run alone where it is larger)."""
    r0, n = 0, len(bounds) - 1
    while r0 < n:
        r1 = min(max(int(np.searchsorted(bounds, bounds[r0] + PLACE_POSTINGS, side="right")) - 1, r0 + 1), n)
        yield r0, r1
        r0 = r1


def _run_sums(values: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Each run's sum of ``values`` (run i: ``values[src[i]:src[i + 1]]``, none empty) as int64,
    `PLACE_POSTINGS` values at a time: ``reduceat`` with an int64 sum converts the array it
    reads to int64 first (8 bytes a posting, the shard's whole at once)."""
    out = np.zeros(len(src) - 1, dtype=np.int64)
    for r0, r1 in _batches(src):
        out[r0:r1] = np.add.reduceat(values[src[r0]:src[r1]], src[r0:r1] - src[r0], dtype=np.int64)
    return out


class _Placement:
    """`PostingsBuilder._plan`: the runs in their final order (``src``: each one's first
    posting in arrival order, ``cnt``: its length), and `place`, which hands an array's
    postings over in that order, `PLACE_POSTINGS` at a time."""

    def __init__(self, terms, df, cf, indptr, doclen, dids, tfs, src, cnt):
        self.terms, self.df, self.cf, self.indptr, self.doclen = terms, df, cf, indptr, doclen
        self.dids, self.tfs, self.src, self.cnt = dids, tfs, src, cnt
        self.n = int(indptr[-1])
        self.dst = np.zeros(len(cnt) + 1, dtype=np.int64)  # each run's first slot
        np.cumsum(cnt, out=self.dst[1:])

    def place(self, values: np.ndarray, put) -> None:
        """``put(a, e, placed[a:e])`` for consecutive ranges [a, e) covering ``values`` placed:
        each range's positions (8 bytes a posting) computed at once, never the shard's."""
        dst = self.dst
        for r0, r1 in _batches(dst):
            pos = np.repeat(self.src[r0:r1] - dst[r0:r1], self.cnt[r0:r1])
            pos += np.arange(dst[r0], dst[r1], dtype=np.int64)
            put(int(dst[r0]), int(dst[r1]), values[pos])
            del pos

    def postings(self, docs, tfs) -> ShardPostings:
        return ShardPostings(self.terms, self.df, self.cf, self.indptr, docs, tfs, self.doclen)


def build_postings(token_lists: Sequence[Sequence[str]]) -> ShardPostings:
    """Invert analyzed documents (local id = position in ``token_lists``) into CSR arrays."""
    b = PostingsBuilder()
    for toks in token_lists:
        b.add(toks)
    return b.finish()


def narrow_tfs(tfs: np.ndarray) -> np.ndarray:
    """``tfs`` as stored (``tfs.npy``): uint16 (2 bytes a posting instead of 4) where every
    tf fits, which it does unless a document repeats a term more than 65,535 times; else
    int32. Serving reads either (``kernels.tf_dtype``)."""
    tfs = np.asarray(tfs)
    if len(tfs) == 0 or int(tfs.max()) <= np.iinfo(np.uint16).max:
        return tfs.astype(np.uint16, copy=False)
    return tfs.astype(np.int32, copy=False)


def write_shard(shard_dir: str, p: ShardPostings) -> None:
    os.makedirs(shard_dir, exist_ok=True)
    save_npy_atomic(os.path.join(shard_dir, "docs.npy"), p.docs)
    save_npy_atomic(os.path.join(shard_dir, "tfs.npy"), narrow_tfs(p.tfs))
    _write_shard_rest(shard_dir, p)


def _write_shard_rest(shard_dir: str, p: ShardPostings) -> None:
    """`write_shard`'s files but ``docs.npy`` and ``tfs.npy``."""
    save_npy_atomic(os.path.join(shard_dir, "indptr.npy"), p.indptr)
    save_npy_atomic(os.path.join(shard_dir, "doclen.npy"), p.doclen)
    table = pa.table({"term": pa.array(p.terms, pa.string()),
                      "df": pa.array(p.df, pa.int64()), "cf": pa.array(p.cf, pa.int64())})
    pq.write_table(table, os.path.join(shard_dir, "terms.parquet"))


def finalize_shard(shard_dir: str, global_terms: np.ndarray, avgdl: float | None = None,
                   packed: bool = False) -> None:
    """Write ``term_gid.npy`` (each local term's position in the sorted global vocabulary),
    the per-term bounds, and, given the collection's ``avgdl`` (and numba), the block
    maxima and the per-posting impacts for the default BM25 parameters
    (`write_block_maxima`, `write_impacts`). ``packed``: the postings then replace
    ``docs.npy``, ``tfs.npy`` and the impacts with their packed form (`pack_shard`)."""
    local = pq.read_table(os.path.join(shard_dir, "terms.parquet"), columns=["term"])
    local_terms = np.asarray(local.column("term").to_pylist(), dtype=object)
    gid = np.searchsorted(global_terms, local_terms).astype(np.int32)
    if len(gid) and not np.array_equal(global_terms[np.minimum(gid, len(global_terms) - 1)], local_terms):
        raise RuntimeError(f"shard {shard_dir}: terms missing from the global vocabulary")
    save_npy_atomic(os.path.join(shard_dir, "term_gid.npy"), gid)
    a = load_shard(shard_dir, with_bounds=False)
    max_tf, min_dl = term_bounds(a["indptr"], a["docs"], a["tfs"], a["doclen"])
    save_npy_atomic(os.path.join(shard_dir, "term_max_tf.npy"), max_tf)
    save_npy_atomic(os.path.join(shard_dir, "term_min_dl.npy"), min_dl)
    if avgdl is not None:
        write_block_maxima(shard_dir, a, avgdl)
        if not packed:
            write_impacts(shard_dir, a, avgdl)
    if packed:
        pack_shard(shard_dir, a)


def pack_shard(shard_dir: str, a: dict[str, np.ndarray]) -> None:
    """Replace the shard's ``docs.npy`` and ``tfs.npy`` (and any ``impacts.npy``) with their
    packed form (``PACKED_FILES``, ``packed.json``; ``serving/kernels/packed.py``): document
    gaps and tfs bit-packed per block of 128 postings, about 1-2 bytes a posting instead of
    6-8. Serving decodes the terms a query reads into a bounded cache (``serving/lexical/packed.py``);
    the stored impacts are not kept (serving scores a packed shard from its tfs, exactly)."""
    from funnel.serving.kernels.packed import PACK_BLOCK, pack_postings
    from funnel.serving.lexical.packed import PACKED_FILES, PACKED_FORMAT, PACKED_KEY
    tfs = narrow_tfs(np.asarray(a["tfs"]))
    arrays = pack_postings(np.asarray(a["indptr"], dtype=np.int64), np.asarray(a["docs"]), tfs)
    for name, arr in zip(PACKED_FILES, arrays, strict=True):
        save_npy_atomic(os.path.join(shard_dir, name), arr)
    write_json_atomic(os.path.join(shard_dir, PACKED_KEY),
                      {"format": PACKED_FORMAT, "block": PACK_BLOCK, "tfs_dtype": str(tfs.dtype),
                       "postings": int(len(tfs))})
    for name in PACKED_REPLACES + (IMPACT_FILE, IMPACT_KEY_FILE):
        path = os.path.join(shard_dir, name)
        if os.path.exists(path):
            os.remove(path)


def is_packed(shard_dir: str) -> bool:
    """Whether the shard's postings are packed (`pack_shard`)."""
    from funnel.serving.lexical.packed import PACKED_KEY
    return os.path.exists(os.path.join(shard_dir, PACKED_KEY))


def posting_files(shard_dir: str) -> tuple[str, ...]:
    """The files that hold a shard's postings: ``POSTING_FILES``, or for a packed shard the
    same less ``PACKED_REPLACES`` plus the packed files (`pack_shard`)."""
    if not is_packed(shard_dir):
        return POSTING_FILES
    from funnel.serving.lexical.packed import PACKED_FILES, PACKED_KEY
    return tuple(n for n in POSTING_FILES if n not in PACKED_REPLACES) + PACKED_FILES + (PACKED_KEY,)


def write_block_maxima(shard_dir: str, a: dict[str, np.ndarray], avgdl: float) -> bool:
    """Store the shard's block maxima for the default BM25 parameters and this ``avgdl``
    (``BLOCK_FILES``, and ``block_maxima.json`` naming what they were computed for), so that
    serving memory-maps them instead of computing them at its first pruning query (0.5 s and
    66 MB at 1M documents). They are the exact impacts serving would compute, one per 64
    postings, rounded to float32 outward (``kernels.block_bounds32``: a block's or term's
    maximum up, a term's k-th block maximum down; ~1/64 of ``docs.npy``), as serving rounds
    the ones it computes. A reindex rewrites them for every shard (avgdl changes). Returns
    False (nothing written) without numba."""
    from funnel.serving import kernels
    if not kernels.HAVE_NUMBA:
        return False
    from funnel.serving.lexical.bm25 import norm_bytes
    from funnel.serving.lexical.retriever import block_maxima_key, default_block_maxima
    arrays = kernels.block_bounds32(
        default_block_maxima(a["indptr"], a["docs"], a["tfs"], norm_bytes(np.asarray(a["doclen"])), avgdl))
    for name, arr in zip(BLOCK_FILES, arrays, strict=True):
        save_npy_atomic(os.path.join(shard_dir, name), arr)
    write_json_atomic(os.path.join(shard_dir, BLOCK_KEY_FILE), block_maxima_key(avgdl))
    return True


def write_impacts(shard_dir: str, a: dict[str, np.ndarray], avgdl: float) -> bool:
    """Store each posting's impact ``tf / (tf + k1·(1 - b + b·L/avgdl))`` for the default
    BM25 parameters and this ``avgdl``, as 16-bit levels rounded up (``impacts.npy``,
    ``kernels.posting_levels``; ``impacts.json`` names what they were computed for and the
    quantization). Serving's exhaustive scoring reads one of these per posting instead of a
    tf, a length code and a table cell, sums them in float64, keeps every document within
    the quantization's proven margin of the k-th and rescores those exactly, so results
    keep float64 scoring's bits (``serving.kernels._search_approx``). A reindex rewrites
    them (avgdl changes). Returns False (nothing written) without numba."""
    from funnel.serving import kernels
    if not kernels.HAVE_NUMBA:
        return False
    from funnel.serving.lexical.bm25 import norm_bytes
    from funnel.serving.lexical.retriever import default_impacts, impacts_key
    imp = default_impacts(a["docs"], a["tfs"], norm_bytes(np.asarray(a["doclen"])), avgdl)
    save_npy_atomic(os.path.join(shard_dir, IMPACT_FILE), imp)
    write_json_atomic(os.path.join(shard_dir, IMPACT_KEY_FILE), impacts_key(avgdl))
    return True


def load_impacts(shard_dir: str) -> tuple[dict, np.ndarray] | None:
    """(what they were computed for, memory-mapped impact levels) of a shard's stored
    per-posting impacts; None where the build did not store them."""
    key_path = os.path.join(shard_dir, IMPACT_KEY_FILE)
    if not (os.path.exists(key_path) and os.path.exists(os.path.join(shard_dir, IMPACT_FILE))):
        return None
    with open(key_path, encoding="utf-8") as f:
        key = json.load(f)
    return key, np.load(os.path.join(shard_dir, IMPACT_FILE), mmap_mode="r")


def load_block_maxima(shard_dir: str) -> tuple[dict, tuple[np.ndarray, ...]] | None:
    """(what they were computed for, memory-mapped (bstart, bmax, tmax, tkth, blast)) of a shard's
    stored block maxima; None where the build did not store them (or stored them before
    ``block_last.npy`` existed: serving then computes them all)."""
    key_path = os.path.join(shard_dir, BLOCK_KEY_FILE)
    if not all(os.path.exists(os.path.join(shard_dir, n)) for n in (BLOCK_KEY_FILE,) + BLOCK_FILES):
        return None
    with open(key_path, encoding="utf-8") as f:
        key = json.load(f)
    return key, tuple(np.load(os.path.join(shard_dir, n), mmap_mode="r") for n in BLOCK_FILES)


def term_bounds(indptr: np.ndarray, docs: np.ndarray, tfs: np.ndarray,
                doclen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per term: (largest tf, shortest document length) over its postings, int32; 0 for a
    term without postings. One pass in chunks of terms, so memory stays small."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n_terms = len(indptr) - 1
    max_tf = np.zeros(n_terms, dtype=np.int32)
    min_dl = np.zeros(n_terms, dtype=np.int32)
    nonempty = np.flatnonzero(np.diff(indptr) > 0)
    chunk = 1 << 16  # terms per step
    for c in range(0, len(nonempty), chunk):
        t = nonempty[c:c + chunk]
        lo, hi = int(indptr[t[0]]), int(indptr[t[-1] + 1])
        starts = indptr[t] - lo
        max_tf[t] = np.maximum.reduceat(np.asarray(tfs[lo:hi]), starts)
        min_dl[t] = np.minimum.reduceat(np.asarray(doclen)[np.asarray(docs[lo:hi])], starts)
    return max_tf, min_dl


def load_shard(shard_dir: str, mmap: bool = True, with_bounds: bool = True,
               decode: bool = True) -> dict[str, np.ndarray]:
    """The shard's arrays by name (``indptr``, ``docs``, ...); the bound arrays where present.
    A packed shard's ``docs`` and ``tfs`` are decoded into memory (``decode``; without it
    they are left out: serving decodes them term by term, ``serving/lexical/packed.py``)."""
    mode = "r" if mmap else None
    packed = is_packed(shard_dir)
    names = tuple(n for n in POSTING_FILES if not (packed and n in PACKED_REPLACES)) + ("term_gid.npy",)
    if with_bounds:
        names += tuple(n for n in BOUND_FILES if os.path.exists(os.path.join(shard_dir, n)))
    out = {n[:-4]: np.load(os.path.join(shard_dir, n), mmap_mode=mode) for n in names}
    if packed and decode:
        from funnel.serving.lexical.packed import PackedShard
        p = PackedShard(shard_dir, np.asarray(out["indptr"]), len(out["doclen"]), shard_dir)
        out["docs"], out["tfs"] = p.all()
    return out

