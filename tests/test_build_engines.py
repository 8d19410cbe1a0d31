"""The two build engines publish the same index: Ray Data (``--engine ray``) and this process
(``--engine local``), and how ``auto`` chooses the engine and the shard count."""

import json
import os

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from funnel.jobs.build_index import (LOCAL_MAX_BYTES, RAY_FIXED_SECONDS, SHARD_TARGET_BYTES, BuildError, build,
                                     choose_engine, choose_shards, corpus_bytes)
from funnel.pipelines.store.artifacts import read_current
from funnel.pipelines.sources.corpus import CorpusSpec
from funnel.serving.search import open_index

from conftest import write_jsonl
from test_build import QUERIES

# What may differ between two builds of the same corpus: when and how it was built, and
# stats.duckdb's bytes (DuckDB's file layout is not byte-stable; its tables are compared).
BUILD_ONLY = ("created_at", "build")
NOT_BYTE_STABLE = ("stats.duckdb",)


def _version(root: str) -> str:
    return os.path.join(root, read_current(root))


def _files(vdir: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), vdir) for d, _, fs in os.walk(vdir) for f in fs)


def _tables(db: str) -> dict:
    con = duckdb.connect(db, read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("terms", "collection", "shards")}
    finally:
        con.close()


def assert_same_index(a_root: str, b_root: str, vector_atol: float | None = None) -> None:
    """Every file of the two live versions equal: arrays and rejects byte for byte, Parquet by
    content, DuckDB by table, the manifest but for its build info; vectors within ``vector_atol``."""
    a, b = _version(a_root), _version(b_root)
    assert _files(a) == _files(b)
    for rel in _files(a):
        pa_, pb = os.path.join(a, rel), os.path.join(b, rel)
        if rel.startswith("manifest.json") or rel in NOT_BYTE_STABLE:
            continue
        if rel.endswith(".parquet"):
            assert pq.read_table(pa_).equals(pq.read_table(pb)), rel
        if vector_atol is not None and rel.startswith("dense/") and not rel.startswith("dense/ids-"):
            if rel.endswith(".npy"):
                np.testing.assert_allclose(np.load(pa_), np.load(pb), rtol=0, atol=vector_atol, err_msg=rel)
            continue  # FAISS files hold the vectors: compared through search below
        with open(pa_, "rb") as fa, open(pb, "rb") as fb:
            assert fa.read() == fb.read(), f"{rel} differs"
    assert _tables(os.path.join(a, "stats.duckdb")) == _tables(os.path.join(b, "stats.duckdb"))
    ma, mb = (json.load(open(os.path.join(v, "manifest.json"))) for v in (a, b))
    for m in (ma, mb):
        for key in BUILD_ONLY:
            m.pop(key)
        for rel in NOT_BYTE_STABLE + (tuple(f for f in m["files"] if f.startswith("dense/")) if vector_atol else ()):
            m["files"].pop(rel)
    assert ma == mb


def assert_same_results(a_root: str, b_root: str, modes=("bm25",)) -> None:
    a, b = open_index(a_root), open_index(b_root)
    for mode in modes:
        for q in QUERIES:
            ha, hb = a.search(q, mode=mode, k=20).hits, b.search(q, mode=mode, k=20).hits
            assert [h.doc_id for h in ha] == [h.doc_id for h in hb], (mode, q)
            # Hit scores are rounded to 6 decimals: vectors that agree to float precision (see
            # below) can round one unit apart, hence 2e-6.
            np.testing.assert_allclose([h.score for h in ha], [h.score for h in hb], rtol=0, atol=2e-6)


@pytest.fixture(scope="module")
def messy_corpus(demo_corpus, tmp_path_factory) -> str:
    """The demo corpus with bad rows and a duplicate spread over several chunks."""
    rows = [json.loads(line) for line in open(demo_corpus)]
    rows[10:10] = ['{"_id": "broken", "text": ', {"title": "no id", "text": "orphan"}]
    rows[200:200] = [dict(rows[0], title="a later duplicate"), {"_id": "blank", "text": "  "}]
    return write_jsonl(tmp_path_factory.mktemp("messy") / "corpus.jsonl", rows)


