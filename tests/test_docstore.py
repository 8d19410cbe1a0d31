"""The document store reads text a stored block at a time (``pipelines/store/docstore.py``), or a
parquet row group at a time for an index built before the store, and keeps a bounded number
of decoded blocks or groups: whatever the bound, every document comes back whole and correct.
Each test runs on both (``kind``): the built index, and a copy without its ``.store`` files."""

from __future__ import annotations

import glob
import math
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from funnel.jobs.build_index import build
from funnel.pipelines.store.artifacts import DOCS_ROW_GROUP
from funnel.pipelines.store.docstore import STORE_BLOCK
from funnel.serving.index import DocStore
from funnel.serving.result import split_docno

from conftest import write_jsonl

N_DOCS = 2 * DOCS_ROW_GROUP + 188  # three row groups, the last one short


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docstore")
    rows = [{"_id": f"d{i:04d}", "title": f"title {i}", "text": f"document {i} says " + "word " * (i % 17)}
            for i in range(N_DOCS)]
    corpus = write_jsonl(tmp / "corpus.jsonl", rows)
    root = str(tmp / "ix")
    build(corpus, root, shards=1, engine="local")
    with open(os.path.join(root, "CURRENT")) as f:
        vdir = os.path.join(root, f.read().strip())
    return vdir, {r["_id"]: r for r in rows}


#: Blocks (or row groups) the 700 documents make.
UNITS = {"store": math.ceil(N_DOCS / STORE_BLOCK), "parquet": 3}


@pytest.fixture(scope="module", params=["store", "parquet"])
def kind(request, built, tmp_path_factory) -> tuple[str, dict, str]:
    """(version dir, rows, "store" or "parquet"): the parquet one is a copy without stores."""
    vdir, rows = built
    if request.param == "parquet":
        old = str(tmp_path_factory.mktemp("parquet-only") / os.path.basename(vdir))
        shutil.copytree(vdir, old)
        for p in glob.glob(os.path.join(old, "docs", "*.store*")):
            os.remove(p)
        vdir = old
    return vdir, rows, request.param


def _docnos(store: DocStore) -> list[int]:
    n = len(store)
    # Interleaved across the row groups, so that a small cache keeps evicting and re-reading.
    order = sorted(range(n), key=lambda i: (i % 7, i))
    return [(0 << 32) + i for i in order]


def test_docs_file_has_row_groups_of_the_declared_size(built):
    vdir, _ = built
    md = pq.ParquetFile(os.path.join(vdir, "docs", "shard-0000.parquet")).metadata
    assert md.num_row_groups == math.ceil(N_DOCS / DOCS_ROW_GROUP) == 3
    assert [md.row_group(g).num_rows for g in range(3)] == [DOCS_ROW_GROUP, DOCS_ROW_GROUP, 188]


@pytest.mark.parametrize("cache_bytes", [1, 10 ** 9])
def test_every_document_comes_back_whole_whatever_the_cache_bound(kind, cache_bytes):
    vdir, rows, how = kind
    store = DocStore(vdir, 1, cache_bytes=cache_bytes)
    seen = set()
    for n in _docnos(store):
        d = store.get(n)
        want = rows[d["doc_id"]]
        assert (d["title"], d["text"]) == (want["title"], want["text"])
        assert (d["shard"], d["local_id"]) == split_docno(n)
        assert d["doc_id"] == store.doc_id(n)
        seen.add(d["doc_id"])
    assert seen == set(rows)
    if cache_bytes == 1:  # the bound holds: the block or group just read is all that stays
        assert len(store._groups) == 1
    else:
        assert len(store._groups) == UNITS[how]
    assert store._cached == sum(nbytes for _, nbytes in store._groups.values())


