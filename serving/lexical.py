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
            ws.append(w)
            kept.append(t)
        gids_a = np.asarray(gids, dtype=np.int64)
        return gids_a, np.asarray(ws, dtype=np.float64) * ix.idf[gids_a], kept

    def search_weighted(self, terms: dict[str, float], k: int, params: BM25Params | None = None) -> list[Scored]:
        dn, sc = self.search_arrays(terms, k, params)
        return [Scored(int(n), float(v)) for n, v in zip(dn, sc)]

    def search_arrays(self, terms: dict[str, float], k: int,
                      params: BM25Params | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(docnos, scores) of the top ``k``, best first; ties by doc_id ascending."""
        params = params or BM25Params()
        gids, ws, _ = self.weights(terms)
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
        if len(gids) == 0:
            return empty
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
