"""Dense retrieval at query time: embed the query, search every FAISS shard, merge.

Why the fingerprint check: vectors from two different models (or one model with a
different prompt or without normalization) live in unrelated spaces, and searching one
with the other returns confident nonsense rather than an error. The index records the
embedding fingerprint it was built with; opening it with a provider whose fingerprint
differs fails with a message naming the field and the fix.

Thread-safe once opened: shard indexes are read-only (``nprobe`` is passed per search,
never set on the shared index) and the query-embedding LRU cache is lock-protected.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

import numpy as np

from funnel.pipelines.artifacts import IndexFormatError
from funnel.pipelines.embed import FINGERPRINT_FIELDS, EmbeddingProvider, canonical_model_name
from funnel.pipelines.vectors import read_index, search_shards

log = logging.getLogger(__name__)


def _normalized(fp: dict) -> dict:
    out = {f: fp.get(f) for f in FINGERPRINT_FIELDS}
    if out["model"] is not None:
        out["model"] = canonical_model_name(out["model"])
    for f in ("query_prompt", "document_prompt"):
        out[f] = out[f] or ""
    return out


def check_fingerprint(index_fp: dict, provider_fp: dict) -> None:
    """Raise ``ValueError`` if the query-time provider cannot search this index.

    Compares model (aliases resolved), dim, normalize and both prompts; ``kind`` may
    differ (an index built in-process can be queried through an endpoint serving the
    same model).

    Raises
    ------
    ValueError
        Naming every differing field, e.g. "index was built with model X dim 384,
        query-time provider is Y dim 768 (differs: model, dim): pass --embed-model X".
    """
    a, b = _normalized(index_fp), _normalized(provider_fp)
    differs = [f for f in FINGERPRINT_FIELDS if a[f] != b[f]]
    if not differs:
        if index_fp.get("kind") != provider_fp.get("kind"):
            log.info("dense index built with %s provider, queried with %s (same model and settings)",
                     index_fp.get("kind"), provider_fp.get("kind"))
        return
    detail = "; ".join(f"{f}: index {a[f]!r}, provider {b[f]!r}" for f in differs
                       if f not in ("model", "dim"))
    fix = [f"--embed-model {a['model']}"] if "model" in differs or "dim" in differs else []
    fix += [f"{f}={a[f]!r}" for f in differs if f not in ("model", "dim")]
    raise ValueError(
        f"index was built with model {a['model']} dim {a['dim']}, query-time provider is "
        f"{b['model']} dim {b['dim']} (differs: {', '.join(differs)}{'; ' + detail if detail else ''}): "
        f"pass {' '.join(fix)}")


class DenseIndex:
    """Shard indexes plus the provider that embeds queries for them.

    Parameters
    ----------
    indexes : list of faiss.Index
        One per shard, ids are docnos.
    provider : EmbeddingProvider
    nprobe : int, optional
        Default cells to probe (``None``: the value stored in each index).
    cache_size : int
        Query embeddings kept in an LRU cache (0 disables it).
    single_query_threads : int, optional
        OpenMP threads when searching one query. Default 1: at nq=1 a second thread
        gains nothing on an idle machine and, when cores are contended, its fork/join
        made single-query IVF search 7x slower here (86 vs 642 q/s at nprobe 64,
        100K x 384, 4 shards). ``None`` keeps faiss's setting; batches always do.
    """

    def __init__(self, indexes: list, provider: EmbeddingProvider, nprobe: int | None = None,
                 cache_size: int = 1024, single_query_threads: int | None = 1):
        if not indexes:
            raise ValueError("DenseIndex needs at least one shard index")
        dims = {ix.d for ix in indexes}
        if dims != {provider.dim}:
            raise ValueError(f"shard indexes have dim {sorted(dims)}, the query provider {provider.dim}")
        self.indexes = indexes
        self.provider = provider
        self.nprobe = nprobe
        self.cache_size = int(cache_size)
        self.single_query_threads = single_query_threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, dense_dir: str, manifest_dense: dict, provider: EmbeddingProvider, *, mmap: bool = True,
             cache_size: int = 1024, nprobe: int | None = None,
             single_query_threads: int | None = 1) -> "DenseIndex":
        """Open the ``dense/`` folder of an index version.

        Parameters
        ----------
        dense_dir : str
        manifest_dense : dict
            The manifest's ``dense`` section (what :func:`build_dense_index` returned,
            with ``fingerprint`` set to the build provider's fingerprint).
        provider : EmbeddingProvider
            Query-time provider; checked with :func:`check_fingerprint`.
        mmap : bool
            Memory-map shard indexes (IVF inverted lists stay on disk until touched).

        Raises
        ------
        ValueError
            Fingerprint mismatch. ``IndexFormatError`` when a shard's size differs from
            the manifest.
        """
        fp = manifest_dense.get("fingerprint")
        if fp:
            check_fingerprint(fp, provider.fingerprint())
        else:
            log.warning("dense manifest has no embedding fingerprint; only the dimension is checked")
        if manifest_dense.get("dim") is not None and int(manifest_dense["dim"]) != provider.dim:
            raise ValueError(f"index dim {manifest_dense['dim']} != query provider {provider.name!r} dim "
                             f"{provider.dim}: pass the --embed-model the index was built with")
        shards = manifest_dense.get("shards") or [
            {"shard": s, "index": f"ivf-{s:04d}.faiss", "count": c} for s, c in enumerate(manifest_dense["counts"])]
        indexes = []
        for sh in shards:
            index = read_index(os.path.join(dense_dir, sh["index"]), mmap=mmap)
            if "count" in sh and index.ntotal != int(sh["count"]):
                raise IndexFormatError(f"{sh['index']} holds {index.ntotal} vectors, the manifest says "
                                       f"{sh['count']}: the dense index is incomplete; rebuild it")
            indexes.append(index)
        return cls(indexes, provider, nprobe=nprobe, cache_size=cache_size,
                   single_query_threads=single_query_threads)

    @property
    def ntotal(self) -> int:
        return int(sum(ix.ntotal for ix in self.indexes))

    def embed_query(self, query: str) -> np.ndarray:
        """The query vector, from the LRU cache when seen recently."""
        if self.cache_size <= 0:
            return self.provider.embed_query(query)
        with self._lock:
            vec = self._cache.get(query)
            if vec is not None:
                self._cache.move_to_end(query)
                return vec
        vec = self.provider.embed_query(query)  # outside the lock: embedding is slow
        with self._lock:
            self._cache[query] = vec
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return vec

    def search_vectors(self, vectors: np.ndarray, k: int = 10, nprobe: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Raw merged search: ``(scores, docnos)``, each ``(nq, k)``, -1 docnos for padding."""
        threads = self.single_query_threads if len(vectors) == 1 else None
        return search_shards(self.indexes, vectors, k, nprobe=nprobe or self.nprobe, threads=threads)

    def search(self, query: str, k: int = 10, nprobe: int | None = None) -> list[tuple[int, float]]:
        """Top-k ``(docno, score)`` for one query, best first."""
        return self.search_batch([query], k, nprobe)[0]

    def search_batch(self, queries: list[str], k: int = 10, nprobe: int | None = None
                     ) -> list[list[tuple[int, float]]]:
        """Top-k ``(docno, score)`` per query; queries are searched as one FAISS batch."""
        if not queries:
            return []
        vectors = np.vstack([self.embed_query(q) for q in queries])
        scores, ids = self.search_vectors(vectors, k, nprobe)
        return [[(int(i), float(s)) for s, i in zip(srow, irow) if i >= 0] for srow, irow in zip(scores, ids)]