@pytest.mark.parametrize("shards", [1, 3])
def test_local_and_ray_publish_the_same_bm25_index(ray_session, messy_corpus, tmp_path, shards):
    roots = {}
    for engine in ("ray", "local"):
        roots[engine] = str(tmp_path / engine)
        # Small chunks: several read tasks on Ray, and rejects' line numbers across chunks.
        rep = build(messy_corpus, roots[engine], shards=shards, engine=engine, chunk_bytes=64 << 10)
        assert rep.engine["name"] == engine and rep.n_rejects == 4 and rep.n_shards == shards
    assert_same_index(roots["ray"], roots["local"])
    assert_same_results(roots["ray"], roots["local"])


def test_rows_through_the_object_store_or_the_work_folder_publish_the_same_index(ray_session, messy_corpus,
                                                                                 tmp_path):
    """On a shared disk the read tasks spill each chunk's rows to the work folder and each shard
    task reads its own back; without one (``shared_disk=False``) the rows wait in Ray's object
    store and the shard files come back through Ray. Both publish the local engine's index."""
    roots = {}
    for name, shared in (("spilled", True), ("object-store", False)):
        roots[name] = str(tmp_path / name)
        rep = build(messy_corpus, roots[name], shards=3, engine="ray", chunk_bytes=64 << 10, shared_disk=shared)
        assert rep.ray["worker_files"]["shipped"] is (not shared) and rep.n_rejects == 4
    build(messy_corpus, str(tmp_path / "local"), shards=3, engine="local", chunk_bytes=64 << 10)
    for name in roots:
        assert_same_index(roots[name], str(tmp_path / "local"))


def test_empty_shards_are_the_same_on_both_engines(ray_session, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": "a", "text": "apples and pears"},
                                                {"_id": "b", "text": "pears and plums"}])
    for engine in ("ray", "local"):
        build(corpus, str(tmp_path / engine), shards=8, engine=engine)
    m = json.load(open(os.path.join(_version(str(tmp_path / "local")), "manifest.json")))
    assert sum(1 for s in m["shards"] if s["n_docs"] == 0) >= 6
    assert_same_index(str(tmp_path / "ray"), str(tmp_path / "local"))


def test_local_and_ray_publish_the_same_dense_index(ray_session, demo_corpus, tmp_path, monkeypatch):
    corpus = tmp_path / "tiny.jsonl"
    with open(demo_corpus) as f, open(corpus, "w") as g:
        g.writelines(line for _, line in zip(range(60), f))
    monkeypatch.setenv("FUNNEL_CACHE", str(tmp_path / "cache"))  # the local build embeds for real
    for engine in ("local", "ray"):
        build(str(corpus), str(tmp_path / engine), shards=2, engine=engine, dense=True)
    # Vectors agree to float precision; bit-equality can depend on how the documents were batched
    # (padding changes the kernels' shapes on some hardware), so they are held to 1e-6 and to search.
    assert_same_index(str(tmp_path / "ray"), str(tmp_path / "local"), vector_atol=1e-6)
    assert_same_results(str(tmp_path / "ray"), str(tmp_path / "local"), modes=("bm25", "dense", "hybrid"))


