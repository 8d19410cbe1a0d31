"""Answer coverage: SQuAD normalization, whole-token matching, answer loading, and
coverage@k on a hand-built run whose expected fractions are counted by hand."""

from __future__ import annotations

import json

import pytest

from funnel.evaluation.coverage import answer_coverage, contains_answer, load_answers, normalize_answer


def test_normalize_answer_squad_rules():
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("  theory of the atom ") == "theory of atom"  # 'theory' keeps its 'the'
    assert normalize_answer("...") == ""


def test_contains_answer_is_token_aligned():
    assert contains_answer("It was built by Gustave Eiffel in 1889.", ["gustave eiffel"])
    assert contains_answer("The answer: 1,889 meters", ["1889"])  # punctuation removed both sides
    assert not contains_answer("concatenate the strings", ["cat"])
    assert contains_answer("a cat sat", ["The cat"])
    assert not contains_answer("anything", ["", "the"])  # empty after normalization never matches


def test_answer_coverage_at_k():
    docs = {f"d{i}": "filler text" for i in range(12)}
    docs.update({"hit3": "Paris is the capital of France.", "hit7": "Born in 1879 in Ulm.",
                 "hit11": "Mount Everest is high."})

    def ranked(target: str, rank: int) -> dict[str, float]:
        ids = [f"d{i}" for i in range(11)]
        ids.insert(rank - 1, target)
        return {d: 100.0 - i for i, d in enumerate(ids)}

    run = {"q1": ranked("hit3", 3), "q2": ranked("hit7", 7), "q3": ranked("hit11", 11), "q4": ranked("d0", 1)}
    answers = {"q1": ["paris"], "q2": ["1879", "Ulm"], "q3": ["Everest"], "q4": ["nowhere"],
               "q5": ["missing from run"], "q6": ["!!"]}  # q6: no usable answer, not counted
    res = answer_coverage(run, docs, answers, ks=(5, 10))
    assert res["n_queries"] == 5
    assert res["coverage@5"] == pytest.approx(1 / 5)
    assert res["coverage@10"] == pytest.approx(2 / 5)
    assert res["per_query"]["q2"] == {"coverage@5": False, "coverage@10": True}
    assert "q6" not in res["per_query"]
    # a callable gives the same answer as the mapping
    assert answer_coverage(run, docs.__getitem__, answers, ks=(5, 10)) == res
    assert answer_coverage(run, docs, answers, ks=(11,))["coverage@11"] == pytest.approx(3 / 5)


def test_answer_coverage_errors():
    with pytest.raises(ValueError, match="not in doc_text"):
        answer_coverage({"q": {"unknown": 1.0}}, {}, {"q": ["x"]})
    with pytest.raises(ValueError, match="non-empty gold answer"):
        answer_coverage({}, {}, {"q": [""]})


def test_load_answers_from_queries_metadata_and_json(tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text("\n".join(json.dumps(r) for r in [
        {"_id": "1", "text": "capital of france", "metadata": {"answers": ["Paris", "paris, france"]}},
        {"_id": "2", "text": "einstein birthplace", "metadata": {"answer": "Ulm"}},
        {"_id": "3", "text": "no answer", "metadata": {}},
    ]) + "\n")
    assert load_answers(queries) == {"1": ["Paris", "paris, france"], "2": ["Ulm"]}
    js = tmp_path / "answers.json"
    js.write_text(json.dumps({"1": ["Paris"], "2": "Ulm"}))
    assert load_answers(js) == {"1": ["Paris"], "2": ["Ulm"]}
    js.write_text(json.dumps({"1": [3]}))
    with pytest.raises(ValueError, match="query '1'.*list of strings"):
        load_answers(js)
