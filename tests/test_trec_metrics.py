"""TREC file I/O and BEIR metrics: hand-built cases with formula expectations, plus the
real Lucene reference runs (Pyserini 2CR figures) when ../shared/data is present."""

from __future__ import annotations

import gzip
import math
import os
from pathlib import Path

import pytest

from funnel.evaluation.metrics import evaluate, exclude_self, format_table, parse_metric
from funnel.evaluation.trec import ranked_docids, read_qrels, read_queries, read_run, write_run

DATA = Path(os.environ.get("FUNNEL_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
LUCENE = DATA / "reference" / "lucene"


def needs_data(*parts: str):
    path = DATA.joinpath(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"shared evaluation data not found at {path} "
                              "(set FUNNEL_SHARED_DATA or check out ../shared)")


# ---------------------------------------------------------------- trec.py

def test_run_round_trip_plain_and_gz(tmp_path):
    run = {"q1": {"d3": 1.5, "d1": 2.25, "d2": 1.5, "d9": -0.1}, "q2": {"x": 0.1 + 0.2}}
    for name in ("run.trec", "run.trec.gz"):
        path = tmp_path / name
        write_run(path, run, tag="funnel-test")
        assert read_run(path) == run  # exact floats: repr round-trips
    lines = (tmp_path / "run.trec").read_text().splitlines()
    # score desc, ties by docid ascending, ranks 1-based
    assert [ln.split()[2:4] for ln in lines[:4]] == [["d1", "1"], ["d2", "2"], ["d3", "3"], ["d9", "4"]]
    assert all(ln.split()[1] == "Q0" and ln.split()[5] == "funnel-test" for ln in lines)
    with gzip.open(tmp_path / "run.trec.gz", "rt") as f:
        assert f.read().splitlines() == lines


def test_write_run_rejects_bad_tag_and_ids(tmp_path):
    with pytest.raises(ValueError, match="tag"):
        write_run(tmp_path / "r", {"q": {"d": 1.0}}, tag="has space")
    with pytest.raises(ValueError, match="whitespace"):
        write_run(tmp_path / "r", {"q": {"d 1": 1.0}}, tag="t")


def test_read_run_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.trec"
    path.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 t\n")
    with pytest.raises(ValueError, match=r"bad\.trec:2: expected 6 columns"):
        read_run(path)
    path.write_text("q1 Q0 d1 1 high t\n")
    with pytest.raises(ValueError, match=r"bad\.trec:1: score 'high'"):
        read_run(path)
    path.write_text("q1 Q0 d1 1 2.0 t\n\nq1 Q0 d1 2 1.0 t\n")
    with pytest.raises(ValueError, match=r"bad\.trec:3: .*twice"):
        read_run(path)


def test_read_qrels_beir_and_trec_formats(tmp_path):
    beir = tmp_path / "test.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2\nq2\td3\t0\n")
    trec = tmp_path / "qrels.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 2\nq2 0 d3 0\n")
    expected = {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 0}}
    assert read_qrels(beir) == expected
    assert read_qrels(trec) == expected
    trec.write_text("q1 0 d1 1\nq1 0 d2\n")
    with pytest.raises(ValueError, match=r"qrels\.txt:2: expected 4 columns"):
        read_qrels(trec)
    trec.write_text("q1 0 d1 yes\n")
    with pytest.raises(ValueError, match=r"qrels\.txt:1: relevance 'yes'"):
        read_qrels(trec)


