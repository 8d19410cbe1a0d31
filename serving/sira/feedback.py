"""Feedback vocabulary: which terms a handful of documents share, weighted as RM3 does.

    RM3 (Lavrenko & Croft 2001; Anserini's ``Rm3Reranker``):
        P(t | R) ∝ Σ_{d ∈ F} w_d · tf(t, d) / |d|

with F the feedback documents and w_d their retrieval score (the P(q | d) stand-in).
`rm3_weights` is that sum; `select_terms` keeps the best ``n`` eligible terms
(not in the query, 1 ≤ df ≤ τ·N as the DF filter will demand, at least two characters:
Anserini skips terms with df/N > 0.1 and one-character terms the same way), optionally
multiplied by idf (the ``dense`` proposer's "discriminative" weighting).

The postings are term-major; feedback needs documents' terms, so `ForwardIndex`
transposes the shards once, lazily, on first use (an ``argsort`` of each shard's postings:
~25 ms for SciFact's 5,183 documents, and one extra in-memory copy of the postings at 8 bytes
per posting: int32 term id, float32 tf). An index too large for that copy would ship a
doc-major array from the build instead.
"""

from __future__ import annotations

import threading

import numpy as np


class ForwardIndex:
    """Documents' (term id, tf) rows over one index version, built on first use.

    All shards are transposed into one doc-major CSR whose row of docno ``shard << 32 |
    local`` is ``offset[shard] + local``, so the rows of many documents are gathered with
    a few vectorized operations.
    """

    def __init__(self, index):
        self.index = index
        self._built: tuple | None = None
        self._lock = threading.Lock()

    def _build(self) -> tuple:
        if self._built is None:
            with self._lock:
                if self._built is None:
                    # Filled shard by shard into arrays of the final size: per-shard arrays
                    # concatenated, and a float64 copy of every tf for the lengths, would
                    # peak at ~1.6x the memory (1M documents, 120M postings).
                    total = sum(len(sh.docs) for sh in self.index.shards)
                    n_docs = sum(sh.n_docs for sh in self.index.shards)
                    ptr = np.empty(n_docs + 1, dtype=np.int64)
                    g = np.empty(total, dtype=np.int32)
                    tf = np.empty(total, dtype=np.float32)  # small ints: exact
                    dl = np.zeros(n_docs)
                    offsets, base, pos = [], 0, 0
                    for sh in self.index.shards:
                        sdocs, stfs = sh.all_postings()  # a packed shard's: decoded (serving.lexical.packed)
                        n = len(sdocs)
                        order = np.argsort(sdocs, kind="stable")
                        ptr[base:base + sh.n_docs + 1] = pos + np.searchsorted(sdocs[order],
                                                                               np.arange(sh.n_docs + 1))
                        g[pos:pos + n] = np.repeat(sh.term_gid.astype(np.int32), np.diff(sh.indptr))[order]
                        tf[pos:pos + n] = np.asarray(stfs)[order]
                        del sdocs, stfs
                        nz = np.flatnonzero(np.diff(ptr[base:base + sh.n_docs + 1]))  # documents with terms
                        if len(nz):  # each one's entries run to the next one's start (or the end)
                            dl[base + nz] = np.add.reduceat(tf[pos:pos + n], ptr[base + nz] - pos, dtype=np.float64)
                        offsets.append(base)
                        base += sh.n_docs
                        pos += n
                        del order
                    ptr[base] = pos
                    terms = np.empty(len(self.index.vocab), dtype=object)
                    for term, i in self.index.vocab.items():
                        terms[i] = term
                    short = np.fromiter((len(x) < 2 for x in terms), dtype=bool, count=len(terms))
                    self._built = (ptr, g, tf, dl, np.asarray(offsets, dtype=np.int64), terms, short)
        return self._built

    def rows(self, docnos) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(term ids, tfs, index of the document each entry belongs to, |d| per document)."""
        ptr, g, tf, dl, offsets, _, _ = self._build()
        docnos = np.asarray(docnos, dtype=np.int64)
        r = offsets[docnos >> 32] + (docnos & 0xFFFFFFFF)
        starts, lens = ptr[r], ptr[r + 1] - ptr[r]
        owner = np.repeat(np.arange(len(r)), lens)
        idx = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens) + starts[owner]
        return g[idx], tf[idx], owner, dl[r]

    def row(self, docno: int) -> tuple[np.ndarray, np.ndarray]:
        """(global term ids, tfs) of one document."""
        g, tf, _, _ = self.rows([docno])
        return g, tf

    @property
    def terms(self) -> np.ndarray:
        """Term string of each global id."""
        return self._build()[5]

    @property
    def short(self) -> np.ndarray:
        """True for one-character terms (never proposed)."""
        return self._build()[6]

    def rm3_weights(self, docnos, doc_weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`rm3_weights` over these documents' rows."""
        g, tf, owner, dl = self.rows(docnos)
        w = np.maximum(np.asarray(doc_weights, dtype=np.float64), 0.0)
        scale = np.divide(w, dl, out=np.zeros_like(w), where=dl > 0)
        return rm3_from_rows(g, tf * scale[owner])


def rm3_from_rows(gids: np.ndarray, contrib: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sum ``contrib`` (w_d · tf/|d| per row entry) per term: (ids, sums, entries per id)."""
    if len(gids) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, np.zeros(0), empty
    uniq, inv = np.unique(gids, return_inverse=True)
    return uniq, np.bincount(inv, weights=contrib), np.bincount(inv)


def rm3_weights(gids: list[np.ndarray], tfs: list[np.ndarray],
                doc_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RM3's relevance model over feedback documents.

    Parameters
    ----------
    gids, tfs
        Per feedback document, its distinct term ids and their tfs.
    doc_weights
        ``w_d`` per document (its retrieval score; negative values count as 0).

    Returns
    -------
    (term ids, Σ_d w_d · tf/|d|, number of feedback documents holding the term)
        over the distinct terms of all feedback documents, ids ascending.
    """
    parts_g, parts_v = [], []
    for g, tf, w in zip(gids, tfs, np.maximum(doc_weights, 0.0)):
        dl = tf.sum()
        if dl > 0 and len(g):
            parts_g.append(g)
            parts_v.append(tf * (w / dl))
    if not parts_g:
        return rm3_from_rows(np.zeros(0, dtype=np.int64), np.zeros(0))
    return rm3_from_rows(np.concatenate(parts_g), np.concatenate(parts_v))


def select_terms(uniq: np.ndarray, weights: np.ndarray, eligible: np.ndarray, n: int,
                 idf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The best ``n`` eligible terms and their weights scaled so the strongest is 1.

    ``eligible`` is a boolean mask over ``uniq``; ``idf`` (over ``uniq``), when given,
    multiplies the weights first. Ties go to the lower term id.
    """
    w = weights * idf if idf is not None else weights
    idx = np.flatnonzero(eligible & (w > 0))
    if len(idx) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    if len(idx) > n:  # keep every candidate tied with the n-th, then order exactly
        kth = np.partition(w[idx], len(idx) - n)[len(idx) - n]
        idx = idx[w[idx] >= kth]
    order = idx[np.lexsort((uniq[idx], -w[idx]))][:n]
    top = w[order]
    return order, top / top[0]
