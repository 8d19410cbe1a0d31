"""``bench/bench_dense.py --gpu``: the dense build's GPU work, measured in one run.

1. Embedding throughput on the same documents and the same length-bucketed batches:
   - the forward pass alone (token ids already on the GPU; fp16 model, pooling and
     normalisation on the GPU), at several model batch sizes;
   - the GPU actor's work (``SentenceTransformerProvider.embed_tokens``: ids from the host,
     vectors back to the host);
   - funnel's embedding stage as the Ray job runs it (``jobs.embed_stage.embed_dataset``:
     a CPU ``TokenizeBatch`` stage feeding one ``num_gpus=1`` ``EmbedBatch`` actor), and
     the same two callables in one process, one after the other (no Ray);
   - raw ``SentenceTransformer.encode`` (per Ray batch, as ``EmbedBatch`` called it before
     the tokenize stage existed, and over all documents in one call).
   The model has MiniLM-L6's shape with random weights (throughput does not depend on the
   weight values): ``config.json`` and the tokenizer files of all-MiniLM-L6-v2 are enough.
2. IVF at ``--faiss-n`` vectors (synthetic clustered, as ``bench_dense.py``): funnel's
   faiss build (``train_quantizer`` + ``build_shard_index``) with whatever faiss is installed,
   against the same k-means and cell assignment in PyTorch on the GPU, exact search on the GPU,
   and recall@10 of each index against exact search.
3. Optionally ``run_dense_stage`` (the build's whole dense stage: Ray embedding, vector
   shards, FAISS) on the same documents, with the GPU's utilisation sampled during it.

Falls back to the CPU (tiny sizes make sense there) when CUDA is absent, so the script is
tested before it runs on a GPU. Results go to ``--json``; ``--from-json FILE --write``
records a saved run's section in bench/RESULTS.md.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import platform
import shutil
import tempfile
import threading
import time

import numpy as np

NAME, TITLE = "dense-gpu", "Dense build on a GPU: embedding stage and IVF (bench/bench_dense.py --gpu)"


# --- inputs ---------------------------------------------------------------------------------


def load_corpus(path: str, n: int) -> dict[str, np.ndarray]:
    """``n`` documents (title, text): the corpus's rows repeated as often as needed."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    reps = -(-n // len(rows))
    rows = (rows * reps)[:n]
    return {"title": np.array([r.get("title", "") for r in rows], dtype=object),
            "text": np.array([r.get("text", "") for r in rows], dtype=object),
            "shard": np.arange(n, dtype=np.int32) % 4, "local_id": np.arange(n, dtype=np.int64),
            "content_hash": np.array([f"{i:016x}" for i in range(n)], dtype=object)}


def random_model(shape_dir: str, out_dir: str, seed: int = 0) -> str:
    """A sentence-transformers folder with ``shape_dir``'s config and tokenizer and random weights."""
    import torch
    from transformers import AutoConfig, AutoModel
    torch.manual_seed(seed)
    shutil.copytree(shape_dir, out_dir, dirs_exist_ok=True)
    AutoModel.from_config(AutoConfig.from_pretrained(shape_dir)).save_pretrained(out_dir)
    return out_dir


class GpuSampler:
    """The GPU's utilisation (NVML, every ``interval`` s) while the ``with`` block runs."""

    def __init__(self, interval: float = 0.1):
        self.interval, self.samples, self._stop = interval, [], threading.Event()

    def __enter__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()
        except Exception:  # no NVML (CPU run): no samples
            self._nvml = None
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu)

    def __exit__(self, *exc):
        self._stop.set()
        if self._nvml is not None:
            self._t.join()

    def summary(self) -> dict:
        s = np.array(self.samples or [np.nan], dtype=float)
        return {"gpu_util_mean": float(np.nanmean(s)) if self.samples else None,
                "gpu_util_p50": float(np.nanmedian(s)) if self.samples else None, "gpu_util_samples": len(self.samples)}


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- 1. embedding ---------------------------------------------------------------------------


