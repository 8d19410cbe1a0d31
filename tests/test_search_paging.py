"""Paging and totals (issue 48 item 4): ``offset`` (HTTP ``from``) and ``total`` of a search.

Oracles: a page at ``offset`` is exactly ranks ``offset + 1 .. offset + k`` of one search as deep
(every mode, filtered and as a restricted caller); a BM25 total is the number of documents the
search may return that hold a query term, counted in plain Python from the corpus rows with
the index's analyzer; a total over the exact bound is a lower bound that never exceeds it.

Real components: the 400-document corpus with ACLs and vectors the ACL tests build
(``fields_corpus.acl_dense_index``), a real uvicorn server on 127.0.0.1, the in-process MCP
client, the CLI through ``main``.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest

from fields_corpus import FINANCE, PUBLIC, SHARED, TEAM, acl_dense_index, matches
from funnel.serving.answers import paging
from funnel.serving.frontends.cli import main
from funnel.serving.errors import SearchError
from funnel.serving.frontends.http import create_app
from funnel.serving.frontends.mcp import build_mcp_server
from funnel.serving.principals import principal
from funnel.serving.search import MAX_K, open_index
from servers import live_server
from test_mcp import with_client

ALICE = principal("alice", ["eng"])
BOB = principal("bob", ["sales"])
READS = {"alice": {"public", "alice", "eng"}, "bob": {"public"}}
WORDS = SHARED + PUBLIC + TEAM + FINANCE


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    corpus, root = acl_dense_index(tmp_path_factory)
    rows = [json.loads(line) for line in open(corpus)]
    ix = open_index(root)
    yield rows, ix, root
    ix.close()


def _ids(res) -> list[tuple[str, int, float]]:
    return [(h.doc_id, h.rank, h.score) for h in res.hits]


def _readable(row: dict, who: str | None) -> bool:
    return who is None or (row.get("acl") or ["public"])[0] in READS[who]


def _brute_total(ix, rows, query: str, who: str | None, flt: dict | None) -> int:
    """Documents holding an analyzed query term, that the filter allows and ``who`` may read."""
    analyze = ix.index.analyzer.analyze
    terms = set(analyze(query))
    return sum(1 for r in rows if _readable(r, who) and (flt is None or matches(r, flt))
               and terms & set(analyze(f"{r['title']} {r['text']}")))


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "sira"])
def test_a_page_is_the_same_ranks_of_one_deeper_search(acl, mode):
    _, ix, _ = acl
    rng = random.Random(5)
    for _ in range(4):
        q = " ".join(rng.sample(WORDS, 3))
        for who, flt in ((None, None), (ALICE, None), (BOB, {"cat": {"in": ["memo", "faq"]}})):
            deep = ix.search(q, mode=mode, k=30, principal=who, filter=flt, explain=False)
            for offset, k in ((0, 10), (10, 10), (25, 5), (7, 23), (29, 1)):
                page = ix.search(q, mode=mode, k=k, offset=offset, principal=who, filter=flt, explain=False)
                assert _ids(page) == _ids(deep)[offset:offset + k], (q, offset, k)
                assert page.offset == offset and [h.rank for h in page.hits] == \
                    list(range(offset + 1, offset + 1 + len(page.hits)))


def test_bm25_total_counts_the_matching_documents_the_caller_may_read(acl):
    rows, ix, _ = acl
    rng = random.Random(9)
    queries = [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(12)] + ["vexillar", "zephyrine apple"]
    for q in queries:
        for who, p in ((None, None), ("alice", ALICE), ("bob", BOB)):
            for flt in (None, {"cat": "memo"}, {"n": {"lt": 300}}):
                res = ix.search(q, mode="bm25", k=5, principal=p, filter=flt)
                want = _brute_total(ix, rows, q, who, flt)
                assert res.total == {"value": want, "relation": "eq"}, (q, who, flt)
                assert len(res.hits) == min(5, want)
    # a word only finance documents hold: bob's total is 0, as if they did not exist
    assert ix.search("vexillar", mode="bm25", principal=BOB).total == {"value": 0, "relation": "eq"}
    assert ix.search("the of", mode="bm25").total == {"value": 0, "relation": "eq"}  # stopwords only


def test_past_the_exact_bound_a_total_is_a_lower_bound(acl, monkeypatch):
    rows, ix, _ = acl
    monkeypatch.setattr(paging, "EXACT_TOTAL_POSTINGS", 25)
    for q in ("river stone market", "apple zephyrine vexillar", "harbor"):
        for who, p in ((None, None), ("bob", BOB)):
            want = _brute_total(ix, rows, q, who, None)
            res = ix.search(q, mode="bm25", k=10, principal=p)
            got = res.total
            if got["relation"] == "eq":
                assert got["value"] == want
            else:
                assert len(res.hits) <= got["value"] <= want and want > 25, (q, who, got, want)
    # one term without a filter is its document frequency, read from the statistics
    assert ix.search("harbor", mode="bm25").total == {"value": _brute_total(ix, rows, "harbor", None, None),
                                                      "relation": "eq"}


def test_other_modes_total_what_the_ranking_returned(acl):
    _, ix, _ = acl
    res = ix.search("river stone", mode="dense", k=10, explain=False)
    assert res.total == {"value": 10, "relation": "gte"}
    few = ix.search("river stone", mode="hybrid", k=50, offset=10, filter={"n": {"lt": 1000}}, explain=False)
    assert few.total["relation"] == "eq" and few.total["value"] == 10 + len(few.hits) < 60 and few.hits
    past = ix.search("river stone", mode="dense", k=5, offset=100, filter={"n": {"lt": 1000}}, explain=False)
    assert past.hits == () and past.total == {"value": few.total["value"], "relation": "eq"}


def test_offset_bounds_name_the_limit(acl):
    _, ix, _ = acl
    with pytest.raises(SearchError, match=f"offset \\+ k is {MAX_K + 1}; at most {MAX_K}"):
        ix.search("river", k=10, offset=MAX_K - 9)
    with pytest.raises(SearchError, match="offset is the number of hits to skip: a whole number from 0, got -1"):
        ix.search("river", offset=-1)
    assert ix.search("river", mode="bm25", k=10, offset=MAX_K - 10).offset == MAX_K - 10


def test_fields_on_hits(acl):
    rows, ix, _ = acl
    by_id = {r["_id"]: r for r in rows}
    res = ix.search("river apple", mode="bm25", k=5, fields=["cat", "n"])
    for h in res.hits:
        want = {k: by_id[h.doc_id][k] for k in ("cat", "n") if k in by_id[h.doc_id]}
        assert h.fields == want and h.to_dict()["fields"] == want
    assert all(h.fields is None and "fields" not in h.to_dict() for h in ix.search("river", mode="bm25").hits)
    mine = ix.search("zephyrine", mode="bm25", k=3, fields="*", principal=ALICE)
    assert mine.hits and all("acl" not in h.fields and "cat" in h.fields or "cat" not in by_id[h.doc_id]
                             for h in mine.hits)
    assert all(h.fields["acl"] for h in ix.search("zephyrine", mode="bm25", k=3, fields="*").hits)
    with pytest.raises(SearchError, match=r"unknown field\(s\) 'nope'"):
        ix.search("river", fields=["nope"])


def test_http_from_offset_total_and_fields(acl):
    _, ix, _ = acl
    with live_server(create_app(ix)) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        body = {"query": "river stone", "mode": "bm25", "k": 5}
        deep = c.post("/search", json={**body, "k": 15}).json()
        page = c.post("/search", json={**body, "from": 10, "fields": ["cat"]}).json()
        same = c.post("/search", json={**body, "offset": 10, "fields": "cat"}).json()
        assert {k: v for k, v in page.items() if k != "trace"} == {k: v for k, v in same.items() if k != "trace"}
        assert [h["doc_id"] for h in page["hits"]] == [h["doc_id"] for h in deep["hits"]][10:]
        assert [h["rank"] for h in page["hits"]] == [11, 12, 13, 14, 15] and page["offset"] == 10
        assert page["total"] == deep["total"] and page["total"]["relation"] == "eq"
        assert all("cat" in h["fields"] or h["fields"] == {} for h in page["hits"])
        both = c.post("/search", json={**body, "from": 1, "offset": 1})
        assert both.status_code == 422 and "offset or from (the same thing), not both" in both.json()["error"]
        deep_page = c.post("/search", json={**body, "offset": MAX_K - 2})
        assert deep_page.status_code == 400 and f"at most {MAX_K}" in deep_page.json()["error"]
        smuggled = c.post("/search", json={**body, "options": {"offset": 3}})
        assert smuggled.status_code == 422 and "offset" in smuggled.json()["error"]


def test_mcp_and_cli_pages(acl, capsys):
    _, ix, root = acl
    deep = ix.search("river stone", mode="bm25", k=8, explain=False)

    async def calls(c):
        return await c.call_tool("search", {"query": "river stone", "mode": "bm25", "k": 4, "offset": 4,
                                            "fields": ["cat"]})

    res = with_client(build_mcp_server(ix), calls)
    sc = res.structured_content
    assert [h["doc_id"] for h in sc["hits"]] == [h.doc_id for h in deep.hits][4:]
    assert sc["offset"] == 4 and sc["total"] == deep.total
    assert main(["search", root, "river stone", "--mode", "bm25", "--k", "4", "--offset", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [h["doc_id"] for h in out["hits"]] == [h.doc_id for h in deep.hits][4:] and out["offset"] == 4
    assert main(["search", root, "--queries", "q.jsonl", "--run", "r.trec", "--offset", "3"]) == 2
    assert "--offset and --fields shape the hits of one query" in capsys.readouterr().err
