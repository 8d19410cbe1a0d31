"""FAISS indexes for dense retrieval: one coarse quantizer, one IVF index per shard.

Why this shape: documents are hash-partitioned into shards that are built in parallel.
Training the coarse quantizer once, on a sample drawn across all shards, and adding each
shard to a copy of it (``add_with_ids`` with global docnos) means every shard shares the
same centroids, so probing the same ``nprobe`` cells in each shard and merging the
per-shard top-k gives the same answer as one big IVF index (faiss ``contrib/ondisk``).
Small corpora use an exact Flat index instead. Shard embeddings are kept as ``.npy``
files so the quantizer can be retrained without re-embedding. Above a memory budget the
shards are IVF-PQ, re-scored exactly from those files at serving (`ExactScorer`;
the comment above `DEFAULT_MEMORY_BUDGET` says why this design).

Layout of ``dense/``::

    emb-NNNN.npy   float32 (n, dim)     ids-NNNN.npy   int64 docnos (shard << 32 | local_id)
    quantizer.faiss (trained, empty)    ivf-NNNN.faiss (one per shard; Flat ones too)

With passages (``pipelines.dense.passages``) a row is a passage: a document has as many rows as
passages, all under its docno (FAISS ids stay document numbers: a document filter and every
reader of ids work unchanged), in (local id, ordinal) order, and ``../passages/shard-NNNN.parquet``
holds each row's (local_id, ordinal, char_start, char_end) in the same order
(`write_passage_shard`).

Pure: no Ray. GPU is used for k-means and adds when faiss-gpu and a GPU are present;
files are always written as CPU indexes.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import uuid

import faiss
import numpy as np

from ..store.artifacts import save_npy_atomic

log = logging.getLogger(__name__)

METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}

# Below this many vectors an exact Flat index is used. Exact search over 50,000 x 384
# float32 (77 MB) costs ~19 MFLOP per query, a few milliseconds on one core (less than
# embedding the query), while IVF at its default nprobe lost NDCG@10 here: SciFact's 10,202
# passage vectors in IVF256 at nprobe 16 gave dense 0.630 against 0.657 exact. Passages
# multiply vectors (2x on abstracts, ~40x on long documents), so a corpus crosses this
# sooner than its document count suggests.
FLAT_THRESHOLD = 50_000
MIN_POINTS_PER_CENTROID = 39  # faiss warns below this; centroids are then unreliable

# -- the memory budget: IVF-Flat below it, IVF-PQ with exact re-scoring above it ------------
#
# Passages multiply vectors (a 10,000-word document gives ~50), and an IVF-Flat list entry is
# the whole float32 vector plus its id: 1,544 bytes at dim 384, 1.5 GB per million passages
# that serving wants in RAM. Above ``memory_budget`` (the lists' estimated bytes,
# `flat_list_bytes`) the build writes IVF-PQ instead: each vector's list entry is a
# product-quantization code of dim/4 bytes (`choose_pq`: 96 bytes at dim 384) plus its
# id, 15x smaller. PQ scores are approximate, so serving re-scores a shortlist exactly
# (`ExactScorer`): the PQ search yields ``k_factor`` times the documents wanted, each is
# scored exactly from the float32 vectors, and the best k are returned with exact scores.
#
# Why not FAISS's ``IndexRefineFlat``: it keeps a second, full float32 copy of every vector
# inside the index, in RAM, so it saves nothing. ``IndexRefine`` with an SQ8 refine index
# keeps dim bytes a vector in RAM (4x less than flat, 4x more than the PQ codes) and its
# re-scores are themselves approximate. Here the float vectors are already on disk: the build
# writes every shard's ``emb-NNNN.npy`` (float32) for quantizer retraining, reindex reuse and
# citations. Memory-mapped, they cost no RAM until a shortlisted document's rows are read,
# add no file, and make the re-scores exact. ``bench/bench_dense_pq.py`` measures float16
# re-scoring too (half the disk; see bench/RESULTS.md, "dense-pq"); it would add a second
# copy of the vectors, so float32 it is.
#
# And why re-score documents, not passages: FAISS ids are docnos (several passages share
# one, so a document filter and every reader of ids work unchanged), so a PQ hit names a
# document, not its row. A shortlisted document is re-scored over all its passages (rows
# ``ids == docno``, contiguous: ``ids-NNNN.npy`` is sorted), which is exactly its MaxP score.

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
#: IVF-Flat below 4 GiB of lists: ~2.7M passages at dim 384 (SciFact's 5,183 abstracts are
#: 16 MB, NFCorpus's 3,633 are 11 MB). A serving machine with less RAM passes a smaller budget.
DEFAULT_MEMORY_BUDGET = 4 * GIB
#: One 8-bit PQ code per 4 dimensions (dim/4 bytes a vector), re-scoring 8 documents per
#: document wanted (`refine_shortlist`): on 1M MiniLM-like vectors (real passages and
#: mixtures of them, real queries; bench/bench_dense_pq.py) in IVF4096 at nprobe 256, recall@10
#: against exact search was 0.88 / 0.965 / 0.99 re-scoring 2x / 4x / 8x with dim/4-byte codes,
#: and 0.63 / 0.79 / 0.90 / 0.95 at 2x / 4x / 8x / 16x with dim/8-byte codes: half the RAM
#: would cost twice the re-scoring and still miss the 0.95 target at 8x.
PQ_DIMS_PER_CODE = 4
REFINE_K_FACTOR = 8
REFINE_DEEP_CAP = 50      # ... for the first 50 documents wanted; a top 100 re-scores 100 + 7 * 50
_UNITS = {"": 1, "b": 1, "k": KIB, "kb": KIB, "kib": KIB, "m": MIB, "mb": MIB, "mib": MIB, "g": GIB, "gb": GIB,
          "gib": GIB, "t": TIB, "tb": TIB, "tib": TIB}


def parse_memory_budget(value) -> int:
    """Bytes of a memory budget: an int (bytes) or a size such as ``"512MiB"``, ``"4GiB"``,
    ``"1.5G"`` (units B, KiB, MiB, GiB, TiB; K/KB/M/MB/... are the same binary units).
    ``None`` is `DEFAULT_MEMORY_BUDGET`.

    Raises
    ------
    ValueError
        For anything else, or a budget that is not positive, naming the value and the fix.
    """
    if value is None:
        return DEFAULT_MEMORY_BUDGET
    import re
    hint = "give a positive size such as 512MiB, 4GiB or 1.5GiB (units B, KiB, MiB, GiB, TiB)"
    if isinstance(value, bool):
        raise ValueError(f"dense memory budget {value!r} is not a size: {hint}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"dense memory budget {value!r} is not a size: {hint}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"dense memory budget {value!r} must be positive: {hint}")
    return n


def format_bytes(n: int) -> str:
    """``n`` bytes as a short binary size (``"4 GiB"``, ``"1.5 MiB"``)."""
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def flat_list_bytes(n: int, dim: int) -> int:
    """Bytes of IVF-Flat (or Flat) lists of ``n`` vectors: a float32 vector and an int64 id each."""
    return int(n) * (4 * int(dim) + 8)


def choose_pq(n: int, dim: int) -> tuple[int, int] | None:
    """``(m, nbits)`` of the PQ codes for ``n`` vectors of ``dim``: ``m`` sub-quantizers (the
    largest divisor of ``dim`` up to dim/4) of ``nbits`` bits, 8 where the corpus has 39
    training points for each of the 256 centroids, fewer below (a small corpus). ``None``
    when it has too few vectors to train even 16 centroids (624): compressing it is
    pointless, and it stays exact."""
    nbits = min(8, int(math.log2(max(1, n) / MIN_POINTS_PER_CENTROID)) if n >= MIN_POINTS_PER_CENTROID else 0)
    if nbits < 4:
        return None
    m = max(d for d in range(1, max(1, dim // PQ_DIMS_PER_CODE) + 1) if dim % d == 0)
    return m, nbits


def refine_shortlist(k: int, k_factor: int = REFINE_K_FACTOR) -> int:
    """Documents re-scored exactly for a top ``k``: ``k_factor`` times ``k`` up to
    `REFINE_DEEP_CAP`, then one per document (a fusion's 100 candidates re-score 450
    documents, not 800: every passage of each is read, and the tail of a candidate list
    weighs little in the fusion)."""
    return int(k) + (int(k_factor) - 1) * min(int(k), REFINE_DEEP_CAP)


def choose_nlist(n: int) -> int:
    """Number of IVF cells for ``n`` vectors: 4*sqrt(n) rounded to a power of two.

    Returns 0 (meaning: exact Flat) when ``n < FLAT_THRESHOLD``. Capped so that the
    corpus holds at least 39 training points per centroid.
    """
    if n < FLAT_THRESHOLD:
        return 0
    nlist = 2 ** round(math.log2(4 * math.sqrt(n)))
    cap = 2 ** int(math.log2(n // MIN_POINTS_PER_CENTROID))
    return int(min(nlist, cap))


def default_nprobe(nlist: int) -> int:
    """Cells probed by default: nlist/16 clamped to [8, 256] (recall@10 >= 0.95 on
    clustered data and MiniLM embeddings in ``tests/test_vectors.py`` and the benchmark)."""
    if nlist <= 0:
        return 0
    return int(min(nlist, max(8, min(256, nlist // 16))))


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees at least one GPU."""
    try:
        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except Exception:
        return False


