"""`funnel search --run`, `funnel eval` and `funnel compare` through the real CLI on a tiny
BEIR-layout QA collection built here (real Ray build, real pytrec_eval)."""

import json
import re
import os

import pytest

from funnel.serving.frontends.cli import main

from conftest import write_jsonl

DOCS = [
    {"_id": "d1", "title": "Paris", "text": "Paris is the capital of France and its largest city."},
    {"_id": "d2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"_id": "d3", "title": "Rivers", "text": "The Seine flows through Paris; the Spree through Berlin."},
    {"_id": "d4", "title": "Mountains", "text": "Mont Blanc is the highest mountain in the Alps."},
]
QUERIES = [
    {"_id": "q1", "text": "capital of France", "metadata": {"answers": ["Paris"]}},
    {"_id": "q2", "text": "capital of Germany", "metadata": {"answers": ["Berlin"]}},
    {"_id": "q3", "text": "highest mountain in the Alps", "metadata": {"answers": ["Mont Blanc"]}},
]


@pytest.fixture(scope="module")
def tiny(ray_session, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    write_jsonl(d / "corpus.jsonl", DOCS)
    write_jsonl(d / "queries.jsonl", QUERIES)
    os.makedirs(d / "qrels")
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq3\td4\t1\n")
    return d


def test_eval_reports_metrics_coverage_and_skips_unavailable_modes(tiny, capsys):
    rc = main(["eval", "--dataset", str(tiny), "--index", str(tiny / "ix"), "--modes", "bm25,sira",
               "--shards", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    m = out["metrics"]["bm25"]
    assert m["ndcg@10"] == pytest.approx(1.0) and m["coverage@5"] == pytest.approx(1.0)
    # sira is evaluated where this index can run it, or skipped with the reason: never dropped.
    assert set(out["metrics"]) | set(out["skipped"]) == {"bm25", "sira"}
    assert all(why for why in out["skipped"].values())


def test_batch_runs_and_compare(tiny, tmp_path, capsys):
    assert main(["eval", "--dataset", str(tiny), "--index", str(tiny / "ix")]) == 0
    capsys.readouterr()
    a, b = str(tmp_path / "a.trec"), str(tmp_path / "b.trec")
    queries = str(tiny / "queries.jsonl")
    assert main(["search", str(tiny / "ix"), "--queries", queries, "--run", a, "--k", "10"]) == 0
    assert main(["search", str(tiny / "ix"), "--queries", queries, "--run", b, "--k", "10", "--b", "1.0",
                 "--k1", "3.0"]) == 0
    lines = open(a).read().splitlines()
    assert lines[0].split()[:4] == ["q1", "Q0", "d1", "1"] and lines[0].split()[5] == "funnel-bm25"
    capsys.readouterr()
    assert main(["compare", a, b, "--qrels", str(tiny / "qrels" / "test.tsv"), "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    assert cmp["a"] + cmp["b"] + cmp["c"] + cmp["d"] == 3 or "table" in cmp


def test_search_cli_single_query_json_and_errors(tiny, capsys):
    assert main(["search", str(tiny / "ix"), "capital of France", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["hits"][0]["doc_id"] == "d1" and res["summary"].startswith("Found")
    assert main(["search", str(tiny / "nope"), "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["search", str(tiny / "ix"), "x", "--mode", "fuzzy"]) == 2
    assert "invalid choice: 'fuzzy' (choose from 'bm25', 'dense', 'hybrid', 'sira')" in capsys.readouterr().err


def test_search_cli_prints_each_hit_once_with_its_snippet(tiny, capsys):
    """The CLI prints the text an agent reads: each hit once, numbered, with where its passage
    is and the passage quoted under it, then how to fetch more."""
    assert main(["search", str(tiny / "ix"), "capital of France", "--k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Found 2 documents for 'capital of France' (bm25):"
    hits = [l for l in lines[1:] if re.match(r"\d+\. \[", l)]
    assert len(hits) == 2 and hits[0].startswith("1. [d1] Paris") and "start=0" in hits[0]
    below_first = lines[lines.index(hits[0]) + 1:lines.index(hits[1])]
    assert any(l.strip().startswith("> Paris is the capital of France") for l in below_first)
    assert sum("[d1]" in l for l in lines) == 1  # no second numbered list
    assert any(l.startswith("More: get_document(\"d1\"") for l in lines)


def test_eval_remove_query_choices(tiny, capsys):
    from funnel.serving.frontends.cli import build_parser
    p = build_parser()
    assert p.parse_args(["eval", "--dataset", "x"]).remove_query == "auto"
    assert p.parse_args(["eval", "--dataset", "x", "--remove-query", "on"]).remove_query == "on"
    assert main(["eval", "--dataset", str(tiny), "--remove-query", "maybe"]) == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
    assert main(["eval", "--dataset", str(tiny), "--index", str(tiny / "ix"), "--remove-query", "off",
                 "--json"]) == 0
    assert "remove-query: off" in " ".join(json.loads(capsys.readouterr().out)["notes"])
