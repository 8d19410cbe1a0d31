"""Answer coverage: DPR has_answer matching (Unicode tokens, NFD, uncased, token
sequences), answer loading, and coverage@k on a hand-built run counted by hand."""

from __future__ import annotations

import json
import logging
import unicodedata

import pytest

from funnel.evaluation.coverage import answer_coverage, answer_tokens, contains_answer, load_answers


def test_answer_tokens_dpr_simple_tokenizer():
    # alphanumeric runs ([\p{L}\p{N}\p{M}]+) and every other non-space character alone
    assert answer_tokens("The A350-900, in 2019!") == ("the", "a350", "-", "900", ",", "in", "2019", "!")
    assert answer_tokens("year—ChatGPT") == ("year", "—", "chatgpt")
    assert answer_tokens("“quoted”") == ("“", "quoted", "”")
    assert answer_tokens("Ünïcode  ÉTÉ") == tuple(unicodedata.normalize("NFD", t) for t in ("ünïcode", "été"))
    assert answer_tokens("   ") == ()


@pytest.mark.parametrize("text, answer, expected", [
    ("In that year—ChatGPT was released", "ChatGPT", True),  # em dash splits tokens
    ("In that year—ChatGPT was released", "year", True),
    ("He called it “quoted” twice", "quoted", True),  # curly quotes are their own tokens
    ("He called it “quoted” twice", '"quoted"', False),  # straight quotes are other characters
    ("Airbus A350-900 aircraft", "A350-900", True),
    ("Airbus A350900 aircraft", "A350-900", False),  # punctuation is not stripped away
    ("Airbus A350-900 aircraft", "A350900", False),
    ("a caf\u00e9 in Paris", "cafe\u0301", True),  # composed text, decomposed answer (NFD)
    ("a cafe\u0301 in Paris", "caf\u00e9", True),
    ("a café in Paris", "cafe", False),  # accents are kept, as in DPR
    ("It was built by Gustave Eiffel in 1889.", "gustave eiffel", True),  # uncased
    ("concatenate the strings", "cat", False),  # whole tokens only
    ("Born in Ulm, Germany", "Ulm, Germany", True),  # multi-token answer with punctuation
    ("Born in Ulm Germany", "Ulm, Germany", False),
    ("The answer: 1,889 meters", "1889", False),
    ("東京タワーは高い", "東京タワーは高い", True),
])
def test_contains_answer_dpr_has_answer(text, answer, expected):
    assert contains_answer(text, [answer]) is expected


def test_contains_answer_ignores_empty_answers():
    assert not contains_answer("anything", ["", "   "])  # no tokens: never a match
    assert contains_answer("anything goes", ["", "goes"])


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
               "q5": ["missing from run"], "q6": ["", " "]}  # q6: no answer with a token, not counted
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


def test_load_answers_without_answers_is_not_a_warning(tmp_path, caplog):
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"_id": "1", "text": "no answers here"}) + "\n")
    with caplog.at_level(logging.DEBUG, logger="funnel.evaluation.coverage"):
        assert load_answers(queries) == {}
    assert caplog.records and all(r.levelno < logging.WARNING for r in caplog.records)


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
