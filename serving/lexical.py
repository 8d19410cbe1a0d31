"""The BM25 retriever: analyzed (or explicitly weighted) terms in, ranked docnos out.

``search_weighted`` takes {term: weight}; plain BM25 uses the term's count in the query,
SIRA (later) passes its own weights for expansion terms: one weighted BM25 call.
Ties are broken by doc_id, so a sharded index returns exactly an unsharded one's ranking.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from .bm25 import BM25Params, idf_lucene
from .index import IndexVersion
from .result import docno


@dataclass(frozen=True)
class Scored:
    docno: int
    score: float


class BM25Retriever:
    name = "bm25"

    def __init__(self, index: IndexVersion):
        self.index = index

    def query_terms(self, query: str) -> Counter:
        return Counter(self.index.analyzer.analyze(query))

    def weights(self, terms: dict[str, float]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(global ids, w·idf, terms) for the terms the collection knows."""
        ix = self.index
        gids, ws, kept = [], [], []
        for t, w in terms.items():
            g = ix.vocab.get(t)
            if g is None or w == 0:
                continue
            gids.append(g)
            ws.append(w * float(idf_lucene(ix.df[g], ix.n_docs_nonempty)))
            kept.append(t)
        return np.asarray(gids, dtype=np.int64), np.asarray(ws, dtype=np.float64), kept

    def search_weighted(self, terms: dict[str, float], k: int, params: BM25Params | None = None) -> list[Scored]:
        params = params or BM25Params()
        gids, ws, _ = self.weights(terms)
        if len(gids) == 0:
            return []
        cands: list[tuple[float, str, int]] = []
        ix = self.index
        for s, shard in enumerate(ix.shards):
            scores = shard.score(gids, ws, params)
            if scores is None:
                continue
            nz = np.flatnonzero(scores > 0)
            if len(nz) > k:
                # Keep every document tied with the k-th score so the global tie-break is exact.
                kth = np.partition(scores[nz], len(nz) - k)[len(nz) - k]
                nz = nz[scores[nz] >= kth]
            ids = ix.docs.doc_ids[s]
            cands.extend((float(scores[i]), ids[i], docno(s, int(i))) for i in nz)
        cands.sort(key=lambda c: (-c[0], c[1]))
        return [Scored(n, sc) for sc, _, n in cands[:k]]

    def search(self, query: str, k: int = 10, params: BM25Params | None = None) -> list[Scored]:
        return self.search_weighted(dict(self.query_terms(query)), k, params)

    def explain(self, terms: dict[str, float], n: int, params: BM25Params | None = None) -> dict[str, dict]:
        """Per matched term: tf, df, idf and its contribution to the document's score."""
        params = params or BM25Params()
        ix = self.index
        gids, ws, kept = self.weights(terms)
        from .result import split_docno
        s, local = split_docno(n)
        shard = ix.shards[s]
        tfs = shard.term_freqs(gids, local)
        dl = float(shard.lengths(params)[local])
        denom = params.k1 * (1 - params.b + params.b * dl / ix.avgdl)
        out = {}
        for t, g, w, tf in zip(kept, gids, ws, tfs):
            if tf > 0:
                out[t] = {"tf": int(tf), "df": int(ix.df[g]), "weight": float(terms[t]),
                          "idf": float(idf_lucene(ix.df[g], ix.n_docs_nonempty)),
                          "contribution": float(w * tf / (tf + denom))}
        return out
