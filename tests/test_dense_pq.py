"""The dense memory budget: above it the build writes IVF-PQ and serving re-scores the PQ
shortlist exactly from the float vectors on disk (``pipelines.dense.vectors``, ``serving.dense``).

Tier 2 against exhaustive MaxP scoring (NumPy over every passage): every returned document
carries its exact MaxP score, in exact-score order, and with a shortlist as deep as the
corpus the result *is* exhaustive MaxP. Then a real build (MiniLM, FAISS, Parquet, the
local engine) under a tiny budget: the manifest, citations, hybrid, reindex, and damage to
the files the re-scoring reads (checksums, structure checks, the scrub). Real components
throughout; the unit tests hand FAISS query vectors directly (the embedder is never called).
"""

from __future__ import annotations

import json
import os
import shutil
import types

import numpy as np
import pytest

from funnel.pipelines.store.artifacts import VERIFIED, IndexFormatError, load_manifest, read_current, verify_version
from funnel.pipelines.dense.vectors import (DEFAULT_MEMORY_BUDGET, ExactScorer, build_dense_index, choose_pq,
                                      flat_list_bytes, parse_memory_budget, write_passage_shard)
from funnel.serving.dense import DenseIndex

DIM = 32


def _maxp_oracle(q: np.ndarray, vecs: np.ndarray, docnos: np.ndarray) -> dict[int, float]:
    """Every passage scored with NumPy; a document's score is its best passage's."""
    best: dict[int, float] = {}
    for d, s in zip(docnos.tolist(), (vecs @ q).tolist()):
        best[d] = max(best.get(d, -np.inf), s)
    return best