def _metric(metric: str) -> int:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return METRICS[metric]


def _as_f32(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {x.shape}")
    return x


def train_quantizer(sample: np.ndarray, factory: str = "IVF{nlist},Flat", metric: str = "ip",
                    nlist: int | None = None, seed: int = 0) -> faiss.Index:
    """Train an empty index on ``sample``.

    Parameters
    ----------
    sample : np.ndarray
        ``(m, dim)`` training vectors.
    factory : str
        A ``faiss.index_factory`` string; ``{nlist}`` is filled in. ``"Flat"`` or
        ``nlist == 0`` gives an exact ``IndexFlat`` (nothing to train).
    metric : {"ip", "l2"}
    nlist : int, optional
        Default: `choose_nlist` of the sample size (the build passes the corpus's).
    seed : int
        k-means seed, so rebuilds are reproducible.

    Raises
    ------
    ValueError
        When the sample has fewer than 39 points per centroid.
    """
    sample = _as_f32(sample)
    dim = sample.shape[1]
    if nlist is None:
        nlist = choose_nlist(len(sample))
    if factory.strip().lower() == "flat" or ("{nlist}" in factory and nlist == 0):
        return faiss.IndexFlat(dim, _metric(metric))
    index = faiss.index_factory(dim, factory.format(nlist=nlist), _metric(metric))
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        need = MIN_POINTS_PER_CENTROID * ivf.nlist
        if len(sample) < need:
            raise ValueError(f"training {factory.format(nlist=nlist)!r} needs >= {need} sample vectors "
                             f"(39 per centroid), got {len(sample)}: pass a larger sample_size or a smaller nlist")
        ivf.cp.seed = seed
        ivf.nprobe = default_nprobe(ivf.nlist)
        pq_ivf = faiss.downcast_index(ivf)
        if isinstance(pq_ivf, faiss.IndexIVFPQ):
            # Polysemous training (on by default) reorders codes for Hamming-distance pre-filtering,
            # which funnel does not use; it took 10x the rest of training (6,000 vectors: 12 s vs 1.3 s).
            pq_ivf.do_polysemous_training = False
            pq_ivf.pq.cp.seed = seed
        if gpu_available():  # k-means on the GPU; the trained index stays on the CPU
            ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlat(dim, _metric(metric)))
    if not index.is_trained:
        index.train(sample)
    if ivf is not None:
        ivf.clustering_index = None
    return index


