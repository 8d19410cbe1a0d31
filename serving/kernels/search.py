"""The entry points: one query over every shard in one compiled call (`search_shards`), and
many queries in one call (`search_batch` and its forms), each answered as `search_shards`
answers it.

`search_shards` finds each query term in each shard (binary search on ``term_gid``), scores
term-at-a-time into a reused accumulator, and cuts the top ``k`` with the ranking's
tie-break (score descending, then doc_id ascending through ``id_rank``). It prunes where the
caller asks and the bounds allow (``blockmax.py`` with block maxima, ``maxscore.py``
without), and hands every other query to ``exhaustive.search_shards_plain``. The batch
forms take the queries as flat term-id arrays (CSR) and put each query's terms in the
canonical order (`_canonical`: weight descending, then term id), as
``BM25Retriever.weights`` orders them.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, _view
from .blockmax import _prune_pays, _score_shard_blocks, _theta_from_blocks
from .decode import _local_terms
from .exhaustive import all_pinned, search_shards_plain
from .heap import _heap_sorted, _new_heap
from .layout import BLOCK, NEED_DECODED, SMALL_SORT
from .maxscore import _score_shard


@jit
def search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                  touched, table, itab, gids, weights, k, prune_min, stats, pk):
    """Top ``k`` over all shards: (docnos ``shard << 32 | local``, scores), best first,
    ties by ``id_rank`` ascending.

    ``meta`` is an int64 [S, 2·META_FIELDS] table of (address, length) of each shard's
    arrays in ``FIELDS`` order (``ShardTable`` builds it and keeps the arrays alive): one
    small argument instead of dozens, which numba would unbox one by one on every call.
    ``code_proto`` is (a zero-length array of the length codes' dtype, one of the tfs'):
    length codes are uint8 Lucene norm bytes or int32 exact lengths, as ``table`` is
    indexed; tfs uint16 (or int32: `tf_dtype`). ``doc_off``: each shard's first position in the
    global document order (S + 1 entries); ``id_rank``: each document's rank by doc_id;
    ``acc`` (float64, at least one per document of the largest shard) is zeroed, and zeroed
    again on return; ``touched`` (int32) has one more slot. Every shard is scored in the
    same leading region ``acc[:shard size]`` (a shard's scores are gone when the next one
    starts), so the working set is one shard's, not the corpus's (a slice per shard of
    a corpus-sized array leaves the L3 cache at a few million documents). ``itab`` holds ``t / (t + table[c])`` at
    ``t · len(table) + c`` for t below ``len(itab) / len(table)``: the impacts of small
    tfs, precomputed per (k1, b), so most postings cost a lookup instead of a division. A shard is
    pruned when ``prune_min >= 0`` and the query has at least ``prune_min`` postings
    there (every weight must then be positive); -1 scores exhaustively.
    ``stats`` (int64, 2) counts the shards where pruning stopped adding new documents
    and the postings of the terms left to candidates there (racy counters, for tests
    and benchmarks). ``bmeta`` (``block_table``; ``NO_BLOCKS`` for none) holds each
    shard's block maxima: where given, pruning shards use ``_score_shard_blocks``
    (``prune_min == 0`` makes it prune wherever the bounds allow, for tests), and a
    query that ``_prune_pays`` judges not worth pruning goes to
    `search_shards_plain` (with ``imeta``, ``imeta32``, ``rescore_min`` and
    ``dense_min``, as that takes them), and so does ``prune_min = -1`` or a non-positive
    weight (whose scores that reads back without a touched list). ``pk``: packed shards
    and the terms pinned decoded there (`search_shards_plain`); pruning reads decoded
    postings only, so it answers ``NEED_DECODED`` for a query with a term not pinned.

    Returns (docnos, scores, fault): fault 0, or ``shard << 8 | FAULT_*`` where a value
    read from the shard's files was impossible (``checks.py``); then the docnos are
    empty and ``acc`` is not zeroed (the caller zeroes it). ``NEED_DECODED`` (negative):
    the caller pins every term of the query and asks again.
    """
    if prune_min < 0 or gids.shape[0] == 0 or weights.min() <= 0.0 or (
            prune_min > 0 and bmeta.shape[0] > 0 and
            not _prune_pays(meta, bmeta, code_proto, table, itab, acc, touched, gids, weights, k)):
        return search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank,
                                   acc, touched, table, itab, gids, weights, k, pk)
    if not all_pinned(meta, pk, gids):
        return np.zeros(0, dtype=np.int64), np.zeros(0), NEED_DECODED
    S = meta.shape[0]
    cap = itab.shape[0] // table.shape[0]
    local = np.empty(gids.shape[0], dtype=np.int64)
    hv, hr, hd = _new_heap(k)
    n = 0
    theta = 0.0
    blocks = bmeta.shape[0] > 0 and prune_min >= 0
    for s in range(S):
        if not _local_terms(_view(meta, s, 3, np.int32), gids, local):
            continue
        lo, hi = doc_off[s], doc_off[s + 1]
        nd = hi - lo  # the shard's documents, scored in acc[:nd] (the docstring says why)
        if blocks:
            indptr = _view(meta, s, 0, np.int64)
            post = 0
            for i in range(local.shape[0]):
                if local[i] >= 0:
                    post += indptr[local[i] + 1] - indptr[local[i]]
            if post >= prune_min:
                theta = max(theta, _theta_from_blocks(_view(bmeta, s, 3, np.float32), local, weights, k))
                n, theta = _score_shard_blocks(
                    indptr, _view(meta, s, 1, np.int32), _view(meta, s, 2, code_proto[1].dtype),
                    _view(meta, s, 5, code_proto[0].dtype), table, itab, cap,
                    _view(bmeta, s, 0, np.int64), _view(bmeta, s, 1, np.float32), _view(bmeta, s, 2, np.float32),
                    _view(bmeta, s, 4, np.int32),
                    BLOCK, local, weights, acc[:nd], touched[:nd + 1], id_rank[lo:hi], np.int64(s) << 32,
                    hv, hr, hd, n, theta, prune_min == 0, stats)
                if n < 0:
                    return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -n
                if n == k:
                    theta = max(theta, hv[0])
                continue
        n = _score_shard(_view(meta, s, 0, np.int64), _view(meta, s, 1, np.int32),
                         _view(meta, s, 2, code_proto[1].dtype), _view(meta, s, 5, code_proto[0].dtype),
                         _view(meta, s, 4, np.int32), _view(meta, s, 6, code_proto[0].dtype),
                         table, itab, cap, local, weights, acc[:nd], touched[:nd + 1],
                         id_rank[lo:hi], np.int64(s) << 32, hv, hr, hd, n, theta, prune_min, stats)
        if n < 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0), (s << 8) | -n
        if n == k:  # the k-th best so far bounds the final k-th from below
            theta = max(theta, hv[0])
    dn, sc = _heap_sorted(hv, hr, hd, n)
    return dn, sc, 0


@jit
def search_batch(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc, touched,
                 table, itab, idf, qptr, qgids, k, prune_min, stats, out_pos, out_score, out_n, pk):
    """Many queries in one call, each exactly as ``search_shards`` answers it.

    Query ``q``'s analyzed terms are the global ids ``qgids[qptr[q]:qptr[q + 1]]`` (repeats
    count: weight = count · idf). Writes its top ``k`` (k <= out_pos.shape[1]) as global
    document positions (``doc_off[shard] + local``) into ``out_pos[q]``, scores into
    ``out_score[q]``, and how many into ``out_n[q]``. Returns 0, or the first query's fault
    code (`search_shards`), where it stops; ``-(q + 1)`` where query q answered
    ``NEED_DECODED`` (``pk``: `search_shards`), the caller going on from there.
    """
    for q in range(qptr.shape[0] - 1):
        a, b = qptr[q], qptr[q + 1]
        out_n[q] = 0
        if b == a:
            continue
        gids, ws = _query_weights(qgids[a:b], idf)
        pm = prune_min if ws.min() > 0 else -1
        dn, sc, fault = search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                      id_rank, acc, touched, table, itab, gids, ws, k, pm, stats, pk)
        if fault:
            return fault if fault > 0 else -(q + 1)
        _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
    return 0


@jit
def search_batch_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc, touched,
                       table, itab, idf, qptr, qgids, k, out_pos, out_score, out_n, pk):
    """``search_batch`` with ``prune_min = -1`` through `search_shards_plain`; returns
    0 or a fault code, as ``search_batch``."""
    for q in range(qptr.shape[0] - 1):
        a, b = qptr[q], qptr[q + 1]
        out_n[q] = 0
        if b == a:
            continue
        gids, ws = _query_weights(qgids[a:b], idf)
        dn, sc, fault = search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                            id_rank, acc, touched, table, itab, gids, ws, k, pk)
        if fault:
            return fault if fault > 0 else -(q + 1)
        _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
    return 0


@jit
def search_batch_weighted(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                          touched, table, itab, idf, qptr, qsplit, qgids, qraw, k, prune_min, stats, out_pos,
                          out_score, out_n, pk):
    """Many weighted queries in one call, each exactly as ``search_shards`` answers it
    through ``search_arrays``: query ``q``'s distinct terms are ``qgids[qptr[q]:qptr[q + 1]]``
    with weights ``qraw`` (before idf; zeros dropped), those before ``qsplit[q]`` scored
    first (SIRA's query, then its expansion). Outputs and returns as ``search_batch``."""
    for q in range(qptr.shape[0] - 1):
        out_n[q] = 0
        gids, ws = _split_weights(qgids, qraw, qptr[q], qsplit[q], qptr[q + 1], idf)
        if gids.shape[0] == 0:
            continue
        dn, sc, fault = search_shards(meta, bmeta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                      id_rank, acc, touched, table, itab, gids, ws, k,
                                      prune_min if ws.min() > 0 else -1, stats, pk)
        if fault:
            return fault if fault > 0 else -(q + 1)
        _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
    return 0


@jit
def search_batch_weighted_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off, id_rank, acc,
                                touched, table, itab, idf, qptr, qsplit, qgids, qraw, k, out_pos, out_score,
                                out_n, pk):
    """``search_batch_weighted`` through `search_shards_plain` (returns as ``search_batch``)."""
    for q in range(qptr.shape[0] - 1):
        out_n[q] = 0
        gids, ws = _split_weights(qgids, qraw, qptr[q], qsplit[q], qptr[q + 1], idf)
        if gids.shape[0] > 0:
            dn, sc, fault = search_shards_plain(meta, imeta, imeta32, rescore_min, dense_min, code_proto, doc_off,
                                                id_rank, acc, touched, table, itab, gids, ws, k, pk)
            if fault:
                return fault if fault > 0 else -(q + 1)
            _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n)
    return 0


