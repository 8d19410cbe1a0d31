"""The dense stage of the build job: embed every document on a Ray actor pool, then FAISS.

    docs/shard-*.parquet --read_parquet--> map_batches(EmbedBatch, actor pool)
        --stream to the driver, spilled per shard (VectorSpool)--> dense/emb-NNNN.npy + ids-NNNN.npy
        --build_dense_index--> ivf-NNNN.faiss

Actors: two per GPU at ``num_gpus=0.5`` where Ray sees GPUs (fp16 there; ``GPU_ACTORS_PER_GPU``); otherwise CPU
actors at ``num_cpus=0.5`` with one torch thread each, so the read tasks always find a CPU
(two actors at ``num_cpus=1`` on a 2-core machine starve the read stage and deadlock).
On GPUs a CPU stage (``TokenizeBatch``) tokenizes ahead of the GPU actors, which then only
run the model on length-bucketed batches of at least ``GPU_BATCH`` documents: tokenizing in
the GPU actor left the GPU waiting on it (``bench/bench_dense.py --gpu``).
Document embeddings are cached by (content hash, model fingerprint), so a rebuild, a
reindex or a CI rerun re-embeds only what changed.

The vectors come back to the driver as the actors produce them and are appended to one spill
file per shard (``pipelines.dense.vectors.VectorSpool``), so the stage holds a batch at a time and
then one shard at a time, never the corpus (a Ray Data group-by did, in its aggregators).
They would reach the driver's disk in the end anyway: that is where the FAISS shards are
built and published, whether or not the workers share it.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import warnings


from funnel.pipelines.progress import DEFAULT_INTERVAL

log = logging.getLogger("funnel.build")

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def provider_spec(embed_model: str | None, batch_size: int, gpu: bool | None, runtime: str = "auto") -> dict:
    """``openai:MODEL@BASE_URL`` (or ``$FUNNEL_EMBED_BASE_URL``) selects an endpoint; anything
    else names a sentence-transformers model (local path, package or HF cache).

    ``gpu``: True for Ray's GPU actors, False for its CPU actors (one thread each), None for this
    process (the device it has). ``runtime`` (``--embed-runtime``, a ``RUNTIME_CHOICES`` name):
    ``auto`` is torch on a GPU and ``CPU_RUNTIME`` (onnxruntime) on a CPU; with ``gpu`` None,
    ``make_provider`` resolves it where the model loads."""
    from funnel.pipelines.dense.embed import CPU_RUNTIME, RUNTIME_CHOICES
    if runtime not in RUNTIME_CHOICES:
        raise ValueError(f"unknown --embed-runtime {runtime!r}; choose one of {', '.join(RUNTIME_CHOICES)}")
    model = embed_model or DEFAULT_MODEL
    if model.startswith("openai:"):
        name, _, base = model[len("openai:"):].partition("@")
        spec = {"kind": "openai", "model": name, "batch_size": batch_size}
        if base:
            spec["base_url"] = base
        return spec
    spec = {"kind": "sentence-transformers", "model": model, "batch_size": batch_size}
    name = runtime
    if runtime == "auto" and gpu is not None:
        name = "torch" if gpu else CPU_RUNTIME
    rt, precision = RUNTIME_CHOICES[name]
    if gpu and rt == "torch":
        precision = "fp16"  # what the GPU actors run; a driver without a GPU then names it the same
    spec["runtime"] = rt
    if precision:
        spec["precision"] = precision
    if gpu is False:
        spec.update(device="cpu", num_threads=1)
    elif rt == "onnx":
        spec["device"] = "cpu"
    return spec


def runtime_label(fingerprint: dict) -> str:
    """``onnx fp32``, ``torch fp16``, ... (``endpoint`` for an OpenAI-compatible one)."""
    if "runtime" not in fingerprint:
        return "endpoint" if fingerprint.get("kind") == "openai" else "torch"
    return f"{fingerprint['runtime']} {fingerprint['precision']}"


def _counted_embed_cls():
    """``EmbedBatch`` that adds each batch to the build's progress counter (``jobs.progress_counter``)."""
    import ray

    from funnel.pipelines.dense.embed import EmbedBatch

    class CountedEmbedBatch(EmbedBatch):
        def __init__(self, provider_spec: dict, cache_dir: str | None = None, counter=None,
                     fingerprint: dict | None = None):
            super().__init__(provider_spec, cache_dir)
            self.counter = counter
            if fingerprint is not None and self.provider.fingerprint() != fingerprint:
                # e.g. a node where the ONNX export failed and torch took over: its vectors
                # would be mixed with the driver's runtime's under the driver's fingerprint.
                raise RuntimeError(f"embedding actor's model is {self.provider.fingerprint()}, the build's "
                                   f"{fingerprint}: vectors of two runtimes would mix in one index")

        def __call__(self, batch: dict) -> dict:
            before = self.embedded
            out = super().__call__(batch)
            if self.counter is not None:
                n = len(out["embedding"])
                # Rows are passages where documents were split: a document is counted at its first.
                docs = int((out["ordinal"] == 0).sum()) if "ordinal" in out else n
                # Written before add returns, so a driver reading the counter after the last
                # batch sees it (reindex reports its vectors from these counts).
                try:
                    self.counter.add("embed", docs=docs, vectors=n, cached=n - (self.embedded - before))
                except Exception as e:  # a count is a report, never worth a failed batch
                    log.warning("embedding progress counter unreachable (%s): counts may be short", e)
            return out

    return CountedEmbedBatch


