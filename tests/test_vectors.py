"""FAISS shards against exact search, the dense/ directory end to end, the embedding cache.

Recall is measured on a clustered Gaussian mixture: on pure noise IVF recall is
meaningless (DESIGN.md), and real embeddings are clustered.
"""

from __future__ import annotations

import json
import os
import threading

import faiss
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel.pipelines.dense.embed import EmbedBatch, EmbeddingCache, SentenceTransformerProvider, fingerprint_key
from funnel.pipelines.dense.vectors import (VectorSpool, build_dense_index, build_shard_index, choose_nlist,
                                      default_nprobe, read_index, search_shards, train_quantizer,
                                      write_dense_shard, write_index)
from funnel.serving.dense import DenseIndex, check_fingerprint

ST_SPEC = {"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2", "device": "cpu"}


def clustered(n: int, dim: int, n_clusters: int, spread: float, seed: int) -> np.ndarray:
    """Unit vectors from a Gaussian mixture (centres ~N(0, I), noise ~N(0, spread² I))."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, n_clusters, n)] + spread * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_topk(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The slow obvious oracle: full inner-product matrix, argsort."""
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


def docnos(shard: int, n: int) -> np.ndarray:
    return (np.int64(shard) << 32) | np.arange(n, dtype=np.int64)


# --- nlist ------------------------------------------------------------------------------


def test_choose_nlist_formula():
    assert choose_nlist(0) == choose_nlist(49_999) == 0
    assert choose_nlist(50_000) == 1024  # 4*sqrt(N) = 894 -> 1024; N/39 = 1282 -> 1024
    assert choose_nlist(1_000_000) == 4096  # 4000 -> 4096
    assert choose_nlist(100_000_000) == 32768  # 40000 -> 32768
    assert default_nprobe(1024) == 64 and default_nprobe(64) == 8 and default_nprobe(0) == 0


@given(st.integers(min_value=50_000, max_value=10**10))
@settings(max_examples=200, deadline=None)
def test_choose_nlist_is_a_power_of_two_with_enough_training_points(n):
    nlist = choose_nlist(n)
    assert nlist & (nlist - 1) == 0
    assert n >= 39 * nlist
    assert nlist <= 2 * 4 * n ** 0.5


# --- oracle tests -----------------------------------------------------------------------


def test_ivf_recall_at_default_nprobe_vs_exact():
    n, dim, k = 50_000, 64, 10
    data = clustered(n + 300, dim, n_clusters=500, spread=1.2, seed=0)
    x, q = data[:n], data[n:]
    nlist = choose_nlist(n)
    rng = np.random.default_rng(0)
    trained = train_quantizer(x[rng.choice(n, 64 * nlist if 64 * nlist < n else n, replace=False)], nlist=nlist)
    assert faiss.extract_index_ivf(trained).nprobe == default_nprobe(nlist)
    parts = np.array_split(np.arange(n), 4)  # 4 shards sharing one quantizer
    shards = [build_shard_index(trained, x[p], p.astype(np.int64)) for p in parts]
    _, got = search_shards(shards, q, k)
    truth = exact_topk(x, q, k)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(truth, got)])
    assert recall >= 0.95, f"recall@10 {recall:.3f} at nprobe {default_nprobe(nlist)}"
    _, probe1 = search_shards(shards, q, k, nprobe=1)  # nprobe is honoured per search
    assert np.mean([len(set(a) & set(b)) / k for a, b in zip(truth, probe1)]) < recall


def test_sharded_flat_equals_unsharded_flat():
    x = clustered(2_000, 32, n_clusters=20, spread=0.5, seed=1)
    q = clustered(50, 32, n_clusters=20, spread=0.5, seed=2)
    trained = train_quantizer(x, nlist=0)
    assert isinstance(trained, faiss.IndexFlat)
    one = build_shard_index(trained, x, np.arange(len(x), dtype=np.int64))
    parts = np.array_split(np.arange(len(x)), 4)
    global_of = {}
    shards = []
    for s, p in enumerate(parts):
        ids = docnos(s, len(p))
        global_of.update(zip(ids.tolist(), p.tolist()))
        shards.append(build_shard_index(trained, x[p], ids))
    d1, i1 = search_shards([one], q, 10)
    d4, i4 = search_shards(shards, q, 10)
    np.testing.assert_array_equal(np.vectorize(global_of.get)(i4), i1)
    np.testing.assert_allclose(d4, d1, rtol=1e-6)
    np.testing.assert_array_equal(i1, exact_topk(x, q, 10))


