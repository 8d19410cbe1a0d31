"""Block maxima stored by the build (``pipelines.lexical.postings.write_block_maxima``): the bits
serving would compute, read (memory-mapped) instead of computed at the first pruning query,
and ignored, never trusted, when they were computed for another avgdl or block layout."""

from __future__ import annotations

import os

import numpy as np
import pytest

from funnel.pipelines.lexical.postings import BLOCK_FILES, load_block_maxima
from funnel.pipelines.lexical.shard import shard_name
from funnel.serving import kernels
from funnel.serving.lexical.retriever import _DEFAULT, block_maxima_key
from funnel.serving.search import open_index

QUERIES = ["anemia iron deficiency", "blood cells", "vitamin", "fatigue and sleep", "heart disease risk"]


def _computed(ix, s):
    shard = ix.index.shards[s]
    den, itab = ix.bm25._table(_DEFAULT)
    return kernels.block_maxima(shard.indptr, shard.docs, shard.tfs, shard.norms, den, itab, kernels.BLOCK)


@pytest.mark.parametrize("fixture", ["demo_index_1", "demo_index_4"])
def test_the_build_stores_the_block_maxima_serving_computes(request, fixture):
    ix = open_index(request.getfixturevalue(fixture))
    for s in range(ix.index.n_shards):
        d = os.path.join(ix.index.dir, "lexical", shard_name(s))
        assert all(n in ix.index.manifest["files"] for n in
                   (f"lexical/{shard_name(s)}/{f}" for f in BLOCK_FILES))  # published and verified
        key, stored = load_block_maxima(d)
        assert key == block_maxima_key(ix.index.avgdl)
        exact = _computed(ix, s)
        for a, b, dt in zip(stored, kernels.block_bounds32(exact), kernels.BLOCK_DTYPES):
            assert a.dtype == dt and np.array_equal(a, b)  # the bits serving rounds its own to
        bstart, bmax, tmax, tkth, blast = stored
        assert np.array_equal(bstart, exact[0]) and np.array_equal(blast, exact[4])
        # float32, rounded outward: the maxima stay upper bounds, the k-th maxima lower ones,
        # each within a float32 step of the exact float64
        for got, want, up in ((bmax, exact[1], True), (tmax, exact[2], True), (tkth, exact[3], False)):
            got = np.asarray(got, dtype=np.float64)
            assert (got >= want).all() if up else (got <= want).all()
            assert np.allclose(got, want, rtol=2 ** -23, atol=0)
        assert (np.asarray(bmax, dtype=np.float64) > exact[1]).any()  # some were rounded, and up


def test_serving_reads_stored_block_maxima_and_recomputes_stale_ones(demo_index_4, monkeypatch):
    ix = open_index(demo_index_4)
    b = ix.bm25
    b.prune_min_postings = -1
    want = b.search_texts(QUERIES, 10)
    b.prune_min_postings = 0  # prune wherever the bounds allow: the block path for every query

    def refuse(*a):
        raise AssertionError("block maxima computed although the build stored them")
    monkeypatch.setattr(kernels, "block_maxima", refuse)
    got = b.search_texts(QUERIES, 10)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    mapped = {int(a.ctypes.data) for a in b._block_args[1]}
    assert any(int(st[1][1].ctypes.data) in mapped for st in (s.stored_blocks for s in ix.index.shards))
    monkeypatch.undo()

    # Stored for another avgdl (a collection that changed without its shards being finalized
    # again): serving computes its own.
    ix2 = open_index(demo_index_4)
    calls = []
    real = kernels.block_maxima
    monkeypatch.setattr(kernels, "block_maxima", lambda *a: calls.append(1) or real(*a))
    shard = ix2.index.shards[0]
    key, arrays = shard.stored_blocks
    shard.stored_blocks = ({**key, "avgdl": key["avgdl"] * 1.5}, arrays)
    ix2.bm25.prune_min_postings = 0
    got = ix2.bm25.search_texts(QUERIES, 10)
    assert all(np.array_equal(x, y) for x, y in zip(got, want)) and len(calls) == 1


def test_block_maxima_stored_before_block_last_are_not_used(demo_index_1, tmp_path):
    """An index whose shards were finalized before ``block_last.npy`` existed: its stored
    block maxima are set aside (serving computes all five arrays), never read half."""
    import shutil
    ix = open_index(demo_index_1)
    src = os.path.join(ix.index.dir, "lexical", shard_name(0))
    old = tmp_path / "shard"
    shutil.copytree(src, old)
    assert load_block_maxima(str(old)) is not None
    os.remove(old / "block_last.npy")
    assert load_block_maxima(str(old)) is None


def test_float64_block_maxima_of_builds_before_issue_50_are_still_read(demo_index_4, tmp_path, monkeypatch):
    """An index whose build stored float64 block maxima (no ``dtype`` in block_maxima.json):
    serving reads them, rounds them outward in memory, and answers as from this build's
    float32 ones, pruning or not, without computing its own."""
    import json
    import shutil

    from funnel.pipelines.lexical.postings import BLOCK_KEY_FILE
    ix = open_index(demo_index_4)
    b = ix.bm25
    b.prune_min_postings = -1
    want = b.search_texts(QUERIES, 10)
    old = tmp_path / "old"
    shutil.copytree(demo_index_4, old, symlinks=True)
    ix_old = open_index(str(old), verify="none")
    for s in range(ix_old.index.n_shards):
        d = os.path.join(ix_old.index.dir, "lexical", shard_name(s))
        for name, arr in zip(BLOCK_FILES, _computed(ix_old, s)):  # the exact float64, as builds stored them
            np.save(os.path.join(d, name), arr)
        with open(os.path.join(d, BLOCK_KEY_FILE), encoding="utf-8") as f:
            key = json.load(f)
        key.pop("dtype")
        with open(os.path.join(d, BLOCK_KEY_FILE), "w", encoding="utf-8") as f:
            json.dump(key, f)
    ix_old.close()

    def refuse(*a):
        raise AssertionError("block maxima computed although the build stored them")
    ix2 = open_index(str(old), verify="none")
    assert all(s.stored_blocks[1][1].dtype == np.float64 for s in ix2.index.shards)
    monkeypatch.setattr(kernels, "block_maxima", refuse)
    ix2.bm25.prune_min_postings = 0
    got = ix2.bm25.search_texts(QUERIES, 10)
    assert all(np.array_equal(x, y) for x, y in zip(got, want))
    assert all(a.dtype == dt for a, dt in zip(ix2.bm25._block_args[1], kernels.BLOCK_DTYPES * ix2.index.n_shards))