def groups(n: int, size: int) -> list[slice]:
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def bench_forward(provider, ids: np.ndarray, lengths: np.ndarray, ray_batch: int, model_batch: int,
                  repeats: int = 2) -> dict:
    """The model alone on the stage's batches: ids staged on the device before the clock starts."""
    import torch
    from funnel.pipelines.dense.embed import length_buckets
    dev = provider.model.device
    batches = []
    for g in groups(len(lengths), ray_batch):
        gl = lengths[g]
        for rows in length_buckets(gl, model_batch):
            width = int(gl[rows].max())
            x = torch.from_numpy(ids[g][rows, :width].astype(np.int64)).to(dev)
            mask = (torch.arange(width, device=dev) < torch.from_numpy(gl[rows]).to(dev)[:, None]).long()
            batches.append((x, mask))
    tokens = int(sum(int(m.sum()) for _, m in batches))
    padded = int(sum(m.numel() for _, m in batches))

    def once():
        with torch.inference_mode():
            for x, mask in batches:
                emb = provider.model({"input_ids": x, "attention_mask": mask})["sentence_embedding"].float()
                torch.nn.functional.normalize(emb, dim=1)
        sync()

    once()  # warm-up: kernels chosen, allocator primed
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    best = min(times)
    return {"model_batch": model_batch, "ray_batch": ray_batch, "docs_s": len(lengths) / best,
            "tokens_s": tokens / best, "padding_share": 1 - tokens / padded, "times_s": times}


def tokenizer_threads(tok_spec: dict, texts: list[str]) -> dict:
    """docs/s of one ``DocumentTokenizer`` call against 8 Python threads calling it on slices:
    whether the Rust tokenizer's own threads use the cores (it releases the GIL either way)."""
    from concurrent.futures import ThreadPoolExecutor

    from funnel.pipelines.dense.embed import DocumentTokenizer
    tok = DocumentTokenizer(**tok_spec)
    tok(texts[:64])
    t = time.perf_counter()
    tok(texts)
    one = len(texts) / (time.perf_counter() - t)
    t = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(tok, [texts[i::8] for i in range(8)]))
    return {"one_call_docs_s": one, "eight_threads_docs_s": len(texts) / (time.perf_counter() - t),
            "cpu_affinity": len(os.sched_getaffinity(0)), "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
            "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS")}


def bench_embed_tokens(provider, ids, lengths, ray_batch) -> dict:
    provider.embed_tokens(ids[:ray_batch], lengths[:ray_batch])  # warm-up
    sync()
    t = time.perf_counter()
    for g in groups(len(lengths), ray_batch):
        provider.embed_tokens(ids[g], lengths[g])
    return {"docs_s": len(lengths) / (time.perf_counter() - t)}


def bench_inprocess_stage(docs, spec, tok_spec, ray_batch) -> dict:
    """TokenizeBatch then EmbedBatch on each Ray-sized batch, one after the other, no Ray."""
    from funnel.pipelines.dense.embed import EmbedBatch, TokenizeBatch
    tok, emb = TokenizeBatch(tok_spec), EmbedBatch(spec)
    n = len(docs["text"])
    emb(tok({k: v[:ray_batch] for k, v in docs.items()}))  # warm-up
    t_tok = t_emb = 0.0
    out = []
    for g in groups(n, ray_batch):
        t = time.perf_counter()
        b = tok({k: v[g] for k, v in docs.items()})
        t_tok += time.perf_counter() - t
        t = time.perf_counter()
        out.append(emb(b)["embedding"])
        t_emb += time.perf_counter() - t
    return {"docs_s": n / (t_tok + t_emb), "tokenize_docs_s": n / t_tok, "embed_docs_s": n / t_emb,
            "vectors": np.vstack(out)}


def bench_encode(model, texts: list[str], ray_batch: int, model_batch: int) -> dict:
    model.encode(texts[:model_batch], batch_size=model_batch)  # warm-up
    t = time.perf_counter()
    per = [model.encode(texts[g], batch_size=model_batch, normalize_embeddings=True, convert_to_numpy=True)
           for g in groups(len(texts), ray_batch)]
    per_s = len(texts) / (time.perf_counter() - t)
    t = time.perf_counter()
    model.encode(texts, batch_size=model_batch, normalize_embeddings=True, convert_to_numpy=True)
    whole_s = len(texts) / (time.perf_counter() - t)
    return {"per_batch_docs_s": per_s, "whole_docs_s": whole_s, "vectors": np.vstack(per)}


