"""Remove-query (BEIR ``ignore_identical_ids``, Pyserini ``--remove-query``), long queries
and per-query errors in batch search, on a real index of the ArguAna-style fixture in
tests/data/beir_selfquery (queries are corpus documents; the relevant document is the
counter-argument).

BM25 on that fixture ranks each query's own document first, then (checked below):
arg1 -> arg1-con at 2, arg2 -> arg2-con at 2, arg3 -> arg3-pro at 2 and arg3-con at 3."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from funnel.evaluation.evaluate import decide_remove_query, eval_dataset, iter_corpus_ids, run_eval
from funnel.evaluation.trec import read_queries
from funnel.serving.search import MAX_QUERY_CHARS, SearchError, open_index

FIXTURE = Path(__file__).parent / "data" / "beir_selfquery"
QUERIES = read_queries(FIXTURE / "queries.jsonl")


@pytest.fixture(scope="module")
def index_root(ray_session, tmp_path_factory) -> str:
    from funnel.jobs.build_index import build
    root = str(tmp_path_factory.mktemp("selfquery") / "ix")
    build(str(FIXTURE), root, shards=1)
    return root


@pytest.fixture(scope="module")
def ix(index_root):
    return open_index(index_root)


def ndcg_one_relevant(rank: int) -> float:
    return 1 / math.log2(rank + 1)  # one relevant document (grade 1): IDCG = 1


def test_search_batch_remove_query_drops_self_hit_and_keeps_k(ix):
    plain = ix.search_batch(QUERIES, k=2)
    assert {q: hits[0][0] for q, hits in plain.items()} == {q: q for q in QUERIES}  # self-hit first
    assert [d for d, _ in plain["arg3"]] == ["arg3", "arg3-pro"]
    removed = ix.search_batch(QUERIES, k=2, remove_query=True)
    assert [d for d, _ in removed["arg3"]] == ["arg3-pro", "arg3-con"]  # k+1 retrieved: still 2 hits
    assert all(q not in dict(hits) for q, hits in removed.items())
    assert removed["arg3"] == plain["arg3"][1:] + [removed["arg3"][1]]  # same scores, shifted up


def test_auto_detects_queries_that_are_corpus_ids(tmp_path):
    assert decide_remove_query("auto", str(FIXTURE), list(QUERIES)) == (
        True, "auto: 3 of 3 query ids are corpus ids")
    assert decide_remove_query("auto", str(FIXTURE), ["arg1", "q2", "q3"]) == (
        False, "auto: 1 of 3 query ids are corpus ids")
    assert decide_remove_query("auto", str(FIXTURE), ["arg1", "q2"])[0] is True  # 50% is enough
    assert decide_remove_query("off", str(FIXTURE), list(QUERIES)) == (False, "off: requested")
    assert decide_remove_query(True, str(FIXTURE), ["q9"]) == (True, "on: requested")
    with pytest.raises(ValueError, match="auto, on, off"):
        decide_remove_query("yes", str(FIXTURE), list(QUERIES))
    # ids are read without parsing documents, including escapes and other key orders
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a\\"b", "text": "x"}\n\n{"text": "y", "_id": 7}\n')
    assert list(iter_corpus_ids(corpus)) == ['a"b', "7"]
    assert list(iter_corpus_ids(FIXTURE / "corpus.jsonl"))[:2] == ["arg1", "arg1-con"]


def test_eval_without_removal_scores_lower_and_auto_gives_the_hand_computed_value(ix, tmp_path):
    off = eval_dataset(ix, str(FIXTURE), ["bm25"], remove_query="off")
    auto = eval_dataset(ix, str(FIXTURE), ["bm25"], out_dir=str(tmp_path))
    # off: the relevant documents sit at ranks 2, 2, 3 behind the self-hits
    assert off["metrics"]["bm25"]["ndcg@10"] == pytest.approx(
        (2 * ndcg_one_relevant(2) + ndcg_one_relevant(3)) / 3)
    assert off["metrics"]["bm25"]["mrr@10"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    # auto: self-hits removed, ranks 1, 1, 2
    assert auto["metrics"]["bm25"]["ndcg@10"] == pytest.approx((2 * 1.0 + ndcg_one_relevant(2)) / 3)
    assert auto["metrics"]["bm25"]["mrr@10"] == pytest.approx((1 + 1 + 1 / 2) / 3)
    assert off["metrics"]["bm25"]["ndcg@10"] < auto["metrics"]["bm25"]["ndcg@10"]
    assert off["remove_query"] == {"applied": False, "setting": "off", "reason": "off: requested"}
    assert auto["remove_query"] == {"applied": True, "setting": "auto",
                                    "reason": "auto: 3 of 3 query ids are corpus ids"}
    assert "remove-query: on (auto: 3 of 3 query ids are corpus ids)" in auto["notes"]
    assert any(n.startswith("tie order: trec_eval") for n in auto["notes"])
    report = (tmp_path / "beir_selfquery.report.md").read_text()
    assert "remove-query: on (auto: 3 of 3 query ids are corpus ids)" in report
    assert "tie order: trec_eval" in report
    run_lines = (tmp_path / "beir_selfquery.bm25.trec").read_text().splitlines()
    assert not any(line.split()[0] == line.split()[2] for line in run_lines)


def test_run_eval_reads_remove_query_from_the_cli_args(index_root, capsys):
    args = dict(dataset=str(FIXTURE), index=index_root, modes="bm25", split="test", k=10, shards=1,
                out=None, check=None, json=True)
    ensure = lambda dataset, index, need_dense, shards: index  # noqa: E731 - the index exists
    assert run_eval(SimpleNamespace(**args), ensure) == 0  # no remove_query attribute: auto
    res = json.loads(capsys.readouterr().out)
    assert res["remove_query"]["applied"] is True
    assert res["metrics"]["bm25"]["mrr@10"] == pytest.approx(5 / 6)
    assert run_eval(SimpleNamespace(**args, remove_query="off", ties="rank"), ensure) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["remove_query"]["applied"] is False and res["ties"] == "rank"
    assert res["metrics"]["bm25"]["mrr@10"] == pytest.approx(4 / 9)
    assert run_eval(SimpleNamespace(**{**args, "json": False}, remove_query="on"), ensure) == 0
    out = capsys.readouterr().out
    assert "remove-query: on (on: requested)" in out and "tie order: trec_eval" in out


# ---------------------------------------------------------------- long and bad queries

def test_long_queries_are_answered_and_the_bound_is_kept(ix):
    argument = " ".join(["Zoos protect endangered species through captive breeding programmes."] * 90)
    assert 5_500 < len(argument) < MAX_QUERY_CHARS  # an ArguAna-sized query
    assert ix.search(argument, k=1).hits[0].doc_id == "arg1"
    assert ix.search_batch({"long": argument}, k=1)["long"][0][0] == "arg1"
    with pytest.raises(SearchError, match=f"limit is {MAX_QUERY_CHARS}"):
        ix.search("x" * (MAX_QUERY_CHARS + 1))


def test_search_batch_records_bad_queries_and_answers_the_rest(ix):
    queries = {"arg1": QUERIES["arg1"], "blank": "   ", "huge": "a " * MAX_QUERY_CHARS, "arg2": QUERIES["arg2"],
               "notext": None}
    errors: dict[str, str] = {}
    out = ix.search_batch(queries, k=3, errors=errors)
    assert list(out) == ["arg1", "arg2"] and out["arg1"][0][0] == "arg1"
    assert set(errors) == {"blank", "huge", "notext"}
    assert "empty query" in errors["blank"] and f"limit is {MAX_QUERY_CHARS}" in errors["huge"]
    with pytest.raises(SearchError, match="query 'blank': empty query"):
        ix.search_batch(queries, k=3)
    # errors about the whole batch are raised whatever `errors` is
    with pytest.raises(SearchError, match="choose one of bm25"):
        ix.search_batch(queries, mode="fuzzy", errors={})
    with pytest.raises(SearchError, match="k must be"):
        ix.search_batch(queries, k=0, errors={})


def test_eval_skips_bad_queries_reports_them_and_scores_them_zero(ix, tmp_path):
    ds = tmp_path / "withblank"
    shutil.copytree(FIXTURE, ds)
    with open(ds / "queries.jsonl", "a") as f:
        f.write(json.dumps({"_id": "blank", "text": "  "}) + "\n")
    with open(ds / "qrels" / "test.tsv", "a") as f:
        f.write("blank\targ1\t1\n")
    res = eval_dataset(ix, str(ds), ["bm25"], remove_query="on")
    assert res["query_errors"] == {"bm25": {"blank": "empty query: pass the text to search for"}}
    assert any(n.startswith("skipped queries (bm25): 1 of 4 could not be run and score 0 (blank: empty query")
               for n in res["notes"])
    assert res["metrics"]["bm25"]["mrr@10"] == pytest.approx((1 + 1 + 1 / 2 + 0) / 4)
