"""Reindex a published funnel index from a changed corpus: process only what changed.

    python jobs/reindex.py --index INDEX_ROOT --corpus PATH [--dense] [--keep N]
    funnel reindex --index INDEX_ROOT --corpus PATH
    ray job submit --working-dir . -- python jobs/reindex.py --index ... --corpus ...

Diffs content hashes of the new corpus against the live version (the one CURRENT names),
keeps the term counts (and vectors) of unchanged documents, analyzes (and embeds) only new
and changed ones, drops deleted ones, recomputes the global statistics (DF reduce in
DuckDB, N, avgdl) and the FAISS shards, and publishes a new version atomically with the
live one as its parent. The new version is the one a full build of the new corpus would
publish: the same documents, local ids, postings, statistics and vectors, file for file.
Fields and ACLs (``pipelines/sources/fields.py``) are diffed too: a document whose text is the same
and whose fields are not is neither analyzed nor embedded; its stored row and the field
columns are rewritten (the schema declared at build, or inferred again over the new corpus).
Where no text changed at all (an ACL revoked, a label moved), the statistics, vocabulary, doc
ids, vectors and FAISS shards are the live version's files, copied: such a reindex takes
about the time to read the corpus.

A corpus with no added, changed or deleted document (nor new fields) publishes nothing ("no changes"),
unless ``--force``. A failure at any point publishes nothing; the live version stays.

Executors: ``local`` runs the stages in this process (no Ray start-up: the right choice for
a cron job on one machine, where a reindex of 3% of SciFact takes about a second and
starting Ray alone costs several); ``ray`` runs each corpus chunk and each shard as a Ray
task and embeds on a Ray Data actor pool, reading and writing the driver's folders, so it
needs every node to share that disk; ``auto`` (default) picks ``ray`` only where that
holds (this process already runs a Ray of its own) and ``local`` otherwise, also under
``ray job submit`` (RAY_ADDRESS), where workers may sit on other machines: a reindex
touches only what changed, so the driver's process does it.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from funnel.jobs.build_index import (BuildError, HelpFormatter, collect_rejects, init_ray, keep_rejects,
                                     llm_endpoint_of, max_restarts, progress_counter)

log = logging.getLogger("funnel.build")

EXECUTORS = ("auto", "local", "ray")
#: Fields of a folder's file that change without its content: a change of these alone is none
#: (the reindex keeps the indexed values and publishes nothing for it).
VOLATILE_FILE_FIELDS = ("mtime",)
#: Manifest keys that publish() writes; a reindex starts from the live manifest without them.
_PUBLISH_KEYS = ("files", "created_at", "parent", "format_version", "manifest_checksum")


@dataclass
class ReindexReport:
    """What a reindex did. ``version`` is None when nothing was published (no changes)."""

    version: str | None
    base_version: str
    index_root: str
    n_docs: int
    n_rejects: int
    unchanged: int
    changed: int
    added: int
    deleted: int
    shards_rebuilt: int
    n_shards: int
    seconds: float
    executor: str
    stage_seconds: dict = field(default_factory=dict)
    rejects_path: str = ""
    dense: dict | None = None     # vectors: reused (from the live version), from_cache, embedded
    enrichment: dict | None = None  # an enriched index's new enrichment section (its counts: cached, asked)
    fields_changed: int = 0  # documents whose text is unchanged and whose fields (an ACL, a label) are not
    touched: int = 0  # folder files whose modification time alone changed (kept as indexed: not a change)

    @property
    def published(self) -> bool:
        return self.version is not None

    def to_dict(self) -> dict:
        return {**self.__dict__, "published": self.published}


# -- executors -------------------------------------------------------------------------------


def _pick_executor(executor: str) -> str:
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if executor != "auto":
        return executor
    if os.environ.get("RAY_ADDRESS"):
        # A cluster's workers may not see this machine's disk (the build ships files through
        # Ray for that; reindex's tasks read and write the driver's folders): stay here.
        log.info("reindex: RAY_ADDRESS is set: running in the driver's process (executor local); "
                 "--executor ray needs every node to share the index root's disk")
        return "local"
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return "ray"
    return "local"


def _map(executor: str, fn, calls: list[tuple]) -> list:
    """``[fn(*args) for args in calls]``, here or as Ray tasks (retried by Ray on a lost worker)."""
    if executor == "local":
        return [fn(*args) for args in calls]
    import ray
    remote = ray.remote(num_cpus=1)(fn)
    return ray.get([remote.remote(*args) for args in calls])


# -- validation --------------------------------------------------------------------------------


def _live_version(root: str) -> tuple[str, str, dict]:
    """(version, its folder, its verified manifest); clear errors for what cannot be reindexed.

    A remote root's live version is read from its verified copy in the local cache.
    """
    from funnel.pipelines.store import remote
    from funnel.pipelines.store.artifacts import IndexFormatError, read_current, verify_version
    if remote.is_remote(root):
        vdir, manifest = remote.fetch_version(root, verify="full")
        return os.path.basename(vdir), vdir, manifest
    if not os.path.isdir(root):
        raise FileNotFoundError(f"index root {root!r} does not exist: reindex updates a published index; "
                                f"build one first with `funnel build --corpus PATH --out {root}`")
    cur = read_current(root)
    if cur is None:
        raise IndexFormatError(f"{root!r} has no live version (no CURRENT): nothing to reindex; build one "
                               f"first with `funnel build --corpus PATH --out {root}`")
    vdir = os.path.join(root, cur)
    if not os.path.isdir(vdir):
        raise IndexFormatError(f"{root!r}: CURRENT names {cur}, which does not exist; run a full build")
    # Every file the reindex reuses is checked against its sha256 first: a damaged live
    # version must not be copied into the next one.
    return cur, vdir, verify_version(vdir, mode="full")


def _check_reusable(manifest: dict, vdir: str) -> None:
    from funnel.pipelines.lexical.analysis import Analyzer
    live, now = manifest.get("analyzer") or {}, Analyzer().describe()
    if live.get("fingerprint") != now["fingerprint"]:
        raise BuildError(f"{vdir} was analyzed with {live} and this funnel analyzes with {now}: its postings "
                         "cannot be reused. Run a full build (funnel build) instead")
    if not manifest.get("shards"):
        raise BuildError(f"{vdir}: its manifest lists no shards; run a full build")


# -- the dense stage ---------------------------------------------------------------------------


def _ray_gpus() -> int:
    import ray
    return int(ray.cluster_resources().get("GPU", 0))


def _embed_spec(manifest: dict, embed_model: str | None, batch_size: int, gpu: bool | None) -> tuple[dict, dict | None]:
    """(provider spec, the live version's model fingerprint or None) for the dense stage.

    ``gpu`` False pins the model to the CPU with one thread (Ray's CPU actors), as the build does;
    None lets the model pick this process's device.
    The live model is embedded with the live runtime and precision (torch for a version whose
    fingerprint names none), so the new vectors join the reused ones from the same runtime.
    """
    from funnel.jobs.embed_stage import DEFAULT_MODEL, provider_spec
    from funnel.pipelines.dense.embed import runtime_name
    live_fp = (manifest.get("dense") or {}).get("fingerprint")
    runtime = "auto"
    if embed_model is None and live_fp:
        embed_model = ("openai:" + live_fp["model"]) if live_fp.get("kind") == "openai" else live_fp["model"]
        runtime = runtime_name(live_fp)
    spec = provider_spec(embed_model or DEFAULT_MODEL, batch_size, gpu, runtime)
    if runtime == "torch" and live_fp and live_fp.get("precision"):
        spec["precision"] = live_fp["precision"]
    return spec, live_fp


def _embed_delta_local(delta_dir: str, out_dir: str, spec: dict, cache_dir: str | None, batch_size: int,
                       fingerprint: dict | None, passages=None) -> tuple[int, int, dict]:
    """Embed every row of ``delta/*.parquet`` in this process; (vectors, embedded, model fingerprint).

    With the model's ``fingerprint`` known (the live version's), a shard whose vectors
    are all in the embedding cache is served from it without loading the model. With
    ``passages`` enabled each document is split first (which needs the model's tokenizer)
    and its passages' vectors come from the cache where their text is unchanged.
    """
    import numpy as np
    import pyarrow.parquet as pq

    from funnel.pipelines.dense.embed import EmbedBatch, EmbeddingCache, default_cache_root
    from funnel.pipelines.dense.vectors import write_dense_shard
    cache = None
    if fingerprint is not None and cache_dir is not None:
        cache = EmbeddingCache(default_cache_root() if cache_dir == "default" else cache_dir, fingerprint)
    eb = None
    n_vectors = 0
    for name in sorted(os.listdir(delta_dir)):
        t = pq.read_table(os.path.join(delta_dir, name))
        shard = int(t.column("shard")[0].as_py())
        local = t.column("local_id").to_numpy()
        cols = {c: np.asarray(t.column(c).to_pylist(), dtype=object) for c in ("title", "text", "content_hash")}
        if passages is not None and passages.enabled:
            from funnel.pipelines.dense.passages import embed_passages, splitter_spec
            from funnel.pipelines.dense.vectors import write_passage_shard
            eb = eb or EmbedBatch(spec, cache_dir)
            split = splitter_spec(eb.provider, passages)
            cols["local_id"] = local.astype(np.int64)
            parts = [embed_passages(eb, split, {c: v[i:i + batch_size] for c, v in cols.items()}, batch_size)
                     for i in range(0, len(local), batch_size)]
            vecs = np.vstack([p[0] for p in parts])
            write_passage_shard(out_dir, os.path.join(out_dir, "passages"), shard, vecs,
                                *np.hstack([p[1] for p in parts]))
            n_vectors += len(vecs)
            continue
        found, vecs = cache.get_many(list(cols["content_hash"])) if cache is not None else (None, None)
        if found is None or not found.all():
            eb = eb or EmbedBatch(spec, cache_dir)
            vecs = np.vstack([eb({c: v[i:i + batch_size] for c, v in cols.items()})["embedding"]
                              for i in range(0, len(local), batch_size)])
        write_dense_shard(out_dir, shard, vecs, (np.int64(shard) << 32) | local)
        n_vectors += len(vecs)
    return (n_vectors, eb.embedded, eb.provider.fingerprint()) if eb is not None else (n_vectors, 0, fingerprint)


def _embed_delta_ray(delta_dir: str, out_dir: str, spec: dict, cache_dir: str | None, batch_size: int,
                     n_rows: int, actor_options: dict, release_ray: bool = False, split: dict | None = None
                     ) -> tuple[int, int]:
    """Embed ``delta/*.parquet`` on a Ray Data actor pool, as the build's dense stage does;
    (vectors, embedded). ``release_ray``: stop Ray once the vectors are on this process's
    disk (nothing after this runs on Ray), so that its workers' memory is free for the FAISS
    shards. ``split``: a ``splitter_spec``; documents are split into passages first."""
    import warnings

    import ray

    from funnel.jobs.embed_stage import _counted_embed_cls, gpu_actors
    from funnel.pipelines.dense.vectors import VectorSpool
    counter = progress_counter()
    gpus = _ray_gpus()
    if gpus > 0:
        n_actors, res = gpu_actors(gpus)
    else:
        n_actors, res = max(1, min(int(ray.cluster_resources().get("CPU", 1)), 8)), {"num_cpus": 0.5}
    n_actors = max(1, min(n_actors, -(-n_rows // batch_size)))
    ds = ray.data.read_parquet(delta_dir).repartition(max(1, min(4 * n_actors, -(-n_rows // batch_size))))
    if split is not None:  # a row per passage from here on (pipelines.dense.passages.split_batch)
        from funnel.pipelines.dense.passages import split_batch
        ds = ds.map_batches(split_batch, fn_kwargs={"spec": split}, batch_size=batch_size, batch_format="numpy")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ds.map_batches(_counted_embed_cls(), fn_constructor_kwargs={"provider_spec": spec, "cache_dir": cache_dir,
                                                                       "counter": counter},
                            batch_size=batch_size, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=n_actors), **res, **actor_options)
    spans = ["ordinal", "char_start", "char_end"] if split is not None else []
    spool = VectorSpool(out_dir, out_dir + "-spill",  # only the shards with changed documents
                        passages_dir=os.path.join(out_dir, "passages") if split is not None else None)
    for batch in ds.select_columns(["shard", "local_id", "embedding"] + spans).iter_batches(batch_size=None,
                                                                                           batch_format="numpy"):
        spool.add(batch["shard"], batch["local_id"], batch["embedding"],
                  passages=tuple(batch[c] for c in spans) if split is not None else None)
    if spool.count:
        spool.finish()
    shutil.rmtree(out_dir + "-spill", ignore_errors=True)
    c = counter.get().get("embed", {})
    counter.close()
    if release_ray:
        ray.shutdown()
        log.info("ray: stopped the local Ray this reindex started (nothing left to run on it); "
                 "its workers' memory is free for the FAISS stage")
    return int(c.get("vectors", 0)), int(c.get("vectors", 0)) - int(c.get("cached", 0))


def _dense_stage(staging: str, work: str, shard_rows: list[dict], spec: dict, live_fp: dict | None,
                 reuse_live: bool, executor: str, cache_dir: str | None, batch_size: int,
                 actor_options: dict, release_ray: bool = False, passages=None,
                 live_passages: dict | None = None, memory_budget: int | None = None) -> dict:
    """Vectors of every document (reused or embedded), then the FAISS shards; the manifest's dense section.

    The FAISS shards are always rebuilt from the vectors, under the live version's memory
    budget (``memory_budget``): a corpus that grows past it gets IVF-PQ, one that shrinks
    below it IVF-Flat again (``pipelines.dense.vectors.build_dense_index``).

    ``passages`` (PassageSettings): split as the live version did (``live_passages``, its
    manifest section), or by these settings where nothing of the live version is reused."""
    import numpy as np

    from funnel.pipelines.store.reindex import assemble_passages, assemble_vectors
    from funnel.pipelines.dense.vectors import build_dense_index, write_dense_shard, write_passage_shard
    delta_dir, emb_dir = os.path.join(work, "delta"), os.path.join(work, "delta-emb")
    n_delta = sum(r["to_embed"] for r in shard_rows)
    embedded, rows, fingerprint = 0, 0, live_fp if reuse_live else None
    on = passages is not None and passages.enabled
    section = {**live_passages} if on and reuse_live and live_passages else None
    split = None  # the splitter's spec, where Ray's tasks need it or the section is new
    if on and (section is None or (n_delta and executor == "ray")):
        from funnel.pipelines.dense.embed import make_provider
        from funnel.pipelines.dense.passages import passages_manifest, splitter_spec
        probe = make_provider(spec)
        split = splitter_spec(probe, passages)
        section = section or passages_manifest(split)
        fingerprint = fingerprint or probe.fingerprint()
        del probe
    if n_delta:
        if executor == "ray":
            rows, embedded = _embed_delta_ray(delta_dir, emb_dir, spec, cache_dir, batch_size, n_delta, actor_options,
                                              release_ray, split=split)
        else:
            rows, embedded, fingerprint = _embed_delta_local(delta_dir, emb_dir, spec, cache_dir, batch_size,
                                                             fingerprint, passages)
    if fingerprint is None:  # Ray embedded it (or nothing was): ask the model once, here
        from funnel.pipelines.dense.embed import make_provider
        fingerprint = make_provider(spec).fingerprint()
    dim = int(fingerprint["dim"])
    dense_dir = os.path.join(staging, "dense")
    for r in shard_rows:
        s = int(r["shard"])
        if on:
            vecs, *cols = assemble_passages(work, s, int(r["n_docs"]), dim, emb_dir)
            write_passage_shard(dense_dir, os.path.join(staging, "passages"), s, vecs, *cols)
            continue
        ids_p, emb_p = os.path.join(emb_dir, f"ids-{s:04d}.npy"), os.path.join(emb_dir, f"emb-{s:04d}.npy")
        have = os.path.exists(ids_p)
        vecs, docnos = assemble_vectors(work, s, int(r["n_docs"]), dim, np.load(ids_p) if have else None,
                                        np.load(emb_p) if have else None)
        write_dense_shard(dense_dir, s, vecs, docnos)
    info = build_dense_index(dense_dir, len(shard_rows), fingerprint=fingerprint, memory_budget=memory_budget)
    info["fingerprint"] = fingerprint
    if on:
        info["passages"] = {**section, "n_docs": sum(int(r["n_docs"]) for r in shard_rows)}
    if cache_dir is not None and embedded:
        from funnel.pipelines.dense.embed import EmbeddingCache, default_cache_root
        EmbeddingCache(default_cache_root() if cache_dir == "default" else cache_dir, fingerprint).compact()
    reused = sum(r["vectors_reused"] for r in shard_rows)
    log.info("dense: %d vectors reused from the live version, %d from the embedding cache, %d embedded",
             reused, rows - embedded, embedded)
    return info, {"reused": reused, "from_cache": rows - embedded, "embedded": embedded}


# -- an enriched live version ----------------------------------------------------------------


def enrich_settings_of(section: dict, llm: tuple[str, str] | None = None):
    """The `EnrichSettings` an enriched version was built with (its manifest section).

    ``llm`` = (base_url, model) replaces the endpoint; ``("local", ...)`` is the embedded
    SmolLM2. Without it: a version enriched by the local SmolLM2 (its manifest says base_url
    ``loopback`` and the SmolLM2 model) uses it again; another loopback endpoint must be named,
    since its port is gone.
    """
    import dataclasses

    from funnel.pipelines.enrich import PROMPT_VERSION, EnrichSettings
    from funnel.serving.chat import SMOLLM2_GGUF
    kw = {f.name: section[f.name] for f in dataclasses.fields(EnrichSettings) if f.name in section}
    if llm is not None:
        kw["base_url"], kw["model"] = llm
    elif kw.get("base_url") == "loopback":
        if kw.get("model") != SMOLLM2_GGUF.removesuffix(".gguf"):
            raise BuildError(f"the live version was enriched by {kw.get('model')!r} on a loopback endpoint that "
                             "is gone: name it with --llm-base-url URL --llm-model NAME (or --llm local)")
        kw["base_url"] = "local"
    if section.get("prompt_version") != PROMPT_VERSION:
        log.warning("the live version's enrichment prompt is %s, this funnel's %s: every document is asked again",
                    section.get("prompt_version"), PROMPT_VERSION)
    return EnrichSettings(**kw)


def _content_diff(old_dir: str, new_dir: str) -> dict[str, int]:
    """unchanged / changed / added / deleted between two versions' (doc_id, content_hash)."""
    import glob

    import pyarrow.parquet as pq

    def pairs(vdir: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for f in sorted(glob.glob(os.path.join(vdir, "docs", "shard-*.parquet"))):
            t = pq.read_table(f, columns=["doc_id", "content_hash"])
            out.update(zip(t.column("doc_id").to_pylist(), t.column("content_hash").to_pylist()))
        return out

    old, new = pairs(old_dir), pairs(new_dir)
    both = old.keys() & new.keys()
    changed = sum(old[d] != new[d] for d in both)
    return {"unchanged": len(both) - changed, "changed": changed, "added": len(new.keys() - old.keys()),
            "deleted": len(old.keys() - new.keys())}


def _reindex_enriched(root: str, local: str, corpus: str, base: str, vdir: str, live: dict, spec, *, dense,
                      keep_versions, strict, embed_model, embed_batch_size, executor, num_cpus, llm,
                      enrich_cache, t0: float) -> ReindexReport:
    """An enriched live version: a full build with its enrichment settings and shard count.

    Injected phrases depend on the DF of the whole un-enriched corpus (the filter's
    ``tau·N``), so one changed document can change what every other document keeps; the
    un-enriched postings are not stored to patch. Every document is analyzed again, and the
    LLM is asked only about new and changed ones (the enrichment cache keyed by content
    hash); vectors come from the embedding cache. The result is a full build's by
    construction.
    """
    from funnel.jobs.build_index import build
    settings = enrich_settings_of(live["enrichment"], llm)
    want_dense = bool(live.get("dense")) if dense is None else bool(dense)
    model = embed_model or ((live.get("dense") or {}).get("fingerprint") or {}).get("model") or "all-MiniLM-L6-v2"
    log.info("reindex %s: the live %s is SIRA-enriched (%s): a full build reusing the enrichment and embedding "
             "caches", root, base, settings.prompt_id)
    rep = build(corpus, root, shards=len(live["shards"]), strict=strict, fmt=spec.format, id_field=spec.id_field,
                title_field=spec.title_field, text_field=spec.text_field, keep_versions=keep_versions,
                dense=want_dense, embed_model=model, embed_batch_size=embed_batch_size, num_cpus=num_cpus,
                engine="ray" if executor == "ray" else "local", enrich=settings, enrich_cache=enrich_cache,
                fields=spec.fields, acl_absent=(live.get("fields") or {}).get("acl_absent", "public"),
                include=spec.include, exclude=spec.exclude, follow_links=spec.follow_links,
                passages=_passage_settings(live), dense_memory_budget=(live.get("dense") or {}).get("memory_budget"))
    diff = _content_diff(vdir, os.path.join(local, rep.version))
    secs = round(time.time() - t0, 2)
    return ReindexReport(rep.version, base, root, rep.n_docs, rep.n_rejects, **diff, shards_rebuilt=rep.n_shards,
                         n_shards=rep.n_shards, seconds=secs, executor=executor, stage_seconds=rep.stage_seconds,
                         rejects_path=rep.rejects_path, enrichment=rep.enrichment)


# -- the job ---------------------------------------------------------------------------------


def reindex(index_root: str, corpus: str, dense: bool | None = None, keep_versions: int | None = None,
            fmt: str | None = None, id_field: str | None = None, title_field: str | None = None,
            text_field: str | None = None, strict: bool = False, force: bool = False,
            embed_model: str | None = None, embed_batch_size: int = 64, executor: str = "auto",
            num_cpus: int | None = None, chunk_bytes: int = 4 << 20,
            embed_cache: str | None = "default", llm: tuple[str, str] | None = None,
            enrich_cache: str | None = "default", include=None, exclude=None,
            follow_links: bool | None = None) -> ReindexReport:
    """Publish the next version of ``index_root`` for ``corpus``, reusing the live version.

    Parameters
    ----------
    index_root : str
        An index with a live version (CURRENT); its shard count, analyzer and corpus
        format settings are kept.
    corpus : str
        The new corpus, in full (documents absent from it are deleted).
    dense : bool, optional
        Vectors and FAISS shards; default: as the live version.
    keep_versions : int, optional
        After publishing, delete all but the newest N versions (never the live one).
    fmt, id_field, title_field, text_field : str, optional
        Corpus reading options; default: the live version's.
    include, exclude, follow_links : optional
        Which files of a folder corpus are read (patterns, links out of the folder); default:
        the live version's (its manifest's ``corpus.spec``). A folder file whose modification
        time alone changed is no change: its fields keep the indexed ``mtime``.
    strict : bool
        Publish nothing if any row is rejected.
    force : bool
        Publish even when no document was added, changed or deleted.
    embed_model : str, optional
        Default: the live version's model (all-MiniLM-L6-v2 if it has none). Another
        model re-embeds every document (through the embedding cache).
    executor : {"auto", "local", "ray"}
        See the module docstring.
    embed_cache : str, optional
        Embedding cache root; ``"default"`` is ``$FUNNEL_CACHE/embeddings``, None: off.
    llm, enrich_cache : optional
        For a SIRA-enriched index (a full build with its settings, see
        `_reindex_enriched`): the LLM endpoint (base_url, model), default the one it
        was built with (`enrich_settings_of`), and the enrichment cache root.

    Returns
    -------
    ReindexReport
        ``version`` is None when nothing changed (and ``force`` is off).

    Raises
    ------
    FileNotFoundError
        The index root or the corpus does not exist.
    IndexFormatError
        The root has no live version, or the live version is damaged.
    BuildError
        Nothing to publish (every row rejected, ``--strict``), or the live version
        cannot be reused (another analyzer): run a full build.
    """
    from funnel.pipelines.store import remote
    from funnel.pipelines.lexical.analysis import Analyzer
    from funnel.pipelines.store.artifacts import new_staging_dir, publish, release_staging
    from funnel.pipelines.sources.corpus import CorpusSpec, plan_chunks
    from funnel.pipelines.store.docorder import write_doc_ids
    from funnel.pipelines.lexical.postings import finalize_shard, is_packed
    from funnel.pipelines.store.reindex import reindex_shard, spill_chunk
    from funnel.pipelines.lexical.shard import combine_fingerprints, shard_name
    from funnel.pipelines.lexical.stats import load_vocabulary, reduce_term_stats, write_vocabulary

    if keep_versions is not None and keep_versions < 1:
        raise ValueError(f"--keep must be at least 1 (the live version is always kept), got {keep_versions}")
    t0 = time.time()
    timings: dict[str, float] = {}
    root = index_root if remote.is_remote(index_root) else os.path.abspath(index_root)
    # A remote root (s3://...) is staged in its local cache folder and uploaded by remote.publish.
    local, publish_to = (remote.local_root(root), remote.publish) if remote.is_remote(root) else (root, publish)
    base, vdir, live = _live_version(root)
    _check_reusable(live, vdir)
    live_spec = (live.get("corpus") or {}).get("spec") or {}
    spec = CorpusSpec(path=corpus, format=fmt or live_spec.get("format", "auto"),
                      id_field=id_field if id_field is not None else live_spec.get("id_field"),
                      title_field=title_field or live_spec.get("title_field", "title"),
                      text_field=text_field or live_spec.get("text_field", "text"),
                      fields=live_spec.get("fields"),  # declared at build: a wrong-typed value is a reject
                      # a folder is listed as its build listed it, unless these are given
                      include=tuple(include if include is not None else live_spec.get("include") or ()),
                      exclude=tuple(exclude if exclude is not None else live_spec.get("exclude") or ()),
                      follow_links=bool(follow_links if follow_links is not None
                                        else live_spec.get("follow_links", False)))
    chunks = plan_chunks(spec, target_bytes=chunk_bytes)  # a missing corpus fails here, before any write
    n_shards = len(live["shards"])
    want_dense = bool(live.get("dense")) if dense is None else bool(dense)
    if live.get("bm25_passages") and not want_dense:
        raise BuildError("the live version scores BM25 by passages (--bm25-passages), which are split by the "
                         "dense stage: reindex without --no-dense, or run a full build (funnel build ...) without "
                         "--bm25-passages")
    executor = _pick_executor(executor)
    if live.get("enrichment"):
        return _reindex_enriched(root, local, corpus, base, vdir, live, spec, dense=dense,
                                 keep_versions=keep_versions, strict=strict, embed_model=embed_model,
                                 embed_batch_size=embed_batch_size, executor=executor, num_cpus=num_cpus, llm=llm,
                                 enrich_cache=enrich_cache, t0=t0)
    log.info("reindex %s (live %s, %d shards) from %s: %d chunks, executor %s", root, base, n_shards, corpus,
             len(chunks), executor)

    staging = new_staging_dir(local)
    work = os.path.join(local, ".work-" + os.path.basename(staging).split("-", 1)[1])
    os.makedirs(work)
    try:
        ray_info = {"cluster": "none", "executor": "local"}
        actor_options: dict = {}
        if executor == "ray":
            ray_info = {**init_ray(num_cpus), "executor": "ray"}
            actor_options = max_restarts(ray_info)
        # In this process the model picks its device (CUDA if present); Ray's CPU actors get one thread.
        gpu = None if executor == "local" else _ray_gpus() > 0
        spec_embed, live_fp = _embed_spec(live, embed_model, embed_batch_size, gpu)
        vectors = "none"
        if want_dense:
            same_model = live_fp is not None and (embed_model is None or _fingerprint_of(spec_embed) == live_fp)
            vectors = "reuse" if same_model else "all"
            if live_fp is not None and not same_model:
                log.warning("embedding model changed (%s -> %s): every document is embedded again (cached "
                            "vectors are used where present)", live_fp.get("model"), spec_embed["model"])

        t = time.time()
        read = _map(executor, spill_chunk, [(c.to_dict(), spec.to_dict(), n_shards, work) for c in chunks])
        timings["read"] = round(time.time() - t, 2)
        t = time.time()
        analyzer = Analyzer()
        passages = _passage_settings(live)
        # A folder's files: a new modification time alone (a touch, a copy, a checkout) is no change.
        volatile = VOLATILE_FILE_FIELDS if chunks and chunks[0].kind == "files" else ()
        shard_rows = _map(executor, reindex_shard, [(s, work, vdir, staging, analyzer.config.to_dict(), vectors,
                                                     passages.enabled, volatile) for s in range(n_shards)])
        shard_rows.sort(key=lambda r: r["shard"])
        timings["diff_shards"] = round(time.time() - t, 2)
        diff = {k: sum(int(r[k]) for r in shard_rows)
                for k in ("unchanged", "fields_changed", "changed", "added", "deleted")}
        touched = sum(int(r.get("touched", 0)) for r in shard_rows)
        rebuilt = sum(1 for r in shard_rows if not r["copied"])
        n_docs = sum(int(r["n_docs"]) for r in shard_rows)
        n_rejects = collect_rejects(work, os.path.join(staging, "rejects.jsonl"))
        log.info("reindex: %d unchanged (%d with only a new modification time), %d with new fields only, %d changed, "
                 "%d added, %d deleted; %d rejected; %d of %d shards rebuilt", diff["unchanged"], touched,
                 diff["fields_changed"], diff["changed"], diff["added"], diff["deleted"], n_rejects, rebuilt, n_shards)
        if n_docs == 0:
            kept, _ = keep_rejects(work, local, staging)
            raise BuildError(f"no valid documents in {corpus}: all {sum(r['rows'] + r['rejects'] for r in read)} "
                             f"rows were rejected; nothing published. The reasons are in {kept}")
        if strict and n_rejects:
            import json
            with open(os.path.join(staging, "rejects.jsonl")) as f:
                first = [json.loads(line) for _, line in zip(range(3), f)]
            raise BuildError(f"--strict: {n_rejects} rows rejected (first: {first}); nothing published")
        no_change = not (diff["changed"] or diff["added"] or diff["deleted"] or diff["fields_changed"]) and \
            want_dense == bool(live.get("dense")) and vectors != "all"
        if no_change and not force:
            if n_rejects:
                log.warning("%d rows of %s rejected (reasons not kept: nothing was published; --force publishes "
                            "a version with its rejects.jsonl)", n_rejects, corpus)
            release_staging(staging, remove=True)
            secs = round(time.time() - t0, 2)
            return ReindexReport(None, base, root, n_docs, n_rejects, **diff, shards_rebuilt=0, n_shards=n_shards,
                                 seconds=secs, executor=executor, stage_seconds=timings, touched=touched)

        t = time.time()
        # Fields or ACLs alone changed (or --force with no change): every shard holds the live
        # version's texts in its order, so its statistics, vocabulary, doc ids and vectors are
        # the live version's files, copied rather than recomputed.
        only_fields = all(r["same_text"] for r in shard_rows) and want_dense == bool(live.get("dense")) \
            and vectors != "all"
        if only_fields:
            _copy_live_files(vdir, live, staging)
            stats = None
        else:
            term_files = [os.path.join(staging, "lexical", shard_name(s), "terms.parquet") for s in range(n_shards)]
            stats = reduce_term_stats(term_files, shard_rows, os.path.join(staging, "stats.duckdb"))
            global_terms, df, cf = load_vocabulary(os.path.join(staging, "stats.duckdb"))
            write_vocabulary(staging, global_terms, df, cf)  # the copy serving reads (pipelines.lexical.stats)
            packed = any(is_packed(os.path.join(vdir, "lexical", shard_name(s))) for s in range(n_shards))
            for s in range(n_shards):  # in the live version's postings format (plain or packed)
                finalize_shard(os.path.join(staging, "lexical", shard_name(s)), global_terms, stats.avgdl,
                               packed=packed)
            del global_terms, df, cf
            write_doc_ids(staging, n_shards)  # every doc_id and its rank in doc_id order (pipelines.store.docorder)
        timings["copy_live" if only_fields else "df_reduce"] = round(time.time() - t, 2)
        t = time.time()
        fields_section = _fields_stage(staging, n_shards, spec.fields, live)
        timings["fields"] = round(time.time() - t, 2)

        manifest = {k: v for k, v in live.items() if k not in _PUBLISH_KEYS}
        manifest.update({
            "corpus": {"source": corpus, "spec": spec.to_dict(),
                       "fingerprint": combine_fingerprints([r["fingerprint_sum"] for r in shard_rows]),
                       "n_docs": n_docs, "n_rejects": n_rejects},
            "analyzer": analyzer.describe(),
            "collection": live["collection"] if stats is None else stats.to_dict(),
            "shards": [{"shard": s, "n_docs": int(r["n_docs"]), "total_terms": int(r["total_terms"]),
                        "n_terms": int(r["n_terms"])} for s, r in enumerate(shard_rows)],
            "dense": None,
            "build": {"seconds": None, "stages": timings, "ray": ray_info},
        })
        manifest.pop("fields", None)  # the new columns' section, as the build writes it (none: no fields)
        if fields_section is not None:
            manifest["fields"] = fields_section
        vec_counts = None
        if want_dense and only_fields:  # the live vectors and FAISS shards, copied
            manifest["dense"] = live["dense"]
            vec_counts = {"reused": sum(int(r["vectors_reused"]) for r in shard_rows), "from_cache": 0, "embedded": 0}
        elif want_dense:
            t = time.time()
            manifest["dense"], vec_counts = _dense_stage(staging, work, shard_rows, spec_embed, live_fp,
                                                         vectors == "reuse", executor, embed_cache,
                                                         embed_batch_size, actor_options,
                                                         release_ray=ray_info.get("cluster") == "local",
                                                         passages=passages,
                                                         live_passages=(live.get("dense") or {}).get("passages"),
                                                         memory_budget=(live.get("dense") or {}).get("memory_budget"))
            timings["dense"] = round(time.time() - t, 2)
        if live.get("bm25_passages") and not only_fields:  # only fields: the live files were copied
            t = time.time()
            from funnel.jobs.passage_bm25 import run_passage_bm25
            # The passage BM25 index, built again from the new version's passages (its N, df and
            # avgdl are over every passage, so one edited document changes every passage's score).
            manifest["bm25_passages"] = run_passage_bm25(staging, work, n_shards,
                                                         engine="local" if executor == "local" else "auto",
                                                         num_cpus=num_cpus)
            timings["bm25_passages"] = round(time.time() - t, 2)
        manifest["reindex"] = {"base": base, **diff, "touched": touched, "shards_rebuilt": rebuilt,
                               "vectors": vec_counts}
        manifest["build"]["seconds"] = round(time.time() - t0, 2)
        version = publish_to(root, staging, manifest, keep=keep_versions)
    except BaseException:
        release_staging(staging, remove=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    secs = round(time.time() - t0, 2)
    log.info("published %s/%s (parent %s): %d docs, %d rejects, %.1fs", root, version, base, n_docs, n_rejects, secs)
    return ReindexReport(version, base, root, n_docs, n_rejects, **diff, shards_rebuilt=rebuilt, n_shards=n_shards,
                         seconds=secs, executor=executor, stage_seconds=timings,
                         rejects_path=os.path.join(root, version, "rejects.jsonl"), dense=vec_counts, touched=touched)


def _copy_live_files(vdir: str, live: dict, staging: str) -> None:
    """Copy into ``staging`` every file of the live version (its manifest's list, checked when
    the reindex began) that the shards did not write, but the stored rows, the field columns
    and the rejects, which are the new version's own."""
    for rel in live["files"]:
        dst = os.path.join(staging, rel)
        if rel.startswith(("docs/shard-", "fields/")) or rel == "rejects.jsonl" or os.path.exists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(vdir, rel), dst)


def _fields_stage(staging: str, n_shards: int, declared: dict | None, live: dict) -> dict | None:
    """Write the new version's field columns from its docs tables, as the build does; its
    manifest ``fields`` section (None: no fields).

    A declared schema (``funnel build --fields``) stays the declared one, its values checked
    as rows are read (a wrong-typed value is a reject naming the row and the field); an
    inferred one is inferred again over the new corpus, so a field that appears or whose
    values change type gets the columns a full build of that corpus would give it.
    ``acl_absent`` stays the live version's."""
    from funnel.pipelines.sources.fields import write_columns
    live_section = live.get("fields") or {}
    section = write_columns(staging, n_shards, declared, live_section.get("acl_absent", "public"))
    old, new = live_section.get("schema") or {}, (section or {}).get("schema") or {}
    if old != new:
        moved = [f"{n}: {old.get(n, 'not filterable')} -> {new.get(n, 'not filterable')}"
                 for n in sorted(old.keys() | new.keys()) if old.get(n) != new.get(n)]
        log.warning("filterable fields changed with the corpus (%s); a filter naming a field that is no longer "
                    "filterable is an error", "; ".join(moved))
    return section


def _passage_settings(live: dict):
    """How the new version splits documents: as the live version did (documents whole if its
    vectors are), or the build's default where it has no vectors."""
    from funnel.pipelines.dense.passages import PassageSettings, settings_from_manifest
    return settings_from_manifest(live["dense"].get("passages")) if live.get("dense") else PassageSettings()


def _fingerprint_of(spec: dict) -> dict:
    from funnel.pipelines.dense.embed import make_provider
    return make_provider(spec).fingerprint()


# -- command line ------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The reindex options (``funnel reindex`` and this script)."""
    p.add_argument("--index", required=True, metavar="INDEX_ROOT", help="INDEX_ROOT of a published index (the folder holding CURRENT) (required)")
    p.add_argument("--corpus", required=True, metavar="PATH",
                   help="the whole new corpus, in any format the build reads; documents absent from it are "
                        "deleted (required)")
    p.add_argument("--dense", dest="dense", action="store_true", default=None,
                   help="keep or add vectors and FAISS shards (default: as the live version)")
    p.add_argument("--no-dense", dest="dense", action="store_false", help="publish without vectors")
    p.add_argument("--keep", "--keep-versions", dest="keep_versions", type=int, default=None, metavar="N",
                   help="after publishing, delete all but the newest N versions, never the live one "
                        "(default: keep all)")
    p.add_argument("--force", action="store_true",
                   help="publish a new version even when no document was added, changed or deleted")
    p.add_argument("--strict", action="store_true", help="publish nothing if any row is rejected")
    p.add_argument("--format", dest="fmt", default=None, choices=["auto", "beir", "jsonl", "parquet", "files"],
                   help="corpus format (default: the live version's)")
    p.add_argument("--id-field", default=None, help="the document id field (default: the live version's)")
    p.add_argument("--title-field", default=None, help="the title field (default: the live version's)")
    p.add_argument("--text-field", default=None, help="the text field (default: the live version's)")
    from funnel.jobs.build_index import add_folder_arguments
    add_folder_arguments(p, reindex=True)
    p.add_argument("--embed-model", default=None,
                   help="embedding model for --dense (default: the live version's, else all-MiniLM-L6-v2); "
                        "another model re-embeds every document")
    p.add_argument("--embed-batch-size", type=int, default=64, help="documents per embedding batch")
    p.add_argument("--executor", default="auto", choices=EXECUTORS,
                   help="where the stages run: this process (local), Ray tasks (ray: every node must share "
                        "the index root's disk), or auto: ray inside a process that already runs its own Ray, "
                        "else local, also under ray job submit (default: auto)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="CPUs of a local Ray that --executor ray starts (default: all of this machine's)")
    p.add_argument("--llm", default=None, choices=["local"],
                   help="a SIRA-enriched index: enrich new and changed documents with the embedded SmolLM2 "
                        "(default: the endpoint the index was built with)")
    p.add_argument("--llm-base-url", default=None, help="a SIRA-enriched index: the OpenAI-compatible endpoint "
                                                        "for new and changed documents (default: as built)")
    p.add_argument("--llm-model", default=None, help="the model name at --llm-base-url (default: as built)")
    p.add_argument("--enrich-cache", default="default",
                   help="a SIRA-enriched index: the enrichment cache root (default: $FUNNEL_CACHE/enrichment; "
                        "'none': off)")


def describe_report(rep: ReindexReport) -> str:
    diff = (f"{rep.unchanged} unchanged, {rep.changed} changed, {rep.added} added, {rep.deleted} deleted, "
            f"{rep.n_rejects} rejected")
    if rep.fields_changed:
        diff = f"{rep.fields_changed} with new fields only (nothing analyzed or embedded), " + diff
    if rep.touched:
        diff += (f"; {rep.touched} files with only a new modification time (no change: their content is the "
                 "same, and their mtime field stays as indexed)")
    if not rep.published:
        return (f"no changes: {rep.index_root}/{rep.base_version} stays live ({diff}; {rep.seconds:.1f}s); "
                "nothing published (--force publishes anyway)")
    lines = [f"published {rep.index_root}/{rep.version} (parent {rep.base_version}): {rep.n_docs} documents; "
             f"{diff}; {rep.shards_rebuilt} of {rep.n_shards} shards rebuilt; {rep.seconds:.1f}s ({rep.executor})"]
    if rep.dense:
        lines.append(f"  dense: {rep.dense['reused']} vectors reused, {rep.dense['from_cache']} from the cache, "
                     f"{rep.dense['embedded']} embedded")
    if rep.enrichment:
        c = rep.enrichment["counts"]
        lines.append(f"  enriched index, rebuilt in full: {c['cached']} documents' phrases from the cache, "
                     f"{c['enriched']} asked of {rep.enrichment['model']}, {c['failed']} failed")
    return "\n".join(lines)


def run_from_args(a: argparse.Namespace) -> ReindexReport:
    rep = reindex(a.index, a.corpus, dense=a.dense, keep_versions=a.keep_versions, fmt=a.fmt, id_field=a.id_field,
                  title_field=a.title_field, text_field=a.text_field, strict=a.strict, force=a.force,
                  embed_model=a.embed_model, embed_batch_size=a.embed_batch_size, executor=a.executor,
                  num_cpus=a.num_cpus, llm=llm_endpoint_of(a), enrich_cache=None if a.enrich_cache == "none" else a.enrich_cache,
                  include=a.include, exclude=a.exclude, follow_links=a.follow_links)
    print(describe_report(rep))
    return rep


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(prog="reindex", description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        run_from_args(a)
    except (BuildError, FileNotFoundError, ValueError) as e:  # IndexFormatError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
