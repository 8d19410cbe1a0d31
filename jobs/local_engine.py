"""The build's stages in this process, without Ray: the ``local`` engine of ``build_index``.

    chunks --read_chunk--> work/rows/shard-NNNN/chunk-*.parquet --build_lexical_shard--> shards
    docs/shard-NNNN.parquet --EmbedBatch--> dense/emb-NNNN.npy + ids-NNNN.npy --build_dense_index-->

The same pure functions of ``funnel.pipelines`` as the Ray engine, called in the same way
on the same rows, so the two engines publish the same files (``tests/test_build_engines.py``
compares them). What differs is only where the work runs: here one chunk and then one
shard at a time, so memory follows the largest chunk and the largest shard, as it does on
Ray, and a small corpus pays no cluster start-up and no shuffle (issue 17: ~12 s and ~1 GB
of a 14 s SciFact build).

Rows wait for their shard as Parquet files under the build's work folder: a chunk's rows
are spilled per shard as soon as it is read, and each shard reads back only its own.
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from funnel.pipelines.progress import DEFAULT_INTERVAL, ProgressLog, Status

log = logging.getLogger("funnel.build")

#: The columns of a parsed row that ``build_lexical_shard`` reads.
ROW_COLUMNS = ("doc_id", "title", "text", "content_hash", "chunk", "line", "fields")
_ROW_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()),
                         ("content_hash", pa.string()), ("chunk", pa.int64()), ("line", pa.int64()),
                         ("fields", pa.string())])  # fields: the row's other fields as JSON (pipelines.sources.fields)


def _write_chunk_rejects(work: str, chunk, res) -> None:
    """``work/rejects/chunk-NNNNNN.json``: the same file the Ray engine's read stage writes."""
    os.makedirs(os.path.join(work, "rejects"), exist_ok=True)
    with open(os.path.join(work, "rejects", f"chunk-{chunk.index:06d}.json"), "w") as f:
        json.dump({"chunk": chunk.index, "path": chunk.path, "lines": res.lines,
                   "rows": len(res.rows), "rejects": res.rejects}, f)


def split_by_shard(rows: list[dict], n_shards: int) -> list[pa.Table]:
    """A chunk's valid rows as one table per shard (``ROW_COLUMNS``; an empty table where the
    chunk has no row of that shard), in chunk order."""
    from funnel.pipelines.sources.corpus import shard_of
    by_shard: list[list[dict]] = [[] for _ in range(n_shards)]
    for r in rows:
        by_shard[shard_of(r["doc_id"], n_shards)].append(r)
    return [pa.table({c: [r.get(c) for r in part] for c in ROW_COLUMNS}, schema=_ROW_SCHEMA) for part in by_shard]


def _spill(work: str, chunk_index: int, rows: list[dict], n_shards: int) -> None:
    """Write a chunk's valid rows to ``work/rows/shard-NNNN/chunk-NNNNNN.parquet``, per shard."""
    from funnel.pipelines.lexical.shard import shard_name
    for s, table in enumerate(split_by_shard(rows, n_shards)):
        if table.num_rows:
            d = os.path.join(work, "rows", shard_name(s))
            os.makedirs(d, exist_ok=True)
            pq.write_table(table, os.path.join(d, f"chunk-{chunk_index:06d}.parquet"))


def _shard_rows(work: str, shard: int) -> pa.Table:
    """The spilled rows of ``shard`` as one Arrow table, in chunk order (an empty table for a
    shard without rows)."""
    from funnel.pipelines.lexical.shard import shard_name
    d = os.path.join(work, "rows", shard_name(shard))
    files = sorted(os.listdir(d)) if os.path.isdir(d) else []
    if not files:
        return _ROW_SCHEMA.empty_table()
    return pa.concat_tables([pq.read_table(os.path.join(d, f)) for f in files])


