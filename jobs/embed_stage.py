"""The dense stage of the build job: embed every document on a Ray actor pool, then FAISS.

    docs/shard-*.parquet --read_parquet--> map_batches(EmbedBatch, actor pool)
        --groupby(shard)--> dense/emb-NNNN.npy + ids-NNNN.npy --build_dense_index--> ivf-NNNN.faiss

Actors: one per GPU with ``num_gpus=1`` where Ray sees GPUs (fp16 there); otherwise CPU
actors at ``num_cpus=0.5`` with one torch thread each, so the read tasks always find a CPU
(two actors at ``num_cpus=1`` on a 2-core machine starve the read stage and deadlock).
Document embeddings are cached by (content hash, model fingerprint), so a rebuild, a
reindex or a CI rerun re-embeds only what changed.
"""

from __future__ import annotations

import logging
import os

import numpy as np

log = logging.getLogger("funnel.build")

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def provider_spec(embed_model: str | None, batch_size: int, gpu: bool) -> dict:
    """``openai:MODEL@BASE_URL`` (or ``$FUNNEL_EMBED_BASE_URL``) selects an endpoint; anything
    else names a sentence-transformers model (local path, package or HF cache)."""
    model = embed_model or DEFAULT_MODEL
    if model.startswith("openai:"):
        name, _, base = model[len("openai:"):].partition("@")
        spec = {"kind": "openai", "model": name, "batch_size": batch_size}
        if base:
            spec["base_url"] = base
        return spec
    spec = {"kind": "sentence-transformers", "model": model, "batch_size": batch_size}
    if not gpu:
        spec.update(device="cpu", num_threads=1)
    return spec


def _write_group_fn(dense_dir: str):
    from funnel.pipelines.vectors import write_dense_shard

    def write(batch: dict) -> dict:
        shard = int(batch["shard"][0])
        local = np.asarray(batch["local_id"], dtype=np.int64)
        order = np.argsort(local, kind="stable")
        vecs = np.asarray(batch["embedding"], dtype=np.float32)[order]
        docnos = (np.int64(shard) << 32) | local[order]
        info = write_dense_shard(dense_dir, shard, vecs, docnos)
        return {k: [v] for k, v in info.items()}

    return write


def run_dense_stage(staging: str, shards: int, embed_model: str | None, batch_size: int = 64,
                    cache_dir: str | None = "default", factory: str | None = None,
                    nlist: int | None = None, n_docs: int | None = None) -> dict:
    """Embed ``staging/docs`` into ``staging/dense``; returns the manifest's ``dense`` section."""
    import ray

    from funnel.pipelines.embed import EmbedBatch, make_provider
    from funnel.pipelines.vectors import build_dense_index, write_dense_shard

    gpus = int(ray.cluster_resources().get("GPU", 0))
    spec = provider_spec(embed_model, batch_size, gpus > 0)
    # Resolve the model on the driver first: a bad name fails here, before any actor starts.
    probe = make_provider(spec)
    fingerprint = probe.fingerprint()
    dim = probe.dim
    del probe
    if gpus > 0:
        n_actors, res = gpus, {"num_gpus": 1}
    else:
        n_actors, res = max(1, min(int(ray.cluster_resources().get("CPU", 1)), 8)), {"num_cpus": 0.5}
    pool = {"compute": ray.data.ActorPoolStrategy(size=n_actors), **res}
    log.info("dense: %s on %s actors (%s)", fingerprint["model"], n_actors, "GPU" if gpus else "CPU")
    dense_dir = os.path.join(staging, "dense")
    os.makedirs(dense_dir, exist_ok=True)
    # Enough blocks to keep every actor busy (Ray would read small shard files as one block).
    # (A shard file is one Parquet row group, which Ray will not split: repartition instead.)
    blocks = max(shards, 4 * n_actors, (n_docs or 0) // (4 * batch_size))
    ds = ray.data.read_parquet(os.path.join(staging, "docs"),
                               columns=["title", "text", "content_hash", "shard", "local_id"])
    ds = ds.repartition(min(blocks, 2000))
    ds = ds.map_batches(EmbedBatch, fn_constructor_kwargs={"provider_spec": spec, "cache_dir": cache_dir},
                        batch_size=batch_size, batch_format="numpy", **pool)
    ds = ds.select_columns(["shard", "local_id", "embedding"])
    written = (ds.groupby("shard", num_partitions=shards)
               .map_groups(_write_group_fn(dense_dir), batch_format="numpy").take_all())
    done = {int(r["shard"]) for r in written}
    for s in range(shards):  # shards without documents get empty files
        if s not in done:
            write_dense_shard(dense_dir, s, np.zeros((0, dim), np.float32), np.zeros(0, np.int64))
    info = build_dense_index(dense_dir, shards, factory=factory, nlist=nlist, fingerprint=fingerprint)
    info["fingerprint"] = fingerprint
    if cache_dir is not None:
        from funnel.pipelines.embed import EmbeddingCache, default_cache_root
        root = default_cache_root() if cache_dir == "default" else cache_dir
        EmbeddingCache(root, fingerprint).compact()  # one segment instead of one per batch
    return info
