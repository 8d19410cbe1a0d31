"""Dense retrieval at query time: embed the query, search every FAISS shard, merge.

Why the fingerprint check: vectors from two different models (or one model with a
different prompt or without normalization) live in unrelated spaces, and searching one
with the other returns confident nonsense rather than an error. The index records the
embedding fingerprint it was built with; opening it with a provider whose fingerprint
differs fails with a message naming the field and the fix.

Passages (DESIGN.md, "Long documents"): an index built with passages holds one vector per
passage, each under its document's docno, so a search's ids are documents and a document
filter applies unchanged. A document's score is its best passage's (MaxP): the passage
search goes deep enough that k distinct documents come out of it (`DenseIndex.search_vectors`),
and the passage that scored is found again from the stored vectors (`DenseIndex.best_passage`).

IVF-PQ (built above the dense memory budget, ``pipelines.dense.vectors``): PQ scores are
approximate, so the search takes a shortlist of ``k_factor`` times the documents wanted and
re-scores each exactly from the float vectors on disk (``ExactScorer``: MaxP over all its
passages, from ``dense/emb-NNNN.npy`` memory-mapped). Every returned score is exact, so the
results have the shape and the scores an IVF-Flat index gives; only a document the PQ
shortlist missed can be absent.

Runtimes (DESIGN.md, "Embedding runtime on a CPU"): the fingerprint names the runtime and
precision the vectors came from. Torch fp32, torch fp16 (GPU builds) and onnxruntime fp32 give
the same vectors to float rounding (cosine >= 0.999, checked when a model is exported), so an
index built with any of them is queried with onnxruntime fp32, which needs no torch import
(`query_spec`); an int8 index is a different embedder and is queried with int8 only
(`check_fingerprint` refuses anything else).

Thread-safe once opened: shard indexes are read-only (``nprobe`` is passed per search,
never set on the shared index) and the query-embedding LRU cache is lock-protected.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict

import numpy as np

from funnel.pipelines.store.artifacts import IndexFormatError
from funnel.pipelines.dense.embed import FINGERPRINT_FIELDS, EmbeddingProvider, canonical_model_name, runtime_name

# funnel.pipelines.dense.vectors (and with it faiss, ~50 ms) is imported where a dense index is opened
# or searched, not here: a BM25 query that only reads a version's passages (Passages) skips it.

log = logging.getLogger(__name__)

#: A filter admitting at least this share of the documents is applied after an unfiltered
#: search about as deep as an unfiltered query's (deeper where that held too few allowed hits);
#: a more selective one goes to FAISS as an ID selector, which skips the disallowed entries'
#: distances. At 1M documents, k=100, half allowed: the bitmap selector (filters.faiss_selectors)
#: 1.32x the unfiltered search, this 0.97x; a tenth allowed: the selector 0.65x. (At 100K, a
#: tenth allowed, this would be 2.1x: its deeper heap.)
POST_FILTER_MIN_SHARE = 0.5


def _normalized(fp: dict) -> dict:
    out = {f: fp.get(f) for f in FINGERPRINT_FIELDS}
    if out["model"] is not None:
        out["model"] = canonical_model_name(out["model"])
    for f in ("query_prompt", "document_prompt"):
        out[f] = out[f] or ""
    return out


def vector_family(fp: dict | None) -> str:
    """Which runtimes' vectors agree with this fingerprint's to float rounding: ``int8`` for an
    int8 model, ``float`` for torch fp32/fp16, onnxruntime fp32, an endpoint, or a fingerprint
    that predates runtimes (torch)."""
    return "int8" if (fp or {}).get("precision") == "int8" else "float"


def query_spec(fp: dict) -> dict:
    """The provider spec that embeds queries for an index built with fingerprint ``fp``.

    A local model runs on onnxruntime on the CPU: fp32 for a float index (whatever runtime built
    it: the vectors agree), int8 for an int8 one. Where ONNX cannot be made, ``make_provider``
    falls back to torch fp32, which a float index accepts and an int8 index refuses
    (`check_fingerprint`). An endpoint's spec is its fingerprint's.
    """
    keys = ("kind", "model", "normalize", "query_prompt", "document_prompt")
    spec = {k: fp[k] for k in keys if k in fp}
    if spec.get("kind", "sentence-transformers") == "sentence-transformers":
        spec.update(device="cpu", runtime="onnx", precision="int8" if vector_family(fp) == "int8" else "fp32")
    return spec


def check_fingerprint(index_fp: dict, provider_fp: dict) -> None:
    """Raise ``ValueError`` if the query-time provider cannot search this index.

    Compares model (aliases resolved), dim, normalize and both prompts; ``kind`` may
    differ (an index built in-process can be queried through an endpoint serving the
    same model), and so may the runtime within one `vector_family` (an index built
    with torch is queried with onnxruntime fp32); an int8 index takes int8 queries only.

    Raises
    ------
    ValueError
        Naming every differing field, e.g. "index was built with model X dim 384,
        query-time provider is Y dim 768 (differs: model, dim): pass --embed-model X".
    """
    a, b = _normalized(index_fp), _normalized(provider_fp)
    differs = [f for f in FINGERPRINT_FIELDS if a[f] != b[f]]
    if not differs and vector_family(index_fp) != vector_family(provider_fp):
        raise ValueError(
            f"index vectors were embedded with runtime {runtime_name(index_fp)} ({index_fp.get('precision', 'fp32')}), "
            f"queries would be embedded with {runtime_name(provider_fp)} ({provider_fp.get('precision', 'fp32')}): "
            "int8 and float vectors are different embedders. Query with the index's runtime (make_provider "
            f"runtime='{index_fp.get('runtime', 'torch')}', precision='{index_fp.get('precision', 'fp32')}'; where "
            "torch took over from onnxruntime, install onnxruntime and onnx), or rebuild the index with the "
            "runtime you query with (funnel build --embed-runtime)")
    if not differs:
        if index_fp.get("kind") != provider_fp.get("kind"):
            log.info("dense index built with %s provider, queried with %s (same model and settings)",
                     index_fp.get("kind"), provider_fp.get("kind"))
        elif runtime_name(index_fp) != runtime_name(provider_fp):
            log.info("dense index embedded with %s, queries with %s (the same vectors to float rounding)",
                     runtime_name(index_fp), runtime_name(provider_fp))
        return
    detail = "; ".join(f"{f}: index {a[f]!r}, provider {b[f]!r}" for f in differs
                       if f not in ("model", "dim"))
    fix = [f"--embed-model {a['model']}"] if "model" in differs or "dim" in differs else []
    fix += [f"{f}={a[f]!r}" for f in differs if f not in ("model", "dim")]
    raise ValueError(
        f"index was built with model {a['model']} dim {a['dim']}, query-time provider is "
        f"{b['model']} dim {b['dim']} (differs: {', '.join(differs)}{'; ' + detail if detail else ''}): "
        f"pass {' '.join(fix)}")


def shard_entries(manifest_dense: dict) -> list[dict]:
    """The manifest's per-shard entries (``shard``, ``index``, ``count``, ``embeddings``)."""
    return manifest_dense.get("shards") or [
        {"shard": s, "index": f"ivf-{s:04d}.faiss", "count": c} for s, c in enumerate(manifest_dense["counts"])]


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
    scorer : ExactScorer, optional
        Re-scores a shortlist exactly (an IVF-PQ index; ``None`` for Flat and IVF-Flat).
    """

    def __init__(self, indexes: list, provider: EmbeddingProvider, nprobe: int | None = None,
                 cache_size: int = 1024, single_query_threads: int | None = 1, passages: "Passages | None" = None,
                 scorer: ExactScorer | None = None, shard_ids: list[int] | None = None):
        if not indexes:
            raise ValueError("DenseIndex needs at least one shard index")
        dims = {ix.d for ix in indexes}
        if dims != {provider.dim}:
            raise ValueError(f"shard indexes have dim {sorted(dims)}, the query provider {provider.dim}")
        self.indexes = indexes
        self.shard_ids = list(range(len(indexes))) if shard_ids is None else [int(s) for s in shard_ids]
        self.provider = provider
        self.nprobe = nprobe
        self.cache_size = int(cache_size)
        self.single_query_threads = single_query_threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.passages = passages
        self.scorer = scorer
        # Passages searched per document wanted: enough for k distinct documents in one search
        # most of the time (deeper searches follow when not); 1 where a document is one vector.
        self.depth_factor = 1 if passages is None or passages.max_per_doc <= 1 else \
            max(2, math.ceil(2 * passages.per_doc))

    @classmethod
    def open(cls, dense_dir: str, manifest_dense: dict, provider: EmbeddingProvider, *, mmap: bool = True,
             cache_size: int = 1024, nprobe: int | None = None,
             single_query_threads: int | None = 1, passages: "Passages | None" = None) -> "DenseIndex":
        """Open the ``dense/`` folder of an index version.

        Parameters
        ----------
        dense_dir : str
        manifest_dense : dict
            The manifest's ``dense`` section (what `build_dense_index` returned,
            with ``fingerprint`` set to the build provider's fingerprint).
        provider : EmbeddingProvider
            Query-time provider; checked with `check_fingerprint`.
        mmap : bool
            Memory-map shard indexes (IVF inverted lists stay on disk until touched).

        Raises
        ------
        ValueError
            Fingerprint mismatch. ``IndexFormatError`` when a shard's size differs from
            the manifest.
        """
        from funnel.pipelines.dense.vectors import REFINE_K_FACTOR, ExactScorer, read_index
        fp = manifest_dense.get("fingerprint")
        if fp:
            check_fingerprint(fp, provider.fingerprint())
        else:
            log.warning("dense manifest has no embedding fingerprint; only the dimension is checked")
        if manifest_dense.get("dim") is not None and int(manifest_dense["dim"]) != provider.dim:
            raise ValueError(f"index dim {manifest_dense['dim']} != query provider {provider.name!r} dim "
                             f"{provider.dim}: pass the --embed-model the index was built with")
        shards = shard_entries(manifest_dense)
        indexes = []
        for sh in shards:
            index = read_index(os.path.join(dense_dir, sh["index"]), mmap=mmap)
            if "count" in sh and index.ntotal != int(sh["count"]):
                raise IndexFormatError(f"{sh['index']} holds {index.ntotal} vectors, the manifest says "
                                       f"{sh['count']}: the dense index is incomplete; rebuild it")
            indexes.append(index)
        if manifest_dense.get("passages") and passages is None:
            passages = Passages.open(os.path.dirname(os.path.abspath(dense_dir)), shards,
                                     [ix.ntotal for ix in indexes])
        scorer = None
        refine = manifest_dense.get("refine")
        if refine:
            from .structure import check_dense_vectors
            scorer = ExactScorer.open(dense_dir, len(shards), metric=manifest_dense.get("metric", "ip"),
                                      k_factor=int(refine.get("k_factor") or REFINE_K_FACTOR), shards=shards)
            version_dir = os.path.dirname(os.path.abspath(dense_dir))
            for sh, emb, ids in zip(shards, scorer.embs, scorer.ids):
                check_dense_vectors(version_dir, "dense", sh, emb, ids, int(provider.dim))
        return cls(indexes, provider, nprobe=nprobe, cache_size=cache_size,
                   single_query_threads=single_query_threads, passages=passages, scorer=scorer,
                   shard_ids=[int(sh.get("shard", i)) for i, sh in enumerate(shards)])

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
        """The top ``k`` documents per query vector: ``(scores, docnos)``, each ``(nq, k)``,
        -1 docnos for padding, best first.

        With passages a document scores its best passage (MaxP). Passages come back best
        first, so the first time a document appears is at its best passage: the first ``k``
        distinct documents of the passage ranking are the top ``k`` by MaxP. A search too
        shallow for ``k`` distinct documents is repeated 4x deeper, until there are ``k`` or
        the index has no more (fewer passages came back than were asked for).

        With a ``scorer`` (IVF-PQ) the same search collects ``scorer.shortlist(k)`` distinct
        documents by PQ score, and the best ``k`` of them by exact score are returned.

        Under a filter (``filters.active()``) only allowed documents come back: FAISS skips
        the others (an ID selector), or for a broad filter they are dropped from a deep
        enough unfiltered search (``POST_FILTER_MIN_SHARE``).
        """
        from .filters import active
        mask = active()
        # A filter admitting a large share of the corpus is applied after an unfiltered search
        # deep enough to hold k allowed hits (POST_FILTER_MIN_SHARE). The probed cells are the
        # same either way, so the allowed hits are the same.
        post = mask is not None and 0 < mask.count and mask.count >= POST_FILTER_MIN_SHARE * len(mask.allow)
        if self.depth_factor == 1 and self.scorer is None and not post:
            return self._search_raw(vectors, k, nprobe, mask)
        from funnel.pipelines.dense.vectors import first_distinct
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        want = k if self.scorer is None else self.scorer.shortlist(k)
        nq = len(vectors)
        out_s = np.full((nq, want), -np.inf, dtype=np.float32)
        out_i = np.full((nq, want), -1, dtype=np.int64)
        todo = np.arange(nq)
        depth = want * self.depth_factor
        if post:  # 1.5x the hits expected to be allowed; depth_factor's margin covers that mostly
            depth = want * max(self.depth_factor, math.ceil(1.5 * len(mask.allow) / mask.count))
        depth = min(self.ntotal, depth)
        while len(todo):
            scores, ids = self._search_raw(vectors[todo], max(1, depth), nprobe, None if post else mask)
            again = []
            for row, q in enumerate(todo.tolist()):
                srow, irow = scores[row], ids[row]
                n_valid = int((irow >= 0).sum())
                if post:
                    keep = mask.allows_docnos(irow)
                    srow, irow = srow[keep], irow[keep]
                first = first_distinct(irow, want)
                if len(first) < want and n_valid >= depth and depth < self.ntotal:
                    again.append(q)
                    continue
                out_i[q, :len(first)] = irow[first]
                out_s[q, :len(first)] = srow[first]
            todo = np.asarray(again, dtype=np.int64)
            if post:  # too few allowed hits: the rest go to FAISS's ID selector, at the usual depth
                post, depth = False, min(self.ntotal, want * self.depth_factor)
            else:
                depth = min(self.ntotal, depth * 4)
        if self.scorer is not None:
            return self.scorer.rerank(vectors, out_i, k)
        return out_s, out_i

    def _search_raw(self, vectors: np.ndarray, k: int, nprobe: int | None, mask=None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """Merged FAISS search: ``(scores, ids)`` of vectors (passages or documents); with a
        ``mask`` FAISS scores its allowed ids only."""
        from funnel.pipelines.dense.vectors import search_shards
        threads = self.single_query_threads if len(vectors) == 1 else None
        return search_shards(self.indexes, vectors, k, nprobe=nprobe or self.nprobe, threads=threads,
                             selector=None if mask is None else mask.faiss_selectors(self.shard_ids))

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

    def best_passage(self, query: str | np.ndarray, docno: int) -> dict | None:
        """The passage of ``docno`` nearest the query (the one its MaxP score came from):
        ``{"ordinal", "start", "end", "score"}`` with character offsets into the document's
        text; ``None`` for an index without passages."""
        if self.passages is None:
            return None
        vec = self.embed_query(query) if isinstance(query, str) else np.asarray(query, dtype=np.float32)
        return self.passages.best(vec, docno)


class Passages:
    """The passages of a dense index: spans and vectors by document, memory-mapped.

    ``passages/shard-NNNN.parquet`` rows are in the order of ``dense/emb-NNNN.npy`` rows
    (local id, then ordinal); ``ptr[shard]`` gives each document's rows.
    """

    def __init__(self, spans: list[dict], embeddings: list[np.ndarray]):
        from funnel.pipelines.dense.passages import doc_pointers
        self.spans, self.emb = spans, embeddings
        self.ptr = []
        for sp in spans:
            n_docs = int(sp["local_id"][-1]) + 1 if len(sp["local_id"]) else 0
            self.ptr.append(doc_pointers(sp["local_id"], n_docs))
        counts = np.concatenate([np.diff(p) for p in self.ptr]) if self.ptr else np.zeros(0)
        counts = counts[counts > 0]
        self.max_per_doc = int(counts.max()) if len(counts) else 0
        self.per_doc = float(counts.mean()) if len(counts) else 0.0

    @classmethod
    def open(cls, version_dir: str, shards: list[dict], counts: list[int]) -> "Passages":
        from funnel.pipelines.dense.passages import read_passages
        spans, embs = [], []
        for sh, n in zip(shards, counts):
            s = int(sh["shard"])
            path = os.path.join(version_dir, "passages", f"shard-{s:04d}.parquet")
            try:
                sp = read_passages(path)
            except (OSError, ValueError) as e:
                raise IndexFormatError(f"{path} cannot be read ({e}): the dense index's passages are missing "
                                       "or damaged; rebuild with `funnel build ... --dense`") from e
            if len(sp["local_id"]) != n:
                raise IndexFormatError(f"{path} lists {len(sp['local_id'])} passages, the FAISS shard holds {n} "
                                       "vectors: the index is damaged; rebuild it")
            spans.append(sp)
            embs.append(np.load(os.path.join(version_dir, "dense", sh.get("embeddings", f"emb-{s:04d}.npy")),
                                mmap_mode="r"))
        return cls(spans, embs)

    def rows(self, docno: int) -> tuple[int, int, int]:
        """(shard, first row, end row) of a document's passages."""
        s, local = int(docno) >> 32, int(docno) & 0xFFFFFFFF
        ptr = self.ptr[s]
        if local + 1 >= len(ptr):
            return s, 0, 0
        return s, int(ptr[local]), int(ptr[local + 1])

    def count(self, docno: int) -> int:
        """How many passages a document has."""
        _, a, b = self.rows(docno)
        return b - a

    def spans_of(self, docno: int) -> np.ndarray:
        """``(m, 2)`` character spans of a document's passages, in order."""
        s, a, b = self.rows(docno)
        sp = self.spans[s]
        return np.stack([sp["char_start"][a:b], sp["char_end"][a:b]], axis=1).astype(np.int64)

    def best(self, vec: np.ndarray, docno: int) -> dict | None:
        s, a, b = self.rows(docno)
        if a == b:
            return None
        scores = np.asarray(self.emb[s][a:b], dtype=np.float32) @ vec
        j = int(np.argmax(scores))
        sp = self.spans[s]
        return {"ordinal": int(sp["ordinal"][a + j]), "start": int(sp["char_start"][a + j]),
                "end": int(sp["char_end"][a + j]), "score": float(scores[j])}