#: Documents per GPU actor call, at least: a GPU does MiniLM-sized work on 64 documents in
#: milliseconds, so smaller calls leave it waiting on Ray's per-call overhead
#: (bench/RESULTS.md, the GPU section). A larger ``--embed-batch-size`` is kept.
GPU_BATCH = 1024

#: Embedding actors per GPU, each reserving ``1 / GPU_ACTORS_PER_GPU`` of it. With one actor
#: the GPU idles while Ray moves a batch in and the vectors out (one call at a time); a second
#: actor on the same GPU overlaps that with the other's forward pass. The model is small
#: (MiniLM: ~90 MB in fp16), so a copy per actor costs little GPU memory. bench_dense.py
#: --gpu --gpu-actors 1,2 measures both (bench/RESULTS.md, the GPU section: on an H200 two
#: actors reach 0.80x the forward-only rate, one 0.61x).
GPU_ACTORS_PER_GPU = 2


def gpu_actors(gpus: int, per_gpu: int | None = None) -> tuple[int, dict]:
    """(embedding actors, the resources each reserves) for ``gpus`` GPUs."""
    per = max(1, int(per_gpu or GPU_ACTORS_PER_GPU))
    return gpus * per, {"num_gpus": 1.0 / per}


def embed_dataset(ds, spec: dict, *, batch_size: int, n_actors: int, actor_resources: dict,
                  tokenizer: dict | None = None, document_prompt: str = "", tokenize_actors: int = 1,
                  cache_dir: str | None = None, counter=None, actor_options: dict | None = None,
                  fingerprint: dict | None = None):
    """``ds`` (``title``, ``text``, ...) -> the same rows plus ``embedding``: the build's embedding stage.

    ``n_actors`` embedding actors, each reserving ``actor_resources`` (``{"num_gpus": 1}`` on a
    GPU), take ``batch_size`` documents a call. With ``tokenizer`` (the provider's
    ``tokenizer_spec()``), a CPU stage of ``tokenize_actors`` actors turns the text into
    token ids first, so the embedding actors only run the model; without it they tokenize too.
    ``fingerprint``: the model fingerprint every actor must have (the driver's probe's).
    Each tokenizer actor reserves half a CPU (the Rust tokenizer runs its own threads), which
    leaves a CPU for the read and repartition tasks on small machines: actors that hold every
    CPU stall those tasks and the stage with them.
    """
    import ray

    from funnel.pipelines.dense.embed import TokenizeBatch

    if tokenizer is not None:
        ds = ds.map_batches(TokenizeBatch, fn_constructor_kwargs={"tokenizer_spec": tokenizer,
                                                                  "document_prompt": document_prompt},
                            batch_size=batch_size, batch_format="numpy", num_cpus=0.5,
                            compute=ray.data.ActorPoolStrategy(size=max(1, tokenize_actors)))
    pool = {"compute": ray.data.ActorPoolStrategy(size=n_actors), **actor_resources, **(actor_options or {})}
    with warnings.catch_warnings():
        # Ray 2.60 takes max_restarts (see build_index.max_restarts) only through
        # **ray_remote_args, which it marks deprecated in favour of named parameters that
        # do not cover it yet: the setting is deliberate, the notice is not for our users.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        return ds.map_batches(_counted_embed_cls(),
                              fn_constructor_kwargs={"provider_spec": spec, "cache_dir": cache_dir,
                                                     "counter": counter, "fingerprint": fingerprint},
                              batch_size=batch_size, batch_format="numpy", **pool)


