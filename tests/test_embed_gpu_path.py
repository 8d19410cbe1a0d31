"""The GPU build's embedding path, run on the CPU: tokenize in one stage, run the model in another.

On a GPU the build tokenizes with ``TokenizeBatch`` (a CPU stage) and the GPU actors run only
the model (``EmbedBatch`` on ``input_ids``, ``SentenceTransformerProvider.embed_tokens``). CI
has no GPU, so these tests run that same code on the CPU and hold it to the reference,
``SentenceTransformer.encode``; the GPU figures are in bench/RESULTS.md (bench_dense.py --gpu).
"""

from __future__ import annotations

import numpy as np
import pytest

from funnel.pipelines.dense.embed import (DocumentTokenizer, EmbedBatch, SentenceTransformerProvider, TokenizeBatch,
                                    length_buckets)

TITLES = ["Rain", "", "Licences", "Long", "Short", "Spaces"]
TEXTS = ["Rain forms when water vapour in clouds condenses into droplets heavy enough to fall.",
         "",
         "The quarterly earnings report showed a rise in software licence revenue.",
         " ".join(["Glaciers retreat as summer melt outpaces winter snowfall in the Alps."] * 60),  # > 256 tokens
         "x",
         "  leading and trailing spaces  "]
SPEC = {"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2", "device": "cpu", "batch_size": 4,
        "num_threads": 2}


@pytest.fixture(scope="module")
def provider():
    return SentenceTransformerProvider("all-MiniLM-L6-v2", device="cpu", batch_size=4, num_threads=2)


@pytest.fixture(scope="module")
def reference(provider):
    """``SentenceTransformer.encode`` of ``title\\ntext``: what every path must reproduce."""
    docs = [f"{t}\n{x}" for t, x in zip(TITLES, TEXTS)]
    return provider.model.encode(docs, batch_size=4, normalize_embeddings=True, convert_to_numpy=True)


def batch(n: int | None = None) -> dict[str, np.ndarray]:
    n = len(TEXTS) if n is None else n
    return {"title": np.array(TITLES[:n], dtype=object), "text": np.array(TEXTS[:n], dtype=object),
            "shard": np.arange(n, dtype=np.int32) % 2, "local_id": np.arange(n, dtype=np.int64),
            "content_hash": np.array([f"h{i}" for i in range(n)], dtype=object)}


def test_tokenizer_matches_transformers(provider):
    spec = provider.tokenizer_spec()
    assert spec is not None and spec["max_length"] == provider.model.max_seq_length == 256
    docs = [f"{t}\n{x}" for t, x in zip(TITLES, TEXTS)]
    ids, lengths = DocumentTokenizer(**spec)(docs)
    ref = provider.model.tokenizer(docs, padding=True, truncation="longest_first", return_tensors="np")
    np.testing.assert_array_equal(lengths, ref["attention_mask"].sum(axis=1))
    assert lengths.max() == 256 and ids.shape == (len(docs), 256) and ids.dtype == np.uint16
    for row, n in enumerate(lengths):
        np.testing.assert_array_equal(ids[row, :n], ref["input_ids"][row, :n])
        assert (ids[row, n:] == spec["pad_id"]).all()


def test_length_buckets_cover_each_row_once_longest_first():
    lengths = np.array([5, 9, 1, 9, 3, 7, 2])
    buckets = length_buckets(lengths, 3)
    assert [len(b) for b in buckets] == [3, 3, 1]
    np.testing.assert_array_equal(np.sort(np.concatenate(buckets)), np.arange(len(lengths)))
    flat = lengths[np.concatenate(buckets)]
    assert (np.diff(flat) <= 0).all()  # each batch pads only to its own longest row
    assert length_buckets(np.array([], dtype=int), 3) == []


def test_embed_documents_equals_encode(provider, reference):
    docs = [f"{t}\n{x}" for t, x in zip(TITLES, TEXTS)]
    got = provider.embed_documents(docs)
    assert got.dtype == np.float32 and got.shape == reference.shape
    np.testing.assert_allclose(got, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert provider.embed_documents([]).shape == (0, 384)


def test_tokenize_stage_then_model_stage_equals_encode(provider, reference):
    tokens = TokenizeBatch(provider.tokenizer_spec())(batch())
    assert "text" not in tokens and "title" not in tokens  # the GPU stage gets token ids, not text
    assert tokens["input_ids"].shape == (len(TEXTS), 256)
    out = EmbedBatch(SPEC)(tokens)
    assert set(out) == {"shard", "local_id", "content_hash", "embedding"}  # token columns dropped
    np.testing.assert_array_equal(out["local_id"], np.arange(len(TEXTS)))
    np.testing.assert_allclose(out["embedding"], reference, atol=1e-5)
    np.testing.assert_allclose(EmbedBatch(SPEC)(batch())["embedding"], reference, atol=1e-5)  # text path


def test_tokenized_batches_use_the_embedding_cache(provider, reference, tmp_path):
    fn = EmbedBatch(SPEC, cache_dir=str(tmp_path))
    tokenize = TokenizeBatch(provider.tokenizer_spec())
    first = fn(tokenize(batch(3)))["embedding"]  # rows 0-2 embedded and cached
    assert fn.embedded == 3
    both = fn(tokenize(batch()))["embedding"]  # rows 0-2 from the cache, 3-5 run through the model
    assert fn.embedded == 3 + (len(TEXTS) - 3)
    np.testing.assert_allclose(first, reference[:3], atol=1e-5)
    np.testing.assert_allclose(both, reference, atol=1e-5)


def test_gpu_actor_layout():
    """Two embedding actors share each GPU by default (each reserves half of it)."""
    from funnel.jobs.embed_stage import gpu_actors

    assert gpu_actors(1) == (2, {"num_gpus": 0.5})
    assert gpu_actors(4) == (8, {"num_gpus": 0.5})
    assert gpu_actors(3, per_gpu=1) == (3, {"num_gpus": 1.0})


@pytest.mark.parametrize("n_actors", [1, 2])
def test_ray_stage_with_tokenize_stage_equals_encode(ray_session, provider, reference, n_actors):
    """The build's wiring (``embed_dataset``) with the tokenize stage the GPU build adds, on CPU
    actors; two embedding actors is the GPU build's layout (two per GPU), one the single-actor one."""
    import ray

    from funnel.jobs.embed_stage import embed_dataset

    ds = ray.data.from_items([{k: v[i] for k, v in batch().items()} for i in range(len(TEXTS))],
                             override_num_blocks=3)
    ds = embed_dataset(ds, SPEC, batch_size=2, n_actors=n_actors, actor_resources={"num_cpus": 0.25},
                       tokenizer=provider.tokenizer_spec(), tokenize_actors=1)
    rows = ds.select_columns(["local_id", "embedding"]).take_all()
    got = np.stack([r["embedding"] for r in sorted(rows, key=lambda r: r["local_id"])])
    np.testing.assert_allclose(got, reference, atol=1e-5)