def test_fewer_documents_than_k_pads_with_minus_one():
    x = clustered(3, 8, 2, 0.1, seed=3)
    index = build_shard_index(train_quantizer(x, nlist=0), x, docnos(2, 3))
    scores, ids = search_shards([index, build_shard_index(train_quantizer(x, nlist=0), x[:0], x[:0, 0])], x[:1], 5)
    assert sorted(ids[0][:3]) == sorted(docnos(2, 3)) and (ids[0][3:] == -1).all()


def test_write_read_mmap_roundtrip(tmp_path):
    x = clustered(4_000, 16, 10, 0.3, seed=4)
    trained = train_quantizer(x, nlist=32)
    index = build_shard_index(trained, x, docnos(1, len(x)))
    path = str(tmp_path / "ivf-0001.faiss")
    write_index(index, path)
    assert os.listdir(tmp_path) == ["ivf-0001.faiss"]  # no temporary file left behind
    back = read_index(path, mmap=True)
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(back).invlists)
    assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.prefetch_nthread == 0  # no thread storm per call
    np.testing.assert_array_equal(search_shards([back], x[:20], 5)[1], search_shards([index], x[:20], 5)[1])
    before = faiss.omp_get_max_threads()
    np.testing.assert_array_equal(search_shards([back], x[:1], 5, threads=1)[1], search_shards([back], x[:1], 5)[1])
    assert faiss.omp_get_max_threads() == before  # the per-call thread count is restored


# --- dense/ end to end ------------------------------------------------------------------


def test_build_dense_index_ivf(tmp_path):
    x = clustered(1_500, 16, 12, 0.3, seed=5)
    parts = np.array_split(np.arange(len(x)), 3)
    for s, p in enumerate(parts):
        write_dense_shard(str(tmp_path), s, x[p], docnos(s, len(p)))
    m = build_dense_index(str(tmp_path), 3, nlist=16, seed=0)
    assert m["factory"] == "IVF16,Flat" and m["nlist"] == 16 and m["dim"] == 16 and m["metric"] == "ip"
    assert m["ntotal"] == 1_500 and m["counts"] == [len(p) for p in parts] and m["sample_size"] >= 39 * 16
    assert m["recall_at_10"] >= 0.9 and m["nprobe"] == default_nprobe(16)
    json.dumps(m)
    for s in range(3):
        ix = read_index(str(tmp_path / f"ivf-{s:04d}.faiss"))
        assert ix.ntotal == len(parts[s])
        _, ids = search_shards([ix], x[parts[s]], 1, nprobe=16)
        np.testing.assert_array_equal(ids[:, 0], docnos(s, len(parts[s])))  # stored under their docnos
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))


def test_build_dense_index_small_is_flat_and_exact(tmp_path):
    x = clustered(900, 16, 6, 0.3, seed=6)
    for s in range(3):
        write_dense_shard(str(tmp_path), s, x[s::3], docnos(s, len(x[s::3])))
    m = build_dense_index(str(tmp_path), 3)
    assert m["factory"] == "Flat" and m["nlist"] == 0 and m["recall_at_10"] is None
    _, ids = search_shards([read_index(str(tmp_path / f"ivf-{s:04d}.faiss")) for s in range(3)], x[:5], 10)
    to_row = lambda d: int(d & 0xFFFFFFFF) * 3 + int(d >> 32)  # noqa: E731
    np.testing.assert_array_equal(np.vectorize(to_row)(ids), exact_topk(x, x[:5], 10))


def test_write_dense_shard_rejects_nan(tmp_path):
    bad = np.ones((2, 4), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="1 embeddings contain NaN"):
        write_dense_shard(str(tmp_path), 0, bad, docnos(0, 2))
    with pytest.raises(FileNotFoundError, match="write_dense_shard for shard 0"):
        build_dense_index(str(tmp_path), 1)


def test_vector_spool_writes_each_shard_in_local_order_from_batches_in_any_order(tmp_path):
    rng = np.random.default_rng(3)
    n, dim = 500, 8
    shard = rng.integers(0, 3, n)            # shard 3 of 4 gets nothing
    local = np.zeros(n, np.int64)
    for s in range(3):
        local[shard == s] = rng.permutation(int((shard == s).sum()))
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    spool = VectorSpool(str(tmp_path / "dense"), str(tmp_path / "spill"), dim, n_shards=4)
    for part in np.array_split(rng.permutation(n), 7):   # batches mix shards, in any order
        spool.add(shard[part], local[part], vecs[part])
    infos = spool.finish()
    assert [i["count"] for i in infos] == [int((shard == s).sum()) for s in range(4)]
    assert os.listdir(tmp_path / "spill") == []
    for s in range(4):
        got = np.load(tmp_path / "dense" / f"emb-{s:04d}.npy")
        ids = np.load(tmp_path / "dense" / f"ids-{s:04d}.npy")
        sel = np.flatnonzero(shard == s)
        want = sel[np.argsort(local[sel])]
        assert np.array_equal(ids, (np.int64(s) << 32) | np.arange(len(sel)))
        assert np.array_equal(got, vecs[want].reshape(-1, dim))