def _top(best: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(best.items(), key=lambda kv: -kv[1])[:k]


def _passage_shards(dense_dir: str, pdir: str, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """180 documents of 1 to 12 passages in 3 shards (~1,200 vectors, enough to train 4-bit
    PQ codes): unit vectors around 12 topics, each document near one topic."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(12, DIM))
    all_vecs, all_docnos = [], []
    for s in range(3):
        counts = rng.integers(1, 13, size=60)
        local = np.repeat(np.arange(len(counts)), counts)
        ordinal = np.concatenate([np.arange(c) for c in counts])
        topic = rng.integers(0, 12, size=len(counts))[local]
        vecs = centers[topic] + 0.5 * rng.normal(size=(len(local), DIM))
        vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)
        perm = rng.permutation(len(local))  # arrive in any order, as batches do
        write_passage_shard(dense_dir, pdir, s, vecs[perm], local[perm], ordinal[perm], ordinal[perm] * 10,
                            ordinal[perm] * 10 + 12)
        all_vecs.append(vecs)
        all_docnos.append((s << 32) | local)
    return np.vstack(all_vecs), np.concatenate(all_docnos)


def _open(dense_dir: str, info: dict) -> DenseIndex:
    info = {**info, "passages": {"window": 256, "overlap": 0.15}}
    provider = types.SimpleNamespace(dim=DIM, name="vectors-given", fingerprint=lambda: {})
    return DenseIndex.open(dense_dir, info, provider)


@pytest.fixture(scope="module")
def pq_index(tmp_path_factory):
    root = tmp_path_factory.mktemp("pq")
    dense_dir = str(root / "dense")
    vecs, docnos = _passage_shards(dense_dir, str(root / "passages"))
    info = build_dense_index(dense_dir, 3, memory_budget="16KiB")
    return _open(dense_dir, info), info, vecs, docnos


def test_a_tiny_budget_builds_ivf_pq_with_exact_rescoring(pq_index):
    index, info, vecs, _ = pq_index
    assert flat_list_bytes(len(vecs), DIM) > 16 * 1024 == info["memory_budget"]
    m, nbits = choose_pq(len(vecs), DIM)
    assert info["factory"] == f"IVF1,PQ{m}x{nbits}" and (m, nbits) == (DIM // 4, 4)
    assert info["refine"]["scores"] == "exact" and info["refine"]["k_factor"] == 8
    assert info["list_bytes"] == len(vecs) * (m * nbits // 8 + 8) < flat_list_bytes(len(vecs), DIM)
    assert isinstance(index.scorer, ExactScorer) and index.passages.max_per_doc > 1
    assert info["recall_at_10"] >= 0.9  # the build's own check goes through the re-scoring too


@pytest.mark.parametrize("k", [1, 10, 37, 180, 200])
def test_returned_scores_are_exact_maxp_in_exact_order(pq_index, k):
    """Re-scoring is exact: each returned document's score is its MaxP score (atol 1e-5, float32
    dot products summed in another order), best first, k distinct documents; the set differs
    from exhaustive MaxP only where the PQ shortlist missed a document: recall against it at
    least 0.95, 0.7 at k=1 (a shortlist of 8 documents, for random queries between topics)."""
    index, _, vecs, docnos = pq_index
    rng = np.random.default_rng(k)
    queries = rng.normal(size=(16, DIM)).astype(np.float32)
    queries[:6] = vecs[rng.integers(0, len(vecs), size=6)]  # some sit on a passage
    scores, ids = index.search_vectors(queries, k)
    hit = total = 0
    for q, srow, irow in zip(queries, scores, ids):
        best = _maxp_oracle(q, vecs, docnos)
        got = [(int(i), float(s)) for i, s in zip(irow, srow) if i >= 0]
        assert len(got) == len({d for d, _ in got}) == min(k, 180)
        np.testing.assert_allclose([s for _, s in got], [best[d] for d, _ in got], rtol=0, atol=1e-5)
        assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        assert (irow[len(got):] == -1).all()
        want = {d for d, _ in _top(best, k)}
        hit, total = hit + len(want & {d for d, _ in got}), total + len(want)
    assert hit / total >= (0.7 if k == 1 else 0.95)


def test_a_shortlist_as_deep_as_the_corpus_is_exhaustive_maxp(pq_index):
    index, _, vecs, docnos = pq_index
    queries = np.random.default_rng(3).normal(size=(8, DIM)).astype(np.float32)
    index.scorer.k_factor = 1000
    try:
        scores, ids = index.search_vectors(queries, 10)
    finally:
        index.scorer.k_factor = 8
    for q, srow, irow in zip(queries, scores, ids):
        want = _top(_maxp_oracle(q, vecs, docnos), 10)
        assert irow.tolist() == [d for d, _ in want]
        np.testing.assert_allclose(srow, [s for _, s in want], rtol=0, atol=1e-5)


def test_best_passage_and_filters_work_on_pq(pq_index):
    """The cited passage is the one the exact score came from; a filter (a document mask, as
    every mode receives it) admits only allowed documents into the shortlist."""
    from funnel.serving.filters import Mask, scope
    index, _, vecs, docnos = pq_index
    q = vecs[100]
    (score,), (doc,) = (x[0] for x in index.search_vectors(q[None, :], 1))
    assert index.best_passage(q, int(doc))["score"] == pytest.approx(float(score), abs=1e-5)
    allow = np.arange(180) % 3 == 0  # 60 documents a shard, global position = shard * 60 + local
    with scope(Mask(allow, np.array([0, 60, 120, 180]))):
        scores, ids = index.search_vectors(vecs[:5], 10)
    pos = (ids >> 32) * 60 + (ids & 0xFFFFFFFF)
    assert (ids >= 0).all() and allow[pos].all()
    for qv, srow, irow in zip(vecs[:5], scores, ids):
        best = _maxp_oracle(qv, vecs, docnos)
        np.testing.assert_allclose(srow, [best[int(d)] for d in irow], atol=1e-5)


def test_the_default_budget_keeps_flat_and_ivf_flat(pq_index, tmp_path):
    _, _, vecs, _ = pq_index
    dense_dir = str(tmp_path / "dense")
    _passage_shards(dense_dir, str(tmp_path / "passages"))
    info = build_dense_index(dense_dir, 3)
    assert info["factory"] == "Flat" and info["refine"] is None and info["memory_budget"] == DEFAULT_MEMORY_BUDGET
    assert _open(dense_dir, info).scorer is None
    # A budget exactly at IVF-Flat's size still fits it; SciFact's passages are far below the default.
    at = flat_list_bytes(len(vecs), DIM)
    assert build_dense_index(dense_dir, 3, memory_budget=at, recall_queries=0)["refine"] is None
    assert flat_list_bytes(10_202, 384) < DEFAULT_MEMORY_BUDGET / 200
    info = build_dense_index(dense_dir, 3, nlist=8, memory_budget=at, recall_queries=0)
    assert info["factory"] == "IVF8,Flat" and info["refine"] is None


def test_too_few_vectors_to_train_pq_stay_exact(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(300, DIM)).astype(np.float32)
    from funnel.pipelines.dense.vectors import write_dense_shard
    write_dense_shard(str(tmp_path), 0, v / np.linalg.norm(v, axis=1, keepdims=True), np.arange(300))
    assert choose_pq(300, DIM) is None
    info = build_dense_index(str(tmp_path), 1, memory_budget=1024)
    assert info["factory"] == "Flat" and info["refine"] is None


@pytest.mark.parametrize("value, message", [
    ("lots", "'lots' is not a size"), ("-1GiB", "is not a size"), (0, "must be positive"),
    ("12 parsecs", "is not a size"), (True, "is not a size")])
def test_a_bad_budget_is_refused_with_the_fix(value, message, tmp_path):
    with pytest.raises(ValueError, match=message) as e:
        parse_memory_budget(value)
    assert "512MiB" in str(e.value)
    from funnel.jobs.build_index import build
    with pytest.raises(ValueError, match=message):  # before any work: the corpus is never read
        build(str(tmp_path / "missing.jsonl"), str(tmp_path / "out"), dense=True, dense_memory_budget=value)


def test_the_cli_refuses_a_bad_budget(tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    rc = main(["build", "--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o"), "--dense",
               "--dense-memory-budget", "4 gigs"])
    assert rc != 0 and "dense memory budget '4 gigs' is not a size" in capsys.readouterr().err


@pytest.mark.parametrize("value, n", [("512MiB", 512 << 20), ("4GiB", 4 << 30), ("1.5G", 3 << 29), (4096, 4096),
                                      ("10 kb", 10240), (None, DEFAULT_MEMORY_BUDGET)])
def test_budget_sizes(value, n):
    assert parse_memory_budget(value) == n


# -- a real build under a tiny budget ------------------------------------------------------


@pytest.fixture(scope="module")
def pq_build(demo_corpus, tmp_path_factory):
    """200 demo documents split into 32-token passages (over a thousand vectors, enough to
    train PQ codes), MiniLM, built in process under a 64 KiB budget."""
    from funnel.jobs.build_index import build
    from funnel.pipelines.dense.passages import PassageSettings
    tmp = tmp_path_factory.mktemp("pqbuild")
    corpus = tmp / "c.jsonl"
    with open(demo_corpus) as f, open(corpus, "w") as g:
        for _, line in zip(range(200), f):
            g.write(line)
    root = str(tmp / "ix")
    build(str(corpus), root, shards=2, dense=True, engine="local", dense_memory_budget="64KiB",
          passages=PassageSettings(window=32, split_above=1))
    return root, str(corpus)


def _vdir(root: str) -> str:
    return os.path.join(root, read_current(root))


def test_the_build_serves_exact_maxp_with_citations(pq_build):
    from funnel.serving.search import open_index
    root, _ = pq_build
    vdir = _vdir(root)
    m = load_manifest(vdir)["dense"]
    assert "PQ" in m["factory"] and m["refine"] and m["memory_budget"] == 64 * 1024
    for s in range(2):  # the files the re-scoring reads are checksummed
        assert {f"dense/emb-{s:04d}.npy", f"dense/ids-{s:04d}.npy", f"dense/ivf-{s:04d}.faiss"} <= \
            set(load_manifest(vdir)["files"])
    ix = open_index(root)
    d = ix.dense_mode.dense()
    assert d.scorer is not None
    vecs = np.vstack([np.load(os.path.join(vdir, "dense", f"emb-{s:04d}.npy")) for s in range(2)])
    docnos = np.concatenate([np.load(os.path.join(vdir, "dense", f"ids-{s:04d}.npy")) for s in range(2)])
    for q in ("parse command line arguments", "compress data with zlib", "read and write csv files"):
        best = _maxp_oracle(d.embed_query(q), vecs, docnos)
        hits = ix.search(q, mode="dense", k=5).hits
        assert len(hits) == 5
        np.testing.assert_allclose([h.score for h in hits], [best[h.docno] for h in hits], atol=1e-5)
        assert hits[0].docno == _top(best, 1)[0][0]
        c = hits[0].passage  # the citation: the best passage by dense and query terms fused
        assert "dense" in c.via.split("+") and c.text
        assert ix.search(q, mode="hybrid", k=5).hits


def test_damage_to_the_rescored_vectors_is_caught(pq_build, tmp_path):
    from funnel.serving.search import open_index
    root = str(tmp_path / "ix")
    shutil.copytree(pq_build[0], root, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    vdir = _vdir(root)
    rel = "dense/emb-0001.npy"
    path = os.path.join(vdir, rel)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF  # a flipped byte: the checksum names the file
    open(path, "wb").write(raw)
    with pytest.raises(IndexFormatError, match=rel):
        verify_version(vdir, "full")
    # A valid .npy of the wrong shape, opened without hashing: the structure check refuses it.
    emb = np.load(path)
    np.save(path, emb[:-1])
    with pytest.raises(IndexFormatError, match=f"{rel}.*expected float32"):
        open_index(root, verify="none").search("parse arguments", mode="dense", k=3)
    np.save(path, emb)
    ids_rel = "dense/ids-0001.npy"
    ids = np.load(os.path.join(vdir, ids_rel))
    np.save(os.path.join(vdir, ids_rel), ids[::-1].copy())  # rows of a document no longer contiguous
    with pytest.raises(IndexFormatError, match=f"{ids_rel}.*does not ascend"):
        open_index(root, verify="none").search("parse arguments", mode="dense", k=3)


def test_the_scrub_finds_a_flip_in_the_vectors(pq_build, tmp_path):
    from funnel.serving.frontends.scrub import Scrubber
    from funnel.serving.search import Searcher
    from test_scrub import rot, trust_as_hashed
    root = str(tmp_path / "ix")
    shutil.copytree(pq_build[0], root, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    trust_as_hashed(_vdir(root))
    with Searcher(root) as s:
        assert s.search("parse command line arguments", mode="dense", k=5).hits
        rot(_vdir(root), "dense/emb-0000.npy")
        assert Scrubber(s.follower, rate_mb_s=10_000).run_once().damaged == "dense/emb-0000.npy"


def test_reindex_keeps_the_budget_and_the_exact_scores(pq_build, tmp_path):
    from funnel.jobs.reindex import reindex
    from funnel.serving.search import open_index
    root = str(tmp_path / "ix")
    shutil.copytree(pq_build[0], root, ignore=shutil.ignore_patterns(".readers", VERIFIED))
    rows = [json.loads(line) for line in open(pq_build[1])]
    rows[3]["text"] += "\n\nAlso explains how to rotate a log file every night."
    corpus = tmp_path / "c2.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = reindex(root, str(corpus), executor="local")
    assert rep.version == read_current(root) != read_current(pq_build[0])
    m = load_manifest(_vdir(root))["dense"]
    assert "PQ" in m["factory"] and m["refine"] and m["memory_budget"] == 64 * 1024
    ix = open_index(root)
    d = ix.dense_mode.dense()
    vdir = _vdir(root)
    vecs = np.vstack([np.load(os.path.join(vdir, "dense", f"emb-{s:04d}.npy")) for s in range(2)])
    docnos = np.concatenate([np.load(os.path.join(vdir, "dense", f"ids-{s:04d}.npy")) for s in range(2)])
    q = "rotate a log file every night"
    hits = ix.search(q, mode="dense", k=3).hits
    best = _maxp_oracle(d.embed_query(q), vecs, docnos)
    np.testing.assert_allclose([h.score for h in hits], [best[h.docno] for h in hits], atol=1e-5)
    assert hits[0].doc_id == rows[3]["_id"]
