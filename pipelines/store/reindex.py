"""Incremental reindexing: rebuild a shard from the live version plus the new corpus's rows.

Pure (no Ray): ``jobs/reindex.py`` runs `spill_chunk` once per corpus chunk and
`reindex_shard` once per shard, in this process or as Ray tasks. Tests call them
directly.

Why the result is the full build's, byte for byte: documents go to the shard
``shard_of(doc_id)`` names (the live version's shard count), duplicates are dropped as
the build drops them (first in corpus order wins), and a shard's documents keep corpus
order, so every document gets the ``local_id`` a full build would give it. A document
whose ``content_hash`` matches the live version keeps its term counts and length, read
back from the live postings; only new and changed documents are analyzed. A document whose
text is unchanged but whose fields (an ACL, a label) differ keeps its postings and vectors too:
only its stored row is rewritten, and the field columns after it. The postings
are then re-sorted exactly as `funnel.pipelines.lexical.postings.build_postings` sorts
them (terms in code point order, doc ids ascending within a term). A shard whose
documents are all unchanged and in the same order is copied as it is.

Work files (``WORK`` is the reindex's ``INDEX_ROOT/.work-<id>``)::

    rows/shard-NNNN/chunk-CCCCCC.arrow     the new corpus's valid rows, hash-partitioned (Arrow IPC)
    rejects/chunk-CCCCCC.json, shard-NNNN.json   the build's reject files (same format)
    dense/part-NNNN.npy                    a shard's vectors reused from the live version
    dense/ppart-NNNN.npy, .spans.npy       with passages: the reused documents' passage vectors and
                                           (new local id, ordinal, char_start, char_end) rows
    delta/shard-NNNN.parquet               its documents that still need a vector
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..lexical.analysis import Analyzer, AnalyzerConfig
from .artifacts import DOCS_ROW_GROUP
from .docstore import store_paths, write_store_table
from ..sources.corpus import Chunk, CorpusSpec, read_chunk, shard_of
from ..lexical.postings import ShardPostings, add_document, load_shard, narrow_tfs, posting_files, write_shard
from ..lexical.shard import corpus_fingerprint_part, shard_name

ROW_COLUMNS = ("doc_id", "title", "text", "content_hash", "chunk", "line", "fields")
_ROW_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string()),
                         ("content_hash", pa.string()), ("chunk", pa.int64()), ("line", pa.int64()),
                         ("fields", pa.string())])  # fields: the row's other fields as canonical JSON
_DELTA_SCHEMA = pa.schema([("shard", pa.int64()), ("local_id", pa.int64()), ("title", pa.string()),
                           ("text", pa.string()), ("content_hash", pa.string())])


# -- pass 1: read the new corpus, partition its rows ---------------------------------------


def spill_chunk(chunk: dict, spec: dict, n_shards: int, work_dir: str) -> dict:
    """Read and validate one chunk; write its rows per shard and its rejects (the build's format).

    Returns ``{"chunk", "rows", "rejects"}`` counts.
    """
    c = Chunk(**chunk)
    res = read_chunk(c, CorpusSpec(**spec))
    os.makedirs(os.path.join(work_dir, "rejects"), exist_ok=True)
    with open(os.path.join(work_dir, "rejects", f"chunk-{c.index:06d}.json"), "w") as f:
        json.dump({"chunk": c.index, "path": c.path, "lines": res.lines, "rows": len(res.rows),
                   "rejects": res.rejects}, f)
    by_shard: dict[int, list[dict]] = {}
    for r in res.rows:
        by_shard.setdefault(shard_of(r["doc_id"], n_shards), []).append(r)
    for s, rows in by_shard.items():
        d = os.path.join(work_dir, "rows", shard_name(s))
        os.makedirs(d, exist_ok=True)
        table = pa.table({k: [r.get(k) for r in rows] for k in ROW_COLUMNS}, schema=_ROW_SCHEMA)
        # Arrow IPC, uncompressed: a work file read once, where Parquet's encoding costs more than it saves.
        with pa.OSFile(os.path.join(d, f"chunk-{c.index:06d}.arrow"), "wb") as sink, \
                pa.ipc.new_file(sink, _ROW_SCHEMA) as writer:
            writer.write_table(table)
    return {"chunk": c.index, "rows": len(res.rows), "rejects": len(res.rejects)}


def read_spilled_rows(work_dir: str, shard: int) -> pa.Table:
    """The rows `spill_chunk` wrote for ``shard`` (any order), one chunk per column."""
    d = os.path.join(work_dir, "rows", shard_name(shard))
    files = sorted(os.path.join(d, n) for n in os.listdir(d)) if os.path.isdir(d) else []
    tables = []
    for f in files:
        with pa.OSFile(f, "rb") as source:
            tables.append(pa.ipc.open_file(source).read_all())
    return pa.concat_tables(tables).combine_chunks() if tables else _ROW_SCHEMA.empty_table()


def dedupe_rows(rows: dict[str, Sequence] | pa.Table) -> tuple[list[int], list[dict]]:
    """Row positions to keep, in corpus order (chunk, line), and the duplicate-id rejects.

    The first occurrence of an id wins, as in `funnel.pipelines.lexical.shard.build_lexical_shard`;
    the rejects have its format (``first`` = where the kept copy is).
    """
    if isinstance(rows, pa.Table):
        rows = {"doc_id": rows.column("doc_id").to_pylist(), "chunk": rows.column("chunk").to_numpy(),
                "line": rows.column("line").to_numpy()}
    n = len(rows["doc_id"])
    if not n:
        return [], []
    chunk, line = np.asarray(rows["chunk"], dtype=np.int64), np.asarray(rows["line"], dtype=np.int64)
    order = np.lexsort((line, chunk))
    seen: dict[str, tuple[int, int]] = {}
    keep, rejects = [], []
    for i in order.tolist():
        did = str(rows["doc_id"][i])
        where = (int(chunk[i]), int(line[i]))
        if did in seen:
            rejects.append({"chunk": where[0], "line": where[1], "doc_id": did,
                            "reason": "duplicate id", "first": list(seen[did])})
            continue
        seen[did] = where
        keep.append(i)
    return keep, rejects


# -- the diff ----------------------------------------------------------------------------


def diff_documents(new_ids: Sequence[str], new_hashes: Sequence[str], old_ids: Sequence[str],
                   old_hashes: Sequence[str], new_fields: Sequence[str | None] | None = None,
                   old_fields: Sequence[str | None] | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """Match a shard's new documents against its live ones by id, content hash and fields.

    ``content_hash`` covers the title and text only; a document's fields (ACL included) are
    compared as their canonical JSON (`funnel.pipelines.sources.fields.encode_fields` sorts
    keys and fixes separators, so equal fields are equal strings). A document whose text is
    the same but whose fields differ keeps its postings and vectors (it is in ``reuse``) and
    is counted as ``fields_changed``: only its stored row and the field columns change.

    Returns
    -------
    reuse : np.ndarray of int64, shape (len(old_ids),)
        For each live document, its position among the new ones when its text is unchanged
        (same id, same content hash), else -1 (changed or deleted).
    fresh : np.ndarray of int64
        Positions of the new documents that must be analyzed (changed or added), ascending.
    counts : dict
        ``unchanged``, ``fields_changed``, ``changed``, ``added``, ``deleted``.
    """
    old_pos = {d: i for i, d in enumerate(old_ids)}
    if old_fields is not None:  # None and "" alike: no fields
        old_fields = [f or None for f in old_fields]
    reuse = np.full(len(old_ids), -1, dtype=np.int64)
    fresh, changed, added, relabeled = [], 0, 0, 0
    for j, (d, h) in enumerate(zip(new_ids, new_hashes)):
        i = old_pos.get(d)
        if i is None:
            added += 1
            fresh.append(j)
        elif old_hashes[i] != h:
            changed += 1
            fresh.append(j)
        else:
            reuse[i] = j
            if new_fields is not None and (new_fields[j] or None) != (old_fields[i] if old_fields else None):
                relabeled += 1
    kept = int((reuse >= 0).sum())
    deleted = len(old_ids) - kept - changed
    return reuse, np.asarray(fresh, dtype=np.int64), {"unchanged": kept - relabeled, "fields_changed": relabeled,
                                                      "changed": changed, "added": added, "deleted": deleted}


def keep_live_fields(new_ids: Sequence[str], new_hashes: Sequence[str], new_fields: Sequence[str | None],
                     old_ids: Sequence[str], old_hashes: Sequence[str], old_fields: Sequence[str | None],
                     volatile: Sequence[str]) -> tuple[list[str | None], int]:
    """The new documents' fields, with the live ones kept where only ``volatile`` keys differ.

    A folder's file that was touched, copied or checked out again has a new ``mtime`` and the
    same content: that is no change, so such a document keeps its live fields whole (the
    ``mtime`` of the content indexed) and `diff_documents` then counts it unchanged.
    Only documents with the same id and content hash are compared. Returns the fields and
    how many documents kept their live fields this way (``touched``)."""
    out = list(new_fields)
    if not volatile:
        return out, 0
    old_pos = {d: i for i, d in enumerate(old_ids)}
    touched = 0
    for j, (d, h) in enumerate(zip(new_ids, new_hashes)):
        i = old_pos.get(d)
        if i is None or old_hashes[i] != h or (out[j] or None) == (old_fields[i] or None):
            continue
        if not out[j] or not old_fields[i]:
            continue
        new, old = json.loads(out[j]), json.loads(old_fields[i])
        if isinstance(new, dict) and isinstance(old, dict) and \
                {k: v for k, v in new.items() if k not in volatile} == {k: v for k, v in old.items() if k not in volatile}:
            out[j] = old_fields[i]
            touched += 1
    return out, touched


# -- postings ----------------------------------------------------------------------------


def merge_postings(old_terms: np.ndarray, old: dict[str, np.ndarray], reuse: np.ndarray, n_docs: int,
                   fresh: np.ndarray, fresh_tokens: Sequence[Sequence[str]]) -> ShardPostings:
    """A shard's postings from its live postings (unchanged documents) and analyzed new ones.

    Equal, array for array, to ``build_postings`` of every document's tokens in the new
    local order: the live shard's term-major CSR is expanded to (term, doc, tf) triples,
    live doc ids are moved to their new positions (``reuse``; -1 drops a document), the
    fresh documents' term counts are added, and the triples are sorted by (term, doc)
    with the vocabulary in code point order.

    Parameters
    ----------
    old_terms : np.ndarray of object
        The live shard's sorted vocabulary (``terms.parquet``).
    old : dict
        The live shard's ``indptr``, ``docs``, ``tfs``, ``doclen`` arrays.
    reuse : np.ndarray of int64
        From `diff_documents`.
    n_docs : int
        Documents in the new shard.
    fresh, fresh_tokens
        Positions of the analyzed documents and their token lists.
    """
    indptr = np.asarray(old["indptr"], dtype=np.int64)
    old_docs = np.asarray(old["docs"], dtype=np.int64)
    term_of = np.repeat(np.arange(len(old_terms), dtype=np.int64), np.diff(indptr))
    target = reuse[old_docs] if len(old_docs) else np.zeros(0, np.int64)
    kept = target >= 0
    o_term, o_doc = term_of[kept], target[kept]
    o_tf = np.asarray(old["tfs"], dtype=np.int32)[kept]

    vocab: dict[str, int] = {}
    n_term, n_doc, n_tf = [], [], []
    doclen = np.zeros(n_docs, dtype=np.int32)
    live = reuse >= 0
    doclen[reuse[live]] = np.asarray(old["doclen"], dtype=np.int32)[live]
    for pos, toks in zip(fresh.tolist(), fresh_tokens):
        doclen[pos] = len(toks)
        add_document(vocab, pos, toks, n_term, n_doc, n_tf)
    new_terms = np.empty(len(vocab), dtype=object)
    new_terms[:] = list(vocab)
    present = np.zeros(len(old_terms), dtype=bool)
    present[o_term] = True
    used_old = np.flatnonzero(present)
    # np.unique sorts with Python's str comparison: code point order, as sorted() in build_postings.
    terms = np.unique(np.concatenate([old_terms[used_old], new_terms])) if len(used_old) or len(new_terms) \
        else np.empty(0, dtype=object)
    old_gid = np.full(len(old_terms), -1, dtype=np.int64)
    old_gid[used_old] = np.searchsorted(terms, old_terms[used_old])
    new_gid = np.searchsorted(terms, new_terms).astype(np.int64) if len(new_terms) else np.zeros(0, np.int64)
    # Sort by (term, doc) as one int64 key. The live postings are sorted by (term, live doc) and
    # term ids keep their order, so they stay sorted unless the corpus reordered documents (then
    # they are sorted again); the few fresh postings are sorted and merged in.
    width = np.int64(n_docs + 1)
    o_key = old_gid[o_term] * width + o_doc
    if len(o_key) > 1 and not (np.diff(o_key) > 0).all():
        order = np.argsort(o_key, kind="stable")
        o_key, o_tf = o_key[order], o_tf[order]
    n_key = new_gid[np.asarray(n_term, dtype=np.int64)] * width + np.asarray(n_doc, dtype=np.int64)
    order = np.argsort(n_key, kind="stable")
    n_key, n_tf = n_key[order], np.asarray(n_tf, dtype=np.int32)[order]
    at = np.searchsorted(o_key, n_key)
    key = np.insert(o_key, at, n_key)
    tf = np.insert(o_tf, at, n_tf).astype(np.int32, copy=False)
    tid, did = key // width, (key % width).astype(np.int32)
    df = np.bincount(tid, minlength=len(terms)).astype(np.int64)
    cf = np.bincount(tid, weights=tf, minlength=len(terms)).astype(np.int64)
    out_indptr = np.zeros(len(terms) + 1, dtype=np.int64)
    np.cumsum(df, out=out_indptr[1:])
    # tfs held as PostingsBuilder.finish holds them (and tfs.npy stores them)
    return ShardPostings([str(t) for t in terms], df, cf, out_indptr, did, narrow_tfs(tf), doclen)


def write_docs_table(out_dir: str, shard: int, rows: pa.Table) -> None:
    """``docs/shard-NNNN.parquet`` exactly as ``build_lexical_shard`` writes it, from ``rows``
    (doc_id, title, text, content_hash and, where any row has one, fields, in local order)."""
    os.makedirs(os.path.join(out_dir, "docs"), exist_ok=True)
    n = rows.num_rows
    table = pa.table({
        "doc_id": rows.column("doc_id"), "title": rows.column("title"), "text": rows.column("text"),
        "content_hash": rows.column("content_hash"),
        "shard": pa.array(np.full(n, shard, dtype=np.int32)),
        "local_id": pa.array(np.arange(n, dtype=np.int32)),
    })
    if "fields" in rows.column_names and rows.column("fields").null_count < n:  # as the build: only if any
        table = table.append_column("fields", rows.column("fields"))
    pq.write_table(table, os.path.join(out_dir, "docs", f"{shard_name(shard)}.parquet"), row_group_size=DOCS_ROW_GROUP)
    write_store_table(os.path.join(out_dir, "docs"), shard_name(shard), table)


# -- pass 2: one shard -------------------------------------------------------------------


def _read_live_docs(live_dir: str, shard: int) -> tuple[list[str], list[str], list[str | None]]:
    """(doc ids, content hashes, fields JSON or None) of a live shard, in local order."""
    pf = pq.ParquetFile(os.path.join(live_dir, "docs", f"{shard_name(shard)}.parquet"))
    has_fields = "fields" in pf.schema_arrow.names  # a shard none of whose documents had a field has no column
    t = pf.read(columns=["doc_id", "content_hash", "local_id"] + (["fields"] if has_fields else []))
    local = t.column("local_id").to_numpy()
    ids, hashes = t.column("doc_id").to_pylist(), t.column("content_hash").to_pylist()
    fields = t.column("fields").to_pylist() if has_fields else [None] * len(ids)
    if not np.array_equal(local, np.arange(len(local))):  # the build writes them in local order
        order = np.argsort(local, kind="stable")
        ids, hashes, fields = [ids[i] for i in order], [hashes[i] for i in order], [fields[i] for i in order]
    return ids, hashes, fields


def _live_vectors(live_dir: str, shard: int) -> tuple[np.ndarray, np.ndarray]:
    """(vectors memory-mapped, row of each live local id) of a live dense shard."""
    emb = np.load(os.path.join(live_dir, "dense", f"emb-{shard:04d}.npy"), mmap_mode="r")
    ids = np.load(os.path.join(live_dir, "dense", f"ids-{shard:04d}.npy"))
    row = np.full(int((ids & 0xFFFFFFFF).max()) + 1 if len(ids) else 0, -1, dtype=np.int64)
    row[ids & 0xFFFFFFFF] = np.arange(len(ids))
    return emb, row


def reindex_shard(shard: int, work_dir: str, live_dir: str, out_dir: str, analyzer_config: dict,
                  vectors: str = "none", passages: bool = False, volatile: Sequence[str] = ()) -> dict:
    """Rebuild shard ``shard`` of the new version in ``out_dir`` from the live version and the spill.

    ``vectors``: ``"none"`` (no dense stage), ``"reuse"`` (take unchanged documents'
    vectors from the live version's ``dense/``; the rest go to ``delta/``) or ``"all"``
    (every document goes to ``delta/``: the live version has no vectors of this model).
    ``passages``: the vectors are passages (the live version's, split the same way): an
    unchanged document keeps all its passages' vectors and spans. ``volatile``: field keys
    whose change alone is none (`keep_live_fields`; a folder's ``mtime``).

    Returns the build's shard summary (n_docs, n_docs_nonempty, total_terms, n_terms,
    fingerprint_sum) plus the diff counts, ``copied`` (the live shard was copied as it
    is), ``same_text`` (its postings were: only fields may differ) and ``to_embed`` /
    ``vectors_reused``.
    """
    spilled = read_spilled_rows(work_dir, shard)
    keep, rejects = dedupe_rows(spilled)
    os.makedirs(os.path.join(work_dir, "rejects"), exist_ok=True)
    with open(os.path.join(work_dir, "rejects", f"{shard_name(shard)}.json"), "w") as f:
        json.dump(rejects, f)
    rows = spilled.take(pa.array(keep, pa.int64())).combine_chunks()  # local order
    doc_ids, hashes = rows.column("doc_id").to_pylist(), rows.column("content_hash").to_pylist()
    old_ids, old_hashes, old_fields = _read_live_docs(live_dir, shard)
    new_fields, touched = keep_live_fields(doc_ids, hashes, rows.column("fields").to_pylist(), old_ids, old_hashes,
                                           old_fields, volatile)
    if touched:
        rows = rows.set_column(rows.schema.get_field_index("fields"), "fields", pa.array(new_fields, pa.string()))
    reuse, fresh, counts = diff_documents(doc_ids, hashes, old_ids, old_hashes, new_fields, old_fields)
    name = shard_name(shard)
    src, dst = os.path.join(live_dir, "lexical", name), os.path.join(out_dir, "lexical", name)
    same_text = doc_ids == old_ids and counts["unchanged"] + counts["fields_changed"] == len(doc_ids)
    copied = same_text and not counts["fields_changed"]
    if same_text:  # the same documents in the same order: the live postings are the new ones
        os.makedirs(dst, exist_ok=True)
        for f in posting_files(src) + ("terms.parquet",):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))
        if copied:
            os.makedirs(os.path.join(out_dir, "docs"), exist_ok=True)
            shutil.copyfile(os.path.join(live_dir, "docs", f"{name}.parquet"),
                            os.path.join(out_dir, "docs", f"{name}.parquet"))
            live_store = store_paths(os.path.join(live_dir, "docs"), name)
            if all(os.path.exists(p) for p in live_store):
                for p, q in zip(live_store, store_paths(os.path.join(out_dir, "docs"), name)):
                    shutil.copyfile(p, q)
            else:  # a shard from a build before the store: it gets one now
                write_store_table(os.path.join(out_dir, "docs"), name, rows)
        else:  # new fields (an ACL, a label) on the same texts: only the stored rows change
            write_docs_table(out_dir, shard, rows)
        doclen = np.load(os.path.join(dst, "doclen.npy"))
        n_terms = pq.ParquetFile(os.path.join(dst, "terms.parquet")).metadata.num_rows
        nonempty, total = int(np.count_nonzero(doclen)), int(doclen.sum())
    else:
        analyzer = Analyzer(AnalyzerConfig(stopwords=analyzer_config["stopwords"],
                                           stemmer=analyzer_config["stemmer"]))
        new = _texts(rows, fresh)
        tokens = [analyzer.analyze(f"{t}\n{x}" if t else x) for t, x in zip(new["title"], new["text"])]
        old_terms = np.asarray(pq.read_table(os.path.join(src, "terms.parquet"), columns=["term"])
                               .column("term").to_pylist(), dtype=object)
        old = load_shard(src, with_bounds=False)  # a packed shard's postings decoded (pipelines.lexical.postings)
        post = merge_postings(old_terms, old, reuse, len(doc_ids), fresh, tokens)
        write_shard(dst, post)
        write_docs_table(out_dir, shard, rows)
        n_terms, nonempty, total = len(post.terms), int(np.count_nonzero(post.doclen)), post.total_terms
    out = {"shard": shard, "n_docs": len(doc_ids), "n_docs_nonempty": nonempty, "total_terms": total,
           "n_terms": n_terms, "fingerprint_sum": corpus_fingerprint_part(doc_ids, hashes), **counts, "touched": touched,
           "copied": bool(copied), "same_text": bool(same_text), "to_embed": 0, "vectors_reused": 0}
    if vectors != "none":
        stage = _stage_passages if passages else _stage_vectors
        out.update(stage(shard, work_dir, live_dir, reuse, rows, reuse_live=(vectors == "reuse")))
    return out


def _texts(rows: pa.Table, positions: np.ndarray) -> dict[str, list]:
    """Title, text and content hash of the rows at ``positions``, as Python lists."""
    sel = rows.take(pa.array(positions, pa.int64()))
    return {c: sel.column(c).to_pylist() for c in ("title", "text", "content_hash")}


def _stage_vectors(shard: int, work_dir: str, live_dir: str, reuse: np.ndarray, rows: pa.Table,
                   reuse_live: bool) -> dict:
    """Write ``dense/part-NNNN.npy`` (reused vectors, zero rows elsewhere) and ``delta/``."""
    n = rows.num_rows
    need = np.ones(n, dtype=bool)
    if reuse_live:
        emb, row = _live_vectors(live_dir, shard)
        part = np.zeros((n, emb.shape[1]), dtype=np.float32)
        live = np.flatnonzero(reuse >= 0)
        live = live[(live < len(row))]
        live = live[row[live] >= 0]
        part[reuse[live]] = emb[row[live]]
        need[reuse[live]] = False
        os.makedirs(os.path.join(work_dir, "dense"), exist_ok=True)
        np.save(os.path.join(work_dir, "dense", f"part-{shard:04d}.npy"), part, allow_pickle=False)
    todo = np.flatnonzero(need)
    if len(todo):
        os.makedirs(os.path.join(work_dir, "delta"), exist_ok=True)
        table = pa.table({"shard": [shard] * len(todo), "local_id": todo.tolist(), **_texts(rows, todo)},
                         schema=_DELTA_SCHEMA)
        pq.write_table(table, os.path.join(work_dir, "delta", f"{shard_name(shard)}.parquet"))
    return {"to_embed": int(len(todo)), "vectors_reused": int(n - len(todo))}


def _stage_passages(shard: int, work_dir: str, live_dir: str, reuse: np.ndarray, rows: pa.Table,
                    reuse_live: bool) -> dict:
    """`_stage_vectors` for a passage index: the unchanged documents' passages (vectors
    and spans, renumbered to their new local ids) go to ``dense/ppart-NNNN``; the rest to
    ``delta/``, to be split and embedded (an edited document's unchanged passages then come
    from the embedding cache, keyed by passage content)."""
    from ..dense.passages import doc_pointers, read_passages
    n = rows.num_rows
    need = np.ones(n, dtype=bool)
    reused = 0
    if reuse_live:
        emb = np.load(os.path.join(live_dir, "dense", f"emb-{shard:04d}.npy"), mmap_mode="r")
        spans = read_passages(os.path.join(live_dir, "passages", f"{shard_name(shard)}.parquet"))
        ptr = doc_pointers(spans["local_id"], len(reuse))
        old = np.flatnonzero(reuse >= 0)
        take = np.concatenate([np.arange(ptr[j], ptr[j + 1]) for j in old]) if len(old) else np.zeros(0, np.int64)
        take = take.astype(np.int64)
        new_local = np.repeat(reuse[old], ptr[old + 1] - ptr[old])
        meta = np.stack([new_local, spans["ordinal"][take], spans["char_start"][take], spans["char_end"][take]],
                        axis=1).astype(np.int64)
        need[reuse[old]] = False
        reused = len(take)
        os.makedirs(os.path.join(work_dir, "dense"), exist_ok=True)
        np.save(os.path.join(work_dir, "dense", f"ppart-{shard:04d}.npy"), np.asarray(emb[take], dtype=np.float32),
                allow_pickle=False)
        np.save(os.path.join(work_dir, "dense", f"ppart-{shard:04d}.spans.npy"), meta, allow_pickle=False)
    todo = np.flatnonzero(need)
    if len(todo):
        os.makedirs(os.path.join(work_dir, "delta"), exist_ok=True)
        table = pa.table({"shard": [shard] * len(todo), "local_id": todo.tolist(), **_texts(rows, todo)},
                         schema=_DELTA_SCHEMA)
        pq.write_table(table, os.path.join(work_dir, "delta", f"{shard_name(shard)}.parquet"))
    return {"to_embed": int(len(todo)), "vectors_reused": int(reused)}


def assemble_passages(work_dir: str, shard: int, n_docs: int, dim: int, delta_dir: str) -> tuple:
    """A passage shard's (vectors, local ids, ordinals, starts, ends): the reused passages
    plus those embedded into ``delta_dir`` (``emb-/ids-NNNN.npy`` and
    ``passages/shard-NNNN.parquet``, as ``write_passage_shard`` wrote them), for
    ``write_passage_shard``. Raises RuntimeError when a document has no passage."""
    from ..dense.passages import read_passages
    vecs, meta = [np.zeros((0, dim), np.float32)], [np.zeros((0, 4), np.int64)]
    p = os.path.join(work_dir, "dense", f"ppart-{shard:04d}.npy")
    if os.path.exists(p):
        vecs.append(np.load(p))
        meta.append(np.load(os.path.join(work_dir, "dense", f"ppart-{shard:04d}.spans.npy")))
    d = os.path.join(delta_dir, f"emb-{shard:04d}.npy")
    if os.path.exists(d):
        vecs.append(np.load(d))
        sp = read_passages(os.path.join(delta_dir, "passages", f"{shard_name(shard)}.parquet"))
        meta.append(np.stack([sp[c].astype(np.int64) for c in ("local_id", "ordinal", "char_start", "char_end")],
                             axis=1))
    vecs, meta = np.vstack(vecs), np.vstack(meta)
    if vecs.shape[1] != dim or len(np.unique(meta[:, 0])) != n_docs or (n_docs and meta[:, 0].max() >= n_docs):
        missing = n_docs - len(np.unique(meta[:, 0]))
        raise RuntimeError(f"shard {shard}: {missing} of {n_docs} documents have no passage vector "
                           f"(vectors {vecs.shape}, dim {dim})")
    return (vecs, *meta.T)


def assemble_vectors(work_dir: str, shard: int, n_docs: int, dim: int,
                     delta_ids: np.ndarray | None, delta_vecs: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A shard's (vectors, docnos) in local order: the reused part plus the freshly embedded rows.

    ``delta_ids`` are docnos (``shard << 32 | local_id``) of ``delta_vecs``' rows.
    """
    p = os.path.join(work_dir, "dense", f"part-{shard:04d}.npy")
    vecs = np.load(p) if os.path.exists(p) else np.zeros((n_docs, dim), dtype=np.float32)
    filled = np.zeros(n_docs, dtype=bool)
    if os.path.exists(p):
        filled[:] = True
        d = os.path.join(work_dir, "delta", f"{shard_name(shard)}.parquet")
        if os.path.exists(d):
            filled[pq.read_table(d, columns=["local_id"]).column("local_id").to_numpy()] = False
    if delta_ids is not None and len(delta_ids):
        local = np.asarray(delta_ids, dtype=np.int64) & 0xFFFFFFFF
        vecs[local] = delta_vecs
        filled[local] = True
    if vecs.shape != (n_docs, dim) or not filled.all():
        raise RuntimeError(f"shard {shard}: {int((~filled).sum())} of {n_docs} documents have no vector "
                           f"(vectors {vecs.shape}, dim {dim})")
    return vecs, (np.int64(shard) << 32) | np.arange(n_docs, dtype=np.int64)
