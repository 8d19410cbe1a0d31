"""Block maxima stored by the build (``pipelines.postings.write_block_maxima``): the bits
serving would compute, read (memory-mapped) instead of computed at the first pruning query,
and ignored, never trusted, when they were computed for another avgdl or block layout."""

from __future__ import annotations

import os

import numpy as np
import pytest

from funnel.pipelines.postings import BLOCK_FILES, load_block_maxima
from funnel.pipelines.shard import shard_name
from funnel.serving import kernels
from funnel.serving.lexical import _DEFAULT, block_maxima_key
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
        for a, b in zip(stored, _computed(ix, s)):
            assert a.dtype == b.dtype and np.array_equal(a, b)  # the same bits


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
