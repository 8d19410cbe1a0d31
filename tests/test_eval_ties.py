"""Tie order: funnel's metrics print what trec_eval prints for the run as written.

trec_eval sorts each query by score descending and breaks ties by docid *descending*
(``form_res_rels.c``: ``strcmp(d2->docno, d1->docno)``). These tests pin that against
pytrec_eval (the trec_eval C code) metric by metric on runs full of ties, against hand
computations, and through a written TREC file."""

from __future__ import annotations

import math

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel.evaluation.compare import success_at_k
from funnel.evaluation.coverage import answer_coverage
from funnel.evaluation.metrics import cut_run, evaluate
from funnel.evaluation.trec import read_run, write_run

POOL = [f"d{i:02d}" for i in range(25)]
SCORES = (0.5, 1.0, 1.5, 2.0)  # a few values: most documents tie with several others


def trec_eval_order(scores: dict[str, float]) -> list[str]:
    """The oracle order, written independently of funnel: score desc, then docid desc."""
    by_doc = sorted(scores, reverse=True)  # docid descending ...
    return sorted(by_doc, key=lambda d: -scores[d])  # ... kept within equal scores (stable sort)


def pytrec(qrels, run, measures) -> dict[str, dict[str, float]]:
    return pytrec_eval.RelevanceEvaluator(qrels, set(measures)).evaluate(run)


runs_and_qrels = st.integers(min_value=1, max_value=6).flatmap(lambda nq: st.tuples(
    st.lists(st.dictionaries(st.sampled_from(POOL), st.sampled_from(SCORES), max_size=len(POOL)),
             min_size=nq, max_size=nq),
    st.lists(st.dictionaries(st.sampled_from(POOL), st.integers(0, 3), min_size=1, max_size=8),
             min_size=nq, max_size=nq),
))


@settings(max_examples=150, deadline=None)
@given(runs_and_qrels)
def test_evaluate_equals_pytrec_eval_metric_by_metric_on_tied_runs(case):
    runs, judged = case
    run = {f"q{i}": r for i, r in enumerate(runs) if r}  # some queries have no results
    qrels = {f"q{i}": j for i, j in enumerate(judged)}
    if not any(g >= 1 for j in qrels.values() for g in j.values()):
        qrels["q0"] = {"d00": 1}  # pytrec_eval needs one relevant judgement somewhere
    mean, per_query = evaluate(run, qrels, ("ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100"))

    ref = pytrec(qrels, run, {"ndcg_cut.10", "recall.10,100", "map"})
    cut10 = {q: {d: docs[d] for d in trec_eval_order(docs)[:10]} for q, docs in run.items()}
    rr = pytrec(qrels, cut10, {"recip_rank"})
    for q in qrels:
        got, want = per_query[q], ref.get(q, {})
        assert got["ndcg@10"] == pytest.approx(want.get("ndcg_cut_10", 0.0), abs=1e-12)
        assert got["recall@10"] == pytest.approx(want.get("recall_10", 0.0), abs=1e-12)
        assert got["recall@100"] == pytest.approx(want.get("recall_100", 0.0), abs=1e-12)
        assert got["map@100"] == pytest.approx(want.get("map", 0.0), abs=1e-12)  # runs < 100 docs
        assert got["mrr@10"] == pytest.approx(rr.get(q, {}).get("recip_rank", 0.0), abs=1e-12)
        # and the reciprocal rank by hand, in the oracle order
        ranks = [i for i, d in enumerate(trec_eval_order(run.get(q, {}))[:10], start=1) if qrels[q].get(d, 0) >= 1]
        assert got["mrr@10"] == pytest.approx(1 / ranks[0] if ranks else 0.0)
    assert mean["ndcg@10"] == pytest.approx(sum(r["ndcg@10"] for r in per_query.values()) / len(qrels))
    # every other place that orders a run agrees with the oracle
    assert {q: list(d) for q, d in cut_run(run, 3).items()} == {q: trec_eval_order(d)[:3] for q, d in run.items()}
    hit3 = success_at_k(run, qrels, 3)
    for q in qrels:
        top = trec_eval_order(run.get(q, {}))[:3]
        assert hit3[q] == any(qrels[q].get(d, 0) >= 1 for d in top)


@settings(max_examples=60, deadline=None)
@given(runs_and_qrels)
def test_written_run_evaluates_like_the_run_in_memory(tmp_path_factory, case):
    # write_run writes exact scores (repr): the file has the same ties, so trec_eval on the
    # file and evaluate() on the run in memory print the same figure.
    runs, judged = case
    run = {f"q{i}": {d: s / 3 for d, s in r.items()} for i, r in enumerate(runs) if r}  # non-terminating floats
    qrels = {f"q{i}": j for i, j in enumerate(judged)} | {"qx": {"d00": 1}}
    path = tmp_path_factory.mktemp("run") / "run.trec"
    write_run(path, run, tag="t")
    written = read_run(path)
    assert written == run
    metrics = ("ndcg@10", "recall@10", "mrr@10", "map@100")
    assert evaluate(written, qrels, metrics) == evaluate(run, qrels, metrics)
    ref = pytrec(qrels, written, {"ndcg_cut.10"})
    _, pq = evaluate(run, qrels, metrics)
    assert all(pq[q]["ndcg@10"] == pytest.approx(ref.get(q, {}).get("ndcg_cut_10", 0.0), abs=1e-12) for q in qrels)


