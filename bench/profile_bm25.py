"""Where a BM25 query's time goes: the kernel's phases timed one at a time on a built index.

    .venv/bin/python bench/profile_bm25.py --corpus topical --workload long --k 10

cProfile sees a compiled kernel as one call, so each phase runs here alone, over every query
of a ``bench/bench_workloads.py`` workload and every shard, and is timed by process CPU (best
of ``--repeats``): accumulating the query's postings into a shard's accumulator with a list
of the documents touched (how the exhaustive path read a shard back before ``impacts.npy``)
or without it, each posting's impact from its tf, length code and grid cell or read from a
stored float64 / float32 array; then also reading the top k back, by a per-document loop or
by the vectorized scan (subtract the float32 line for the read-back alone); and the whole
kernels: block-max pruning wherever the bounds allow, exhaustive with
the touched list and the grid, exhaustive over the grid with the dense read-back, and the
default (float32 impacts, exact rescoring of the candidates). Needs the index that
``bench/bench_workloads.py --size 1m --build-only`` makes (or ``--size`` of your own). Prints
a table; nothing is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from funnel.serving import kernels as K  # noqa: E402
from funnel.serving.lexical.retriever import _DEFAULT  # noqa: E402
from funnel.serving.search import open_index  # noqa: E402


@njit(nogil=True)
def _dense_from(indptr, docs, local, weights, acc, imp):
    """Accumulate from a stored impact per posting (float64 or float32), no touched list."""
    for i in range(local.shape[0]):
        li = local[i]
        if li < 0:
            continue
        w = weights[i]
        for p in range(np.uint64(indptr[li]), np.uint64(indptr[li + 1])):
            acc[np.uint64(docs[p])] += w * np.float64(imp[p])


@njit(nogil=True)
def _touched_grid(indptr, docs, tfs, code, den, itab, cap, local, weights, acc, touched):
    """``kernels._accumulate`` (touched list, grid), then the touched scores zeroed."""
    m = K._accumulate(indptr, docs, tfs, code, den, itab, cap, local, weights, acc, touched, 0, np.zeros(0))
    for j in range(m):
        acc[touched[j]] = 0.0


@njit(nogil=True)
def _branchy_readback(acc, k):
    """The top k's bar by a per-document heap test, then zero: the read-back before the scan."""
    heap = np.zeros(k)
    for d in range(acc.shape[0]):
        v = acc[d]
        if v > heap[0]:
            i = 0
            while True:
                c = 2 * i + 1
                if c >= k:
                    break
                if c + 1 < k and heap[c + 1] < heap[c]:
                    c += 1
                if heap[c] >= v:
                    break
                heap[i] = heap[c]
                i = c
            heap[i] = v
        acc[d] = 0.0
    return heap[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", default="topical", choices=["topical", "zipf"])
    p.add_argument("--workload", default="long")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--size", default="1m")
    p.add_argument("--queries", type=int, default=200, help="the query set's size (its file name)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default=os.path.join(".funnel", "workloads"))
    a = p.parse_args(argv)
    work = os.path.join(a.work, f"{a.corpus}-{a.size}")
    with open(os.path.join(work, f"queries-{a.queries}.json")) as f:
        texts = list(json.load(f)[a.workload].values())
    ix = open_index(os.path.join(work, "funnel"))
    b = ix.bm25
    shards, k, n = ix.index.shards, a.k, len(texts)
    meta, proto, doc_off, id_rank, _ = b._shard_args("lucene-byte4")
    acc, touched = b._buffers()
    den, itab = b._table(_DEFAULT)
    cap = itab.shape[0] // den.shape[0]
    bmeta, imeta32 = b._blocks(_DEFAULT), b._impacts32(_DEFAULT)
    if imeta32.shape[0] == 0:
        sys.exit(f"{work}/funnel has no impacts.npy: rebuild it (bench/bench_workloads.py --build-only)")
    imp32 = [s.stored_impacts[1] for s in shards]
    imp64 = [K.posting_impacts(s.docs, s.tfs, s.norms, den, itab) for s in shards]
    qptr, qgids = b.query_gids(texts)
    queries = []
    for q in range(n):
        g, w = K._query_weights(qgids[qptr[q]:qptr[q + 1]], ix.index.idf)
        queries.append((w, [s.local_terms(g) for s in shards]))
    post = sum(int(np.asarray(ix.index.df)[np.unique(qgids[qptr[q]:qptr[q + 1]])].sum()) for q in range(n)) / n
    nd = [s.n_docs for s in shards]
    none = np.zeros(0)
    out = (np.zeros((n, k), dtype=np.int64), np.zeros((n, k)), np.zeros(n, dtype=np.int64))
    stats = np.zeros(2, dtype=np.int64)

    def per_shard(fn):
        def run():
            for w, locs in queries:
                for s, sh in enumerate(shards):
                    fn(s, sh, locs[s], w)
        return run

    def batch(bm, rescore_min, dense_min, prune_min):
        def run():
            if prune_min < 0:
                K.search_batch_plain(meta, K.NO_IMPACTS, imeta32, rescore_min, dense_min, proto, doc_off, id_rank,
                                     acc, touched, den, itab, ix.index.idf, qptr, qgids, k, *out, b._all_decoded())
            else:
                K.search_batch(meta, bm, K.NO_IMPACTS, imeta32, rescore_min, dense_min, proto, doc_off, id_rank, acc,
                               touched, den, itab, ix.index.idf, qptr, qgids, k, prune_min, stats, *out,
                               b._all_decoded())
        return run

    def touched_grid(s, sh, loc, w):
        _touched_grid(sh.indptr, sh.docs, sh.tfs, sh.norms, den, itab, cap, loc, w, acc[:nd[s]], touched[:nd[s] + 1])

    phases = [
        ("accumulate: touched list, tf + norm + grid", per_shard(touched_grid)),
        ("accumulate: no list, tf + norm + grid", per_shard(lambda s, sh, loc, w: (K._accumulate_dense(
            sh.indptr, sh.docs, sh.tfs, sh.norms, den, itab, cap, loc, w, acc[:nd[s]], none), acc[:nd[s]].fill(0)))),
        ("accumulate: no list, float64 impact per posting", per_shard(lambda s, sh, loc, w: (_dense_from(
            sh.indptr, sh.docs, loc, w, acc[:nd[s]], imp64[s]), acc[:nd[s]].fill(0)))),
        ("accumulate: no list, float32 impact per posting", per_shard(lambda s, sh, loc, w: (_dense_from(
            sh.indptr, sh.docs, loc, w, acc[:nd[s]], imp32[s]), acc[:nd[s]].fill(0)))),
        ("the same + read-back by a per-document heap test", per_shard(lambda s, sh, loc, w: (_dense_from(
            sh.indptr, sh.docs, loc, w, acc[:nd[s]], imp32[s]), _branchy_readback(acc[:nd[s]], k)))),
        ("the same + read-back by 64-score scans (_offer_dense)", per_shard(lambda s, sh, loc, w: (_dense_from(
            sh.indptr, sh.docs, loc, w, acc[:nd[s]], imp32[s]), _scan_readback(acc[:nd[s]], id_rank[
                doc_off[s]:doc_off[s + 1]], s, k)))),
        ("kernel: block-max pruning wherever the bounds allow (prune_min 0)", batch(bmeta, -1, -1, 0)),
        ("kernel: exhaustive, touched list, grid", batch(bmeta, -1, -1, -1)),
        ("kernel: exhaustive, dense read-back, grid", batch(bmeta, -1, 0, -1)),
        ("kernel: default (float32 impacts + rescoring)", batch(bmeta, b.rescore_min_postings, b.dense_min_docs,
                                                                 b.prune_min_postings)),
    ]
    print(f"{a.corpus} {a.size}, {a.workload} ({n} queries, {post:,.0f} postings a query), k={k}, "
          f"{len(shards)} shards; process CPU per query, best of {a.repeats}; load {os.getloadavg()[0]:.1f}")
    print("| phase | ms / query |\n|---|---:|")
    for name, fn in phases:
        fn()  # compile, warm
        best = min(_timed(fn) for _ in range(a.repeats))
        print(f"| {name} | {best * 1000 / n:.2f} |", flush=True)
    print(f"(load {os.getloadavg()[0]:.1f} at the end)")


def _scan_readback(acc, rank, s, k):
    bv, br, bd, tv, tr = K._new_top(k)
    return K._offer_dense(acc, rank, np.int64(s) << 32, bv, br, bd, 0, tv, tr, k)


def _timed(fn) -> float:
    c = time.process_time()
    fn()
    return time.process_time() - c


if __name__ == "__main__":
    main()
