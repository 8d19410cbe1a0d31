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
from ..store.artifacts import DOCS_ROW_GROUP
from ..store.docstore import write_store_table
from .postings import PostingsBuilder

#: Documents analyzed between two ``progress`` calls of `build_lexical_shard`.
PROGRESS_EVERY = 1000


def shard_name(shard: int) -> str:
    return f"shard-{shard:04d}"


def build_lexical_shard(rows: dict | pa.Table, shard: int, out_dir: str, work_dir: str,
                        analyzer_config: AnalyzerConfig | None = None,
                        progress: Callable[[int], None] | None = None) -> dict:
    """Write ``docs/shard-NNNN.parquet`` and ``lexical/shard-NNNN/`` under ``out_dir``.

    ``rows`` is an Arrow table, or a dict of equal-length sequences, with doc_id, title,
    text, content_hash, chunk, line (and optionally fields). Returns the shard summary
    (counts, per-document sums for the corpus fingerprint). ``progress(n)``, if given, is told
    every ``PROGRESS_EVERY`` documents analyzed (and once for the rest), so a large shard
    reports while it works.

    `write_shard_docs` then `index_shard_docs`: a caller that can drop ``rows`` between the
    two (the build's engines do) does not hold them while the postings are inverted.
    """
    docs = write_shard_docs(rows, shard, out_dir, work_dir)
    return shard_summary(docs, index_shard_docs(shard, out_dir, analyzer_config, progress))


def shard_summary(docs: dict, lexical: dict) -> dict:
    """`build_lexical_shard`'s summary from its two halves' results."""
    return {"shard": docs["shard"], "n_docs": docs["n_docs"], **lexical, "fingerprint_sum": docs["fingerprint_sum"]}


#: Rows converted to Python strings at a time while a shard's documents are written and
#: analyzed: the shard's text stays in Arrow buffers, never a Python string per document of it.
SLICE_ROWS = 4096


def _rows_table(rows: dict | pa.Table) -> pa.Table:
    """``rows`` as a table; a dict's values as strings (``str()`` of each, as the ids and texts
    are written) and its fields column kept only where present."""
    if isinstance(rows, pa.Table):
        return rows
    cols = {c: pa.array([str(v) for v in rows[c]], pa.string()) for c in ("doc_id", "title", "text", "content_hash")}
    cols.update({c: pa.array(np.asarray(rows[c], dtype=np.int64)) for c in ("chunk", "line")})
    if rows.get("fields") is not None:
        cols["fields"] = pa.array(list(rows["fields"]), pa.string())
    return pa.table(cols)


def write_shard_docs(rows: dict | pa.Table, shard: int, out_dir: str, work_dir: str) -> dict:
    """The first half of `build_lexical_shard`: dedupe ``rows`` (the first occurrence of an id
    in corpus order wins; later ones become rejects in ``work_dir/rejects/shard-NNNN.json``)
    and write ``docs/shard-NNNN.parquet`` and the shard's document store. Returns
    ``{"shard", "n_docs", "fingerprint_sum"}``.

    The text is read from Arrow buffers ``SLICE_ROWS`` documents at a time: memory follows
    ``rows`` (Arrow, no copy unless duplicates are dropped), not a Python string per document.
    """
    table = _rows_table(rows)
    n = table.num_rows
    ids = table.column("doc_id").to_pylist()
    if n:
        chunk = np.asarray(table.column("chunk").to_numpy(), dtype=np.int64)
        line = np.asarray(table.column("line").to_numpy(), dtype=np.int64)
        order = np.lexsort((line, chunk))
    else:
        chunk = line = order = np.zeros(0, dtype=np.int64)
    seen: dict[str, tuple[int, int]] = {}
    keep: list[int] = []
    rejects = []
    for i in order:
        did = ids[i]
        where = (int(chunk[i]), int(line[i]))
        if did in seen:
            rejects.append({"chunk": where[0], "line": where[1], "doc_id": did,
                            "reason": "duplicate id", "first": list(seen[did])})
            continue
        seen[did] = where
        keep.append(int(i))
    del seen, chunk, line, order
    doc_ids = [ids[i] for i in keep]
    del ids
    if keep != list(range(n)):  # duplicates or rows out of corpus order: the kept ones, in order
        table = table.take(pa.array(keep, pa.int64()))
    hashes = table.column("content_hash").to_pylist()
    out = pa.table({
        "doc_id": table.column("doc_id"), "title": table.column("title"), "text": table.column("text"),
        "content_hash": table.column("content_hash"),
        "shard": pa.array(np.full(len(keep), shard, dtype=np.int32)),
        "local_id": pa.array(np.arange(len(keep), dtype=np.int32)),
    })
    if "fields" in table.column_names and table.column("fields").null_count < len(keep):
        out = out.append_column("fields", table.column("fields").cast(pa.string()))  # kept fields (pipelines.sources.fields)
    del table
    name = shard_name(shard)
    os.makedirs(os.path.join(out_dir, "docs"), exist_ok=True)
    pq.write_table(out, os.path.join(out_dir, "docs", f"{name}.parquet"), row_group_size=DOCS_ROW_GROUP)
    write_store_table(os.path.join(out_dir, "docs"), name, out, slice_rows=SLICE_ROWS)
    os.makedirs(os.path.join(work_dir, "rejects"), exist_ok=True)
    with open(os.path.join(work_dir, "rejects", f"{name}.json"), "w") as f:
        json.dump(rejects, f)
    return {"shard": shard, "n_docs": len(keep), "fingerprint_sum": corpus_fingerprint_part(doc_ids, hashes)}


def index_shard_docs(shard: int, out_dir: str, analyzer_config: AnalyzerConfig | None = None,
                     progress: Callable[[int], None] | None = None) -> dict:
    """The second half of `build_lexical_shard`: invert ``docs/shard-NNNN.parquet`` (as
    `write_shard_docs` wrote it, read back one row group at a time) into
    ``lexical/shard-NNNN/``; the summary's lexical counts. While the postings are inverted
    and sorted this holds them and one row group of text, nothing else of the shard."""
    # What Arrow's allocator kept of freed buffers (the rows a caller dropped: reading them
    # from Parquet took ~3x their size) goes back to the system before the postings grow.
    pa.default_memory_pool().release_unused()
    analyzer = Analyzer(analyzer_config)
    name = shard_name(shard)
    builder = PostingsBuilder()  # each document's tokens are inverted and dropped at once
    f = pq.ParquetFile(os.path.join(out_dir, "docs", f"{name}.parquet"))
    n = 0
    # Row group by row group: ``iter_batches`` kept every batch's Arrow buffers allocated until
    # the file closed (129 MiB of a 200K-document shard's text at its end, pyarrow 26).
    for g in range(f.metadata.num_row_groups):
        batch = f.read_row_group(g, columns=["title", "text"])
        for t, x in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
            builder.add_text(flat_document(t, x), analyzer)
            n += 1
            if progress is not None and n % PROGRESS_EVERY == 0:
                progress(PROGRESS_EVERY)
        del batch
    f.close()
    pa.default_memory_pool().release_unused()
    if progress is not None and n % PROGRESS_EVERY:
        progress(n % PROGRESS_EVERY)
    del analyzer  # its word cache (up to WORD_CACHE_SIZE words) is done with before the sort's peak
    post = builder.finish_to(os.path.join(out_dir, "lexical", name))
    return {"n_docs_nonempty": int(np.count_nonzero(post.doclen)),
            "total_terms": post.total_terms, "n_terms": len(post.terms)}


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
    del t, analyzer
    post = builder.finish_to(os.path.join(out_dir, "lexical", name))
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