#: What the embedder reads of ``docs/shard-*.parquet``.
DOC_COLUMNS = ["title", "text", "content_hash", "shard", "local_id"]


def _docs_dataset(docs_dir: str, ship: bool):
    """``docs/shard-*.parquet`` as a Ray dataset of the columns the embedder needs.

    Without ``ship`` the workers read the files (a disk they share with this process); with
    it this process reads them, a row group at a time, into the object store, where the
    workers on any machine find them.
    """
    import pyarrow.parquet as pq
    import ray

    files = sorted(glob.glob(os.path.join(docs_dir, "shard-*.parquet")))  # not ids.arrow beside them
    if not ship:
        return ray.data.read_parquet(files).select_columns(DOC_COLUMNS)
    refs = []
    for path in files:
        f = pq.ParquetFile(path)
        refs += [ray.put(f.read_row_group(g, columns=DOC_COLUMNS)) for g in range(f.num_row_groups)]
    return ray.data.from_arrow_refs(refs)


def run_dense_stage(staging: str, shards: int, embed_model: str | None, batch_size: int = 64,
                    cache_dir: str | None = "default", factory: str | None = None,
                    nlist: int | None = None, n_docs: int | None = None, counter=None,
                    progress_seconds: float = DEFAULT_INTERVAL, actor_options: dict | None = None,
                    ship: bool = False, release_ray: bool = False, passages=None,
                    memory_budget: int | None = None, runtime: str = "auto") -> dict:
    """Embed ``staging/docs`` into ``staging/dense``; returns the manifest's ``dense`` section.

    ``passages`` (`funnel.pipelines.dense.passages.PassageSettings`, default: on) splits each
    document into passages first (a map stage, ``split_batch``): one vector per passage, their
    spans in ``staging/passages``. Disabled, each document is embedded whole (its first window).

    ``counter`` is the build's progress counter (see ``build_index``): with it, a line with
    documents embedded, rate and ETA is logged every ``progress_seconds``.
    ``actor_options`` go to the actor pool's ``map_batches`` (e.g. ``max_restarts``).
    ``ship``: the workers share no disk with this process; they get the documents through the
    object store (the vectors come back to this process either way).
    ``cache_dir`` is the embedding cache on each worker's machine.
    ``memory_budget``: bytes the FAISS lists may take at serving (``build_dense_index``).
    ``runtime``: ``--embed-runtime`` (``provider_spec``); an onnxruntime model runs on CPU actors
    even where Ray has GPUs.
    ``release_ray``: stop Ray once every vector is on this process's disk, before the vector
    shards are written and the FAISS stage; for a local Ray that funnel started for this build
    and nothing else uses. Its idle workers, spill workers and object store otherwise hold
    their memory (~3 GB at 1M documents) until the process exits, on top of those stages' own.
    """
    import ray

    from funnel.pipelines.dense.embed import make_provider
    from funnel.pipelines.progress import ProgressLog, Status
    from funnel.pipelines.dense.vectors import VectorSpool, build_dense_index

    gpus = int(ray.cluster_resources().get("GPU", 0))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    spec = provider_spec(embed_model, batch_size, gpus > 0, runtime)
    if spec.get("runtime") == "onnx":
        gpus = 0  # onnxruntime embeds on the CPU
    if gpus > 0:
        batch_size = spec["batch_size"] = max(batch_size, GPU_BATCH)
    # Resolve the model on the driver first: a bad name fails here, before any actor starts (and
    # an ONNX export happens once, here, for the actors on this machine to find).
    probe = make_provider(spec)
    fingerprint = probe.fingerprint()
    if "runtime" in fingerprint:  # a fallback to torch on the driver is the actors' runtime too
        spec.update(runtime=fingerprint["runtime"], precision=fingerprint["precision"])
    dim = probe.dim
    # On GPUs, tokenisation is a CPU stage of its own (the GPU actors would otherwise wait on it).
    tokenizer = getattr(probe, "tokenizer_spec", lambda: None)() if gpus > 0 else None
    document_prompt = probe.document_prompt
    from funnel.pipelines.dense.passages import PassageSettings, passages_manifest, split_batch, splitter_spec
    passages = passages if passages is not None else PassageSettings()
    split = splitter_spec(probe, passages) if passages.enabled else None
    del probe
    if gpus > 0:
        n_actors, res = gpu_actors(gpus)
    else:
        n_actors, res = max(1, min(cpus, 8)), {"num_cpus": 0.5}
    log.info("embed: %s documents with %s (%s) on %d %s actor(s)%s", f"{n_docs:,}" if n_docs is not None else "all",
             fingerprint["model"], runtime_label(fingerprint), n_actors, "GPU" if gpus else "CPU",
             ", tokenized by a CPU stage" if tokenizer is not None else "")
    dense_dir = os.path.join(staging, "dense")
    os.makedirs(dense_dir, exist_ok=True)
    # Enough blocks to keep every actor busy (Ray would read small shard files as one block).
    # (A shard file is one Parquet row group, which Ray will not split: repartition instead.)
    blocks = max(shards, 4 * n_actors, (n_docs or 0) // (4 * batch_size))
    ds = _docs_dataset(os.path.join(staging, "docs"), ship).repartition(min(blocks, 2000))
    if split is not None:  # from here on a row is a passage, shaped like a document
        ds = ds.map_batches(split_batch, fn_kwargs={"spec": split}, batch_size=batch_size, batch_format="numpy")
    ds = embed_dataset(ds, spec, batch_size=batch_size, n_actors=n_actors, actor_resources=res,
                       tokenizer=tokenizer, document_prompt=document_prompt,
                       tokenize_actors=max(1, min(8, cpus // 2)), cache_dir=cache_dir,
                       counter=counter, actor_options=actor_options, fingerprint=fingerprint)
    span_columns = ["ordinal", "char_start", "char_end"] if split is not None else []
    ds = ds.select_columns(["shard", "local_id", "embedding"] + span_columns)

    def status() -> Status:
        c = counter.get().get("embed", {})
        done, vectors, cached = c.get("docs", 0), c.get("vectors", 0), c.get("cached", 0)
        detail = [f"{vectors:,} passages"] if split is not None else []
        detail += [f"{cached:,} from the cache"] if cached else []
        return Status("embed", done, total=n_docs, detail=", ".join(detail))

    spool = VectorSpool(dense_dir, os.path.join(staging, "dense-spill"), dim, n_shards=shards,
                        passages_dir=os.path.join(staging, "passages") if split is not None else None)
    with ProgressLog(status, progress_seconds if counter is not None else 0, log):
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            spool.add(batch["shard"], batch["local_id"], batch["embedding"],
                      passages=tuple(batch[c] for c in span_columns) if split is not None else None)
    if release_ray:  # every vector is in the spill files on this process's disk
        ray.shutdown()
        log.info("ray: stopped the local Ray this build started (nothing left to run on it); "
                 "its workers' memory is free for the vector shards and the FAISS stage")
    log.info("embed: %s vectors; writing %d vector shards", f"{spool.count:,}", shards)
    spool.finish()
    shutil.rmtree(os.path.join(staging, "dense-spill"), ignore_errors=True)
    log.info("faiss: building the vector index of %d shards", shards)
    info = build_dense_index(dense_dir, shards, factory=factory, nlist=nlist, fingerprint=fingerprint,
                             memory_budget=memory_budget)
    info["fingerprint"] = fingerprint
    if split is not None:
        info["passages"] = passages_manifest(split, n_docs)
    if cache_dir is not None:
        from funnel.pipelines.dense.embed import EmbeddingCache, default_cache_root
        root = default_cache_root() if cache_dir == "default" else cache_dir
        EmbeddingCache(root, fingerprint).compact()  # one segment instead of one per batch
    return info