def run_lexical(chunks: list, spec, n_shards: int, staging: str, work: str, analyzer_cfg: dict,
                progress_seconds: float = DEFAULT_INTERVAL) -> list[dict]:
    """Read, validate and shard every chunk, then build each lexical shard; the shard summaries.

    Writes what the Ray engine writes: ``docs/`` and ``lexical/`` under ``staging``, the
    per-chunk and per-shard reject files under ``work/rejects``. Every shard in
    ``range(n_shards)`` is built, an empty one too.
    """
    from funnel.pipelines.lexical.analysis import AnalyzerConfig
    from funnel.pipelines.sources.corpus import read_chunk
    from funnel.pipelines.lexical.shard import index_shard_docs, shard_summary, write_shard_docs

    cfg = AnalyzerConfig(stopwords=analyzer_cfg["stopwords"], stemmer=analyzer_cfg["stemmer"])
    done = {"chunks": 0, "docs": 0, "rejects": 0, "indexed": 0, "shards": 0}

    def status() -> Status:
        if done["chunks"] < len(chunks):
            return Status("read + analyze", done["docs"], fraction=done["chunks"] / max(1, len(chunks)),
                          detail=f"chunk {done['chunks']} of {len(chunks)}, {done['rejects']:,} rejected")
        return Status("index shards", done["indexed"], total=done["docs"],
                      detail=f"{done['shards']} of {n_shards} shards written")

    def analyzed(n: int) -> None:
        done["indexed"] += n

    summaries = []
    with ProgressLog(status, progress_seconds, log):
        for chunk in chunks:
            res = read_chunk(chunk, spec)
            _write_chunk_rejects(work, chunk, res)
            _spill(work, chunk.index, res.rows, n_shards)
            done["chunks"] += 1
            done["docs"] += len(res.rows)
            done["rejects"] += len(res.rejects)
        for s in range(n_shards):
            rows = _shard_rows(work, s)
            docs = write_shard_docs(rows, s, staging, work)
            del rows  # not held while the shard's postings are inverted (build_lexical_shard)
            summaries.append(shard_summary(docs, index_shard_docs(s, staging, cfg, progress=analyzed)))
            done["shards"] += 1
    return summaries


def run_dense(staging: str, n_shards: int, embed_model: str | None, batch_size: int = 64,
              cache_dir: str | None = "default", n_docs: int | None = None,
              progress_seconds: float = DEFAULT_INTERVAL, passages=None, memory_budget: int | None = None,
              runtime: str = "auto") -> dict:
    """Embed ``staging/docs`` into ``staging/dense`` in this process; the manifest's ``dense`` section.

    The model runs on this process's device (CUDA when present) with its runtime's own
    thread count; batches of ``batch_size`` rows go through the same `split_batch` (with
    ``passages`` on, the default), `EmbedBatch` and embedding cache as the Ray
    engine's tasks and actors. A batch of documents is split, then its passages are embedded
    ``batch_size`` at a time: memory follows the batch, however long a document is. ``runtime``
    is ``--embed-runtime`` (``auto``: torch on CUDA, else onnxruntime).

    Progress counts passages as each ``batch_size`` of them is embedded, and a document once its
    last passage is: a batch of long documents holds thousands of passages, minutes of work.
    """
    from funnel.jobs.embed_stage import provider_spec, runtime_label
    from funnel.pipelines.dense.embed import EmbedBatch, EmbeddingCache, default_cache_root
    from funnel.pipelines.dense.passages import PassageSettings, embed_passages, passages_manifest, splitter_spec
    from funnel.pipelines.lexical.shard import shard_name
    from funnel.pipelines.dense.vectors import build_dense_index, write_dense_shard, write_passage_shard

    embed = EmbedBatch(provider_spec(embed_model, batch_size, gpu=None, runtime=runtime), cache_dir)
    fingerprint = embed.provider.fingerprint()
    passages = passages if passages is not None else PassageSettings()
    split = splitter_spec(embed.provider, passages) if passages.enabled else None
    log.info("embed: %s documents with %s in this process (%s, %s)", f"{n_docs:,}" if n_docs is not None else "all",
             fingerprint["model"], getattr(embed.provider, "device", "cpu"), runtime_label(fingerprint))
    dense_dir = os.path.join(staging, "dense")
    os.makedirs(dense_dir, exist_ok=True)
    done = {"docs": 0, "vectors": 0, "cached": 0, "embedded": 0}

    def status() -> Status:
        detail = [f"{done['vectors']:,} passages"] if split is not None else []
        detail += [f"{done['cached']:,} from the cache"] if done["cached"] else []
        return Status("embed", done["docs"], total=n_docs, detail=", ".join(detail))

    def count(vectors: int, docs: int) -> None:
        """Add ``vectors`` just embedded (or read from the cache), ``docs`` of them finishing a document."""
        done["vectors"] += vectors
        done["docs"] += docs
        done["cached"] += vectors - (embed.embedded - done["embedded"])
        done["embedded"] = embed.embedded

    with ProgressLog(status, progress_seconds, log):
        for s in range(n_shards):
            t = pq.read_table(os.path.join(staging, "docs", f"{shard_name(s)}.parquet"),
                              columns=["title", "text", "content_hash", "local_id"])
            local = t.column("local_id").to_numpy().astype(np.int64)
            cols = {c: np.asarray(t.column(c).to_pylist(), dtype=object) for c in ("title", "text", "content_hash")}
            cols["local_id"] = local
            parts, spans = [], []
            for i in range(0, len(local), batch_size):
                batch = {c: v[i:i + batch_size] for c, v in cols.items()}
                if split is not None:
                    vecs, rows = embed_passages(embed, split, batch, batch_size, progress=count)
                    spans.append(rows)
                else:
                    vecs = embed(batch)["embedding"]
                    count(len(vecs), len(vecs))
                parts.append(vecs)
            vecs = np.vstack(parts) if parts else np.zeros((0, embed.provider.dim), np.float32)
            if split is not None:
                rows = np.hstack(spans) if spans else np.zeros((4, 0), np.int64)
                write_passage_shard(dense_dir, os.path.join(staging, "passages"), s, vecs, *rows)
            else:
                write_dense_shard(dense_dir, s, vecs, (np.int64(s) << 32) | local)
    log.info("faiss: building the vector index of %d shards", n_shards)
    info = build_dense_index(dense_dir, n_shards, fingerprint=fingerprint, memory_budget=memory_budget)
    info["fingerprint"] = fingerprint
    if split is not None:
        info["passages"] = passages_manifest(split, n_docs)
    if cache_dir is not None:
        root = default_cache_root() if cache_dir == "default" else cache_dir
        EmbeddingCache(root, fingerprint).compact()  # one segment instead of one per batch
    return info