@jit
def _query_weights(raw, idf):
    """(distinct gids, count · idf) of one query's term ids (with repeats), in the canonical
    order: weight descending, then gid ascending (``np.lexsort((gids, -ws))``)."""
    ug, cnt = _distinct_counts(raw)
    return _canonical(ug, cnt, idf)


@jit
def _split_weights(qgids, qraw, a, s, b, idf):
    """(gids, raw · idf) of one weighted query of ``search_batch_weighted``: the terms
    ``qgids[a:s]`` first, then ``qgids[s:b]``, each group in the canonical order, as
    ``BM25Retriever.search_arrays(terms, k, params, then)`` orders them."""
    g1, w1 = _canonical(qgids[a:s], qraw[a:s], idf)
    g2, w2 = _canonical(qgids[s:b], qraw[s:b], idf)
    n1 = g1.shape[0]
    gids = np.empty(n1 + g2.shape[0], dtype=np.int64)
    ws = np.empty(n1 + g2.shape[0])
    gids[:n1] = g1
    gids[n1:] = g2
    ws[:n1] = w1
    ws[n1:] = w2
    return gids, ws


@jit
def _canonical(gids, raw, idf):
    """(gids, raw · idf) in the canonical term order: weight descending, then gid ascending;
    zero weights dropped (as ``BM25Retriever.weights`` drops them). ``gids`` are distinct.
    Up to SMALL_SORT terms by insertion (cheaper for a short query than three sorts and a
    dozen arrays), more through argsort and a stable mergesort."""
    n = gids.shape[0]
    if n <= SMALL_SORT:
        g = np.empty(n, dtype=np.int64)  # by gid
        w = np.empty(n)
        m = 0
        for i in range(n):
            if raw[i] == 0.0:
                continue
            x = gids[i]
            j = m
            while j > 0 and g[j - 1] > x:
                g[j] = g[j - 1]
                w[j] = w[j - 1]
                j -= 1
            g[j] = x
            w[j] = raw[i]
            m += 1
        og = np.empty(m, dtype=np.int64)  # then by weight descending, stably: ties keep gid order
        ow = np.empty(m)
        for i in range(m):
            v = w[i] * idf[g[i]]
            j = i
            while j > 0 and ow[j - 1] < v:
                og[j] = og[j - 1]
                ow[j] = ow[j - 1]
                j -= 1
            og[j] = g[i]
            ow[j] = v
        return og, ow
    by_id = np.argsort(gids)
    g = gids[by_id]
    w = raw[by_id]
    keep = np.empty(g.shape[0], dtype=np.int64)
    m = 0
    for i in range(g.shape[0]):
        if w[i] != 0.0:
            keep[m] = i
            m += 1
    g = g[keep[:m]]
    neg = np.empty(m)
    for i in range(m):
        neg[i] = -(w[keep[i]] * idf[g[i]])
    order = np.argsort(neg, kind="mergesort")
    return g[order], -neg[order]


