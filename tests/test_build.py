"""The build job end to end (in-process for these small corpora, engine auto; on a real local Ray where
named, and both ways in test_build_engines.py): validation, rejects, shards, publish, serving."""

import json
import os
import shutil

import numpy as np
import pytest

from funnel.jobs.build_index import BuildError, build
from funnel.pipelines.store.artifacts import LOCK, IndexFormatError, read_current, write_manifest
from funnel.serving.search import SearchError, open_index

from conftest import write_jsonl

QUERIES = ["parse command line arguments", "compress a file with gzip", "thread lock release",
           "random number generator seed", "json encode python object", "temporary directory",
           "regular expression match group", "send an email message header", "sqlite database cursor",
           "http request headers", "decimal rounding precision", "path of the current working directory",
           "iterate over combinations", "queue get block timeout", "unicode normalize string"]


def test_rejects_are_reported_with_line_and_reason(ray_session, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [
        {"_id": "a", "title": "Alpha", "text": "the first document about cats"},
        '{"_id": "broken", "text": ',
        {"title": "no id", "text": "orphan text"},
        {"_id": "e", "title": "", "text": "   "},
        {"_id": "n", "title": 5, "text": "title is a number"},
        {"_id": "a", "title": "Again", "text": "duplicate id"},
        "",
        {"_id": "b", "title": "Beta", "text": "the second document about dogs"},
    ])
    rep = build(corpus, str(tmp_path / "ix"), shards=2)
    assert rep.n_docs == 2 and rep.n_rejects == 5
    rejects = [json.loads(l) for l in open(rep.rejects_path)]
    by_line = {r["line"]: r["reason"] for r in rejects}
    assert set(by_line) == {2, 3, 4, 5, 6}
    assert by_line[2].startswith("invalid JSON")
    assert "missing id" in by_line[3]
    assert "empty text" in by_line[4]
    assert "'title' is int" in by_line[5]
    assert "duplicate id 'a' (first seen at line 1)" == by_line[6]
    ix = open_index(str(tmp_path / "ix"))
    assert ix.search("document", k=10).hits[0].doc_id in {"a", "b"}
    assert ix.get_document("a")["title"] == "Alpha"  # the first occurrence won


def test_strict_publishes_nothing(ray_session, tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"_id": "x", "text": "hello world"}])
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"_id": "y", "text": "fine"}, "{not json"])
    root = str(tmp_path / "ix")
    build(good, root, shards=1)
    with pytest.raises(BuildError, match="--strict: 1 rows rejected"):
        build(bad, root, shards=1, strict=True)
    assert read_current(root) == "v000001"
    assert sorted(d for d in os.listdir(root) if not d.startswith("CURRENT") and d != LOCK) == ["v000001"]


def test_bad_corpus_paths(ray_session, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build(str(tmp_path / "nope.jsonl"), str(tmp_path / "ix"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="no corpus files"):
        build(str(tmp_path / "empty"), str(tmp_path / "ix"))
    empty = write_jsonl(tmp_path / "allbad.jsonl", ["[1, 2]"])
    with pytest.raises(BuildError, match="no valid documents"):
        build(empty, str(tmp_path / "ix"))
    assert read_current(str(tmp_path / "ix")) is None


def test_four_shards_rank_exactly_like_one(demo_index_1, demo_index_4):
    one, four = open_index(demo_index_1), open_index(demo_index_4)
    assert one.index.n_docs == four.index.n_docs == 400
    assert four.index.n_shards == 4 and all(s.n_docs > 0 for s in four.index.shards)
    for q in QUERIES:
        a = one.search_batch({"q": q}, k=50)["q"]
        b = four.search_batch({"q": q}, k=50)["q"]
        assert [d for d, _ in a] == [d for d, _ in b], q
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], rtol=0, atol=1e-9)


def test_scores_equal_brute_force_reference(demo_corpus, demo_index_4):
    """Oracle: a NumPy brute force over the same analyzed documents, Lucene length norms."""
    import math
    from collections import Counter
    from funnel.pipelines.lexical.analysis import Analyzer
    from funnel.serving.lexical.bm25 import lucene_lengths
    a = Analyzer()
    docs = [json.loads(l) for l in open(demo_corpus)]
    toks = [Counter(a.analyze(d["title"] + "\n" + d["text"])) for d in docs]
    dl = np.array([sum(t.values()) for t in toks])
    n = int(np.count_nonzero(dl))
    avgdl = dl.sum() / n
    L = lucene_lengths(dl)
    ix = open_index(demo_index_4)
    for q in QUERIES[:8]:
        qt = Counter(a.analyze(q))
        ref = np.zeros(len(docs))
        for t, w in qt.items():
            df = sum(1 for c in toks if t in c)
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for i, c in enumerate(toks):
                if c[t]:
                    ref[i] += w * idf * c[t] / (c[t] + 0.9 * (1 - 0.4 + 0.4 * L[i] / avgdl))
        got = dict(ix.search_batch({"q": q}, k=20)["q"])
        for did, s in got.items():
            i = next(j for j, d in enumerate(docs) if d["_id"] == did)
            assert abs(ref[i] - s) < 1e-5
        assert sorted(ref, reverse=True)[len(got) - 1] == pytest.approx(min(got.values()), abs=1e-5)