def test_vector_spool_takes_rows_as_an_object_array_and_its_dim_from_the_first_batch(tmp_path):
    spool = VectorSpool(str(tmp_path / "d"), str(tmp_path / "s"))   # a reindex delta: no dim, no shard count
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    spool.add(np.array([2, 2]), np.array([1, 0]), rows)
    assert [i["shard"] for i in spool.finish()] == [2]               # only the shard seen
    assert np.array_equal(np.load(tmp_path / "d" / "emb-0002.npy"), np.array([[4, 5, 6], [1, 2, 3]], np.float32))


def test_vector_spool_refuses_a_vector_twice_and_bad_batches(tmp_path):
    spool = VectorSpool(str(tmp_path / "d"), str(tmp_path / "s"), 2)
    with pytest.raises(ValueError, match=r"expected \(n, 2\)"):
        spool.add(np.array([0]), np.array([0]), np.zeros((1, 3), np.float32))
    spool.add(np.array([5, 5]), np.array([0, 0]), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="shard 5: a document's vector arrived twice"):
        spool.finish()


@pytest.fixture(scope="module")
def st_provider():
    return SentenceTransformerProvider("all-MiniLM-L6-v2", device="cpu")


DOCS = {
    "title": np.array(["Rain", "Stocks", "Volcanoes", "Photosynthesis", None], dtype=object),
    "text": np.array(["Water vapour condenses in clouds into droplets that fall as rain.",
                      "Share prices rose after the central bank held interest rates.",
                      "Magma rises through the crust and erupts as lava.",
                      "Plants turn light, water and carbon dioxide into sugar.",
                      "An untitled note about gardening tools."], dtype=object),
    "content_hash": np.array([f"h{i}" for i in range(5)], dtype=object),
}


def test_embed_batch_on_a_plain_dict(st_provider):
    out = EmbedBatch(ST_SPEC)(dict(DOCS))
    assert set(out) == set(DOCS) | {"embedding"}
    assert out["embedding"].shape == (5, 384) and out["embedding"].dtype == np.float32
    flat = [f"{t or ''}\n{x}" for t, x in zip(DOCS["title"], DOCS["text"])]
    np.testing.assert_allclose(out["embedding"], st_provider.embed_documents(flat), atol=1e-6)


def test_embed_batch_uses_the_cache(tmp_path, st_provider):
    cache = EmbeddingCache(str(tmp_path), st_provider.fingerprint())
    marker = np.full((1, 384), 1 / np.sqrt(384), np.float32)  # no real document embeds to this
    cache.put_many(["h2"], marker)
    fn = EmbedBatch(ST_SPEC, cache_dir=str(tmp_path))
    out = fn(dict(DOCS))
    np.testing.assert_array_equal(out["embedding"][2], marker[0])
    assert fn.embedded == 4 and len(cache) == 5
    again = EmbedBatch(ST_SPEC, cache_dir=str(tmp_path))
    np.testing.assert_array_equal(again(dict(DOCS))["embedding"], out["embedding"])
    assert again.embedded == 0


def test_dense_end_to_end_with_serving(tmp_path, st_provider):
    out = EmbedBatch(ST_SPEC)(dict(DOCS))
    for s, rows in enumerate([[0, 2, 4], [1, 3]]):
        write_dense_shard(str(tmp_path), s, out["embedding"][rows], docnos(s, len(rows)))
    manifest = build_dense_index(str(tmp_path), 2, fingerprint=st_provider.fingerprint())
    dense = DenseIndex.open(str(tmp_path), manifest, st_provider)
    assert dense.ntotal == 5
    hits = dense.search("why does it rain?", k=3)
    assert hits[0][0] == docnos(0, 1)[0] and len(hits) == 3 and hits[0][1] > hits[1][1]
    batch = dense.search_batch(["why does it rain?", "how do plants make sugar"], k=1)
    assert [h[0][0] for h in batch] == [docnos(0, 1)[0], docnos(1, 2)[1]]
    other = {**st_provider.fingerprint(), "model": "BAAI/bge-base-en-v1.5", "dim": 768}
    with pytest.raises(ValueError, match="built with model BAAI/bge-base-en-v1.5 dim 768, query-time provider is "
                                         "sentence-transformers/all-MiniLM-L6-v2 dim 384.*--embed-model BAAI"):
        DenseIndex.open(str(tmp_path), {**manifest, "fingerprint": other}, st_provider)


