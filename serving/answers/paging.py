"""Paging through a ranking and counting its matches: ``search(..., offset=N)`` and a
result's ``total`` (Elasticsearch's ``from`` and ``hits.total``).

``offset`` skips the first hits: a search returns those ranked ``offset + 1`` to
``offset + k``, each with its rank in the whole ranking. The mode ranks ``offset + k``
documents and the first ``offset`` are dropped, so a page costs what a search that deep
costs, and ``offset + k`` is bounded by ``MAX_K`` (Elasticsearch bounds ``from + size`` by
``index.max_result_window`` the same way). Deeper than that, narrow the query or the filter.

``total`` is ``{"value": n, "relation": "eq" | "gte"}`` (Elasticsearch's
``track_total_hits`` form), counted over the documents the search may return: a filter and
a caller's ACL narrow it exactly as they narrow the hits, so a restricted caller's total
never counts a document it may not read.

* **bm25**: the documents that hold at least one query term (every such document has a
  positive score). Exact (``eq``) when the query's terms have at most
  `EXACT_TOTAL_POSTINGS` postings in all: their postings are marked over the allowed
  documents. Beyond that only the first `EXACT_TOTAL_POSTINGS` postings (rarest terms
  first) are counted, and the answer is a lower bound (``gte``): the larger of that count,
  the hits the ranking returned, and (for a search that sees every document) the most common
  term's document frequency.
* **other modes** rank every document (dense, hybrid) or a weighted term set (sira):
  ``eq`` with the number ranked when the ranking ran out before ``offset + k`` (every
  match was returned), else ``gte offset + k``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SearchError

#: Postings a bm25 total reads, at most, before it settles for a lower bound: marking 200,000
#: of them in a 1M-document shard and counting the allowed ones takes ~0.5 ms of CPU, small
#: beside the search itself.
EXACT_TOTAL_POSTINGS = 200_000


def check_offset(offset: Any, k: int, max_k: int) -> int:
    """``offset`` as a whole number with ``offset + k <= max_k``; a SearchError naming the bound."""
    if offset is None:
        return 0
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise SearchError(f"offset is the number of hits to skip: a whole number from 0, got {offset!r}")
    if offset + k > max_k:
        raise SearchError(f"offset + k is {offset + k}; at most {max_k}: a search ranks at most {max_k} documents "
                          "deep. Narrow the query or the filter to reach later documents")
    return int(offset)


def total_of(vs, mode: str, query: str, n_ranked: int, depth: int, mask) -> dict:
    """A search's ``total`` (module docstring): ``n_ranked`` documents came back from a ranking
    asked for ``depth``; ``mask`` is the search's ``filters.Mask`` (None: every document)."""
    if mode == "bm25":
        return bm25_total(vs.index, vs.bm25.query_terms(query), mask, n_ranked)
    return {"value": int(n_ranked) if n_ranked < depth else int(depth),
            "relation": "eq" if n_ranked < depth else "gte"}


def bm25_total(index, terms, mask, returned: int, budget: int = EXACT_TOTAL_POSTINGS) -> dict:
    """How many documents ``mask`` allows that hold at least one of ``terms`` (analyzed
    terms), exact while their postings fit ``budget``, else a lower bound."""
    gids = np.asarray(sorted({index.vocab[t] for t in terms if t in index.vocab}), dtype=np.int64)
    if len(gids) == 0:
        return {"value": 0, "relation": "eq"}
    allow = None if mask is None else mask.allow
    dfs = np.asarray(index.df)[gids]
    if allow is None and len(gids) == 1:
        return {"value": int(dfs[0]), "relation": "eq"}
    doc_off = np.cumsum([0] + [s.n_docs for s in index.shards])
    seen: dict[int, np.ndarray] = {}
    spent, exact = 0, True
    order = gids[np.argsort(dfs, kind="stable")]
    # Each shard's local ids of every term in one lookup (a binary search in its term table).
    local = [shard.local_terms(order).tolist() for shard in index.shards]
    for i in range(len(order)):
        for s, shard in enumerate(index.shards):
            li = int(local[s][i])
            if li < 0:
                continue
            a, b = int(shard.indptr[li]), int(shard.indptr[li + 1])
            take = min(b - a, budget - spent)
            if take < b - a:
                exact = False
            if take > 0:
                marks = seen.get(s)
                if marks is None:
                    marks = seen[s] = np.zeros(shard.n_docs, dtype=bool)
                marks[np.asarray(shard.term_docs(li, take))] = True
                spent += take
            if not exact:
                break
        if not exact:
            break
    count = 0
    for s, marks in seen.items():
        if allow is not None:
            marks &= allow[int(doc_off[s]):int(doc_off[s + 1])]
        count += int(np.count_nonzero(marks))
    if exact:
        return {"value": count, "relation": "eq"}
    floor = max(count, int(returned), int(dfs.max()) if allow is None else 0)
    return {"value": floor, "relation": "gte"}