def test_a_miss_reads_only_the_block_or_row_group_it_needs(kind):
    """However large the bound, one document costs one block's (or row group's) read, never
    the shard's: the first query at 1M documents read three whole 250K-document shards
    (~1 s each) to show ten snippets."""
    vdir, rows, how = kind
    store = DocStore(vdir, 1, cache_bytes=10 ** 9)
    reads = []
    if how == "store":
        reader = store._store(0, N_DOCS)
        real_block = reader.block
        reader.block = lambda b: reads.append((0, b)) or real_block(b)
    else:
        real = store._read
        store._read = lambda shard, group: reads.append((shard, group)) or real(shard, group)
    last_unit = UNITS[how] - 1
    last = (0 << 32) + N_DOCS - 1
    assert store.get(last)["doc_id"] == f"d{N_DOCS - 1:04d}"
    assert reads == [(0, last_unit)] and list(store._groups) == [(0, last_unit)]
    assert store.get(last - 1)["text"] == rows[f"d{N_DOCS - 2:04d}"]["text"]
    assert reads == [(0, last_unit)]  # the same block or group, from the cache
    store.get(0)
    assert reads == [(0, last_unit), (0, 0)]


def test_a_local_id_past_the_shard_is_an_index_error(kind):
    vdir, _, _ = kind
    store = DocStore(vdir, 1)
    with pytest.raises(IndexError, match="has 700 documents"):
        store.get(N_DOCS)


@pytest.mark.parametrize("cache_bytes", [1, 10 ** 9])
def test_concurrent_readers_get_every_document_right(kind, cache_bytes):
    """Reads run outside the store's lock (each parquet read on a handle of its own; a stored
    block is decompressed from the shared read-only map): eight threads
    asking for every document in different orders (with a 1-byte bound every miss is a
    read, and threads often miss the same group at once) all get each document whole, the
    cache's byte count stays the sum of what it holds, and no more handles exist than the
    reads that could overlap."""
    import random
    import threading

    vdir, rows, how = kind
    store = DocStore(vdir, 1, cache_bytes=cache_bytes)
    docnos = _docnos(store)
    errors: list[str] = []
    start = threading.Barrier(8)

    def reader(seed: int) -> None:
        order = list(docnos)
        random.Random(seed).shuffle(order)
        start.wait()
        for n in order:
            d = store.get(n)
            want = rows[d["doc_id"]]
            if (d["title"], d["text"], d["local_id"]) != (want["title"], want["text"], split_docno(n)[1]):
                errors.append(f"docno {n}: got {d['doc_id']!r}")

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert 1 <= len(store._idle[0]) <= 8
    assert store._cached == sum(nbytes for _, nbytes in store._groups.values())
    assert len(store._groups) == (1 if cache_bytes == 1 else UNITS[how])


def _ids_in_docno_order(vdir: str) -> list[str]:
    t = pq.ParquetFile(os.path.join(vdir, "docs", "shard-0000.parquet")).read(columns=["doc_id"])
    return t.column("doc_id").to_pylist()


def test_the_build_stores_every_id_and_its_rank_in_doc_id_order(built):
    """``docs/ids.arrow`` holds every doc_id (docno order) and its position in Python's
    sorted order of all ids: what breaks score ties. The store memory-maps it and reads no
    doc_id column of the parquet files; a document's id also comes with its row group, and
    the ids as Python strs are made only when something needs them all."""
    import pyarrow as pa
    from funnel.pipelines.store.docorder import DOC_IDS
    from funnel.serving import index as index_mod
    vdir, rows = built
    ids = _ids_in_docno_order(vdir)
    stored = pa.ipc.open_file(os.path.join(vdir, DOC_IDS)).read_all()
    assert stored.column("doc_id").to_pylist() == ids
    assert stored.column("rank").to_pylist() == [sorted(ids).index(i) for i in ids]
    reads = []
    real = index_mod._read_parquet
    index_mod._read_parquet = lambda path, columns, **kw: reads.append(columns) or real(path, columns, **kw)
    try:
        store = DocStore(vdir, 1)
        assert store.id_rank[0].tolist() == stored.column("rank").to_pylist() and len(store) == N_DOCS
        assert store.get(5)["doc_id"] == ids[5] and _holds_no_id_objects(store)
        assert store.doc_id(7) == ids[7] and store.ids_at(np.arange(N_DOCS)).tolist() == ids
        assert reads == []
    finally:
        index_mod._read_parquet = real