def test_hand_made_tie_where_ascending_and_descending_differ():
    # One tie of two judged documents: a (grade 2) and b (grade 1), plus an unjudged c below.
    run = {"q": {"a": 1.0, "b": 1.0, "c": 0.5}}
    qrels = {"q": {"a": 2, "b": 1}}
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    # trec_eval: b (docid desc) then a
    mean, _ = evaluate(run, qrels, ("ndcg@10", "ndcg@1", "mrr@10"))
    assert mean["ndcg@10"] == pytest.approx((1 / math.log2(2) + 2 / math.log2(3)) / idcg)  # 0.8597
    assert mean["ndcg@1"] == pytest.approx(1 / 2)
    assert mean["mrr@10"] == 1.0
    assert mean["ndcg@10"] == pytest.approx(pytrec(qrels, run, {"ndcg_cut.10"})["q"]["ndcg_cut_10"])
    # rank (the run's own order, docid asc): a then b, the ideal ranking
    rank, _ = evaluate(run, qrels, ("ndcg@10", "ndcg@1"), ties="rank")
    assert rank == {"ndcg@10": pytest.approx(1.0), "ndcg@1": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="trec_eval, rank"):
        evaluate(run, qrels, ("ndcg@10",), ties="asc")


def test_mrr_cut_follows_trec_eval_order():
    # 11 documents tied; the relevant one is "d00": last in trec_eval's order (rank 11),
    # first in the run's own order.
    run = {"q": {f"d{i:02d}": 1.0 for i in range(11)}}
    qrels = {"q": {"d00": 1}}
    assert evaluate(run, qrels, ("mrr@10", "mrr@11"))[0] == {"mrr@10": 0.0, "mrr@11": pytest.approx(1 / 11)}
    assert evaluate(run, qrels, ("mrr@10",), ties="rank")[0] == {"mrr@10": 1.0}


def test_coverage_top_k_follows_trec_eval_order():
    run = {"q": {"a": 1.0, "z": 1.0}}
    docs = {"a": "Paris is in France", "z": "nothing here"}
    assert answer_coverage(run, docs, {"q": ["Paris"]}, ks=(1,))["coverage@1"] == 0.0  # z first
    assert answer_coverage(run, docs, {"q": ["Paris"]}, ks=(1,), ties="rank")["coverage@1"] == 1.0


def test_tiebreak_is_anserinis_convention():
    """Rounded to 4 decimals, then ties lowered 1e-6 per place in docid-ascending order,
    as in Lucene's reference run (``4.618900`` then ``4.618899`` for MED-4936, MED-839)."""
    from funnel.evaluation.trec import tiebreak
    out = tiebreak({"MED-839": 4.61889996, "MED-4936": 4.6189001, "a": 5.0, "z": 1.23456})
    assert list(out) == ["a", "MED-4936", "MED-839", "z"]
    assert out == {"a": 5.0, "MED-4936": 4.6189, "MED-839": 4.618899, "z": 1.2346}


def test_tiebroken_run_evaluates_as_written_and_in_docid_ascending_order(tmp_path):
    """After ``tiebreak_run`` no exact ties remain, so trec_eval of the written file equals
    funnel's metric and ranks ties docid *ascending*: the order Anserini writes."""
    from funnel.evaluation.trec import tiebreak_run
    run = {"q1": {d: 1.0 for d in POOL[:12]}, "q2": {d: float(i % 3) for i, d in enumerate(POOL)}}
    qrels = {"q1": {POOL[0]: 1, POOL[11]: 2}, "q2": {POOL[3]: 1, POOL[24]: 1}}
    tb = tiebreak_run(run)
    assert all(len(set(docs.values())) == len(docs) for docs in tb.values())
    path = tmp_path / "r.trec"
    write_run(path, tb, tag="t")
    from_file = pytrec(qrels, read_run(path), {"ndcg_cut.10"})
    mean, per_query = evaluate(tb, qrels, ["ndcg@10"])
    for q in qrels:
        assert per_query[q]["ndcg@10"] == pytest.approx(from_file[q]["ndcg_cut_10"], abs=1e-12)
    # q1: all tied; docid ascending puts d00 (grade 1) first and d11 (grade 2) twelfth.
    assert per_query["q1"]["ndcg@10"] == pytest.approx(1 / (2 + 1 / math.log2(3)))
