"""Optional numba kernel for the BM25 hot loop; the NumPy path in ``bm25.py`` is the reference.

``accumulate_topk`` fuses what the NumPy path does in several array passes (gather each
term's postings, scatter-add impact·weight, find touched documents, cut at the k-th score)
into one compiled loop with a reused accumulator. Tests run both paths and require
identical results; ``FUNNEL_NUMBA=0`` turns the kernel off.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger(__name__)

try:  # numba is an accelerator, never a requirement
    if os.environ.get("FUNNEL_NUMBA", "1") == "0":
        raise ImportError("disabled by FUNNEL_NUMBA=0")
    from numba import njit
    HAVE_NUMBA = True
except ImportError as e:  # pragma: no cover - exercised where numba is absent
    log.info("numba unavailable (%s): using the NumPy BM25 path", e)
    HAVE_NUMBA = False

if HAVE_NUMBA:
    @njit(cache=True, nogil=True)
    def accumulate_topk(indptr, docs, impacts, local_terms, weights, acc, k):
        """Top ``k`` (ties at the k-th score included) of Σ_t weight_t · impact[t, d].

        ``acc`` is a zeroed float64 buffer of the shard's size; it is zeroed again on return.
        Returns (local doc ids, scores), unordered.
        """
        n_touch = 0
        for i in range(local_terms.shape[0]):
            li = local_terms[i]
            if li >= 0:
                n_touch += indptr[li + 1] - indptr[li]
        touched = np.empty(n_touch, dtype=np.int64)
        m = 0
        for i in range(local_terms.shape[0]):
            li = local_terms[i]
            if li < 0:
                continue
            w = weights[i]
            for p in range(indptr[li], indptr[li + 1]):
                d = docs[p]
                if acc[d] == 0.0:
                    touched[m] = d
                    m += 1
                acc[d] += w * impacts[p]
        ids = touched[:m]
        vals = np.empty(m, dtype=np.float64)
        for j in range(m):
            vals[j] = acc[ids[j]]
            acc[ids[j]] = 0.0
        if m > k:
            kth = -np.partition(-vals, k - 1)[k - 1]
            keep = vals >= kth
            return ids[keep], vals[keep]
        return ids, vals
else:
    accumulate_topk = None