def test_read_queries_jsonl_and_errors(tmp_path):
    path = tmp_path / "queries.jsonl"
    path.write_text('{"_id": "1", "text": "what is bm25", "metadata": {"answers": ["a"]}}\n'
                    '{"_id": 2, "text": "second"}\n')
    assert read_queries(path) == {"1": "what is bm25", "2": "second"}
    path.write_text('{"_id": "1", "text": "ok"}\n{"_id": "2"}\n')
    with pytest.raises(ValueError, match=r"queries\.jsonl:2: a query needs '_id' and a string 'text'"):
        read_queries(path)
    path.write_text('{"_id": "1", "text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"queries\.jsonl:2: not valid JSON"):
        read_queries(path)


def test_ranked_docids_follows_trec_eval_ties_by_default():
    # trec_eval breaks score ties by docid descending (form_res_rels.c); funnel's own order
    # (ties ascending, as write_run writes ranks) is available as ties="rank".
    scores = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert ranked_docids(scores) == ["c", "b", "a"]
    assert ranked_docids(scores, 2) == ["c", "b"]
    assert ranked_docids(scores, ties="rank") == ["c", "a", "b"]
    with pytest.raises(ValueError, match="trec_eval, rank"):
        ranked_docids(scores, ties="random")
    qrels = {"q": {"a": 1}}
    mean, _ = evaluate({"q": {"a": 1.0, "b": 1.0}}, qrels, ["mrr@10", "ndcg@1"])
    assert mean == {"mrr@10": 0.5, "ndcg@1": 0.0}  # b outranks a in trec_eval's order
    mean, _ = evaluate({"q": {"a": 1.0, "b": 1.0}}, qrels, ["mrr@10", "ndcg@1"], ties="rank")
    assert mean == {"mrr@10": 1.0, "ndcg@1": 1.0}


# ---------------------------------------------------------------- metrics.py

def test_metrics_by_formula_and_missing_query_scores_zero():
    qrels = {"q1": {"d1": 1, "d2": 2, "d9": 0}, "q2": {"d5": 1}}
    run = {"q1": {"d2": 3.0, "x": 2.0, "d1": 1.0}, "q_extra": {"d1": 1.0}}  # q2 absent
    mean, per_query = evaluate(run, qrels, ("ndcg@10", "recall@10", "recall@1", "mrr@10", "mrr@1", "precision@2"))
    assert set(per_query) == {"q1", "q2"}  # qrels queries only
    dcg = 2 / math.log2(2) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    q1 = per_query["q1"]
    assert q1["ndcg@10"] == pytest.approx(dcg / idcg)
    assert q1["recall@10"] == pytest.approx(1.0)
    assert q1["recall@1"] == pytest.approx(0.5)
    assert q1["mrr@10"] == pytest.approx(1.0)
    assert q1["precision@2"] == pytest.approx(0.5)
    assert all(v == 0.0 for v in per_query["q2"].values())
    for name, v in mean.items():
        assert v == pytest.approx(q1[name] / 2)  # averaged over BOTH qrels queries


def test_mrr_is_cut_at_k():
    qrels = {"q": {"rel": 1}}
    run = {"q": {f"d{i:02d}": 100.0 - i for i in range(12)} | {"rel": 100.0 - 11.5}}  # rel at rank 13
    _, pq = evaluate(run, qrels, ("mrr@10", "mrr@100"))
    assert pq["q"]["mrr@10"] == 0.0
    assert pq["q"]["mrr@100"] == pytest.approx(1 / 13)


def test_unknown_metric_lists_choices():
    with pytest.raises(ValueError, match="ndcg, recall, precision, map, mrr"):
        parse_metric("bleu@4")
    with pytest.raises(ValueError, match="NAME@K"):
        evaluate({"q": {"d": 1.0}}, {"q": {"d": 1}}, ("ndcg",))


def test_exclude_self():
    run = {"q1": {"q1": 9.0, "d1": 1.0}, "d1": {"d1": 5.0}}
    assert exclude_self(run) == {"q1": {"d1": 1.0}, "d1": {}}
    assert run["q1"]["q1"] == 9.0  # input untouched
    qrels = {"q1": {"d1": 1}}
    assert evaluate(exclude_self(run), qrels, ("mrr@10",))[0]["mrr@10"] == 1.0
    assert evaluate(run, qrels, ("mrr@10",))[0]["mrr@10"] == 0.5


def test_format_table():
    text = format_table([{"mode": "bm25", "ndcg@10": 0.67891}, {"mode": "dense", "ndcg@10": 0.6451}])
    lines = text.splitlines()
    assert lines[0].split("|")[1].strip() == "mode"
    assert lines[1].endswith(":|")  # numeric column right-aligned
    assert "0.6789" in lines[2] and "0.6451" in lines[3]


# ---------------------------------------------------------------- the Lucene reference

@pytest.mark.parametrize("dataset, ndcg10, r10, r100", [
    ("scifact", 0.6789, 0.8038, 0.9253),
    ("nfcorpus", 0.3218, 0.1541, 0.2457),
])
def test_lucene_reference_reproduces_published_figures(dataset, ndcg10, r10, r100):
    run_path = LUCENE / f"{dataset}.bm25flat.top100.trec.gz"
    qrels_path = DATA / "beir" / dataset / "qrels" / "test.tsv"
    if not run_path.exists() or not qrels_path.exists():
        pytest.skip(f"shared evaluation data not found ({run_path}); set FUNNEL_SHARED_DATA or check out ../shared")
    qrels = read_qrels(qrels_path)
    mean, per_query = evaluate(read_run(run_path), qrels)
    assert round(mean["ndcg@10"], 4) == ndcg10
    assert round(mean["recall@10"], 4) == r10
    assert round(mean["recall@100"], 4) == r100
    assert len(per_query) == len(qrels)
    # per-query figures match Lucene's own per-query table
    for line in (LUCENE / f"{dataset}.bm25flat.perquery.tsv").read_text().splitlines()[1:]:
        qid, ndcg, rec10, rec100, _ = line.split("\t")
        assert per_query[qid]["ndcg@10"] == pytest.approx(float(ndcg), abs=1e-6)
        assert per_query[qid]["recall@100"] == pytest.approx(float(rec100), abs=1e-6)


@needs_data("beir", "scifact", "queries.jsonl")
def test_read_real_queries():
    queries = read_queries(DATA / "beir" / "scifact" / "queries.jsonl")
    qrels = read_qrels(DATA / "beir" / "scifact" / "qrels" / "test.tsv")
    assert len(qrels) == 300
    assert set(qrels) <= set(queries)
