"""Metadata filters: fields at build, the filter language, exact pre-filtering in every mode.

The oracle: for random filters of selectivity from 0.01% to 100%, a filtered search's top k
equals exhaustive scoring of the documents the filter allows (the filter itself interpreted
in plain Python on the corpus rows, ``fields_corpus.matches``), with the same scores, and it
returns k hits whenever at least k allowed documents match.
"""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import numpy as np
import pytest

from fields_corpus import PUBLIC, SHARED, acl_dense_index, matches, random_filter, write_corpus
from funnel.pipelines.sources import fields as F
from funnel.serving import filters
from funnel.serving.errors import SearchError
from funnel.serving.lexical.retriever import Scored
from funnel.serving.search import open_index

WORDS = SHARED + PUBLIC
SELECTIVE = [{"n": {"lt": t}} for t in (1, 2, 10, 100, 1000, 5000, 10_000)]  # 0.01% .. 100%


@pytest.fixture(scope="module")
def bm25_corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("filters")
    corpus = str(d / "corpus.jsonl")
    write_corpus(corpus, n_docs=2000, seed=3)
    from funnel.jobs.build_index import build
    build(corpus, str(d / "ix"), shards=3, engine="local")
    rows = [json.loads(line) for line in open(corpus)]
    return rows, str(d / "ix")


@pytest.fixture(scope="module")
def bm25(bm25_corpus):
    rows, root = bm25_corpus
    ix = open_index(root)
    yield rows, ix._current
    ix.close()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    corpus, root = acl_dense_index(tmp_path_factory)
    ix = open_index(root)
    yield [json.loads(line) for line in open(corpus)], ix._current
    ix.close()


def _allowed(vs, rows, flt) -> set[int]:
    return {vs.index.docs.docno_of(r["_id"]) for r in rows if flt is None or matches(r, flt)}


def _brute_bm25(vs, query: str, allowed: set[int]) -> list[tuple[int, float]]:
    """Every allowed document's BM25 score (the NumPy reference arithmetic, shard by shard),
    positive ones ranked by score, then doc_id."""
    gids, ws = vs.bm25._canonical(dict(vs.bm25.query_terms(query)))
    out = []
    for s, shard in enumerate(vs.index.shards):
        scores = shard.score(gids, ws, vs._bm25_params({}))
        if scores is None:
            continue
        for local in np.flatnonzero(scores > 0):
            n = (s << 32) | int(local)
            if n in allowed:
                out.append((n, float(scores[local])))
    return sorted(out, key=lambda x: (-x[1], vs.index.docs.doc_id(x[0])))