def test_auto_builds_a_small_corpus_in_process_and_says_why(demo_corpus, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with caplog.at_level("INFO", logger="funnel.build"):
        rep = build(demo_corpus, str(tmp_path / "ix"))
    assert rep.engine["name"] == "local" and rep.engine["requested"] == "auto"
    assert "RAY_ADDRESS unset" in rep.engine["reason"] and rep.ray == {}
    assert rep.n_shards == 1 and rep.shard_plan == {"n": 1, "requested": "auto", "reason": rep.shard_plan["reason"]}
    assert rep.shard_plan["reason"].startswith("auto: ")
    m = json.load(open(os.path.join(_version(str(tmp_path / "ix")), "manifest.json")))
    assert m["build"]["engine"] == rep.engine and m["build"]["shards"] == rep.shard_plan
    assert m["build"]["engine"]["corpus_bytes"] == os.path.getsize(demo_corpus)
    said = [r.getMessage() for r in caplog.records]
    assert any("engine local (auto: " in s and "1 shard(s) (auto: " in s for s in said)
    assert any(s.startswith("published ") and s.endswith("engine local") for s in said)


def test_an_explicit_shard_count_wins(demo_corpus, tmp_path):
    rep = build(demo_corpus, str(tmp_path / "ix"), shards=4, engine="local")
    assert rep.n_shards == 4 and rep.shard_plan == {"n": 4, "requested": 4, "reason": "set by --shards 4"}
    assert rep.engine["reason"] == "set by --engine local"
    assert len(open_index(str(tmp_path / "ix")).index.shards) == 4


def test_local_engine_refuses_an_all_rejected_corpus(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]", '{"_id": "x"}'])
    with pytest.raises(BuildError, match="no valid documents.*all 2 rows were rejected"):
        build(bad, str(tmp_path / "ix"), engine="local")
    assert read_current(str(tmp_path / "ix")) is None
    assert [f for f in os.listdir(tmp_path / "ix") if f.startswith("rejects-")]  # the reasons are kept


# -- the choices, as formulas ---------------------------------------------------------------------


@pytest.mark.parametrize("nbytes, want", [
    (0, 1), (8 << 20, 1), (SHARD_TARGET_BYTES, 1), (SHARD_TARGET_BYTES + 1, 2),
    (10 * SHARD_TARGET_BYTES, 10), (10 * SHARD_TARGET_BYTES + 1, 11),
])
def test_auto_shards_keep_each_under_the_target(nbytes, want):
    n, why = choose_shards(None, nbytes)
    assert n == want == max(1, -(-nbytes // SHARD_TARGET_BYTES)) and why.startswith("auto: ")
    assert choose_shards(7, nbytes) == (7, "set by --shards 7")


def test_choose_shards_refuses_zero():
    with pytest.raises(ValueError, match="--shards must be >= 1, got 0"):
        choose_shards(0, 1)


def test_shard_mib_sets_the_auto_size_and_is_checked(tmp_path):
    from funnel.jobs.build_index import build
    n, why = choose_shards(None, 800 << 20, 80 << 20)
    assert n == 10 and "one shard per 80.0 MiB" in why
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": "a", "text": "x"}])
    for kw in ({"shard_mib": 0}, {"shard_mib": 64, "shards": 2}):
        with pytest.raises(ValueError, match="--shard-mib must be >= 1 and is not used with --shards"):
            build(corpus, str(tmp_path / "ix"), engine="local", **kw)
    assert not os.path.exists(tmp_path / "ix" / "CURRENT")


def test_auto_engine_by_size_and_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert choose_engine("auto", 8 << 20, 1, cpus=16)[0] == "local"
    # One shard: Ray cannot parallelize the analysis, so up to the limit it stays in-process.
    assert choose_engine("auto", LOCAL_MAX_BYTES, 1, cpus=16)[0] == "local"
    assert choose_engine("auto", LOCAL_MAX_BYTES + 1, 2, cpus=16)[0] == "ray"
    # Explicit shards: Ray when the parallel time it saves beats its start-up.
    from funnel.jobs.build_index import LOCAL_BYTES_PER_SECOND as rate
    worth = int(rate * RAY_FIXED_SECONDS * 4 / 3) + (1 << 20)  # saves t·(1 − 1/4) > the fixed cost
    assert choose_engine("auto", worth, 4, cpus=4)[0] == "ray"
    assert choose_engine("auto", worth, 4, cpus=1)[0] == "local"
    assert choose_engine("auto", int(rate * RAY_FIXED_SECONDS), 4, cpus=4)[0] == "local"
    assert choose_engine("local", 10 * LOCAL_MAX_BYTES, 8) == ("local", "set by --engine local")
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    engine, why = choose_engine("auto", 1, 1)
    assert engine == "ray" and "RAY_ADDRESS=ray://head:10001" in why
    with pytest.raises(ValueError, match="unknown engine 'spark'; choose one of auto, ray, local"):
        choose_engine("spark", 1, 1)


def test_corpus_bytes_counts_parquet_uncompressed(demo_corpus, tmp_path):
    import pyarrow as pa
    rows = [json.loads(line) for line in open(demo_corpus)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=100, compression="zstd")
    md = pq.ParquetFile(tmp_path / "c.parquet").metadata
    want = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
    assert corpus_bytes(CorpusSpec(str(tmp_path / "c.parquet"))) == want > os.path.getsize(tmp_path / "c.parquet")
    assert corpus_bytes(CorpusSpec(demo_corpus)) == os.path.getsize(demo_corpus)
