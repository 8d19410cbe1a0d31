"""BM25 as Lucene 9 scores it, over term-major shard postings with global statistics.

    idf(t)     = ln(1 + (N - df + 0.5) / (df + 0.5))                      (Lucene BM25Similarity)
    score(q,d) = Σ_t w_t · idf(t) · tf / (tf + k1 · (1 - b + b · dl / avgdl))

no (k1 + 1) factor (Lucene 9 dropped it; rank-equivalent). ``dl`` is, by default, the
document length after Lucene's one-byte norm encoding (``SmallFloat.intToByte4`` then
``byte4ToInt``): scoring SciFact with it reproduces Lucene's rankings, with exact lengths
it does not. N is the number of documents with at least one term, avgdl = total terms / N.
Every shard scores with these global statistics, so a sharded index ranks like one shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShardFault

LENGTH_NORMS = ("lucene-byte4", "exact")


def _long_to_int4(i: int) -> int:
    num_bits = i.bit_length()
    if num_bits < 4:
        return i
    shift = num_bits - 4
    return ((i >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_long(i: int) -> int:
    bits = i & 0x07
    shift = (i >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_NUM_FREE_VALUES = 255 - _long_to_int4(2**31 - 1)  # 24


def int_to_byte4(i: int) -> int:
    """Lucene ``SmallFloat.intToByte4``: lossy one-byte encoding of a non-negative int."""
    if i < 0:
        raise ValueError("length must be >= 0")
    if i < _NUM_FREE_VALUES:
        return i
    return _NUM_FREE_VALUES + _long_to_int4(i - _NUM_FREE_VALUES)


def byte4_to_int(b: int) -> int:
    """Lucene ``SmallFloat.byte4ToInt``."""
    if b < _NUM_FREE_VALUES:
        return b
    return _NUM_FREE_VALUES + _int4_to_long(b - _NUM_FREE_VALUES)


_BYTE4_TABLE = np.array([byte4_to_int(b) for b in range(256)], dtype=np.float64)


def _searched_norms(lengths: np.ndarray) -> np.ndarray:
    """Each length's norm byte: the last byte whose decoded value does not exceed it."""
    return (np.searchsorted(_BYTE4_TABLE, lengths, side="right") - 1).astype(np.uint8)


#: The norm byte of every length below 65,536 (64 KiB): one lookup a document in norm_bytes.
_SHORT_NORMS = _searched_norms(np.arange(1 << 16))


def lucene_lengths(doclen: np.ndarray) -> np.ndarray:
    """Decoded Lucene norms for exact lengths (vectorized through a 256-entry table)."""
    return _BYTE4_TABLE[norm_bytes(doclen)]


