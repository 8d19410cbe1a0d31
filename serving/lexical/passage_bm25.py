"""Passage BM25: a document scored by its best passage (MaxP), over an index built with
``funnel build --dense --bm25-passages``.

The build indexes every passage as a document of a second, ordinary BM25 index in the
version's ``bm25-passages/`` folder (``funnel.pipelines.lexical.passage_bm25``). This module wraps
an ordinary `BM25Retriever` over that index and answers as the
whole-document retriever does (same methods, the parent's docnos and doc ids), so bm25,
hybrid and sira use it unchanged when ``VersionSearcher`` puts it in place of ``bm25``:

* **MaxP, exactly.** A passage search ``depth`` deep returns passages best first; each
  document's first passage there is its best one, and every passage left out scores at most
  the last one returned. So once ``k`` documents are found and the k-th scores strictly more
  than the last passage returned (or the search returned every matching passage), those are
  the top ``k`` documents by best passage, ties by doc_id as in whole-document BM25.
  Otherwise the search is repeated `GROWTH` times deeper (`PassageBM25.search_arrays`).
* **Filters and ACLs.** The search's document mask (``serving.filters``) becomes a passage
  mask (a passage is allowed where its document is), and the passage search runs under it:
  the masked search admits allowed passages only, so no passage of a document the caller may
  not read is scored, shown or counted, and ``k`` allowed documents come back whenever they
  exist. The dfs an explanation shows a principal count the passages it may read.
* **Citations.** `PassageBM25.best_passage` names the passage a document's score came
  from, with its character offsets (``passages/`` of the version), for the hit's citation.

Scores are the passage index's BM25: its N (passages), df (passages holding a term) and
avgdl (mean passage length). The default whole-document BM25 is untouched.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter

import numpy as np

from funnel.pipelines.store.artifacts import IndexFormatError
from funnel.pipelines.lexical.passage_bm25 import parse_passage_ids

from .. import filters
from .bm25 import BM25Params
from ..index import IndexVersion
from .retriever import BM25Retriever, Scored

#: How much deeper each repeated passage search goes.
GROWTH = 4
_DEFAULT = BM25Params()


class PassageBM25:
    """The BM25 retriever of an index with passage BM25 (see the module docstring).

    Parameters
    ----------
    index : IndexVersion
        The parent version (documents, doc ids, tie order).
    section : dict
        Its manifest's ``bm25_passages`` section (``dir``: the passage index's folder).
    spans_of : callable, optional
        ``docno -> (m, 2)`` character spans of a document's passages in ordinal order (the
        version's ``passages/``, ``dense.Passages.spans_of``), for `best_passage`.
    """

    name = "bm25"

    def __init__(self, index: IndexVersion, section: dict, spans_of=None):
        self.index = index
        self.section = section
        self.spans_of = spans_of
        # Its files were verified with the parent's (they are in the parent's manifest); the
        # structure checks of every open still run.
        self.passages = IndexVersion(os.path.join(index.dir, section["dir"]), verify="none")
        # Damage a query finds in the passage index is the version's (its files are the
        # version's): recorded there, under the passage folder.
        self.passages.on_damage = lambda file, reason: index.damaged(f"{section['dir']}/{file}", reason)
        self.inner = BM25Retriever(self.passages)
        pdocs, docs = self.passages.docs, index.docs
        self.passage_off = np.cumsum([0] + [pdocs.shard_size(s) for s in range(pdocs.n_shards)]).astype(np.int64)
        doc_off = np.cumsum([0] + [docs.shard_size(s) for s in range(docs.n_shards)]).astype(np.int64)
        try:
            shard, local, ordinal = parse_passage_ids(pdocs._ids_arrow())
        except ValueError as e:
            raise IndexFormatError(f"{self.passages.dir}: {e}; rebuild the index (funnel build ... "
                                   "--bm25-passages)") from e
        if len(shard) and (shard.min() < 0 or shard.max() >= docs.n_shards
                           or (local >= doc_off[1:][shard] - doc_off[:-1][shard]).any()):
            raise IndexFormatError(f"{self.passages.dir} names documents its version does not have; rebuild "
                                   "the index (funnel build ... --bm25-passages)")
        #: Per passage position (passage shards concatenated): its document's global position,
        #: docno and the passage's ordinal.
        self.doc_off = doc_off
        self.parent_pos = doc_off[shard] + local
        self.parent_docno = (shard << 32) | local
        self.ordinal = ordinal
        self.doc_rank = docs.rank
        # A document's passage positions: by_doc[ptr[pos]:ptr[pos + 1]] (pos: its global position).
        self.by_doc = np.argsort(self.parent_pos, kind="stable")
        self.ptr = np.searchsorted(self.parent_pos[self.by_doc], np.arange(int(doc_off[-1]) + 1)).astype(np.int64)
        self._masks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    # -- what the whole-document retriever also offers -----------------------------------
    @property
    def kernels(self) -> bool:
        return self.inner.kernels

    @kernels.setter
    def kernels(self, value: bool) -> None:
        self.inner.kernels = value

    @property
    def prune_stats(self) -> np.ndarray:
        return self.inner.prune_stats

    def _use_kernel(self) -> bool:
        """False: the compiled paths that read a retriever's arrays directly (``sira.batch``)
        score whole documents; this retriever answers through `search_arrays`."""
        return False

    def query_terms(self, query: str) -> Counter:
        return Counter(self.index.analyzer.analyze(query))

    def doc_ids_at(self, pos: np.ndarray) -> np.ndarray:
        """Doc ids (object array) at the parent's global positions."""
        docs = self.index.docs
        if len(docs) == 0:
            return np.full(np.shape(pos), None, dtype=object)
        return docs.ids_at(pos)

    # -- the mask ------------------------------------------------------------------------
    def _passage_mask(self) -> filters.Mask | None:
        """The passage mask of the search's document mask (None: unfiltered)."""
        mask = filters.current()
        if mask is None:
            return None
        with self._lock:
            got = self._masks.get(mask)
        if got is None:
            allow = None if mask.allow is None else np.ascontiguousarray(mask.allow[self.parent_pos])
            got = filters.Mask(allow, self.passage_off, mask.restricted)
            with self._lock:
                self._masks[mask] = got
        return got

    # -- MaxP ----------------------------------------------------------------------------
    def _collapse(self, ppos: np.ndarray, psc: np.ndarray, k: int, complete: bool):
        """(document positions, scores, best passage positions) of the top ``k`` documents
        of a passage list (best first), and whether they are exact (module docstring)."""
        if len(ppos) == 0:
            z = np.zeros(0, dtype=np.int64)
            return z, np.zeros(0), z, True
        par = self.parent_pos[ppos]
        _, first = np.unique(par, return_index=True)
        sc = psc[first]
        order = np.lexsort((self.doc_rank[par[first]], -sc))[:k]
        top = first[order]
        exact = complete or (len(top) == k and psc[top[-1]] > psc[-1])
        return par[top], psc[top], ppos[top], exact

    def _first_depth(self, k: int) -> int:
        return int(min(self.passages.n_docs, max(4 * k, k + 64)))

    def _maxp(self, terms: dict[str, float], k: int, params: BM25Params, then: dict[str, float] | None = None,
              depth: int | None = None):
        """(document positions, scores, best passage positions) of the top ``k`` by best passage."""
        n = self.passages.n_docs
        depth = self._first_depth(k) if depth is None else int(min(n, depth))
        pmask = self._passage_mask()
        while True:
            with filters.scope(pmask):
                pdn, psc = self.inner.search_arrays(terms, max(depth, 1), params, then)
            ppos = self.passage_off[pdn >> 32] + (pdn & 0xFFFFFFFF)
            got = self._collapse(ppos, psc, k, len(pdn) < depth or depth >= n)
            if got[3] or depth >= n:
                return got[:3]
            depth = min(n, depth * GROWTH)

    def _docnos(self, pos: np.ndarray) -> np.ndarray:
        return self.parent_docno[self.by_doc[self.ptr[pos]]] if len(pos) else np.zeros(0, dtype=np.int64)

    def search_arrays(self, terms: dict[str, float], k: int, params: BM25Params | None = None,
                      then: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, scores) of the top ``k`` documents by best passage, best first; ties by
        doc_id ascending. ``terms`` and ``then`` as for ``BM25Retriever.search_arrays``."""
        pos, sc, _ = self._maxp(terms, k, params or _DEFAULT, then)
        return self._docnos(pos), sc

    def search_weighted(self, terms: dict[str, float], k: int, params: BM25Params | None = None,
                        then: dict[str, float] | None = None) -> list[Scored]:
        dn, sc = self.search_arrays(terms, k, params, then)
        return [Scored(int(n), float(v)) for n, v in zip(dn, sc)]

    def search(self, query: str, k: int = 10, params: BM25Params | None = None) -> list[Scored]:
        return self.search_weighted(dict(self.query_terms(query)), k, params)

    def search_texts(self, texts: list[str], k: int, params: BM25Params | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``k`` of many query texts, as ``BM25Retriever.search_texts`` (positions are the
        parent's): the passage lists of the whole batch in one call ``4k``-ish deep, and a
        deeper search for each query whose top ``k`` that does not settle."""
        params = params or _DEFAULT
        n = len(texts)
        pos, score, cnt = np.zeros((n, k), dtype=np.int64), np.zeros((n, k)), np.zeros(n, dtype=np.int64)
        if n == 0:
            return pos, score, cnt
        depth = max(1, self._first_depth(k))
        with filters.scope(self._passage_mask()):
            ppos, psc, pcnt = self.inner.search_texts(texts, depth, params)
        for i in range(n):
            m = int(pcnt[i])
            p, s, _, exact = self._collapse(ppos[i, :m], psc[i, :m], k, m < depth or depth >= self.passages.n_docs)
            if not exact:
                p, s, _ = self._maxp(dict(self.query_terms(texts[i])), k, params, None, depth * GROWTH)
            pos[i, :len(p)], score[i, :len(p)], cnt[i] = p, s, len(p)
        return pos, score, cnt

    def search_weighted_batch(self, queries: list[tuple[dict[str, float], dict[str, float] | None]], k: int,
                              params: BM25Params | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Top ``k`` of many weighted queries ``(terms, then)``, as ``BM25Retriever``'s."""
        params = params or _DEFAULT
        n = len(queries)
        pos, score, cnt = np.zeros((n, k), dtype=np.int64), np.zeros((n, k)), np.zeros(n, dtype=np.int64)
        for i, (terms, then) in enumerate(queries):
            p, s, _ = self._maxp(terms, k, params, then)
            pos[i, :len(p)], score[i, :len(p)], cnt[i] = p, s, len(p)
        return pos, score, cnt

    # -- explanations and citations --------------------------------------------------------
    def _passages_of(self, docno: int) -> np.ndarray:
        """Passage positions of a document, in ordinal order."""
        g = int(self.doc_off[docno >> 32]) + (docno & 0xFFFFFFFF)
        rows = self.by_doc[self.ptr[g]:self.ptr[g + 1]]
        return rows[np.argsort(self.ordinal[rows], kind="stable")]

    def _pdocno(self, p: int) -> int:
        s = int(np.searchsorted(self.passage_off, p, side="right") - 1)
        return (s << 32) | (int(p) - int(self.passage_off[s]))

    def _best(self, terms: dict[str, float], n: int, params: BM25Params) -> tuple[int, float, dict] | None:
        """(passage position, score, its explanation) of document ``n``'s best passage (the
        first on ties), None where no passage matches: every passage scored at once
        (``passage_rank.bm25_of_docnos``), the best one explained."""
        from ..answers.passage_rank import bm25_of_docnos
        pdn = self.passage_docnos(n)
        if len(pdn) == 0:
            return None
        sc = bm25_of_docnos(self.inner, terms, pdn, params)
        j = int(np.argmax(sc))
        if sc[j] <= 0:
            return None
        with filters.scope(self._passage_mask()):
            ex = self.inner.explain(terms, int(pdn[j]), params)
        if not ex:
            return None
        return int(self._passages_of(n)[j]), sum(v["contribution"] for v in ex.values()), ex

    def passage_docnos(self, n: int) -> np.ndarray:
        """Docnos, in the passage index, of document ``n``'s passages in ordinal order (for
        scoring them all at once: ``serving.answers.passage_rank.bm25_of_docnos``)."""
        p = self._passages_of(n)
        s = np.searchsorted(self.passage_off, p, side="right") - 1
        return (s.astype(np.int64) << 32) | (p - self.passage_off[s])

    def explain(self, terms: dict[str, float], n: int, params: BM25Params | None = None) -> dict[str, dict]:
        """Per matched term of document ``n``'s best passage: tf, df (passages), idf (over
        passages) and its contribution to the score."""
        got = self._best(terms, n, params or BM25Params())
        return {} if got is None else got[2]

    def best_passage(self, terms: dict[str, float], n: int, params: BM25Params | None = None) -> dict | None:
        """Document ``n``'s best passage for ``terms``: ``{"start", "end", "ordinal", "score",
        "via": "bm25"}`` (character offsets into its text), None where no passage matches."""
        got = self._best(terms, n, params or BM25Params())
        if got is None:
            return None
        p, sc, _ = got
        spans = self.spans_of(n) if self.spans_of is not None else None
        o = int(self.ordinal[p])
        if spans is None or o >= len(spans):
            return None
        return {"start": int(spans[o][0]), "end": int(spans[o][1]), "ordinal": o, "score": float(sc), "via": "bm25"}