def _query(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


# -- fields at build ------------------------------------------------------------------------

def test_declarations_parse_and_bad_ones_name_the_problem(tmp_path):
    assert F.parse_declaration("year:number, tags:keyword_list") == {"year": "number", "tags": "keyword_list"}
    (tmp_path / "s.json").write_text(json.dumps({"updated": "date"}))
    assert F.parse_declaration(f"@{tmp_path / 's.json'}") == {"updated": "date"}
    for bad, says in [("year", "has no type"), ("year:int", "unknown type 'int'"), ("and:keyword", "operator"),
                      ("acl:keyword", "always a keyword_list"), ("a b:number", "letter")]:
        with pytest.raises(F.FieldError, match=says):
            F.parse_declaration(bad)


def test_a_value_of_the_wrong_type_is_a_reject_naming_row_and_field(tmp_path):
    rows = [{"_id": "a", "text": "x", "year": 2020, "metadata": {"team": "x"}},
            {"_id": "b", "text": "x", "year": "soon"},
            {"_id": "c", "text": "x", "acl": "alice"},
            {"_id": "d", "text": "x", "acl": [1]},
            {"_id": "e", "text": "x", "team": "y", "metadata": {"team": "z"}}]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from funnel.jobs.build_index import build
    rep = build(str(corpus), str(tmp_path / "ix"), engine="local", fields="year:number,team:keyword")
    rejects = [json.loads(line) for line in open(rep.rejects_path)]
    assert [(r["line"], r["doc_id"]) for r in rejects] == [(2, "b"), (4, "d"), (5, "e")]
    assert "field 'year' is a string (\"soon\"); it is declared number" in rejects[0]["reason"]
    assert "field 'acl' is a list ([1]); it is always keyword_list" in rejects[1]["reason"]
    assert "'team' is given both at the top level and in 'metadata'" in rejects[2]["reason"]
    ix = open_index(str(tmp_path / "ix"))
    assert ix.index.manifest["fields"]["schema"] == {"year": "number", "team": "keyword", "acl": "keyword_list"}
    assert [h.doc_id for h in ix.search("x", filter={"team": "x"}).hits] == ["a"]
    ix.close()


def test_inference_types_agreeing_values_and_says_why_not_others():
    kinds = F.observe({}, [json.dumps({"n": 1, "s": "a", "d": "2025-06-01", "l": ["a"], "b": True, "m": 1}),
                           json.dumps({"n": 2.5, "s": "2025-01-01", "d": "2024-01-01T10:00:00Z", "l": "b",
                                       "b": False, "m": "x", "o": {"k": 1}})])
    schema, skipped = F.infer_schema(kinds)
    assert schema == {"b": "bool", "d": "date", "l": "keyword_list", "n": "number", "s": "keyword"}
    assert set(skipped) == {"m", "o"} and "mixed" in skipped["m"]


def test_columns_are_in_the_manifest_with_checksums(bm25_corpus):
    _, root = bm25_corpus
    ix = open_index(root)
    m = ix.index.manifest
    assert m["fields"]["schema"] == {"cat": "keyword", "day": "date", "flag": "bool", "n": "number",
                                     "tags": "keyword_list"}
    for name in ("fields/shard-0002/n.f8.npy", "fields/shard-0000/tags.ptr.npy", "fields/shard-0001/cat.vocab.json"):
        assert len(m["files"][name]["sha256"]) == 64
    ix.close()


# -- the language -----------------------------------------------------------------------------

@pytest.mark.parametrize("flt, says", [
    ({"nope": 1}, "unknown filter field 'nope'; filterable fields: cat (keyword), day (date)"),
    ({"n": "x"}, "filter field 'n' is a number field: 'eq' takes a number, got \"x\""),
    ({"cat": {"gte": "a"}}, "'cat' is a keyword field: operator 'gte' does not apply; use one of eq, in, prefix, exists"),
    ({"n": {"prefix": "1"}}, "'n' is a number field: operator 'prefix' does not apply; use one of eq, in, gte"),
    ({"cat": {"prefix": 3}}, "filter field 'cat' is a keyword field: 'prefix' takes a string, got 3"),
    ({"doc_id": {"exists": True}}, "'doc_id' is a doc_id field: operator 'exists' does not apply; use one of eq, in, "
                                   "prefix"),
    ({"nope": 1}, "doc_id (the document id: eq, in, prefix)"),
    ({"day": {"lt": "June"}}, "'day' is a date field: 'lt' takes an ISO 8601 date string"),
    ({"tags": {"all": []}}, "'all' takes a non-empty list"),
    ({"flag": {"exists": "yes"}}, "'exists' takes true or false"),
    ({"and": {"n": 1}}, "'and' takes a non-empty list of filters"),
    ([], "a filter is a non-empty JSON object"),
    ("{not json", "the filter is not valid JSON"),
])
def test_bad_filters_name_the_field_and_its_type(bm25, flt, says):
    _, vs = bm25
    with pytest.raises(SearchError) as e:
        vs.search("river", filter=flt)
    assert says in str(e.value)


def test_filters_are_bounded(bm25):
    _, vs = bm25
    deep = {"n": 1}
    for _ in range(filters.MAX_DEPTH):
        deep = {"not": deep}
    with pytest.raises(SearchError, match="nests more than"):
        vs.search("river", filter=deep)
    with pytest.raises(SearchError, match="more than 256 conditions"):
        vs.search("river", filter={"or": [{"n": i} for i in range(300)]})
    with pytest.raises(SearchError, match="at most 1024"):
        vs.search("river", filter={"cat": {"in": ["x"] * 2000}})


def test_mask_equals_the_filter_interpreted_on_every_row(bm25):
    rows, vs = bm25
    rng = random.Random(5)
    for flt in SELECTIVE + [random_filter(rng) for _ in range(40)]:
        mask = vs.mask(flt)
        want = _allowed(vs, rows, flt)
        docnos = np.array([vs.index.docs.docno_of(r["_id"]) for r in rows] + [-1, 1 << 40], dtype=np.int64)
        got = {n for n in docnos.tolist() if mask.allows_docno(n)}
        assert got == want, flt
        assert set(docnos[mask.allows_docnos(docnos)].tolist()) == want, flt
        assert mask.count == len(want)


PREFIXES = [{"cat": {"prefix": "r"}}, {"cat": {"prefix": "run"}}, {"cat": {"prefix": ""}}, {"cat": {"prefix": "zz"}},
            {"cat": {"prefix": "runbook"}}, {"cat": {"prefix": "runbookx"}}, {"tags": {"prefix": "b"}},
            {"tags": {"prefix": "i"}}, {"tags": {"prefix": "q"}}, {"doc_id": {"prefix": "d000"}},
            {"doc_id": {"prefix": "d01"}}, {"doc_id": {"prefix": "e"}}, {"doc_id": {"prefix": ""}},
            {"doc_id": "d00007"}, {"doc_id": {"in": ["d01999", "d00000", "nope"]}},
            {"doc_id": {"prefix": "d0019"}, "cat": {"prefix": "m"}}, {"not": {"doc_id": {"prefix": "d00"}}},
            {"or": [{"doc_id": {"prefix": "d0000"}}, {"tags": {"prefix": "w"}}]}]


@pytest.mark.parametrize("flt", PREFIXES, ids=[json.dumps(f) for f in PREFIXES])
def test_prefix_and_doc_id_conditions_equal_the_filter_on_every_row(bm25, flt):
    """``prefix`` on keyword and keyword_list fields and on the document id (a run of the sorted
    vocabulary or ids): the mask is exactly the rows whose value starts with it, over 3 shards,
    and a search under it returns only those."""
    rows, vs = bm25
    want = _allowed(vs, rows, flt)
    mask = vs.mask(flt)
    docnos = np.array([vs.index.docs.docno_of(r["_id"]) for r in rows], dtype=np.int64)
    assert set(docnos[mask.allows_docnos(docnos)].tolist()) == want and mask.count == len(want)
    hits = vs.search("river apple", k=50, filter=flt).hits
    assert [h.docno for h in hits] == [n for n, _ in _brute_bm25(vs, "river apple", want)[:50]]


def test_faiss_selectors_admit_exactly_each_shards_allowed_documents(bm25):
    """The per-shard bitmaps FAISS tests (offset so that shard s's ids ``s << 32 | local`` index
    them): every id of every shard, ids of the other shards and past the shard's end."""
    _, vs = bm25
    rng = random.Random(8)
    n_shards = len(vs.index.shards)
    assert n_shards == 3
    for flt in [SELECTIVE[2], SELECTIVE[5], random_filter(rng), random_filter(rng)]:
        mask = vs.mask(flt)
        sels = mask.faiss_selectors(list(range(n_shards)))
        assert mask.faiss_selectors(list(range(n_shards))) is sels  # built once
        for s in range(n_shards):
            n = int(mask.doc_off[s + 1] - mask.doc_off[s])
            got = [bool(sels[s].is_member((s << 32) | i)) for i in range(n)]
            assert got == mask.allow[mask.doc_off[s]:mask.doc_off[s + 1]].tolist(), (flt, s)
            for other in range(n_shards):
                if other != s:
                    assert not any(sels[s].is_member((other << 32) | i) for i in range(0, n, 7))
            assert not any(sels[s].is_member((s << 32) | (n + i)) for i in range(64))
        reordered = mask.faiss_selectors([2, 0])  # index i holds shard shards[i]
        assert [bool(reordered[0].is_member((2 << 32) | i)) for i in range(50)] == \
            mask.allow[mask.doc_off[2]:mask.doc_off[2] + 50].tolist()


# -- the oracle -------------------------------------------------------------------------------

@pytest.mark.parametrize("kernels, strategy, prune_min", [
    (True, "auto", None), (True, "candidates", None), (True, "masked", None), (True, "candidates", 0),
    (True, "masked", 0), (True, "auto", -1), (False, "auto", None)])
def test_filtered_bm25_equals_exhaustive_scoring_of_the_allowed_documents(bm25, kernels, strategy, prune_min,
                                                                          monkeypatch):
    """Every path of ``serving/lexical/masked.py`` (the per-shard choice, each strategy forced; pruning
    as served, eager (0) and off (-1: no block maxima)) and the NumPy one."""
    from funnel.serving.lexical import masked
    rows, vs = bm25
    vs.bm25.kernels = kernels
    monkeypatch.setattr(masked, "STRATEGY", "blocks" if strategy == "masked" else strategy)
    if prune_min is not None:
        monkeypatch.setattr(vs.bm25, "prune_min_postings", prune_min)
    rng = random.Random(11)
    try:
        cases = [(f, _query(rng)) for f in SELECTIVE for _ in range(3)]
        cases += [(random_filter(rng), _query(rng)) for _ in range(40)]
        for flt, q in cases:
            allowed = _allowed(vs, rows, flt)
            want = _brute_bm25(vs, q, allowed)
            for k in (1, 10, 100):
                with filters.scope(vs.mask(flt)):
                    dn, sc = vs.bm25.search_arrays(dict(vs.bm25.query_terms(q)), k)
                assert list(zip(dn.tolist(), sc.tolist())) == want[:k], (flt, q, k)
            hits = vs.search(q, k=10, filter=flt).hits
            assert len(hits) == min(10, len(want))  # never starved: k whenever k allowed documents match
            assert [h.docno for h in hits] == [n for n, _ in want[:10]]
    finally:
        vs.bm25.kernels = True


def test_a_filtered_batch_answers_each_query_as_search_does(bm25):
    rows, vs = bm25
    rng = random.Random(2)
    queries = {f"q{i}": _query(rng) for i in range(30)}
    flt = {"cat": {"in": ["memo", "faq"]}, "n": {"lt": 5000}}
    got = vs.search_batch(queries, k=20, filter=flt)
    allowed = _allowed(vs, rows, flt)
    for qid, q in queries.items():
        assert [d for d, _ in got[qid]] == [vs.index.docs.doc_id(n) for n, _ in _brute_bm25(vs, q, allowed)[:20]]


def _dense_all(vs, query: str) -> list[tuple[int, float]]:
    d = vs.dense_mode.dense()
    sc, ids = d.search_vectors(d.embed_query(query)[None, :], vs.index.n_docs)
    return [(int(i), float(s)) for s, i in zip(sc[0], ids[0]) if i >= 0]


@pytest.mark.parametrize("post_share", [None, 0.0, 1.01])
def test_filtered_dense_and_hybrid_equal_exhaustive_scoring_of_the_allowed_documents(dense, post_share,
                                                                                     monkeypatch):
    """As served, every filter applied after a deep unfiltered search (0.0), and every filter
    given to FAISS as an ID selector (1.01)."""
    from funnel.serving import dense as dense_module
    from funnel.serving.hybrid import fuse
    if post_share is not None:
        monkeypatch.setattr(dense_module, "POST_FILTER_MIN_SHARE", post_share)
    rows, vs = dense
    rng = random.Random(4)
    cfg = vs.hybrid_config
    for flt in SELECTIVE[::2] + [random_filter(rng) for _ in range(6)]:
        q = _query(rng)
        allowed = _allowed(vs, rows, flt)
        dense_all = [(n, s) for n, s in _dense_all(vs, q) if n in allowed]
        with filters.scope(vs.mask(flt)):
            got = vs.dense_mode.search(q, 10)
        assert [s.docno for s in got] == [n for n, _ in dense_all[:10]], flt
        assert np.allclose([s.score for s in got], [s for _, s in dense_all[:10]], atol=1e-6)
        assert len(got) == min(10, len(allowed))
        # hybrid fuses the two filtered lists, each as deep as unfiltered
        bm = [Scored(n, s) for n, s in _brute_bm25(vs, q, allowed)[:cfg.candidates]]
        dn = [Scored(n, s) for n, s in dense_all[:cfg.candidates]]
        want = [f.key for f in fuse(cfg, bm, dn)[:10]]
        assert [h.docno for h in vs.search(q, mode="hybrid", k=10, filter=flt).hits] == want, flt


def test_filtered_sira_draws_feedback_and_expansion_terms_from_allowed_documents(dense):
    rows, vs = dense
    rng = random.Random(9)
    for proposer in ("prf", "dense"):
        for flt in [{"cat": "memo"}, {"n": {"lt": 500}}, random_filter(rng)]:
            allowed = _allowed(vs, rows, flt)
            allowed_text = " ".join(" ".join(vs.index.analyzer.analyze(f"{r['title']} {r['text']}"))
                                    for r in rows if vs.index.docs.docno_of(r["_id"]) in allowed).split()
            res = vs.search("river stone harbor", mode="sira", k=10, filter=flt, proposer=proposer)
            assert {h.docno for h in res.hits} <= allowed
            # the expansion only adds terms: at least as many hits as the allowed BM25 matches
            assert len(res.hits) >= min(10, len(_brute_bm25(vs, "river stone harbor", allowed)))
            for term in res.trace["sira"]["expansion_terms"]:
                assert term in allowed_text, (flt, term)


def test_a_filter_that_allows_nothing_answers_empty_in_every_mode(dense):
    _, vs = dense
    for mode in ("bm25", "dense", "hybrid", "sira"):
        res = vs.search("river", mode=mode, filter={"n": {"lt": -1}})
        assert res.hits == () and res.trace["filter"]["documents"] == 0


# -- HTTP -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def live(bm25_corpus):
    import socket

    import uvicorn

    from funnel.serving.frontends.http import create_app
    _, root = bm25_corpus
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(root), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            pytest.fail("uvicorn did not start within 30 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    t.join(timeout=10)


def test_http_filter_and_its_errors_over_real_http(live, bm25):
    rows, vs = bm25
    flt = {"tags": {"any": ["auth"]}, "day": {"gte": "2025-03-01"}}
    with httpx.Client(timeout=30) as c:
        r = c.post(f"{live}/search", json={"query": "river harbor", "k": 5, "filter": flt})
        assert r.status_code == 200, r.text
        allowed = _allowed(vs, rows, flt)
        assert [h["doc_id"] for h in r.json()["hits"]] == [vs.index.docs.doc_id(n) for n, _ in
                                                            _brute_bm25(vs, "river harbor", allowed)[:5]]
        assert r.json()["trace"]["filter"] == {"filter": flt, "documents": len(allowed)}
        for bad, says in [({"colour": "red"}, "unknown filter field 'colour'"),
                          ({"n": {"gte": "ten"}}, "'n' is a number field"),
                          ({"flag": "yes"}, "'flag' is a bool field: 'eq' takes true or false")]:
            r = c.post(f"{live}/search", json={"query": "river", "filter": bad})
            assert r.status_code == 400 and says in r.json()["error"], r.text
        r = c.post(f"{live}/search", json={"query": "river", "filter": ["n"]})
        assert r.status_code == 422 and "filter" in r.json()["error"]


def test_cli_filter_for_one_query_and_a_batch(bm25_corpus, tmp_path, capsys):
    from funnel.serving.frontends.cli import main
    rows, root = bm25_corpus
    flt = '{"cat": "runbook", "n": {"gte": 2000}}'
    assert main(["search", root, "river stone", "--filter", flt, "--json", "--k", "5"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and all(matches(r, json.loads(flt)) for r in rows if r["_id"] in {h["doc_id"] for h in hits})
    (tmp_path / "q.tsv").write_text("1\triver stone\n2\tharbor ledger\n")
    (tmp_path / "f.json").write_text(flt)
    run = tmp_path / "run.trec"
    assert main(["search", root, "--queries", str(tmp_path / "q.tsv"), "--run", str(run),
                 "--filter", f"@{tmp_path / 'f.json'}"]) == 0
    ids = {line.split()[2] for line in run.read_text().splitlines()}
    assert ids and all(matches(r, json.loads(flt)) for r in rows if r["_id"] in ids)
    assert main(["search", root, "river", "--filter", '{"cat": 1}']) != 0
    assert "filter field 'cat' is a keyword field" in capsys.readouterr().err
