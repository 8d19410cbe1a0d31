"""Stored documents for random access (``pipelines/store/docstore.py``), end to end: what a hit, a citation and
``get_document`` read, in place of a 256-row parquet group per document.

Real indexes built with the local engine from a corpus with fields; stores damaged in place
as a failing disk would (same size and mtime).
"""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fields_corpus import write_corpus
from test_faults_served_bits import built, root  # noqa: F401 (fixtures: 1,200 documents with fields, 2 shards)
from funnel.pipelines.store.artifacts import IndexFormatError, load_manifest, read_current, write_manifest
from funnel.pipelines.store.docstore import STORE_BLOCK, store_paths
from funnel.serving.errors import IndexDamaged
from funnel.serving.search import open_index

QUERIES = ["river stone", "market signal garden", "lantern meadow thunder", "copper valley"]


def _docs_dir(root: str) -> str:
    return os.path.join(root, read_current(root), "docs")


def _without_stores(root: str) -> None:
    """The index as a build before the store wrote it: no ``.store`` files."""
    for p in glob.glob(os.path.join(_docs_dir(root), "*.store*")):
        os.remove(p)


def _answer(s, q: str) -> tuple:
    res = s.search(q, k=8, fields="*")
    return res.summary, [(h.doc_id, h.title, h.snippet, h.fields, h.passage) for h in res.hits]


def test_every_stored_document_reads_as_its_parquet_record(root, tmp_path):
    """Each shard has a store; every document (text, title, hash and fields JSON) read from it
    is what the shard's parquet file holds, and an index without stores (an older build)
    gives the same answers, summaries and fetched documents, read from parquet."""
    docs = _docs_dir(root)
    for s in range(2):
        assert all(os.path.exists(p) for p in store_paths(docs, f"shard-{s:04d}"))
    old = str(tmp_path / "old")
    shutil.copytree(root, old)
    _without_stores(old)
    with open_index(root) as new, open_index(old, verify="none") as before:
        a, b = new.index.docs, before.index.docs
        assert a._store(0, a.shard_size(0)) is not None and b._store(0, b.shard_size(0)) is None
        n = 0
        for s in range(2):
            for i in range(a.shard_size(s)):
                no = (s << 32) | i
                assert a.get(no) == b.get(no)
                assert a.fields_json(no) == b.fields_json(no)
                n += a.fields_json(no) is not None
        assert n == len(a) == 1200  # every document kept fields
        for q in QUERIES:
            assert _answer(new, q) == _answer(before, q)
        hit = new.search("river", k=1).hits[0]
        assert new.get_document(hit.doc_id) == before.get_document(hit.doc_id)


def test_a_flipped_byte_in_a_served_store_is_damage_named_not_garbage(root):
    """A store changed under a served version (same size and mtime): the query that reads the
    block fails with IndexDamaged naming the file (its block checksum), the version records
    the damage as it does for postings (the only version: nothing left to serve), and blocks
    read before stay as they were read."""
    docs = _docs_dir(root)
    store, _ = store_paths(docs, "shard-0000")
    with open_index(root) as s:
        version = s.index
        dstore = version.docs
        first = dstore.get(0)  # opens shard 0's store and reads block 0
        last = dstore.shard_size(0) - 1
        assert last // STORE_BLOCK > 0
        st = os.stat(store)
        with open(store, "r+b") as f:
            f.seek(st.st_size - 3)
            b = f.read(1)
            f.seek(st.st_size - 3)
            f.write(bytes([b[0] ^ 0x10]))
        os.utime(store, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(IndexDamaged) as e:
            dstore.get(last)
        msg = str(e.value)
        assert "docs/shard-0000.store" in msg and "checksum" in msg and "damaged" in msg, msg
        assert version.damage is not None and version.damage[0] == "docs/shard-0000.store"
        with pytest.raises(IndexFormatError, match="no index version .* can be served.*shard-0000.store"):
            s.search("river")  # the only version stops being served, as for damaged postings
        assert dstore.get(0) == first


def test_a_store_index_that_does_not_fit_its_shard_is_refused_by_name(root):
    """A block index for another document count (or a truncated store) is refused when the
    shard's store is first read, naming the file, never read past."""
    docs = _docs_dir(root)
    store, index = store_paths(docs, "shard-0001")
    offsets = np.load(index)
    np.save(index, offsets[:-1])
    with open_index(root, verify="none") as s:
        with pytest.raises(IndexFormatError, match=r"shard-0001\.store.*does not match"):
            s.index.docs.get(1 << 32)
    np.save(index, offsets)
    with open(store, "r+b") as f:
        f.truncate(os.path.getsize(store) - 1)
    with open_index(root, verify="none") as s:
        with pytest.raises(IndexFormatError, match=r"shard-0001\.store"):
            s.index.docs.get(1 << 32)


def test_a_reindex_keeps_or_writes_the_store(root, tmp_path):
    """A reindex of the same corpus copies each unchanged shard's store; one whose live shard
    has none (built before the store) gets one; either way it reads as the parquet record."""
    from funnel.jobs.reindex import reindex
    corpus = str(tmp_path / "corpus.jsonl")
    write_corpus(corpus, n_docs=1200, seed=5)  # the fixture's corpus
    live = _docs_dir(root)
    before = {p: open(p, "rb").read() for p in store_paths(live, "shard-0000")}
    m = load_manifest(os.path.dirname(live))
    for p in store_paths(live, "shard-0001"):  # shard 1 as a build before the store wrote it
        os.remove(p)
        m["files"].pop(os.path.relpath(p, os.path.dirname(live)))
    write_manifest(os.path.dirname(live), m)
    assert reindex(root, corpus, executor="local", force=True).version is not None
    new = _docs_dir(root)
    assert new != live
    assert {p: open(q, "rb").read() for p, q in zip(before, store_paths(new, "shard-0000"))} == before
    assert all(os.path.exists(p) for p in store_paths(new, "shard-0001"))
    old = str(tmp_path / "old")
    shutil.copytree(root, old)
    _without_stores(old)
    with open_index(root) as a, open_index(old, verify="none") as b:
        for q in QUERIES:
            assert _answer(a, q) == _answer(b, q)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.text(max_size=12), st.text(max_size=20), st.text(max_size=300),
                          st.one_of(st.none(), st.text(min_size=1, max_size=30))),
                max_size=2 * STORE_BLOCK + 1))
def test_a_store_gives_back_every_value_it_was_given(tmp_path_factory, docs):
    """Round trip over any documents (none, a block and one, empty titles and texts, any
    Unicode, fields or none): each value comes back as written, a missing fields JSON as None."""
    from funnel.pipelines.store.docstore import StoreReader, write_store
    d = str(tmp_path_factory.mktemp("store"))
    ids, titles, texts, fields = ([x[i] for x in docs] for i in range(4))
    hashes = [f"h{i}" for i in range(len(docs))]
    write_store(d, "shard-0000", ids, titles, texts, hashes, fields)
    r = StoreReader(*store_paths(d, "shard-0000"), len(docs))
    for i, want in enumerate(zip(ids, titles, texts, hashes, fields)):
        block, _ = r.block(i // STORE_BLOCK)
        got = tuple(block.value(c, i % STORE_BLOCK) for c in ("doc_id", "title", "text", "content_hash", "fields"))
        assert got == want