def build_shard_index(trained: faiss.Index, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    """A copy of ``trained`` holding ``vectors`` under ``ids`` (int64 docnos).

    Flat (and other id-less) indexes are wrapped in ``IndexIDMap``.
    """
    vectors = _as_f32(vectors) if len(vectors) else np.zeros((0, trained.d), np.float32)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if len(ids) != len(vectors):
        raise ValueError(f"{len(vectors)} vectors but {len(ids)} ids")
    if vectors.shape[1] != trained.d:
        raise ValueError(f"vectors have dim {vectors.shape[1]}, the trained index {trained.d}")
    index = faiss.clone_index(trained)
    if faiss.try_extract_index_ivf(index) is None and not isinstance(index, faiss.IndexIDMap):
        index = faiss.IndexIDMap(index)
    if not len(ids):
        return index
    if gpu_available() and faiss.try_extract_index_ivf(index) is not None:
        try:  # assignment to cells on the GPU, stored back on the CPU
            gpu = faiss.index_cpu_to_all_gpus(index)
            gpu.add_with_ids(vectors, ids)
            return faiss.index_gpu_to_cpu(gpu)
        except RuntimeError as e:  # an index type the GPU does not support
            log.info("GPU add failed (%s); adding on the CPU", e)
    index.add_with_ids(vectors, ids)
    return index


def write_index(index: faiss.Index, path: str) -> None:
    """Write ``index`` atomically (temporary file, fsync, rename)."""
    if hasattr(faiss, "index_gpu_to_cpu") and "Gpu" in type(index).__name__:
        index = faiss.index_gpu_to_cpu(index)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    faiss.write_index(index, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_index(path: str, mmap: bool = True) -> faiss.Index:
    """Read an index, memory-mapped (``IO_FLAG_MMAP``) where faiss supports it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"FAISS index {path!r} does not exist")
    if mmap:
        try:
            index = faiss.read_index(path, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError as e:
            log.debug("mmap read of %s failed (%s); reading into memory", path, e)
        else:
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None:
                invlists = faiss.downcast_InvertedLists(ivf.invlists)
                if isinstance(invlists, faiss.OnDiskInvertedLists):
                    # Memory-mapped lists come back as OnDiskInvertedLists, whose prefetch
                    # starts 32 threads per search call: 1.3 ms instead of 0.06 ms for one
                    # query at nprobe 32 (measured here). The page cache does the prefetching.
                    invlists.prefetch_nthread = 0
            return index
    return faiss.read_index(path)


def _is_max_metric(index: faiss.Index) -> bool:
    return index.metric_type == faiss.METRIC_INNER_PRODUCT


def search_shards(indexes: list[faiss.Index], queries: np.ndarray, k: int,
                  nprobe: int | None = None, threads: int | None = None,
                  selector=None) -> tuple[np.ndarray, np.ndarray]:
    """Search every shard and merge the per-shard top-k (``faiss.ResultHeap``).

    Parameters
    ----------
    indexes : list of faiss.Index
        Shard indexes sharing one metric (built from one trained quantizer).
    queries : np.ndarray
        ``(nq, dim)`` float32.
    k : int
    nprobe : int, optional
        IVF cells to visit per shard; default: the value stored in each index. Passed
        as search parameters, so concurrent searches never mutate shared indexes.
    threads : int, optional
        OpenMP threads for this call only (OpenMP's setting is per calling thread, so
        concurrent callers are unaffected). One thread is as fast for a single query on
        an idle machine and several times faster on a busy one; default: faiss's setting.
    selector : faiss.IDSelector or list of them, optional
        Only ids it admits are scored (inside the IVF scan: a filter that never starves k);
        a list gives each index its own (``serving.filters.Mask.faiss_selectors``).

    Returns
    -------
    scores, ids : np.ndarray
        ``(nq, k)``, best first; ids are docnos, -1 where fewer than k were found.
    """
    queries = _as_f32(queries)
    if not indexes:
        raise ValueError("search_shards: no indexes")
    previous = faiss.omp_get_max_threads()
    if threads:
        faiss.omp_set_num_threads(int(threads))
    try:
        # The heap's heapify and reorder are OpenMP loops too: under ``threads`` as well (with
        # faiss's default of one thread per core, on a busy 2-core machine their fork and join
        # cost 20-40 ms a query, more than the search; measured here with the load at 17).
        heap = faiss.ResultHeap(len(queries), k, keep_max=_is_max_metric(indexes[0]))
        for i, index in enumerate(indexes):
            if index.ntotal == 0:
                continue
            sel = selector[i] if isinstance(selector, list) else selector
            params = None
            ivf = faiss.try_extract_index_ivf(index)
            if nprobe and ivf is not None:
                params = faiss.SearchParametersIVF(nprobe=int(min(nprobe, ivf.nlist)))
            if sel is not None:
                if params is None:
                    params = (faiss.SearchParametersIVF(nprobe=int(ivf.nprobe)) if ivf is not None
                              else faiss.SearchParameters())
                params.sel = sel
            scores, ids = index.search(queries, k, params=params)
            heap.add_result(scores, ids)
        heap.finalize()
    finally:
        if threads:
            faiss.omp_set_num_threads(previous)
    return heap.D, heap.I


def needs_refine(index: faiss.Index) -> bool:
    """True when ``index`` stores compressed codes (IVF-PQ, ...), whose scores are approximate
    and are re-scored from the float vectors (`ExactScorer`); False for Flat and IVF-Flat."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return not isinstance(faiss.downcast_index(ivf), faiss.IndexIVFFlat)
    inner = index.index if isinstance(index, faiss.IndexIDMap) else index
    return not isinstance(faiss.downcast_index(inner), faiss.IndexFlat)


class ExactScorer:
    """Exact document scores from the float vectors on disk: the re-scoring half of IVF-PQ.

    ``embs[s]`` (``emb-NNNN.npy``, memory-mapped: only the rows of a shortlisted document are
    read) and ``ids[s]`` (``ids-NNNN.npy``, ascending docnos, one per row) of each shard. A
    document's score is its best row's (MaxP; a document of one vector: that vector's).

    Parameters
    ----------
    embs, ids : list of np.ndarray
        Per shard, ``(n_s, dim)`` vectors (float32, or float16: computed in float32) and
        ``(n_s,)`` int64 docnos sorted ascending.
    metric : {"ip", "l2"}
        Inner product (higher is better) or squared L2 distance (lower is better), as FAISS.
    k_factor : int
        Documents re-scored per document wanted (`refine_shortlist`).
    """

    def __init__(self, embs: list[np.ndarray], ids: list[np.ndarray], metric: str = "ip",
                 k_factor: int = REFINE_K_FACTOR):
        if len(embs) != len(ids):
            raise ValueError(f"{len(embs)} vector arrays but {len(ids)} id arrays")
        _metric(metric)
        self.embs, self.ids, self.metric, self.k_factor = embs, ids, metric, int(k_factor)
        self.keep_max = metric == "ip"

    @classmethod
    def open(cls, dense_dir: str, n_shards: int, metric: str = "ip", k_factor: int = REFINE_K_FACTOR,
             shards: list[dict] | None = None) -> "ExactScorer":
        """Memory-map every shard's ``emb-NNNN.npy`` and ``ids-NNNN.npy`` (``shards``: the
        manifest's entries, naming the files; default the standard names)."""
        embs, ids = [], []
        for s in range(n_shards):
            emb_path, ids_path, _ = _shard_files(dense_dir, s)
            if shards is not None:
                emb_path = os.path.join(dense_dir, shards[s].get("embeddings", os.path.basename(emb_path)))
                ids_path = os.path.join(dense_dir, shards[s].get("ids", os.path.basename(ids_path)))
            embs.append(_random_access(np.load(emb_path, mmap_mode="r")))
            ids.append(np.load(ids_path, mmap_mode="r"))
        return cls(embs, ids, metric, k_factor)

    def shortlist(self, k: int) -> int:
        """Documents to take from the PQ search and re-score for a top ``k``."""
        return refine_shortlist(k, self.k_factor)

    def doc_scores(self, query: np.ndarray, docnos: np.ndarray) -> np.ndarray:
        """Exact scores of ``docnos`` for one query vector (``-inf``, or ``inf`` for l2, for a
        docno with no vector)."""
        query = np.asarray(query, dtype=np.float32).reshape(-1)
        docnos = np.asarray(docnos, dtype=np.int64)
        out = np.full(len(docnos), -np.inf if self.keep_max else np.inf, dtype=np.float32)
        shard = docnos >> 32
        for s in np.unique(shard).tolist():
            if not 0 <= s < len(self.ids):
                continue
            sel = np.flatnonzero(shard == s)
            ids = self.ids[s]
            lo = np.searchsorted(ids, docnos[sel], "left")
            n = np.searchsorted(ids, docnos[sel], "right") - lo
            has = n > 0
            if not has.any():
                continue
            sel, lo, n = sel[has], lo[has], n[has]
            starts = np.cumsum(n) - n
            rows = np.arange(int(n.sum())) - np.repeat(starts - lo, n)  # each document's rows, in turn
            vecs = np.asarray(self.embs[s][rows], dtype=np.float32)
            if self.keep_max:
                out[sel] = np.maximum.reduceat(vecs @ query, starts)
            else:
                out[sel] = np.minimum.reduceat(((vecs - query) ** 2).sum(axis=1), starts)
        return out

    def rerank(self, queries: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` of each query's candidate documents by exact score.

        Parameters
        ----------
        queries : np.ndarray
            ``(nq, dim)``.
        candidates : np.ndarray
            ``(nq, m)`` distinct docnos per row, -1 for padding.

        Returns
        -------
        scores, ids : np.ndarray
            ``(nq, k)``, best first (ties keep the candidates' order); -1 ids where a row had
            fewer than ``k`` candidates.
        """
        nq = len(queries)
        out_s = np.full((nq, k), -np.inf if self.keep_max else np.inf, dtype=np.float32)
        out_i = np.full((nq, k), -1, dtype=np.int64)
        for q in range(nq):
            row = candidates[q][candidates[q] >= 0]
            if not len(row):
                continue
            exact = self.doc_scores(queries[q], row)
            order = np.argsort(-exact if self.keep_max else exact, kind="stable")[:k]
            out_i[q, :len(order)] = row[order]
            out_s[q, :len(order)] = exact[order]
        return out_s, out_i


def _random_access(arr: np.ndarray) -> np.ndarray:
    """``madvise(MADV_RANDOM)`` on a memory-mapped array: a re-scored document's rows are a few
    KB anywhere in the file, and the kernel's default readahead (up to 128 KB a fault) would
    read ~30-80x that from a cold disk and fill the page cache with vectors no query asked for."""
    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mm.madvise(mmap.MADV_RANDOM)
    return arr


def first_distinct(row: np.ndarray, n: int) -> np.ndarray:
    """Positions of the first ``n`` distinct ids of a ranking (-1 padding ignored), in rank
    order: with passages, where each document appears first, at its best passage."""
    valid = int((row >= 0).sum()) if len(row) and row[-1] < 0 else len(row)
    return np.sort(np.unique(row[:valid], return_index=True)[1])[:n]


# --- the dense/ directory ---------------------------------------------------------------


def _shard_files(dense_dir: str, shard: int) -> tuple[str, str, str]:
    return (os.path.join(dense_dir, f"emb-{shard:04d}.npy"), os.path.join(dense_dir, f"ids-{shard:04d}.npy"),
            os.path.join(dense_dir, f"ivf-{shard:04d}.faiss"))


def write_dense_shard(out_dir: str, shard: int, vectors: np.ndarray, docnos: np.ndarray) -> dict:
    """Write ``emb-NNNN.npy`` (float32) and ``ids-NNNN.npy`` (int64) for one shard.

    Returns ``{"shard", "count", "dim"}``. Rejects NaN/inf vectors (a broken model or
    endpoint must not poison the index).
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    docnos = np.asarray(docnos, dtype=np.int64)
    if vectors.ndim != 2 or len(vectors) != len(docnos):
        raise ValueError(f"shard {shard}: vectors {vectors.shape} and docnos {docnos.shape} do not match")
    if not np.isfinite(vectors).all():
        bad = int((~np.isfinite(vectors).all(axis=1)).sum())
        raise ValueError(f"shard {shard}: {bad} embeddings contain NaN or inf; check the embedding model/endpoint")
    os.makedirs(out_dir, exist_ok=True)
    emb, ids, _ = _shard_files(out_dir, shard)
    save_npy_atomic(emb, vectors)
    save_npy_atomic(ids, docnos)
    return {"shard": shard, "count": int(len(docnos)), "dim": int(vectors.shape[1])}


class VectorSpool:
    """Collects ``(shard, local_id, vector)`` batches in any order and writes each shard's
    ``emb-NNNN.npy`` + ``ids-NNNN.npy`` in local-id order, holding one batch at a time.

    Why not a group-by (Ray Data ``groupby("shard").map_groups``, which the build used): its
    shuffle keeps every vector of the corpus in memory at once, in long-lived aggregator
    processes, ~1.5 KB a document at dim 384 (15 GB at 10M documents). Here each batch is
    appended to the shard's two raw spill files under ``spill_dir`` as it arrives; ``finish``
    then reads back one shard at a time (its vectors, sorted by local id, are what the FAISS
    shard needs anyway), so memory follows the shard, not the corpus.
    """

    def __init__(self, out_dir: str, spill_dir: str, dim: int | None = None, n_shards: int | None = None,
                 passages_dir: str | None = None):
        """``dim``: the vectors' dimension (``None``: the first batch's). ``n_shards``: the
        index's shard count; ``finish`` then writes empty files for the shards that got no
        vector (a build). ``None``: only the shards seen (a reindex delta). ``passages_dir``:
        the vectors are passages (``add`` gets their ordinals and spans), written with
        `write_passage_shard`."""
        self.out_dir, self.spill_dir = out_dir, spill_dir
        self.dim = None if dim is None else int(dim)
        self.n_shards = None if n_shards is None else int(n_shards)
        self.passages_dir = passages_dir
        self.count = 0
        self.seen: set[int] = set()
        os.makedirs(spill_dir, exist_ok=True)

    def _spill(self, shard: int) -> tuple[str, str]:
        return (os.path.join(self.spill_dir, f"vec-{shard:04d}.f32"),
                os.path.join(self.spill_dir, f"loc-{shard:04d}.i64"))

    def add(self, shards: np.ndarray, local_ids: np.ndarray, vectors: np.ndarray,
            passages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        """One batch: ``vectors`` is (n, dim), or n rows of dim (Ray's numpy batches of a
        variable-shape column come as an object array of rows). ``passages``: the rows'
        (ordinal, char_start, char_end), with ``passages_dir``."""
        shards = np.asarray(shards, dtype=np.int64)
        local_ids = np.asarray(local_ids, dtype=np.int64)
        vectors = np.asarray(vectors)
        vectors = (np.stack(vectors) if vectors.dtype == object and len(vectors) else vectors).astype(np.float32,
                                                                                                    copy=False)
        if self.dim is None and vectors.ndim == 2:
            self.dim = int(vectors.shape[1])
        if vectors.ndim != 2 or vectors.shape[1] != self.dim or not len(shards) == len(local_ids) == len(vectors):
            raise ValueError(f"vector batch of shape {vectors.shape} with {len(shards)} shard and "
                             f"{len(local_ids)} local ids; expected (n, {self.dim}) and n of each")
        top = (self.n_shards or 10**6) - 1
        if len(shards) and (shards.min() < 0 or shards.max() > top):
            raise ValueError(f"shard ids must be in 0..{top}, got {shards.min()}..{shards.max()}")
        if (passages is None) != (self.passages_dir is None):
            raise ValueError("VectorSpool: pass passages=(ordinal, char_start, char_end) exactly when the "
                             "spool was made with passages_dir")
        for s in np.unique(shards).tolist():
            self.seen.add(s)
            sel = shards == s
            vec_path, loc_path = self._spill(s)
            with open(vec_path, "ab") as f:
                f.write(np.ascontiguousarray(vectors[sel]).tobytes())
            with open(loc_path, "ab") as f:
                if passages is None:
                    f.write(np.ascontiguousarray(local_ids[sel]).tobytes())
                else:  # local id, ordinal, char_start, char_end: 4 int64 per row
                    cols = [local_ids[sel]] + [np.asarray(c, dtype=np.int64)[sel] for c in passages]
                    f.write(np.ascontiguousarray(np.stack(cols, axis=1)).tobytes())
        self.count += len(shards)

    def finish(self) -> list[dict]:
        """Writes each shard's files (see ``n_shards``), removes the spill files; returns
        `write_dense_shard`'s info per shard. A local id seen twice is an error (a
        batch delivered twice must not give a document two vectors)."""
        infos = []
        for s in sorted(self.seen | set(range(self.n_shards or 0))):
            vec_path, loc_path = self._spill(s)
            if self.dim is None:
                raise ValueError("VectorSpool.finish: no vector was added and no dim was given")
            if os.path.exists(loc_path):
                local = np.fromfile(loc_path, dtype=np.int64)
                vecs = np.fromfile(vec_path, dtype=np.float32).reshape(-1, self.dim)
            else:
                local, vecs = np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
            if self.passages_dir is not None:
                rows = local.reshape(-1, 4)
                if len(rows) != len(vecs):
                    raise ValueError(f"shard {s}: passage spill holds {len(rows)} rows for {len(vecs)} vectors")
                infos.append(write_passage_shard(self.out_dir, self.passages_dir, s, vecs, *rows.T))
                del vecs
                for path in (vec_path, loc_path):
                    if os.path.exists(path):
                        os.remove(path)
                continue
            order = np.argsort(local, kind="stable")
            local = local[order]
            if len(local) > 1 and (local[1:] == local[:-1]).any():
                raise ValueError(f"shard {s}: a document's vector arrived twice; rebuild")
            infos.append(write_dense_shard(self.out_dir, s, vecs[order], (np.int64(s) << 32) | local))
            del vecs
            for path in (vec_path, loc_path):
                if os.path.exists(path):
                    os.remove(path)
        return infos


def write_passage_shard(dense_dir: str, passages_dir: str, shard: int, vectors: np.ndarray, local_ids,
                        ordinals, starts, ends) -> dict:
    """One shard of a passage index: ``emb-NNNN.npy`` (one vector per passage) and
    ``ids-NNNN.npy`` (each passage's docno ``shard << 32 | local_id``: FAISS ids stay
    document numbers, so a document filter applies to passages unchanged, and a search's
    ids are documents) in (local id, ordinal) order, and ``passages_dir/shard-NNNN.parquet``
    with each row's (local_id, ordinal, char_start, char_end) in the same order.

    Raises ``ValueError`` when a document's passages are not exactly ordinals 0, 1, ...
    (a batch delivered twice or lost)."""
    from .passages import check_passages, write_passages
    local = np.asarray(local_ids, dtype=np.int64)
    ordinals = np.asarray(ordinals, dtype=np.int64)
    order = np.lexsort((ordinals, local))
    local, ordinals = local[order], ordinals[order]
    check_passages(local, ordinals)
    info = write_dense_shard(dense_dir, shard, np.asarray(vectors)[order], (np.int64(shard) << 32) | local)
    write_passages(os.path.join(passages_dir, f"shard-{shard:04d}.parquet"), local, ordinals,
                   np.asarray(starts, dtype=np.int64)[order], np.asarray(ends, dtype=np.int64)[order])
    info["documents"] = int(len(np.unique(local)))
    return info


def _draw_sample(embs: list[np.ndarray], size: int, seed: int) -> np.ndarray:
    """Uniform sample of rows across memory-mapped shard arrays (only those rows are read)."""
    counts = np.array([len(e) for e in embs], dtype=np.int64)
    total = int(counts.sum())
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(total, size=min(size, total), replace=False))
    starts = np.concatenate([[0], np.cumsum(counts)])
    parts = []
    for s, e in enumerate(embs):
        sel = rows[(rows >= starts[s]) & (rows < starts[s + 1])] - starts[s]
        if len(sel):
            parts.append(np.asarray(e[sel], dtype=np.float32))
    return np.vstack(parts)


def _recall_at_k(dense_dir: str, n_shards: int, queries: np.ndarray, k: int, nprobe: int,
                 k_factor: int | None = None) -> float:
    """recall@k of the written shard indexes against exact search over the embeddings, over
    documents: the first ``k`` distinct ids of each ranking (with passages several vectors
    share a document's id; searched ``k`` times the most passages of a document deep).
    ``k_factor``: the indexes are re-scored (IVF-PQ), as serving does: the first
    `refine_shortlist` distinct documents, re-scored by `ExactScorer`."""
    per_doc = 1
    for s in range(n_shards):
        ids = np.load(_shard_files(dense_dir, s)[1])
        if len(ids):
            per_doc = max(per_doc, int(np.unique(ids, return_counts=True)[1].max()))
    total = sum(len(np.load(_shard_files(dense_dir, s)[1], mmap_mode="r")) for s in range(n_shards))
    depth = max(1, min(k * per_doc, total))
    exact = faiss.ResultHeap(len(queries), depth, keep_max=True)
    approx = []
    for s in range(n_shards):
        emb_path, ids_path, ivf_path = _shard_files(dense_dir, s)
        emb = np.load(emb_path, mmap_mode="r")
        if len(emb):
            ids = np.load(ids_path)
            d, i = faiss.knn(queries, np.ascontiguousarray(emb), min(depth, len(emb)),
                             metric=faiss.METRIC_INNER_PRODUCT)
            i = _pad(i, depth, -1)
            exact.add_result(_pad(d, depth, -np.inf), np.where(i >= 0, ids[np.maximum(i, 0)], -1))
        approx.append(read_index(ivf_path))
    exact.finalize()
    if k_factor:
        scorer = ExactScorer.open(dense_dir, n_shards, k_factor=k_factor)
        want = scorer.shortlist(k)
        _, got = search_shards(approx, queries, max(1, min(want * per_doc, total)), nprobe=nprobe)
        cand = np.full((len(got), want), -1, dtype=np.int64)
        for r, row in enumerate(got):
            pos = first_distinct(row, want)
            cand[r, :len(pos)] = row[pos]
        _, got = scorer.rerank(queries, cand, k)
    else:
        _, got = search_shards(approx, queries, depth, nprobe=nprobe)

    def first(row: np.ndarray) -> set:
        row = row[row >= 0]
        return set(row[np.sort(np.unique(row, return_index=True)[1])[:k]].tolist())

    pairs = [(first(a), first(b)) for a, b in zip(exact.I, got)]
    return sum(len(e & g) for e, g in pairs) / max(1, sum(len(e) for e, _ in pairs))


def _pad(x: np.ndarray, k: int, fill) -> np.ndarray:
    if x.shape[1] == k:
        return x
    return np.hstack([x, np.full((len(x), k - x.shape[1]), fill, dtype=x.dtype)])


def build_dense_index(dense_dir: str, n_shards: int, factory: str | None = None, nlist: int | None = None,
                      sample_size: int | None = None, seed: int = 0, metric: str = "ip",
                      recall_queries: int = 100, fingerprint: dict | None = None,
                      memory_budget: int | str | None = None) -> dict:
    """Train one quantizer across shards, write ``quantizer.faiss`` and ``ivf-NNNN.faiss``.

    Reads the ``emb-/ids-NNNN.npy`` files written by `write_dense_shard`
    memory-mapped: only the training sample and one shard at a time are in memory.

    Parameters
    ----------
    dense_dir : str
    n_shards : int
    factory : str, optional
        ``faiss.index_factory`` string (``{nlist}`` filled in); default
        ``"IVF{nlist},Flat"``, or ``"Flat"`` when nlist is 0; above ``memory_budget``,
        ``"IVF{nlist},PQ{m}x{nbits}"`` (`choose_pq`; nlist at least 1). A factory
        whose codes are approximate (PQ, SQ) is re-scored at serving (``refine``).
    nlist : int, optional
        Default `choose_nlist` of the corpus size (0: exact Flat).
    sample_size : int, optional
        Training sample; default ``64 * nlist`` (at least 39 * nlist), capped at the
        corpus size.
    seed : int
        Sampling and k-means seed.
    metric : {"ip", "l2"}
    recall_queries : int
        Sampled document vectors used to measure recall@10 against exact search at the
        default nprobe (IVF only; 0 skips).
    fingerprint : dict, optional
        The embedding model fingerprint, stored as ``fingerprint`` in the result.
    memory_budget : int or str, optional
        Bytes (or a size, `parse_memory_budget`) the index's lists may take in RAM at
        serving; default `DEFAULT_MEMORY_BUDGET`. Where IVF-Flat's
        (`flat_list_bytes`) would exceed it, the default factory is IVF-PQ with exact
        re-scoring (the comment above `DEFAULT_MEMORY_BUDGET` says why).

    Returns
    -------
    dict
        For the manifest: factory, nlist, nprobe, metric, dim, ntotal, counts,
        quantizer and per-shard files, sample_size, seed, recall_at_10, faiss_version,
        memory_budget, list_bytes (the chosen lists' estimated bytes) and refine (None, or
        how serving re-scores: ``k_factor``, the vectors read).
    """
    budget = parse_memory_budget(memory_budget)
    embs = []
    for s in range(n_shards):
        emb_path, ids_path, _ = _shard_files(dense_dir, s)
        if not (os.path.exists(emb_path) and os.path.exists(ids_path)):
            raise FileNotFoundError(f"{emb_path} or {ids_path} is missing: call write_dense_shard for shard {s}")
        embs.append(np.load(emb_path, mmap_mode="r"))
    dims = {e.shape[1] for e in embs if e.ndim == 2}
    if len(dims) != 1:
        raise ValueError(f"shard embeddings disagree on dim: {sorted(dims)}")
    dim = dims.pop()
    counts = [int(len(e)) for e in embs]
    ntotal = sum(counts)
    pq = choose_pq(ntotal, dim) if factory is None and flat_list_bytes(ntotal, dim) > budget else None
    if pq is None and factory is None and flat_list_bytes(ntotal, dim) > budget:
        log.warning("dense index: %d vectors are too few to train PQ codes; exact Flat although its %s exceed "
                    "the memory budget of %s", ntotal, format_bytes(flat_list_bytes(ntotal, dim)), format_bytes(budget))
    if nlist is None:
        nlist = max(1, choose_nlist(ntotal)) if pq else choose_nlist(ntotal)
    if factory is None:
        factory = f"IVF{{nlist}},PQ{pq[0]}x{pq[1]}" if pq else ("IVF{nlist},Flat" if nlist else "Flat")
        if pq:
            log.info("dense index: IVF-Flat lists would take %s, over the memory budget of %s: IVF-PQ (%d-byte "
                     "codes) with exact re-scoring from the vectors on disk",
                     format_bytes(flat_list_bytes(ntotal, dim)), format_bytes(budget), pq[0] * pq[1] // 8)
    if sample_size is None:
        sample_size = 64 * nlist if "{nlist}" in factory else (0 if factory.lower() == "flat" else 65_536)
        if pq:  # the PQ codebooks: 64 points per centroid of a sub-quantizer
            sample_size = max(sample_size, 64 << pq[1])
    sample_size = min(ntotal, max(sample_size, MIN_POINTS_PER_CENTROID * nlist if "{nlist}" in factory else 0))
    sample = _draw_sample(embs, sample_size, seed) if sample_size else np.zeros((0, dim), np.float32)
    trained = train_quantizer(sample, factory=factory, metric=metric, nlist=nlist, seed=seed)
    write_index(trained, os.path.join(dense_dir, "quantizer.faiss"))
    ivf = faiss.try_extract_index_ivf(trained)
    nprobe = int(ivf.nprobe) if ivf is not None else 0
    nlist = int(ivf.nlist) if ivf is not None else 0
    resolved = "Flat" if isinstance(trained, faiss.IndexFlat) else factory.format(nlist=nlist)
    refine = needs_refine(trained)
    # Bytes of the lists serving holds: per vector its code (the float vector for Flat) and id.
    code_size = int(ivf.code_size) if ivf is not None else 4 * dim
    shards = []
    for s in range(n_shards):
        emb_path, ids_path, ivf_path = _shard_files(dense_dir, s)
        index = build_shard_index(trained, np.asarray(embs[s]), np.load(ids_path))
        write_index(index, ivf_path)
        shards.append({"shard": s, "count": counts[s], "index": os.path.basename(ivf_path),
                       "embeddings": os.path.basename(emb_path), "ids": os.path.basename(ids_path)})
        log.info("dense shard %d: %d vectors -> %s", s, counts[s], ivf_path)
    recall = None
    if ivf is not None and recall_queries and metric == "ip" and ntotal:
        queries = _draw_sample(embs, min(recall_queries, ntotal), seed + 1)
        recall = round(_recall_at_k(dense_dir, n_shards, queries, 10, nprobe,
                                    k_factor=REFINE_K_FACTOR if refine else None), 4)
        log.info("dense index: recall@10 vs exact = %.4f at nprobe %d", recall, nprobe)
    return {"factory": resolved, "nlist": int(nlist), "nprobe": nprobe, "metric": metric, "dim": int(dim),
            "ntotal": int(ntotal), "counts": counts, "quantizer": "quantizer.faiss", "shards": shards,
            "sample_size": int(len(sample)), "seed": seed, "recall_at_10": recall,
            "recall_nprobe": nprobe if recall is not None else None, "faiss_version": faiss.__version__,
            "fingerprint": dict(fingerprint) if fingerprint else None,
            "memory_budget": int(budget), "list_bytes": int(ntotal * (code_size + 8)),
            "refine": {"scores": "exact", "k_factor": REFINE_K_FACTOR,
                       "vectors": "emb-NNNN.npy (float32, memory-mapped), rows of a document by ids-NNNN.npy"}
            if refine else None}