def bench_ray_stage(docs, spec, tok_spec, ray_batch, tokenize_actors, gpu: bool, tokens=None,
                    gpu_actors: int = 1) -> dict:
    """``embed_dataset`` (the build's wiring) over an in-memory dataset; rows counted at the driver.

    ``tokens`` (ids, lengths): the dataset holds token ids already and only the embedding
    actor runs (the Ray stage's ceiling with tokenisation taken out). ``gpu_actors``: embedding
    actors sharing the one GPU (``embed_stage.gpu_actors``)."""
    import pyarrow as pa
    import ray

    from funnel.jobs.embed_stage import embed_dataset
    n = len(docs["text"])
    if tokens is not None:
        from ray.data.extensions import ArrowTensorArray
        ds = ray.data.from_arrow(pa.table({"input_ids": ArrowTensorArray.from_numpy(tokens[0]),
                                           "n_tokens": tokens[1], "local_id": docs["local_id"]}))
        tok_spec, tokenize_actors = None, 0
    else:
        ds = ray.data.from_arrow(pa.table({k: (v.tolist() if v.dtype == object else v) for k, v in docs.items()}))
    ds = ds.repartition(max(4, n // ray_batch))
    from funnel.jobs.embed_stage import gpu_actors as actors_for
    n_actors, res = actors_for(1, gpu_actors) if gpu else (gpu_actors, {"num_cpus": 0.5})
    ds = embed_dataset(ds, spec, batch_size=ray_batch, n_actors=n_actors, actor_resources=res, tokenizer=tok_spec,
                       tokenize_actors=tokenize_actors).select_columns(["local_id", "embedding"])
    arrivals, got = [], 0
    t0 = time.perf_counter()
    with GpuSampler() as gs:
        for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
            got += len(b["local_id"])
            arrivals.append((time.perf_counter() - t0, got))
    total = time.perf_counter() - t0
    assert got == n, (got, n)
    # Steady state: from the batch that brought the count past 10% to the last one (actor
    # start and model load excluded).
    first = next(a for a in arrivals if a[1] >= 0.1 * n)
    steady = (n - first[1]) / (total - first[0]) if first[1] < n and total > first[0] else None
    return {"docs_s_incl_start": n / total, "docs_s_steady": steady, "wall_s": total,
            "tokenize_actors": tokenize_actors, "gpu_actors": gpu_actors, **gs.summary()}


def bench_embedding(a, model_dir: str, dev: str) -> dict:
    import torch

    from funnel.pipelines.dense.embed import DocumentTokenizer, SentenceTransformerProvider
    r: dict = {}
    docs = load_corpus(a.corpus, a.docs)
    texts = [f"{t}\n{x}" for t, x in zip(docs["title"], docs["text"])]
    provider = SentenceTransformerProvider(model_dir, device=dev, batch_size=a.model_batch)
    tok_spec = provider.tokenizer_spec()
    spec = {"kind": "sentence-transformers", "model": model_dir, "device": dev, "batch_size": a.model_batch}
    t = time.perf_counter()
    ids, lengths = DocumentTokenizer(**tok_spec)(texts)
    r["tokenize_one_call_docs_s"] = len(texts) / (time.perf_counter() - t)
    r["tokenize_threads"] = tokenizer_threads(tok_spec, texts[:20_000])
    r.update(docs=len(texts), mean_tokens=float(lengths.mean()), max_length=tok_spec["max_length"],
             fp16=provider.fp16, ray_batch=a.ray_batch, model_batch=a.model_batch)
    m = min(len(texts), a.sweep_docs)  # the sweep on a slice: its ratios, not its totals, matter
    r["forward"] = [bench_forward(provider, ids[:m], lengths[:m], max(a.ray_batch, b), b) for b in a.forward_batches]
    r["forward_main"] = bench_forward(provider, ids, lengths, a.ray_batch, a.model_batch)
    r["embed_tokens"] = bench_embed_tokens(provider, ids, lengths, a.ray_batch)
    ne = min(a.encode_docs, len(texts))
    enc = bench_encode(provider.model, texts[:ne], a.ray_batch, a.model_batch)
    r["encode"] = {k: v for k, v in enc.items() if k != "vectors"} | {"docs": ne}
    inproc = bench_inprocess_stage({k: v[:ne] for k, v in docs.items()}, spec, tok_spec, a.ray_batch)
    r["inprocess_stage"] = {k: v for k, v in inproc.items() if k != "vectors"} | {"docs": ne}
    diff = np.abs(inproc["vectors"] - enc["vectors"])
    r["stage_vs_encode_max_abs_diff"] = float(diff.max())
    r["stage_vs_encode_min_cos"] = float((inproc["vectors"] * enc["vectors"]).sum(1).min())
    save(a, "embedding", r)
    if a.ray:
        try:
            r["ray_stage"] = []
            if a.ray_pretokenized:
                r["ray_stage"].append(bench_ray_stage(docs, spec, tok_spec, a.ray_batch, 0, dev == "cuda",
                                                      tokens=(ids, lengths)))
                save(a, "embedding", r)
            for g in a.gpu_actors:
                for k in a.tokenize_actors:
                    r["ray_stage"].append(bench_ray_stage(docs, spec, tok_spec, a.ray_batch, k, dev == "cuda",
                                                          gpu_actors=g))
                    save(a, "embedding", r)
        except Exception as e:
            r["ray_error"] = f"{type(e).__name__}: {e}"[:400]
            logging.exception("ray stage failed")
    del provider
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    save(a, "embedding", r)
    return r


def bench_run_dense_stage(docs, model_dir) -> dict:
    """The build's dense stage on these documents: Parquet shards in, vectors and FAISS out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from funnel.jobs.embed_stage import run_dense_stage
    marks = {}

    class Marks(logging.Handler):
        def emit(self, rec):
            msg = rec.getMessage()
            for key in ("embed:", "faiss:"):
                if msg.startswith(key) and key not in marks:
                    marks[key] = time.perf_counter()
    h = Marks()
    logging.getLogger("funnel.build").addHandler(h)
    logging.getLogger("funnel.build").setLevel(logging.INFO)
    staging = tempfile.mkdtemp(prefix="dense-stage-")
    try:
        os.makedirs(os.path.join(staging, "docs"))
        n = len(docs["text"])
        for s in range(4):
            rows = np.flatnonzero(docs["shard"] == s)
            pq.write_table(pa.table({"title": docs["title"][rows].tolist(), "text": docs["text"][rows].tolist(),
                                     "content_hash": docs["content_hash"][rows].tolist(),
                                     "shard": docs["shard"][rows], "local_id": np.arange(len(rows))}),
                           os.path.join(staging, "docs", f"shard-{s:04d}.parquet"))
        t0 = time.perf_counter()
        with GpuSampler() as gs:
            info = run_dense_stage(staging, 4, model_dir, batch_size=64, cache_dir=None, n_docs=n)
        total = time.perf_counter() - t0
        embed_s = marks.get("faiss:", t0 + total) - t0  # up to the FAISS stage's first line
        return {"docs": n, "wall_s": total, "embed_and_spool_s": embed_s, "docs_s_embed": n / embed_s,
                "faiss_s": total - embed_s, "nlist": info.get("nlist"), "recall_at_10": info.get("recall_at_10"),
                "vectors": info.get("ntotal"),
                **gs.summary()}
    finally:
        logging.getLogger("funnel.build").removeHandler(h)
        shutil.rmtree(staging, ignore_errors=True)


# --- 2. IVF ---------------------------------------------------------------------------------


def torch_kmeans(x, k: int, niter: int, spherical: bool, seed: int = 0):
    """Lloyd's k-means with inner-product assignment, as faiss's IVF training does for the IP
    metric (centroids renormalised when ``spherical``); an empty cluster keeps its centroid."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    c = x[torch.randperm(len(x), generator=g)[:k].to(x.device)].clone()
    for _ in range(niter):
        labels = assign(x, c)
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        nonempty = counts > 0
        c[nonempty] = sums[nonempty] / counts[nonempty, None]
        if spherical:
            c = torch.nn.functional.normalize(c, dim=1)
    return c


def assign(x, c, chunk: int = 262_144):
    import torch
    return torch.cat([(x[i:i + chunk] @ c.T).argmax(1) for i in range(0, len(x), chunk)])


def exact_topk(x, q, k: int, chunk: int = 4096):
    import torch
    vals, idx = [], []
    for i in range(0, len(q), chunk):
        v, j = torch.topk(q[i:i + chunk] @ x.T, k, dim=1)
        vals.append(v)
        idx.append(j)
    return torch.cat(vals), torch.cat(idx)


def recall(truth: np.ndarray, got: np.ndarray) -> float:
    return float(np.mean([len(set(t) & set(g)) / len(t) for t, g in zip(truth, got)]))


def bench_ivf(n: int, nq: int, dim: int, dev: str) -> dict:
    import faiss
    import torch

    from funnel.pipelines.dense.vectors import (build_shard_index, choose_nlist, default_nprobe, gpu_available,
                                          train_quantizer)
    sys_path_bench()
    from bench_dense import clustered
    r = {"n": n, "nq": nq, "dim": dim, "faiss": faiss.__version__, "faiss_gpu": gpu_available(),
         "omp_threads": faiss.omp_get_max_threads()}
    t = time.perf_counter()
    data = clustered(n + nq, dim, seed=0)
    r["generate_s"] = time.perf_counter() - t
    x, q = data[:n], data[n:]
    nlist = choose_nlist(n)
    nprobe = default_nprobe(nlist)
    sample = x[np.random.default_rng(0).choice(n, min(n, 64 * nlist), replace=False)]
    r.update(nlist=nlist, nprobe=nprobe, sample=len(sample))
    # Exact search, the truth: on the device in fp32, and fp16 for its speed and recall.
    xg, qg = torch.from_numpy(x).to(dev), torch.from_numpy(q).to(dev)
    exact_topk(xg, qg[:64], 10)
    sync()
    t = time.perf_counter()
    _, truth = exact_topk(xg, qg, 10)
    sync()
    r["gpu_exact_fp32_qps"] = nq / (time.perf_counter() - t)
    truth = truth.cpu().numpy()
    if dev == "cuda":
        xh, qh = xg.half(), qg.half()
        exact_topk(xh, qh[:64], 10)
        sync()
        t = time.perf_counter()
        _, got = exact_topk(xh, qh, 10)
        sync()
        r["gpu_exact_fp16_qps"] = nq / (time.perf_counter() - t)
        r["gpu_exact_fp16_recall"] = recall(truth, got.cpu().numpy())
        del xh, qh
    # Exact search on the CPU (faiss IndexFlatIP), on a slice of the queries.
    flat = faiss.IndexFlatIP(dim)
    flat.add(x)
    m = min(nq, 1000)
    t = time.perf_counter()
    flat.search(q[:m], 10)
    r["cpu_exact_qps"] = m / (time.perf_counter() - t)
    del flat
    # funnel's build with the installed faiss: train on the sample, add every vector.
    t = time.perf_counter()
    trained = train_quantizer(sample, nlist=nlist)
    r["faiss_train_s"] = time.perf_counter() - t
    ivf = faiss.extract_index_ivf(trained)
    niter, spherical = int(ivf.cp.niter), bool(ivf.cp.spherical)
    t = time.perf_counter()
    index = build_shard_index(trained, x, np.arange(n, dtype=np.int64))
    r["faiss_add_s"] = time.perf_counter() - t
    faiss.extract_index_ivf(index).nprobe = nprobe
    t = time.perf_counter()
    _, got = index.search(q, 10)
    r["faiss_search_qps"] = nq / (time.perf_counter() - t)
    r["faiss_recall"] = recall(truth, got)
    del index
    # The same k-means and assignment in PyTorch on the device; the index is then filled from
    # those assignments (add_core), so the search and its recall are faiss's on the CPU.
    sg = torch.from_numpy(sample).to(dev)
    torch_kmeans(sg[: 40 * 64], 64, 2, spherical)  # warm-up
    sync()
    t = time.perf_counter()
    cent = torch_kmeans(sg, nlist, niter, spherical)
    sync()
    r["torch_train_s"] = time.perf_counter() - t
    t = time.perf_counter()
    labels = assign(xg, cent)
    sync()
    r["torch_assign_s"] = time.perf_counter() - t
    labels = labels.cpu().numpy().astype(np.int64)
    r.update(niter=niter, spherical=spherical, torch_device=dev,
             list_size_max=int(np.bincount(labels, minlength=nlist).max()))
    idx2 = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    ivf2 = faiss.extract_index_ivf(idx2)
    ivf2.quantizer.add(np.ascontiguousarray(cent.cpu().numpy()))
    ivf2.is_trained = True
    ids = np.arange(n, dtype=np.int64)
    t = time.perf_counter()
    ivf2.add_core(n, faiss.swig_ptr(x), faiss.swig_ptr(ids), faiss.swig_ptr(labels))
    r["fill_from_assignments_s"] = time.perf_counter() - t
    ivf2.nprobe = nprobe
    _, got = idx2.search(q, 10)
    r["torch_centroids_recall"] = recall(truth, got)
    return r


# --- driver ---------------------------------------------------------------------------------

T0 = time.perf_counter()


def sys_path_bench():
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


def save(a, key: str, value) -> None:
    """Write the results so far (a run cut short by its time limit still leaves them)."""
    RESULT[key] = value
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(RESULT, f, indent=1, default=float)
        os.replace(a.json + ".tmp", a.json)


RESULT: dict = {}


def environment(dev: str) -> dict:
    import torch
    import transformers
    import sentence_transformers
    env = {"date": time.strftime("%Y-%m-%d"), "device": dev, "cpus": os.cpu_count(), "machine": platform.machine(),
           "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "sentence_transformers": sentence_transformers.__version__}
    if dev == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        import ray
        env["ray"] = ray.__version__
    except ImportError:
        env["ray"] = None
    return env


def run(a) -> dict:
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    save(a, "env", environment(dev))
    model_dir = a.model or random_model(a.shape, tempfile.mkdtemp(prefix="minilm-shape-"))
    if a.ray:  # one local Ray for the Ray stage and run_dense_stage
        import ray
        ray.init(num_cpus=max(4, os.cpu_count() or 1), num_gpus=1 if dev == "cuda" else 0, include_dashboard=False,
                 log_to_driver=False, object_store_memory=a.object_store_gb << 30)
        ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        bench_embedding(a, model_dir, dev)
    except Exception as e:
        logging.exception("embedding benchmark failed")
        save(a, "embedding_error", f"{type(e).__name__}: {e}"[:400])
    if a.faiss_n and time.perf_counter() - T0 < a.deadline:
        try:
            save(a, "ivf", bench_ivf(a.faiss_n, a.faiss_queries, 384, dev))
        except Exception as e:
            logging.exception("IVF benchmark failed")
            save(a, "ivf_error", f"{type(e).__name__}: {e}"[:400])
    if a.ray and a.dense_stage and time.perf_counter() - T0 < a.deadline:
        try:
            save(a, "run_dense_stage", bench_run_dense_stage(load_corpus(a.corpus, a.dense_stage_docs), model_dir))
        except Exception as e:
            logging.exception("run_dense_stage failed")
            save(a, "run_dense_stage_error", f"{type(e).__name__}: {e}"[:400])
    if a.ray:
        ray.shutdown()
    save(a, "total_s", time.perf_counter() - T0)
    return RESULT


def render(r: dict, cmd: str) -> str:
    env, e = r["env"], r.get("embedding", {})
    dev = env.get("gpu", "CPU") + (f" ({env['gpu_memory_gib']} GiB)" if "gpu_memory_gib" in env else "")
    lines = [f"`{cmd}` — {env['date']}, {dev}, {env['cpus']} CPU cores; torch {env['torch']}, transformers "
             f"{env['transformers']}, sentence-transformers {env['sentence_transformers']}, Ray {env['ray']}.", ""]
    if e:
        fwd = e["forward_main"]["docs_s"]
        lines += [f"**Embedding** MiniLM-L6 shape, random weights, fp16={e['fp16']}, {e['docs']:,} SciFact "
                  f"documents (title + text, the corpus repeated), mean {e['mean_tokens']:.0f} tokens after "
                  f"truncation at {e['max_length']}; Ray batches of {e['ray_batch']} documents, cut into "
                  f"length buckets of {e['model_batch']} inside each:", "",
                  "| path | docs/s | / forward only |", "|---|---|---|"]

        def row(name, v):
            lines.append(f"| {name} | {v:,.0f} | {v / fwd:.2f} |")
        row("forward pass only (ids already on the GPU; pooling + normalisation on the GPU)", fwd)
        row("GPU actor's work, `embed_tokens` (ids from the host, vectors back)", e["embed_tokens"]["docs_s"])
        for s in e.get("ray_stage", []):
            if s["docs_s_steady"] is None:  # too few batches to tell start-up from steady state
                s["docs_s_steady"] = s["docs_s_incl_start"]
            g = s.get("gpu_actors", 1)
            gw = f"{g} `EmbedBatch` GPU actor" + (f"s sharing the GPU (`num_gpus={1 / g:g}` each)" if g > 1 else "")
            what = (f"`TokenizeBatch` CPU stage ({s['tokenize_actors']} actors) → {gw}"
                    if s["tokenize_actors"] else f"token ids in the dataset → {gw} (no tokenizing)")
            row(f"**Ray stage** `embed_dataset`: {what}, steady state (GPU busy in {s['gpu_util_mean'] or 0:.0f}% "
                f"of samples over the whole run)", s["docs_s_steady"])
            row("same, whole run incl. actor start and model load", s["docs_s_incl_start"])
        ip = e["inprocess_stage"]
        row(f"`TokenizeBatch` then `EmbedBatch`, one process, serial ({ip['docs']:,} docs)", ip["docs_s"])
        enc = e["encode"]
        row(f"`SentenceTransformer.encode` per Ray batch (what `EmbedBatch` ran before; {enc['docs']:,} docs)",
            enc["per_batch_docs_s"])
        row("`SentenceTransformer.encode`, all documents in one call", enc["whole_docs_s"])
        if "ray_error" in e:
            lines.append(f"| Ray stage | failed: {e['ray_error']} | |")
        lines += ["", f"Tokenizer alone (`DocumentTokenizer`, one call, Rust threads): "
                      f"{e['tokenize_one_call_docs_s']:,.0f} docs/s. Stage vectors against `encode`'s: max |Δ| "
                      f"{e['stage_vs_encode_max_abs_diff']:.1e}, min cosine {e['stage_vs_encode_min_cos']:.5f}.", "",
                  "Forward pass only by model batch size: " + ", ".join(
                      f"{f['model_batch']}: {f['docs_s']:,.0f} docs/s ({f['padding_share']:.0%} padding)"
                      for f in e["forward"]) + "."]
        ds = r.get("run_dense_stage")
        if ds:
            lines += ["", f"**`run_dense_stage`** (the build's dense stage: Parquet shards → Ray embedding → vector "
                          f"shards → FAISS IVF{ds['nlist']}) on the same {ds['docs']:,} documents: {ds['wall_s']:.1f} s; "
                          f"embedding and spooling {ds['embed_and_spool_s']:.1f} s = {ds['docs_s_embed']:,.0f} docs/s "
                          f"incl. Ray start-up of its actors; FAISS {ds['faiss_s']:.1f} s, recall@10 "
                          f"{ds['recall_at_10']}; GPU busy in {ds['gpu_util_mean'] or 0:.0f}% of samples "
                          f"(median {ds['gpu_util_p50'] or 0:.0f}%) over the whole stage."]
    if "run_dense_stage_error" in r:
        lines += ["", f"run_dense_stage failed: {r['run_dense_stage_error']}"]
    if "embedding_error" in r:
        lines += ["", f"Embedding benchmark failed: {r['embedding_error']}"]
    v = r.get("ivf")
    if v:
        lines += ["", f"**IVF** synthetic clustered {v['n']:,} × {v['dim']} (as bench_dense.py), IVF{v['nlist']},Flat "
                      f"inner product, {v['sample']:,}-vector training sample, k-means {v['niter']} iterations "
                      f"(spherical={v['spherical']}), nprobe {v['nprobe']}, {v['nq']:,} queries; faiss "
                      f"{v['faiss']} (GPU build: {v['faiss_gpu']}), {v['omp_threads']} OpenMP threads:", "",
                  "| step | faiss (CPU) | PyTorch on the GPU |", "|---|---|---|",
                  f"| k-means training | {v['faiss_train_s']:.2f} s | {v['torch_train_s']:.3f} s |",
                  f"| assign + add {v['n']:,} vectors | {v['faiss_add_s']:.2f} s | {v['torch_assign_s']:.3f} s "
                  f"assign + {v['fill_from_assignments_s']:.2f} s filling the faiss index (CPU) |",
                  f"| recall@10 at nprobe {v['nprobe']} (faiss search, CPU) | {v['faiss_recall']:.4f} "
                  f"| {v['torch_centroids_recall']:.4f} (GPU centroids) |",
                  f"| IVF search q/s (batch, CPU) | {v['faiss_search_qps']:,.0f} | – |",
                  f"| exact search q/s | {v['cpu_exact_qps']:,.0f} (IndexFlatIP) | {v['gpu_exact_fp32_qps']:,.0f} fp32"
                  + (f", {v['gpu_exact_fp16_qps']:,.0f} fp16 (recall@10 {v['gpu_exact_fp16_recall']:.4f})"
                     if "gpu_exact_fp16_qps" in v else "") + " |"]
    if "ivf_error" in r:
        lines += ["", f"IVF benchmark failed: {r['ivf_error']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys
    sys_path_bench()
    from results import add_common_arguments, report
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--gpu", action="store_true", help="this benchmark (bench_dense.py's GPU mode)")
    p.add_argument("--corpus", default=os.path.join("..", "shared", "data", "beir", "scifact", "corpus.jsonl"),
                   help="BEIR corpus.jsonl (or .jsonl.gz) whose documents are repeated up to --docs")
    p.add_argument("--shape", default=None, help="folder with config.json + tokenizer files: a random-weight "
                   "model of that shape is built (default: all-MiniLM-L6-v2's files from its package)")
    p.add_argument("--model", default=None, help="a sentence-transformers folder to use as is, instead of --shape")
    p.add_argument("--docs", type=int, default=100_000, help="documents (default %(default)s)")
    p.add_argument("--encode-docs", type=int, default=20_000,
                   help="documents for SentenceTransformer.encode and the serial in-process stage (default %(default)s)")
    p.add_argument("--ray-batch", type=int, default=1024, help="documents per Ray batch (default %(default)s)")
    p.add_argument("--model-batch", type=int, default=1024, help="documents per forward pass (default %(default)s)")
    p.add_argument("--forward-batches", default="64,256,1024", help="model batch sizes for the forward-only sweep")
    p.add_argument("--sweep-docs", type=int, default=50_000, help="documents for that sweep (default %(default)s)")
    p.add_argument("--no-ray", dest="ray", action="store_false", help="skip the Ray stage")
    p.add_argument("--ray-pretokenized", action="store_true",
                   help="also run the Ray stage on token ids (the embedding actor alone)")
    p.add_argument("--tokenize-actors", default="4", help="TokenizeBatch actor counts to try, comma-separated")
    p.add_argument("--gpu-actors", default="1", help="embedding actor counts on the one GPU to try, comma-separated")
    p.add_argument("--dense-stage", action="store_true", help="also run run_dense_stage on the documents")
    p.add_argument("--dense-stage-docs", type=int, default=100_000, help="its documents (default %(default)s)")
    p.add_argument("--object-store-gb", type=int, default=8, help="Ray object store (default %(default)s GiB)")
    p.add_argument("--faiss-n", type=int, default=1_000_000, help="vectors for the IVF part, 0 to skip")
    p.add_argument("--faiss-queries", type=int, default=10_000, help="queries for the IVF part")
    p.add_argument("--deadline", type=float, default=300, help="skip later parts after this many seconds")
    p.add_argument("--json", default=None, help="write the results here as they come")
    p.add_argument("--from-json", default=None, help="render (and with --write record) a saved run instead")
    add_common_arguments(p)
    a = p.parse_args(argv)
    a.forward_batches = [int(b) for b in a.forward_batches.split(",") if b]
    a.tokenize_actors = [int(k) for k in a.tokenize_actors.split(",") if k]
    a.gpu_actors = [int(k) for k in a.gpu_actors.split(",") if k]
    if a.from_json:
        with open(a.from_json) as f:
            r = json.load(f)
        cmd = r.get("cmd", "python bench/bench_dense.py --gpu")
    else:
        if a.shape is None and a.model is None:
            from funnel.pipelines.dense.embed import resolve_model
            a.shape = resolve_model("all-MiniLM-L6-v2")
        r = run(a)
        r["cmd"] = cmd = "python bench/bench_dense.py " + " ".join(argv if argv is not None else sys.argv[1:])
        save(a, "cmd", cmd)
        print(json.dumps(r, indent=1, default=float))
    report(NAME, TITLE, render(r, cmd), a.write)


if __name__ == "__main__":
    main()
