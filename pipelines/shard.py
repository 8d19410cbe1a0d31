"""Building one lexical shard from its rows: dedupe, analyze, invert, write.

Pure (no Ray): the build job calls `build_lexical_shard` once per hash partition,
and tests call it directly. Duplicate ids inside a shard (all copies of an id hash to the
same shard) keep the first occurrence in corpus order; later ones become rejects.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .analysis import Analyzer, AnalyzerConfig
from .artifacts import DOCS_ROW_GROUP
from .docstore import write_store
from .postings import PostingsBuilder, write_shard

#: Documents analyzed between two ``progress`` calls of `build_lexical_shard`.
PROGRESS_EVERY = 1000


def shard_name(shard: int) -> str:
    return f"shard-{shard:04d}"


def build_lexical_shard(rows: dict, shard: int, out_dir: str, work_dir: str,
                        analyzer_config: AnalyzerConfig | None = None,
                        progress: Callable[[int], None] | None = None) -> dict:
    """Write ``docs/shard-NNNN.parquet`` and ``lexical/shard-NNNN/`` under ``out_dir``.

    ``rows`` is a dict of equal-length sequences with doc_id, title, text, content_hash,
    chunk, line. Returns the shard summary (counts, per-document sums for the corpus
    fingerprint). ``progress(n)``, if given, is told every ``PROGRESS_EVERY`` documents
    analyzed (and once for the rest), so a large shard reports while it works.
    """
    analyzer = Analyzer(analyzer_config)
    n = len(rows["doc_id"])
    order = np.lexsort((np.asarray(rows["line"], dtype=np.int64), np.asarray(rows["chunk"], dtype=np.int64))) \
        if n else np.zeros(0, dtype=np.int64)
    seen: dict[str, tuple[int, int]] = {}
    keep: list[int] = []
    rejects = []
    for i in order:
        did = str(rows["doc_id"][i])
        where = (int(rows["chunk"][i]), int(rows["line"][i]))
        if did in seen:
            rejects.append({"chunk": where[0], "line": where[1], "doc_id": did,
                            "reason": "duplicate id", "first": list(seen[did])})
            continue
        seen[did] = where
        keep.append(int(i))
    doc_ids = [str(rows["doc_id"][i]) for i in keep]
    titles = [str(rows["title"][i]) for i in keep]
    texts = [str(rows["text"][i]) for i in keep]
    hashes = [str(rows["content_hash"][i]) for i in keep]
    builder = PostingsBuilder()  # each document's tokens are inverted and dropped at once
    for i, (t, x) in enumerate(zip(titles, texts), start=1):
        builder.add_text(flat_document(t, x), analyzer)
        if progress is not None and i % PROGRESS_EVERY == 0:
            progress(PROGRESS_EVERY)
    if progress is not None and len(texts) % PROGRESS_EVERY:
        progress(len(texts) % PROGRESS_EVERY)
    post = builder.finish()
    name = shard_name(shard)
    write_shard(os.path.join(out_dir, "lexical", name), post)
    os.makedirs(os.path.join(out_dir, "docs"), exist_ok=True)
    table = pa.table({
        "doc_id": pa.array(doc_ids, pa.string()), "title": pa.array(titles, pa.string()),
        "text": pa.array(texts, pa.string()), "content_hash": pa.array(hashes, pa.string()),
        "shard": pa.array(np.full(len(keep), shard, dtype=np.int32)),
        "local_id": pa.array(np.arange(len(keep), dtype=np.int32)),
    })
    fields = rows.get("fields")
    kept_fields = None
    if fields is not None and any(fields[i] is not None for i in keep):  # kept fields (pipelines.fields)
        kept_fields = [fields[i] for i in keep]
        table = table.append_column("fields", pa.array(kept_fields, pa.string()))
    pq.write_table(table, os.path.join(out_dir, "docs", f"{name}.parquet"), row_group_size=DOCS_ROW_GROUP)
    write_store(os.path.join(out_dir, "docs"), name, doc_ids, titles, texts, hashes, kept_fields)
    os.makedirs(os.path.join(work_dir, "rejects"), exist_ok=True)
    with open(os.path.join(work_dir, "rejects", f"{name}.json"), "w") as f:
        json.dump(rejects, f)
    return {"shard": shard, "n_docs": len(keep),
            "n_docs_nonempty": int(np.count_nonzero(post.doclen)),
            "total_terms": post.total_terms, "n_terms": len(post.terms),
            "fingerprint_sum": corpus_fingerprint_part(doc_ids, hashes)}


def flat_document(title: str, text: str) -> str:
    """The indexed text: Pyserini's BEIR "flat" document, title and text joined by a newline."""
    return f"{title}\n{text}" if title else text


def rebuild_lexical_shard(out_dir: str, shard: int, extra_tokens: dict[int, list[str]],
                          analyzer_config: AnalyzerConfig | None = None) -> dict:
    """Rewrite ``lexical/shard-NNNN/`` from ``docs/shard-NNNN.parquet`` with ``extra_tokens[local_id]``
    appended to those documents' analyzed tokens (SIRA corpus enrichment); the new counts.

    The stored documents, their order and local ids are unchanged; the returned dict has the
    lexical keys of `build_lexical_shard`'s summary (n_docs, n_docs_nonempty,
    total_terms, n_terms), which replace the un-enriched ones.
    """
    analyzer = Analyzer(analyzer_config)
    name = shard_name(shard)
    t = pq.read_table(os.path.join(out_dir, "docs", f"{name}.parquet"), columns=["title", "text", "local_id"])
    order = t.column("local_id").to_pylist()
    if order != list(range(len(order))):
        raise RuntimeError(f"{name}: local ids of the stored documents are not 0..n-1")
    builder = PostingsBuilder()
    for i, (ti, x) in enumerate(zip(t.column("title").to_pylist(), t.column("text").to_pylist())):
        builder.add(analyzer.analyze(flat_document(ti, x)) + list(extra_tokens.get(i, ())))
    post = builder.finish()
    write_shard(os.path.join(out_dir, "lexical", name), post)
    return {"n_docs": post.n_docs, "n_docs_nonempty": int(np.count_nonzero(post.doclen)),
            "total_terms": post.total_terms, "n_terms": len(post.terms)}


def corpus_fingerprint_part(doc_ids: list[str], hashes: list[str]) -> str:
    """Order-independent digest of (doc_id, content_hash) pairs: a sum mod 2**128, as hex.

    Summing per-shard parts gives the same corpus fingerprint whatever the shard count.
    """
    import hashlib
    total = 0
    for d, h in zip(doc_ids, hashes):
        total += int.from_bytes(hashlib.sha256(f"{d}\x1f{h}".encode()).digest()[:16], "big")
    return f"{total % (1 << 128):032x}"


def combine_fingerprints(parts: list[str]) -> str:
    return f"{sum(int(p, 16) for p in parts) % (1 << 128):032x}"