@jit
def _distinct_counts(raw):
    """(distinct ids ascending, their counts as float64) of one query's term ids; up to
    SMALL_SORT ids by insertion (no sort call, two allocations), more through a sort."""
    ug = np.empty(raw.shape[0], dtype=np.int64)
    cnt = np.empty(raw.shape[0])
    n = 0
    if raw.shape[0] <= SMALL_SORT:
        for i in range(raw.shape[0]):
            x = raw[i]
            j = n
            while j > 0 and ug[j - 1] > x:
                j -= 1
            if j > 0 and ug[j - 1] == x:
                cnt[j - 1] += 1.0
                continue
            for t in range(n, j, -1):
                ug[t] = ug[t - 1]
                cnt[t] = cnt[t - 1]
            ug[j] = x
            cnt[j] = 1.0
            n += 1
        return ug[:n], cnt[:n]
    g = np.sort(raw)
    for i in range(g.shape[0]):
        if n > 0 and ug[n - 1] == g[i]:
            cnt[n - 1] += 1.0
        else:
            ug[n] = g[i]
            cnt[n] = 1.0
            n += 1
    return ug[:n], cnt[:n]


@jit(inline="always")
def _put_row(q, dn, sc, doc_off, out_pos, out_score, out_n):
    """Query ``q``'s ranked docnos as global positions (``doc_off[shard] + local``) and
    scores into row ``q`` of the batch outputs, and their count."""
    for j in range(dn.shape[0]):
        out_pos[q, j] = doc_off[dn[j] >> 32] + (dn[j] & 0xFFFFFFFF)
        out_score[q, j] = sc[j]
    out_n[q] = dn.shape[0]