def _ids_at_agree(store, ids: list[str]) -> None:
    """``ids_at`` on both its paths (each id cut from the buffers, and Arrow's take) gives
    ``ids`` at every position, negative ones too, in the positions' shape; a position out of
    range is an IndexError on both."""
    n = len(ids)
    pos = np.array([[0, n - 1, -1], [-n, n // 2, 3]])
    want = np.asarray(ids, dtype=object)
    for take_above in (128, 0):
        store.TAKE_ABOVE = take_above
        assert store.ids_at(np.arange(n)).tolist() == ids
        got = store.ids_at(pos)
        assert got.shape == pos.shape and got.tolist() == want[pos].tolist()
        assert store.ids_at(np.zeros((0, 4), np.int64)).shape == (0, 4)
        for bad in (n, -n - 1):
            with pytest.raises(IndexError, match="out of range"):
                store.ids_at([0, bad])
    del store.TAKE_ABOVE


def _holds_no_id_objects(store) -> bool:
    """Whether nothing the store keeps holds an entry per document as Python objects (a
    list, a dict or an object array of every id: ~70 bytes a document, ~200 MiB at 3M; a
    map by id ~400 MiB)."""
    return not any(isinstance(v, (list, dict, np.ndarray)) and len(v) >= len(store)
                   and (not isinstance(v, np.ndarray) or v.dtype == object) for v in vars(store).values())


def test_ids_by_position_and_by_id_never_make_every_id_a_str(built):
    """A search's doc ids, ``doc_id`` and ``doc_ids_of`` are cut from the ids file's buffers
    (``ids_at``), and ``docno_of`` / ``positions_of`` search the ids in sorted order or scan
    them in Arrow: every id is found, an id no document has (before the first, after the
    last, a prefix of one, one past one, not a str) is not, and the store never keeps every
    id as Python objects, nor does a search."""
    from funnel.serving.search import open_index
    vdir, _ = built
    ids = _ids_in_docno_order(vdir)
    store = DocStore(vdir, 1)
    _ids_at_agree(store, ids)
    assert store.doc_id(7) == ids[7] and store.doc_ids_of(np.array([3, 1])) == [ids[3], ids[1]]
    assert [store.docno_of(d) for d in ids] == list(range(N_DOCS))
    missing = ["", "\x00", min(ids)[:-1], max(ids) + "\x00", ids[3] + "0", "\U0010ffff" * 3, "\ud800", 7, None]
    assert [store.docno_of(d) for d in missing] == [None] * len(missing)
    for scan_above in (1024, 0):  # a binary search an id, and one scan of every id
        store.SCAN_ABOVE = scan_above
        asked = [ids[9], ids[2], "nope", ids[9]] + missing
        assert store.positions_of(asked).tolist() == [2, 9]
        assert store.positions_of(asked, 3, N_DOCS).tolist() == [9]  # remembered, then cut
        assert store.positions_of(asked, 0, 9).tolist() == [2]
        assert store.positions_of([ids[5]], 0, N_DOCS).tolist() == [5]
        assert store.positions_of([], 0, N_DOCS).tolist() == []
        store._last_positions = None
    assert _holds_no_id_objects(store)
    root = os.path.dirname(vdir)
    with open_index(root) as ix:
        out = ix.search_batch({"a": "document says word", "b": "word"}, k=5)
        assert out["a"] and all(d in ids for d, _ in out["a"] + out["b"])
        assert ix.search("document says word", k=3).hits
        assert ix.search("word", k=3, filter={"doc_id": {"in": ids[:3]}}).hits
        assert ix.index.docs.docno_of(ids[4]) == 4
        assert _holds_no_id_objects(ix.index.docs)


def test_id_prefixes_find_the_run_of_ids_they_begin(tmp_path):
    """``id_range`` (a doc_id ``prefix`` filter) cuts each probe's bytes from the ids' buffers:
    for ids in many scripts (UTF-8's byte order is code point order, as the ranks sort them),
    every prefix of every id, and prefixes no id has, give exactly the ids that start with
    them."""
    ids = ["a", "ab", "abc", "a\x00", "b", "Z", "é", "éa", "e\u0301", "日本", "日本語", "\U0001F600x", "\U0001F600",
           "z" * 40, "zz"]
    rows = [{"_id": d, "title": "t", "text": f"word {i}"} for i, d in enumerate(ids)]
    root = str(tmp_path / "ix")
    build(write_jsonl(tmp_path / "c.jsonl", rows), root, shards=2, engine="local")
    with open(os.path.join(root, "CURRENT")) as f:
        store = DocStore(os.path.join(root, f.read().strip()), 2)
    at = store.ids_at(np.arange(len(store))).tolist()
    order = store.sorted_positions()
    prefixes = {d[:j] for d in ids for j in range(len(d) + 1)} | {"abd", "\U0010ffff", "\ud800", "éb", "日", "Y"}
    for pre in sorted(prefixes):
        lo, hi = store.id_range(pre)
        assert sorted(at[p] for p in order[lo:hi]) == sorted(d for d in ids if d.startswith(pre)), pre


def _copy_version(vdir: str, dest) -> str:
    import shutil
    shutil.copytree(vdir, dest, ignore=shutil.ignore_patterns(".readers", ".verified"))
    return str(dest)


def test_an_index_without_the_ids_file_sorts_its_ids_at_open(built, tmp_path):
    """A version built before ``ids.arrow`` existed opens as before: it reads the doc_id
    columns and sorts them at open, to the same ranks."""
    from funnel.pipelines.store.artifacts import load_manifest, write_manifest
    from funnel.pipelines.store.docorder import DOC_IDS
    from funnel.serving.search import open_index
    vdir, _ = built
    root = tmp_path / "old"
    old = _copy_version(vdir, root / os.path.basename(vdir))
    (root / "CURRENT").write_text(os.path.basename(vdir))
    stored = DocStore(vdir, 1)
    os.remove(os.path.join(old, DOC_IDS))
    m = load_manifest(old)
    del m["files"][DOC_IDS]
    write_manifest(old, m)
    with open_index(str(root), verify="full") as ix:
        assert ix.index.docs.id_rank[0].tolist() == stored.id_rank[0].tolist()
        every = stored.ids_at(np.arange(len(stored))).tolist()
        assert ix.index.docs.ids_at(np.arange(len(stored))).tolist() == every
        assert [ix.index.docs.docno_of(d) for d in every] == list(range(len(every)))
        assert ix.search("document says word", k=3).hits
        _ids_at_agree(ix.index.docs, every)


@pytest.mark.parametrize("rows, says", [(N_DOCS - 1, "expected one row per document"),
                                        (None, "cannot be read")], ids=["short", "not-arrow"])
def test_a_damaged_ids_file_names_the_file(built, tmp_path, rows, says):
    import pyarrow as pa
    from funnel.pipelines.store.artifacts import IndexFormatError
    from funnel.pipelines.store.docorder import DOC_IDS, SCHEMA
    vdir, _ = built
    bad = _copy_version(vdir, tmp_path / "v")
    path = os.path.join(bad, DOC_IDS)
    if rows is None:
        with open(path, "wb") as f:
            f.write(b"not an arrow file")
    else:
        t = pa.table([pa.array([f"d{i}" for i in range(rows)]), pa.array(range(rows), type=pa.int64())],
                     schema=SCHEMA)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as w:
            w.write_table(t)
    with pytest.raises(IndexFormatError, match=r"ids\.arrow cannot be read .*" + says if rows else "ids.arrow cannot be read"):
        DocStore(bad, 1)


@pytest.mark.parametrize("slice_rows", [1, STORE_BLOCK, 40, 10_000])
def test_the_store_written_a_slice_at_a_time_is_the_same_bytes(built, tmp_path, slice_rows):
    """The build writes a shard's store from its Arrow table ``slice_rows`` documents at a time
    (rounded up to whole blocks), so that no Python string per document of the shard is held:
    the store and its block index are byte for byte what the whole table at once writes, and
    what the build published."""
    from funnel.pipelines.store.docstore import store_paths, write_store_table
    vdir, _ = built
    table = pq.read_table(os.path.join(vdir, "docs", "shard-0000.parquet"))
    for name, rows in (("whole", None), ("sliced", slice_rows)):
        os.makedirs(tmp_path / name)
        write_store_table(str(tmp_path / name), "shard-0000", table, slice_rows=rows)
    for whole, sliced, published in zip(store_paths(str(tmp_path / "whole"), "shard-0000"),
                                        store_paths(str(tmp_path / "sliced"), "shard-0000"),
                                        store_paths(os.path.join(vdir, "docs"), "shard-0000")):
        with open(whole, "rb") as a, open(sliced, "rb") as b, open(published, "rb") as c:
            assert a.read() == b.read() == c.read(), os.path.basename(whole)