def test_check_fingerprint_names_the_field():
    fp = {"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2", "dim": 384, "normalize": True,
          "query_prompt": "", "document_prompt": ""}
    check_fingerprint(fp, {**fp, "kind": "openai", "model": "sentence-transformers/all-MiniLM-L6-v2"})
    with pytest.raises(ValueError, match="differs: query_prompt; query_prompt: index '', provider 'query: '"):
        check_fingerprint(fp, {**fp, "query_prompt": "query: "})
    with pytest.raises(ValueError, match="differs: normalize"):
        check_fingerprint(fp, {**fp, "normalize": False})


# --- the embedding cache ----------------------------------------------------------------


FP = {"kind": "sentence-transformers", "model": "m", "dim": 8, "normalize": True,
      "query_prompt": "", "document_prompt": ""}


def test_cache_roundtrip_and_persistence(tmp_path):
    rng = np.random.default_rng(7)
    v = rng.standard_normal((6, 8)).astype(np.float32)
    c = EmbeddingCache(str(tmp_path), FP)
    assert c.put_many([f"k{i}" for i in range(4)], v[:4]) == 4
    assert c.put_many(["k3", "k4", "k4", "k5"], v[[3, 4, 4, 5]]) == 2  # k3 known, k4 once
    found, got = EmbeddingCache(str(tmp_path), FP).get_many(["k5", "nope", "k0"])  # a fresh reader
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(got[[0, 2]], v[[5, 0]])
    assert (got[1] == 0).all()
    assert os.path.isdir(tmp_path / fingerprint_key(FP))
    other = EmbeddingCache(str(tmp_path), {**FP, "query_prompt": "q: "})  # another fingerprint: a miss
    assert not other.get_many(["k0"])[0].any()
    assert c.compact() == 2 and len(EmbeddingCache(str(tmp_path), FP)) == 6
    np.testing.assert_array_equal(EmbeddingCache(str(tmp_path), FP).get_many(["k4"])[1][0], v[4])
    with pytest.raises(ValueError, match="does not match"):
        c.put_many(["x"], np.zeros((1, 4), np.float32))


def test_cache_keeps_few_segments_open_and_survives_another_process_compacting(tmp_path, monkeypatch):
    """A build writes a segment per batch; holding every segment memory-mapped (a file
    descriptor each) ran a 1M-document build out of descriptors before its final compact()."""
    from funnel.pipelines.dense import embed
    monkeypatch.setattr(embed, "OPEN_SEGMENTS", 4)
    rng = np.random.default_rng(3)
    v = rng.standard_normal((60, 8)).astype(np.float32)
    keys = [f"k{i}" for i in range(60)]
    c = EmbeddingCache(str(tmp_path), FP)
    fds = len(os.listdir("/proc/self/fd"))
    for b in range(30):
        assert c.put_many(keys[2 * b:2 * b + 2], v[2 * b:2 * b + 2]) == 2
    found, got = c.get_many(keys[::-1])
    assert found.all()
    np.testing.assert_array_equal(got, v[::-1])
    assert len(c._open) <= 4
    assert len(os.listdir("/proc/self/fd")) <= fds + 4 + 2  # the maps kept open, and slack
    # another process's compact() replaces the 30 segments with one: this reader finds every row
    assert EmbeddingCache(str(tmp_path), FP).compact() == 30
    c._open.clear()  # as after other reads: the old segments must be reopened, and are gone
    found, got = c.get_many(keys)
    assert found.all()
    np.testing.assert_array_equal(got, v)
    assert len(c) == 60


def test_cache_ignores_partial_writes_and_concurrent_writers(tmp_path):
    c = EmbeddingCache(str(tmp_path), FP)
    d = tmp_path / fingerprint_key(FP)
    (d / "seg-crashed.vec.npy.123.abc.tmp").write_bytes(b"partial")  # a writer died mid-write
    (d / "seg-torn.keys.npy").write_bytes(b"\x93NUMPY garbage")  # and a torn commit marker
    def writer(w):
        cache = EmbeddingCache(str(tmp_path), FP)  # each its own instance, as separate processes
        for b in range(10):
            keys = [f"w{w}-{b}-{i}" for i in range(5)] + [f"shared-{b}"]
            cache.put_many(keys, np.full((6, 8), w + b / 10, np.float32))
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c) == 3 * 10 * 5 + 10
    found, got = c.get_many(["w2-9-4", "shared-3"])
    assert found.all() and got[0, 0] == pytest.approx(2.9)