def test_search_result_explains_itself(demo_index_1):
    res = open_index(demo_index_1).search("parse command line arguments", k=3)
    assert res.mode == "bm25" and len(res.hits) == 3
    assert res.summary.startswith("Found 3 documents for 'parse command line arguments'")
    h = res.hits[0]
    assert h.rank == 1 and h.matched_terms and h.why.startswith("matched ")
    assert sum(v["contribution"] for v in h.explain["terms"].values()) == pytest.approx(h.score, abs=1e-5)
    assert res.trace["bm25"]["k1"] == 0.9 and "total" in res.trace["timings_ms"]


def test_query_errors_and_stopwords(demo_index_1):
    ix = open_index(demo_index_1)
    with pytest.raises(SearchError, match="empty query"):
        ix.search("   ")
    with pytest.raises(SearchError, match="unknown mode 'fuzzy'; choose one of bm25, dense, hybrid, sira"):
        ix.search("x", mode="fuzzy")
    with pytest.raises(SearchError, match="k must be"):
        ix.search("x", k=0)
    res = ix.search("the of and is")
    assert res.hits == () and "stopword" in res.summary
    res = ix.search("zzxqv")
    assert res.hits == () and "zzxqv" in res.summary


def test_index_errors(demo_index_1, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_index(str(tmp_path / "missing"))
    os.makedirs(tmp_path / "notindex")
    with pytest.raises(IndexFormatError, match="not a funnel index"):
        open_index(str(tmp_path / "notindex"))
    copy = tmp_path / "copy"
    shutil.copytree(demo_index_1, copy)
    v = copy / read_current(str(copy))
    m = json.load(open(v / "manifest.json"))
    # Manifests written as a build writes them (with their checksum file), so the checks
    # on their content are what refuses them.
    write_manifest(str(v), {**m, "format_version": 99})
    with pytest.raises(IndexFormatError, match="format version 99; this funnel reads versions 1, 2, 3. Rebuild"):
        open_index(str(copy))
    assert m["format_version"] == 2  # what a build writes now
    write_manifest(str(v), {**m, "format_version": 1})  # an index from before the 16-bit postings opens
    with open_index(str(copy)) as s:
        assert s.search("test", mode="bm25", k=1).hits is not None
    write_manifest(str(v), {**m, "analyzer": {**m["analyzer"], "fingerprint": "0" * 16}})
    with pytest.raises(IndexFormatError, match="analyzer mismatch"):
        open_index(str(copy))
    write_manifest(str(v), m)
    with open(v / "lexical" / "shard-0000" / "tfs.npy", "ab") as f:
        f.write(b"x")
    with pytest.raises(IndexFormatError, match="damaged or partial"):
        open_index(str(copy))


def test_new_version_is_published_atomically_and_picked_up(ray_session, tmp_path):
    root = str(tmp_path / "ix")
    c1 = write_jsonl(tmp_path / "c1.jsonl", [{"_id": "1", "text": "apples and oranges"}])
    c2 = write_jsonl(tmp_path / "c2.jsonl", [{"_id": "1", "text": "apples and oranges"},
                                             {"_id": "2", "text": "bananas are yellow"}])
    build(c1, root, shards=1)
    ix = open_index(root)
    assert ix.search("bananas").hits == ()
    build(c2, root, shards=1)
    assert read_current(root) == "v000002"
    assert ix.refresh() is True and ix.version == "v000002"
    assert ix.search("bananas").hits[0].doc_id == "2"
    m = json.load(open(os.path.join(root, "v000002", "manifest.json")))
    assert m["parent"] == "v000001" and m["corpus"]["n_docs"] == 2
    build(c1, root, shards=1, keep_versions=1)
    # v000002 is open in ix: its reader lease keeps it through retention until ix is gone
    assert sorted(d for d in os.listdir(root) if d.startswith("v")) == ["v000002", "v000003"]
    import gc as pygc

    from funnel.pipelines.store.artifacts import gc as index_gc
    del ix
    pygc.collect()
    index_gc(root, keep=1)
    assert sorted(d for d in os.listdir(root) if d.startswith("v")) == ["v000003"]


def test_parquet_corpus_matches_jsonl(ray_session, demo_corpus, demo_index_1, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [json.loads(l) for l in open(demo_corpus)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=150)
    build(str(tmp_path / "c.parquet"), str(tmp_path / "ix"), shards=3)
    a, b = open_index(demo_index_1), open_index(str(tmp_path / "ix"))
    for q in QUERIES[:5]:
        assert a.search_batch({"q": q}, k=20) == b.search_batch({"q": q}, k=20) or \
            [d for d, _ in a.search_batch({"q": q}, k=20)["q"]] == [d for d, _ in b.search_batch({"q": q}, k=20)["q"]]
    m1 = json.load(open(os.path.join(demo_index_1, read_current(demo_index_1), "manifest.json")))
    m2 = json.load(open(os.path.join(tmp_path / "ix", read_current(str(tmp_path / "ix")), "manifest.json")))
    assert m1["corpus"]["fingerprint"] == m2["corpus"]["fingerprint"]  # independent of shards and format


def test_numba_kernel_equals_numpy_reference(demo_index_4):
    from funnel.serving.kernels import HAVE_NUMBA
    fast, ref = open_index(demo_index_4), open_index(demo_index_4)
    for s in ref.index.shards:
        s.use_kernel = False
    assert HAVE_NUMBA  # numba is a declared dependency; the NumPy path is the reference
    for q in QUERIES:
        a, b = fast.search_batch({"q": q}, k=30)["q"], ref.search_batch({"q": q}, k=30)["q"]
        assert [d for d, _ in a] == [d for d, _ in b]
        np.testing.assert_allclose([s for _, s in a], [s for _, s in b], rtol=0, atol=1e-12)


def test_corpus_given_as_a_pyarrow_filesystem_uri(ray_session, tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": "u1", "text": "read through a file URI"}])
    rep = build("file://" + corpus, str(tmp_path / "ix"), shards=1)
    assert rep.n_docs == 1
    assert open_index(str(tmp_path / "ix")).search("uri").hits[0].doc_id == "u1"


def test_unknown_options_are_refused_with_the_valid_ones(demo_index_1):
    ix = open_index(demo_index_1)
    with pytest.raises(SearchError, match="unknown option.*k_1.*valid: b, context_tokens, k1, length_norm"):
        ix.search("x", k1=1.2, k_1=3)
    with pytest.raises(SearchError, match="unknown option"):
        ix.search_batch({"q": "x"}, fusion="rrf")


def test_build_records_which_ray_ran_it(ray_session, tmp_path):
    # The session's Ray was initialized by the test process, so a Ray build uses it as it is
    # (a fresh `funnel build` process starts its own local Ray: tests/test_cli_build.py).
    import ray
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": "1", "text": "apples and oranges"}])
    rep = build(corpus, str(tmp_path / "ix"), shards=1, engine="ray")
    m = json.load(open(os.path.join(tmp_path, "ix", rep.version, "manifest.json")))
    assert m["build"]["ray"] == rep.ray
    assert m["build"]["engine"] == rep.engine and rep.engine["name"] == "ray" and rep.engine["requested"] == "ray"
    assert rep.ray["cluster"] == "existing" and rep.ray["address"] == ray.get_runtime_context().gcs_address
    assert rep.ray["cpus"] == ray.cluster_resources()["CPU"]


def test_shard_build_reports_progress_for_every_document(tmp_path):
    from funnel.pipelines.lexical.shard import PROGRESS_EVERY, build_lexical_shard
    n = 2 * PROGRESS_EVERY + 7
    rows = {"doc_id": [f"d{i}" for i in range(n)], "title": [""] * n, "text": [f"word{i % 50} text" for i in range(n)],
            "content_hash": [f"{i:032x}" for i in range(n)], "chunk": [0] * n, "line": list(range(1, n + 1))}
    calls = []
    summary = build_lexical_shard(rows, 0, str(tmp_path / "out"), str(tmp_path / "work"), progress=calls.append)
    assert calls == [PROGRESS_EVERY, PROGRESS_EVERY, 7] and summary["n_docs"] == n


def test_explanations_of_a_whole_answer_are_each_hits_own(demo_index_4):
    """An answer's hits are explained all at once (``BM25Retriever.explain_many``: one
    postings search per term and shard for every hit). Each hit's explanation must be what
    explaining it alone gives, over hits spread across the shards, a docno matching only some
    of the terms and one matching none, and each explains its score."""
    ix = open_index(demo_index_4)
    b = ix.bm25
    terms = dict(b.query_terms("parse command line arguments and options"))
    hits = ix.search("parse command line arguments and options", k=20).hits
    assert len({h.docno >> 32 for h in hits}) > 1  # several shards
    other = next(n for n in range(ix.index.docs.shard_size(0)) if n not in {h.docno for h in hits})
    docnos = [h.docno for h in hits] + [other]
    many = b.explain_many(terms, docnos)
    for n in docnos:
        assert many[n] == b.inner.explain(terms, n) if hasattr(b, "inner") else many[n] == b.explain(terms, n)
    assert any(0 < len(many[h.docno]) < len(terms) for h in hits)
    for h in hits:
        assert sum(v["contribution"] for v in many[h.docno].values()) == pytest.approx(h.score, abs=1e-5)
        assert h.explain["terms"] == dict(sorted(many[h.docno].items(), key=lambda kv: -kv[1]["contribution"]))