def idf_lucene(df: np.ndarray | float, n_docs: int) -> np.ndarray:
    """``ln(1 + (N - df + 0.5) / (df + 0.5))``."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def length_denominator(dl: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """``k1 · (1 - b + b · dl / avgdl)`` per document."""
    return k1 * (1.0 - b + b * np.asarray(dl, dtype=np.float64) / avgdl)


def term_impacts(tf: np.ndarray, denom_of_docs: np.ndarray) -> np.ndarray:
    """``tf / (tf + denom)``: the per-posting factor that idf and the query weight scale."""
    tf = tf.astype(np.float64)
    return tf / (tf + denom_of_docs)


@dataclass(frozen=True)
class BM25Params:
    k1: float = 0.9
    b: float = 0.4
    length_norm: str = "lucene-byte4"

    def __post_init__(self):
        if self.k1 < 0:
            raise ValueError(f"k1 must be >= 0, got {self.k1}")
        if not 0.0 <= self.b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {self.b}")
        if self.length_norm not in LENGTH_NORMS:
            raise ValueError(f"unknown length_norm {self.length_norm!r}; choose one of {', '.join(LENGTH_NORMS)}")


def norm_bytes(doclen: np.ndarray) -> np.ndarray:
    """Lucene's one-byte norm (``SmallFloat.intToByte4``) of each length, as uint8.

    The encoding rounds down and its decoded values rise with the byte, so a length's byte is
    the last one whose decoded value does not exceed it: a binary search in the 256 decoded
    values (a table of its answers below 65,536), with no sort of the lengths (``np.unique``
    took 0.12 s of the first query at 1M documents)."""
    a = np.asarray(doclen)
    if a.size and a.min() < 0:
        raise ValueError("length must be >= 0")
    if a.size and a.max() < len(_SHORT_NORMS):  # documents shorter than 65,536 terms: one lookup each
        return _SHORT_NORMS[a]
    return _searched_norms(a.astype(np.int64))


def denominator_table(params: "BM25Params", avgdl: float, max_len: int) -> np.ndarray:
    """``k1 · (1 - b + b · L / avgdl)`` for every length code a document can have.

    With Lucene norms the code is the norm byte (256 entries, L = ``byte4ToInt(code)``), as
    Lucene's BM25Similarity caches it; with exact lengths the code is the length itself
    (``max_len + 1`` entries). Elementwise the same arithmetic as ``length_denominator``
    on each document's length, so scores are bit-identical to a per-document computation.
    """
    if params.length_norm == "exact":
        return length_denominator(np.arange(max_len + 1, dtype=np.float64), avgdl, params.k1, params.b)
    return length_denominator(_BYTE4_TABLE, avgdl, params.k1, params.b)


class ShardScorer:
    """One shard's postings, memory-mapped, and the NumPy reference scorer.

    Nothing proportional to the postings is ever materialised: the per-posting factor
    ``tf/(tf+denom)`` is computed for the query's postings only, from a per-document length
    code (Lucene's norm byte, computed once per shard: one byte per document) and a small
    table of denominators per (k1, b). The fast path is ``kernels.search_shards``, which
    scores all shards in one compiled call; ``use_kernel = False`` on any shard selects
    this reference path instead (tests run both).

    Per-term bounds for pruning (largest tf, shortest document length) are read from
    ``term_max_tf.npy`` / ``term_min_dl.npy`` when the build wrote them, else computed on
    first use (indexes from before they existed).

    The arrays are memory-mapped: their bytes may change while the version is served (see
    ``kernels``, "Damaged files"). What indexes a table by a value read from them is checked
    first: here each term's postings range, document ids and tfs before NumPy uses them; the
    length codes (``norms``, ``exact_codes``) and minimum-length codes are private copies
    checked when made. An impossible value raises ``errors.ShardFault`` naming the file
    (``rel``: the shard's folder in the version, ``lexical/shard-NNNN``).
    """

    def __init__(self, arrays: dict[str, np.ndarray], avgdl: float, stored_blocks: tuple | None = None,
                 stored_impacts: tuple | None = None, rel: str = "lexical/shard-0000", packed=None):
        # Plain ndarray views of the memory maps: slicing an np.memmap subclass costs ~1µs more.
        self.indptr = np.asarray(arrays["indptr"])
        # A packed shard (serving.lexical.packed.PackedShard): ``docs`` and ``tfs`` are its decode
        # targets, which hold a term's postings only while the postings cache has it decoded;
        # the kernels read them (BM25Retriever pins their terms first), everything else here
        # decodes a term for itself (`postings`, `all_postings`).
        self.packed = packed
        self.docs = packed.docs if packed is not None else np.asarray(arrays["docs"])
        self.tfs = packed.tfs if packed is not None else np.asarray(arrays["tfs"])
        self.doclen = np.asarray(arrays["doclen"])
        self.term_gid = np.asarray(arrays["term_gid"])
        self.n_docs = len(self.doclen)
        self.avgdl = avgdl
        self._max_tf = arrays.get("term_max_tf")
        self._min_dl = arrays.get("term_min_dl")
        # (key, (bstart, bmax, tmax, tkth, blast)) block maxima the build stored (load_block_maxima),
        # used by BM25Retriever._blocks when the key matches; None: computed on first use.
        self.stored_blocks = stored_blocks
        # (key, impact level per posting) the build stored (load_impacts), used by
        # BM25Retriever._impacts32 when the key matches; None: the exhaustive kernels use the grid.
        self.stored_impacts = stored_impacts
        self.rel = rel
        # The longest document when opened: exact-length tables are sized by it, and a length
        # read later above it is damage, not a table of billions of entries.
        self.max_len = int(self.doclen.max(initial=0))
        self._norms = None
        self._min_norm = None
        self._exact = None
        self._exact_min = None
        self._lucene_dl = None
        self.use_kernel = True

    def fault(self, name: str, reason: str) -> ShardFault:
        """The error for an impossible value in this shard's file ``name`` (``docs.npy``)."""
        return ShardFault(f"{self.rel}/{name}", reason)

    def _lengths_copy(self, a, name: str, hi: int | None = None) -> np.ndarray:
        """A private int32 copy of lengths ``a`` (from ``name``), each in [0, hi] (hi None: no
        upper bound): what indexes a length table, checked once, immune to later writes."""
        c = np.array(a, dtype=np.int32)
        if len(c) and (int(c.min()) < 0 or (hi is not None and int(c.max()) > hi)):
            i = int(np.flatnonzero((c < 0) | (c > (hi if hi is not None else np.iinfo(np.int32).max)))[0])
            raise self.fault(name, f"holds length {int(c[i])} at position {i}, outside [0, "
                                   f"{hi if hi is not None else 'inf'}]")
        return c

    @property
    def norms(self) -> np.ndarray:
        """Lucene norm byte of every document (uint8; made from a checked copy of the lengths)."""
        if self._norms is None:
            self._norms = norm_bytes(self._lengths_copy(self.doclen, "doclen.npy"))
        return self._norms

    def exact_codes(self) -> np.ndarray:
        """Each document's exact length (int32), the length code of ``length_norm="exact"``:
        a private copy, checked once (each within [0, ``max_len``]), so the exact tables sized
        by its largest value stay large enough whatever ``doclen.npy`` holds later."""
        if self._exact is None:
            self._exact = self._lengths_copy(self.doclen, "doclen.npy", self.max_len)
        return self._exact

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(largest tf, shortest document length) of each local term's postings."""
        if self._max_tf is None or self._min_dl is None:
            from funnel.pipelines.lexical.postings import term_bounds
            try:
                self._max_tf, self._min_dl = term_bounds(self.indptr, *self.all_postings(), self.doclen)
            except (IndexError, ValueError) as e:  # the postings do not index the lengths
                raise self.fault("docs.npy", f"does not index the shard's documents ({e})") from None
        return np.asarray(self._max_tf), np.asarray(self._min_dl)

    def min_norms(self) -> np.ndarray:
        """Norm byte of each term's shortest document (the bound's length code, Lucene norms)."""
        if self._min_norm is None:
            self._min_norm = norm_bytes(self._lengths_copy(self.bounds()[1], "term_min_dl.npy"))
        return self._min_norm

    def exact_min_codes(self) -> np.ndarray:
        """Each term's shortest document length, the bound's code for exact lengths: a private
        copy, checked within [0, the longest document] (the exact table's size)."""
        if self._exact_min is None:
            self._exact_min = self._lengths_copy(self.bounds()[1], "term_min_dl.npy",
                                                 int(self.exact_codes().max(initial=0)))
        return self._exact_min

    def codes(self, params: BM25Params) -> np.ndarray:
        """Each document's length code: its norm byte, or its exact length."""
        return self.exact_codes() if params.length_norm == "exact" else self.norms

    def lengths(self, params: BM25Params) -> np.ndarray:
        if params.length_norm == "exact":
            return self.exact_codes().astype(np.float64)
        if self._lucene_dl is None:
            self._lucene_dl = _BYTE4_TABLE[self.norms]
        return self._lucene_dl

    def _range(self, li: int) -> tuple[int, int]:
        """Local term ``li``'s postings [s, e), checked inside ``docs``."""
        s, e = int(self.indptr[li]), int(self.indptr[li + 1])
        if not 0 <= s <= e <= len(self.docs):
            raise self.fault("indptr.npy", f"gives term {li} the postings {s} to {e}, outside [0, {len(self.docs)}]")
        return s, e

    def all_postings(self) -> tuple[np.ndarray, np.ndarray]:
        """(document ids, tfs) of every posting, in term order: the maps, or a packed
        shard's postings decoded into new arrays (checked as they are decoded)."""
        if self.packed is not None:
            return self.packed.all()
        return self.docs, self.tfs

    def term_postings(self, li: int) -> tuple[np.ndarray, np.ndarray]:
        """(document ids, tfs) of local term ``li``, its range checked: views of the maps,
        their values unchecked (`postings` checks them), or a packed shard's decoded into new
        arrays (checked as they are decoded)."""
        s, e = self._range(li)
        if self.packed is not None:
            return self.packed.term(li)
        return self.docs[s:e], self.tfs[s:e]

    def term_docs(self, li: int, take: int | None = None) -> np.ndarray:
        """The first ``take`` (all: None) document ids of local term ``li`` (`term_postings`)."""
        d = self.term_postings(li)[0]
        return d if take is None else d[:take]

    def postings(self, li: int) -> tuple[np.ndarray, np.ndarray]:
        """(document ids, tfs) of local term ``li``, checked: its range inside the postings,
        ids within the shard, tfs at least 1 (else ``ShardFault``). Views of the maps: NumPy
        checks its own indexing, so a write between this check and the use can make a wrong
        score or an IndexError, never a read outside an array. A packed shard's: decoded into
        new arrays."""
        s, e = self._range(li)
        if self.packed is not None:
            return self.packed.term(li)
        d = self.docs[s:e]
        tf = self.tfs[s:e]
        if len(d) and (int(d.min()) < 0 or int(d.max()) >= self.n_docs):
            bad = int(d.min()) if int(d.min()) < 0 else int(d.max())
            raise self.fault("docs.npy", f"holds document id {bad} at position {s + int(np.flatnonzero(d == bad)[0])}, "
                                         f"outside [0, {self.n_docs})")
        if len(tf) and int(tf.min()) < 1:
            raise self.fault("tfs.npy", f"holds term frequency {int(tf.min())} at position "
                                        f"{s + int(np.argmin(tf))}, below 1")
        return d, tf

    def local_terms(self, gids: np.ndarray) -> np.ndarray:
        """Local term index of each global id, -1 where the shard lacks the term."""
        tg = self.term_gid
        if len(tg) == 0:
            return np.full(len(gids), -1, dtype=np.int64)
        # The keys in the table's dtype: a searchsorted of int64 keys in an int32 table converts
        # the whole table on every call (0.23 ms for 300K terms; ~1 us this way, measured).
        # An id outside the dtype's range cannot be in the table.
        g = np.asarray(gids)
        info = np.iinfo(tg.dtype)
        inside = (g >= info.min) & (g <= info.max)
        keys = np.where(inside, g, 0).astype(tg.dtype)
        pos_c = np.minimum(np.searchsorted(tg, keys), len(tg) - 1)
        return np.where(inside & (tg[pos_c] == keys), pos_c, -1)

    def _term_parts(self, gids, weights, params):
        local = self.local_terms(gids)
        code = self.codes(params)
        table = denominator_table(params, self.avgdl, int(self.exact_codes().max(initial=0))
                                  if params.length_norm == "exact" else 255)
        for li, w in zip(local.tolist(), weights.tolist()):
            if li < 0:
                continue
            d, tf = self.postings(li)
            yield d, term_impacts(tf, table[code[d]]) * w

    def score(self, gids: np.ndarray, weights: np.ndarray, params: BM25Params) -> np.ndarray | None:
        """Dense score vector over the shard's documents (None when no term occurs here).

        ``weights`` already include idf: w_t · idf_t. Terms are summed in the given order.
        """
        parts = list(self._term_parts(gids, weights, params))
        if not parts:
            return None
        if len(parts) == 1:
            out = np.zeros(self.n_docs)
            out[parts[0][0]] = parts[0][1]
            return out
        return np.bincount(np.concatenate([d for d, _ in parts]), weights=np.concatenate([v for _, v in parts]),
                           minlength=self.n_docs)

    def top_candidates(self, gids: np.ndarray, weights: np.ndarray, params: BM25Params,
                       k: int) -> tuple[np.ndarray, np.ndarray]:
        """Local ids and scores of the shard's top ``k`` (all ties at the k-th score kept),
        positive scores only; the NumPy reference for ``kernels.search_shards``."""
        scores = self.score(gids, weights, params)
        if scores is None:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        nz = np.flatnonzero(scores > 0)
        vals = scores[nz]
        if len(nz) > k:
            kth = np.partition(vals, len(nz) - k)[len(nz) - k]
            keep = vals >= kth
            nz, vals = nz[keep], vals[keep]
        return nz, vals

    def term_freqs(self, gids: np.ndarray, local_ids: np.ndarray) -> np.ndarray:
        """``(len(gids), len(local_ids))`` tf of each global term in each document (0 where
        absent); for explanations: one binary search per term for all the documents."""
        local_ids = np.asarray(local_ids).reshape(-1)
        out = np.zeros((len(gids), len(local_ids)), dtype=np.int64)
        if len(local_ids) == 0:
            return out
        for i, li in enumerate(self.local_terms(gids).tolist()):
            if li < 0:
                continue
            d, tfs = self.term_postings(li)
            if len(d) == 0:
                continue
            # the ids in the postings' dtype: mixed dtypes would convert the whole list
            j = np.minimum(np.searchsorted(d, local_ids.astype(d.dtype)), len(d) - 1)
            found = d[j] == local_ids
            out[i] = np.where(found, tfs[j], 0)
        return out

