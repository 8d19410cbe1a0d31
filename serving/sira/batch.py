"""SIRA's offline proposers (``prf``, ``dense``, ``union`` of the two) over a whole batch of
queries in one compiled call (``kernels.sira_batch``): feedback retrieval, RM3 term
selection and the weighted BM25 call per query, with no Python objects per proposal, and
the query's own postings read once (the prf feedback ranking and the final score share
them: BM25(q) is accumulated first, λ·BM25(e) added to it).

Each query's result is exactly what the per-query path (``mode.sira_arrays``: proposers,
DF filter, ``search_weighted``) returns; ``tests/test_sira_batch.py`` holds the two equal on
every query of the fixtures. The per-query path stays the reference, and the one used
without numba, for the ``llm`` proposer, and by ``search()`` (which also builds the trace
and the explanations). For the dense proposer the query vectors come from the dense index's
cache (``search_batch`` embeds the batch first); its FAISS searches run in groups below
FAISS's BLAS threshold (`per_query_group`), so every score is the one a single-query
search computes.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..errors import ShardFault

#: The proposers the compiled batch path runs; others (llm) go query by query.
BATCH_SOURCES = frozenset({"prf", "dense"})


def batch_available(searcher, prep) -> bool:
    """True when this batch can take the compiled path."""
    return (kernels.HAVE_NUMBA and bool(prep.sources) and set(prep.sources) <= BATCH_SOURCES
            and searcher.bm25._use_kernel())


def per_query_group(dim: int) -> int:
    """The most queries of dimension ``dim`` that one exhaustive FAISS search keeps on its
    per-query path (each inner product as a single-query search computes it), not BLAS.

    FAISS 1.15 switches to BLAS once ``nx * d`` reaches ``distance_compute_blas_threshold``
    (128,000: 333 queries of 384 floats, 166 of 768); older releases switched once ``nx``
    reached it (20). The group satisfies both rules."""
    import faiss
    limit = int(faiss.cvar.distance_compute_blas_threshold) - 1
    return max(1, min(limit, limit // max(1, int(dim))))


def _dense_feedback(searcher, texts: list[str], fb_docs: int, nprobe, offsets: np.ndarray):
    """(rows [n, fb], scores [n, fb], counts [n], split [n]) of each text's dense neighbours,
    as global forward-index rows; ``split``: a neighbour is a document of several passages,
    whose feedback is its best passage (``proposers.passage_rows``), not its row."""
    d = searcher.dense_mode.dense()
    vecs = np.vstack([d.embed_query(t) for t in texts]).astype(np.float32, copy=False)
    group = per_query_group(vecs.shape[1])
    scores = np.zeros((len(texts), fb_docs))
    rows = np.zeros((len(texts), fb_docs), dtype=np.int64)
    counts = np.zeros(len(texts), dtype=np.int64)
    split = np.zeros(len(texts), dtype=bool)
    stored = searcher.dense_mode.passages()
    multi = stored is not None and stored.max_per_doc > 1
    for s in range(0, len(texts), group):
        sc, ids = d.search_vectors(vecs[s:s + group], fb_docs, nprobe)
        valid = ids >= 0  # FAISS pads at the end of a row
        counts[s:s + group] = valid.sum(axis=1)
        safe = np.where(valid, ids, 0)
        rows[s:s + group] = np.where(valid, offsets[safe >> 32] + (safe & 0xFFFFFFFF), 0)
        scores[s:s + group] = np.where(valid, sc.astype(np.float64), 0.0)
        if multi:
            for q, row in enumerate(ids.tolist(), start=s):
                split[q] = any(stored.count(n) > 1 for n in row if n >= 0)
    return rows, scores, counts, split


def search_texts(searcher, texts: list[str], k: int, prep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top ``k`` of each text under SIRA (``prep`` from ``mode.prepare``, with
    `batch_available`): (global positions [n, k], scores [n, k], counts [n]), as
    ``BM25Retriever.search_texts``."""
    bm, ix, cfg, params = searcher.bm25, searcher.index, prep.config, prep.params
    n = len(texts)
    pos = np.zeros((n, k), dtype=np.int64)
    score = np.zeros((n, k))
    cnt = np.zeros(n, dtype=np.int64)
    nexp = np.zeros(n, dtype=np.int64)
    if n == 0:
        return pos, score, cnt
    qptr, qgids = bm.query_gids(texts)
    bm._refuse_damaged()
    try:
        meta, proto, doc_off, id_rank, _ = bm._shard_args(params.length_norm)
        den, itab = bm._table(params)
        imp = bm._impacts(params)  # held while the kernel runs
        cache = getattr(ix, "postings_cache", None)
        if cache is not None:  # the kernel picks expansion terms itself: every term decoded (serving.lexical.packed)
            cache.pin_all()
    except ShardFault as e:  # a damaged file (kernels/checks.py, "Damaged files")
        raise bm.fault_error(e) from None
    acc, touched = bm._buffers(whole=True)  # every shard's scores at once
    fptr, fg, ftf, fdl, offsets, _, short = searcher.forward._build()
    split = np.zeros(n, dtype=bool)
    if "dense" in prep.sources:
        d_rows, d_w, d_n, split = _dense_feedback(searcher, texts, cfg.fb_docs, prep.nprobe, offsets)
    else:
        d_rows, d_w, d_n = np.zeros((n, 0), dtype=np.int64), np.zeros((n, 0)), np.zeros(n, dtype=np.int64)
    V = len(ix.vocab)
    lam = float(cfg.lambda_for(prep.proposer))
    fault = kernels.sira_batch(meta, imp[0], proto, doc_off, id_rank, acc, touched, den, itab, ix.idf, qptr, qgids,
                               k, fptr, fg, ftf, fdl, np.asarray(ix.df), short,
                               float(cfg.tau * ix.n_docs), int(cfg.fb_docs), int(cfg.fb_terms), lam,
                               "prf" in prep.sources, d_rows, d_w, d_n, np.zeros(V), np.zeros(V, dtype=np.uint8),
                               pos, score, cnt, nexp)
    if fault:  # a damaged file (kernels/checks.py, "Damaged files")
        raise bm.fault_error(fault)
    if split.any():  # their feedback is passages, which the kernel's document rows do not hold
        from .mode import expand_weights
        todo = np.flatnonzero(split)
        p, sc, c = bm.search_weighted_batch([expand_weights(searcher, texts[q], prep) for q in todo], k, params)
        pos[todo], score[todo], cnt[todo] = p, sc, c
    return pos, score, cnt