def run_enrich(staging: str, work: str, n_shards: int, settings, analyzer_cfg: dict, n_docs: int,
               cache_dir: str | None = "default", progress_seconds: float = DEFAULT_INTERVAL,
               propose=None) -> tuple[dict, dict[int, dict]]:
    """SIRA corpus enrichment of the built shards, in this process (both engines run it here).

    A second pass once the un-enriched DF is known (the DF filter needs it):

    1. per shard, phrases for every document from the cache or the LLM
       (``settings.concurrency`` requests in flight; a failure leaves the document as it is);
    2. the un-enriched df of every window of every proposed phrase: unigrams from
       ``staging/stats.duckdb``, n-grams (max_n >= 2) counted on the shards' documents;
    3. per shard, the DF filter (``df <= tau·N``, N = ``n_docs``), then the shard's postings are
       rebuilt with the kept phrases' terms appended (`rebuild_lexical_shard`).

    The LLM calls wait on the endpoint, which does the batching (vLLM/TGI on a GPU cluster),
    so a bounded thread pool here keeps it as busy as Ray actors would. Returns the
    manifest's ``enrichment`` section and, per shard, the new lexical counts; writes
    ``work/enrich/{audit,docs}-NNNN.parquet`` for `funnel.pipelines.enrich.write_audit`.
    ``propose`` replaces the LLM client (tests).
    """
    import duckdb

    from funnel.pipelines.lexical.analysis import Analyzer, AnalyzerConfig
    from funnel.pipelines.enrich import (EnrichClient, EnrichmentCache, default_cache_root, filter_phrase,
                                         injection_terms, ngram_doc_freq, propose_documents, windows)
    from funnel.pipelines.lexical.shard import flat_document, rebuild_lexical_shard, shard_name

    cfg = AnalyzerConfig(stopwords=analyzer_cfg["stopwords"], stemmer=analyzer_cfg["stemmer"])
    analyzer = Analyzer(cfg)
    cache = None
    if cache_dir is not None:
        cache = EnrichmentCache(default_cache_root() if cache_dir == "default" else cache_dir,
                                settings.model, settings.prompt_id)
    if propose is None:
        propose = EnrichClient(settings).propose
    edir = os.path.join(work, "enrich")
    os.makedirs(edir, exist_ok=True)
    counts = {"documents": 0, "cached": 0, "enriched": 0, "failed": 0, "with_kept": 0,
              "phrases_proposed": 0, "phrases_kept": 0, "phrases_rejected": 0, "terms_injected": 0}
    done = {"asked": 0}
    total = sum(pq.read_metadata(os.path.join(staging, "docs", f"{shard_name(s)}.parquet")).num_rows
                for s in range(n_shards))

    # The rate and ETA are about the documents sent to the LLM: cache hits cost nothing, so
    # they are counted up front and named in the detail, not mixed into the rate.
    hits = 0
    if cache is not None:
        for s in range(n_shards):
            hashes = pq.read_table(os.path.join(staging, "docs", f"{shard_name(s)}.parquet"),
                                   columns=["content_hash"]).column(0).to_pylist()
            hits += len(cache.get_many(hashes))

    def status() -> Status:
        return Status("enrich", done["asked"], total=total - hits,
                      detail=f"{hits:,} answered from the cache, {counts['failed']:,} failed")

    def tick(n: int, cached: bool) -> None:
        done["asked"] += 0 if cached else n

    def docs_of(s: int) -> dict:
        return pq.read_table(os.path.join(staging, "docs", f"{shard_name(s)}.parquet"),
                             columns=["doc_id", "title", "text", "content_hash"]).to_pydict()

    phrase_tokens: dict[str, tuple[str, ...]] = {}
    with ProgressLog(status, progress_seconds, log):
        for s in range(n_shards):  # 1: propose
            d = docs_of(s)
            outs = propose_documents(list(zip(d["content_hash"], d["title"], d["text"])), propose, cache,
                                     settings.concurrency, progress=tick)
            for o in outs:
                counts[o.status] += 1
                for p in o.phrases:
                    if p not in phrase_tokens:
                        phrase_tokens[p] = tuple(analyzer.analyze(p))
            with open(os.path.join(edir, f"proposals-{s:04d}.json"), "w") as f:
                json.dump([[o.status, list(o.phrases), o.error] for o in outs], f)
    counts["documents"] = total
    if cache is not None:
        cache.compact()

    # 2: un-enriched df of every window
    keys = {k for toks in phrase_tokens.values() for k in windows(toks, settings.max_n)}
    uni = [k for k in keys if " " not in k]
    con = duckdb.connect(os.path.join(staging, "stats.duckdb"), read_only=True)
    try:
        con.register("wanted", pa.table({"term": pa.array(uni, pa.string())}))
        df = dict(con.execute("SELECT t.term, t.df FROM terms t JOIN wanted w ON t.term = w.term").fetchall())
    finally:
        con.close()
    ngrams = {k for k in keys if " " in k}
    if ngrams:
        for s in range(n_shards):
            d = docs_of(s)
            df.update({k: df.get(k, 0) + v for k, v in ngram_doc_freq(
                (analyzer.analyze(flat_document(t, x)) for t, x in zip(d["title"], d["text"])),
                ngrams, settings.max_n).items()})

    def df_of(key: str) -> int:
        return int(df.get(key, 0))

    # 3: filter, inject, rebuild
    verdicts = {p: filter_phrase(toks, df_of, n_docs, settings.tau, settings.max_n)
                for p, toks in phrase_tokens.items()}
    new_rows: dict[int, dict] = {}
    for s in range(n_shards):
        d = docs_of(s)
        with open(os.path.join(edir, f"proposals-{s:04d}.json")) as f:
            outs = json.load(f)
        audit = {"doc_id": [], "phrase": [], "kept": [], "reason": [], "df": []}
        docs = {"doc_id": [], "status": [], "n_phrases": [], "n_kept": [], "error": []}
        extra: dict[int, list[str]] = {}
        for local, (doc_id, (st, phrases, err)) in enumerate(zip(d["doc_id"], outs)):
            kept = 0
            for p in phrases:
                v = verdicts[p]
                for col, val in zip(audit, (doc_id, p, v.kept, v.reason, v.df)):
                    audit[col].append(val)
                if v.kept:
                    kept += 1
                    extra.setdefault(local, []).extend(injection_terms(v.tokens, settings.max_n))
            counts["phrases_proposed"] += len(phrases)
            counts["phrases_kept"] += kept
            counts["with_kept"] += bool(kept)
            for col, val in zip(docs, (doc_id, st, len(phrases), kept, err or None)):
                docs[col].append(val)
        counts["terms_injected"] += sum(len(v) for v in extra.values())
        pq.write_table(pa.table(audit, schema=pa.schema([("doc_id", pa.string()), ("phrase", pa.string()),
                                                         ("kept", pa.bool_()), ("reason", pa.string()),
                                                         ("df", pa.int64())])),
                       os.path.join(edir, f"audit-{s:04d}.parquet"))
        pq.write_table(pa.table(docs, schema=pa.schema([("doc_id", pa.string()), ("status", pa.string()),
                                                        ("n_phrases", pa.int32()), ("n_kept", pa.int32()),
                                                        ("error", pa.string())])),
                       os.path.join(edir, f"docs-{s:04d}.parquet"))
        new_rows[s] = rebuild_lexical_shard(staging, s, extra, cfg)
    counts["phrases_rejected"] = counts["phrases_proposed"] - counts["phrases_kept"]
    if counts["failed"]:
        log.warning("enrichment: %d of %d documents failed and stay unenriched (see `funnel enrich-report`); "
                    "a rebuild retries only them", counts["failed"], total)
    log.info("enrichment: %d documents (%d from the cache, %d asked, %d failed); %d of %d phrases kept",
             total, counts["cached"], counts["enriched"], counts["failed"], counts["phrases_kept"],
             counts["phrases_proposed"])
    section = {**settings.describe(), "fields": ["lexical"], "unenriched": ["docs", "dense"],
               "injection": "kept phrases analyzed, unigrams + 2..max_n n-gram terms appended to the "
                            "document's tokens (length grows)",
               "df_filter": "keep if some 1..max_n window has df <= tau*N on the un-enriched corpus",
               "n_docs": n_docs, "counts": counts}
    if settings.base_url.startswith(("http://127.", "http://localhost")):
        section["base_url"] = "loopback"
    return section, new_rows
