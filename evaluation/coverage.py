r"""Answer coverage for question-answering collections.

Why: QA sets (Natural Questions, TriviaQA, HotpotQA) often come with answer strings
rather than complete relevance judgements; what a reader model needs is a passage that
contains the answer. Following DPR (Karpukhin et al. 2020, "top-k retrieval accuracy"):

    coverage@k = |{q : some gold answer of q occurs in the text of q's top k documents}|
                 / |{q : q has at least one gold answer}|

Matching is DPR's ``has_answer`` (``dpr/data/qa_validation.py``, ``match_type="string"``):
both sides are NFD-normalized and split by DPR's ``SimpleTokenizer`` into tokens that are
either runs of letters, digits and combining marks (``[\p{L}\p{N}\p{M}]+``) or single
other non-space characters (``[^\p{Z}\p{C}]``), lowercased; an answer matches when its
token sequence occurs contiguously in the text's. So "year—ChatGPT" contains "ChatGPT",
"A350-900" matches "A350-900" but not "A350900", "cat" does not match "concatenate", and a
composed "café" matches a decomposed one (accents are kept, not stripped: "cafe" does not
match "café"). A query with answers but no run results counts as not covered; answers
without any token are ignored, and queries left without an answer are not counted.

Answers come from BEIR ``queries.jsonl`` metadata (``metadata.answers``: list, or
``metadata.answer``: string) or a JSON file ``{qid: [answers]}`` (see `load_answers`).
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Callable, Mapping, Sequence

import regex

from .trec import PathLike, check_ties, open_text, ranked_docids, read_query_records

logger = logging.getLogger(__name__)

# DPR's SimpleTokenizer (dpr/utils/tokenizers.py): alphanumeric runs, or one non-space char.
_DPR_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.UNICODE | regex.MULTILINE)


def answer_tokens(text: str) -> tuple[str, ...]:
    """DPR ``has_answer`` tokens of ``text``: NFD-normalized, SimpleTokenizer, lowercased."""
    return tuple(m.lower() for m in _DPR_TOKEN.findall(unicodedata.normalize("NFD", text)))


def _contains_tokens(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    if n == 0:
        return False  # DPR would match an empty answer everywhere; it is no answer
    first = needle[0]
    return any(haystack[i] == first and tuple(haystack[i:i + n]) == tuple(needle)
               for i in range(len(haystack) - n + 1))


def contains_answer(text: str, answers: Sequence[str]) -> bool:
    """True when the tokens of any answer occur as a contiguous token sequence of ``text``
    (DPR ``has_answer``; see the module docstring)."""
    haystack = answer_tokens(text)
    return any(_contains_tokens(haystack, answer_tokens(a)) for a in answers)


def _as_answer_list(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"{where}: answers must be a string or a list of strings, got {type(value).__name__}")


def load_answers(path: PathLike) -> dict[str, list[str]]:
    """Gold answers by query id.

    Parameters
    ----------
    path : str or PathLike
        Either a BEIR ``queries.jsonl`` whose ``metadata`` holds ``answers`` (list) or
        ``answer`` (string), or a ``.json`` file ``{qid: [answers]}`` (a string value is
        one answer).

    Returns
    -------
    dict[str, list[str]]
        Only queries that have answers.
    """
    name = str(path).removesuffix(".gz")
    if name.endswith(".json"):
        with open_text(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: not valid JSON ({exc.msg}); expected {{qid: [answers]}}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object {{qid: [answers]}}, got {type(data).__name__}")
        return {str(q): _as_answer_list(v, f"{path}: query {q!r}") for q, v in data.items()}
    answers: dict[str, list[str]] = {}
    for qid, rec in read_query_records(path).items():
        meta = rec.get("metadata") or {}
        if not isinstance(meta, dict):
            continue
        value = meta.get("answers", meta.get("answer"))
        if value is not None:
            answers[qid] = _as_answer_list(value, f"{path}: query {qid!r} metadata")
    if not answers:
        # Most BEIR sets have no answers: not a problem, coverage is simply not computed.
        logger.info("%s: no query has metadata.answers or metadata.answer; no answer coverage", path)
    return answers


def answer_coverage(
    run: Mapping[str, Mapping[str, float]],
    doc_text: Callable[[str], str] | Mapping[str, str],
    answers: Mapping[str, Sequence[str]],
    ks: Sequence[int] = (5, 10),
    ties: str = "trec_eval",
) -> dict:
    """Fraction of queries whose top-k documents contain a gold answer.

    Parameters
    ----------
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``.
    doc_text : Callable[[str], str] or Mapping[str, str]
        The text of a document by id (e.g. title + text from the corpus).
    answers : Mapping[str, Sequence[str]]
        Gold answers by query id (`load_answers`).
    ks : Sequence[int]
        Cutoffs to report.
    ties : {"trec_eval", "rank"}
        Order of the top k: trec_eval's (score desc, docid desc; default) or the run's own.

    Returns
    -------
    dict
        ``{"n_queries": N, "coverage@5": float, "coverage@10": float, ...,
        "per_query": {qid: {"coverage@5": bool, ...}}}``.
    """
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive cutoffs, got {list(ks)}")
    check_ties(ties)
    if isinstance(doc_text, Mapping):
        texts = doc_text

        def get_text(docid: str) -> str:
            try:
                return texts[docid]
            except KeyError:
                raise ValueError(
                    f"document {docid!r} is in the run but not in doc_text; pass the corpus the run was made from"
                ) from None
    else:
        get_text = doc_text

    usable = {q: [t for t in map(answer_tokens, ans) if t] for q, ans in answers.items()}
    skipped = [q for q, ans in usable.items() if not ans]
    if skipped:
        logger.info("%d queries have no usable answer and are not counted", len(skipped))
    usable = {q: ans for q, ans in usable.items() if ans}
    if not usable:
        raise ValueError("no query has a non-empty gold answer; check the answers file")

    kmax = max(ks)
    doc_tokens: dict[str, tuple[str, ...]] = {}  # a document is tokenized once, whatever the query

    def tokens_of(docid: str) -> tuple[str, ...]:
        if docid not in doc_tokens:
            doc_tokens[docid] = answer_tokens(get_text(docid))
        return doc_tokens[docid]

    per_query: dict[str, dict[str, bool]] = {}
    for qid, ans in usable.items():
        top = ranked_docids(run.get(qid, {}), kmax, ties)
        # rank of the first document containing an answer, or None
        first = next((i for i, d in enumerate(top, start=1)
                      if any(_contains_tokens(tokens_of(d), a) for a in ans)), None)
        per_query[qid] = {f"coverage@{k}": first is not None and first <= k for k in ks}
    n = len(per_query)
    result: dict = {"n_queries": n}
    for k in ks:
        result[f"coverage@{k}"] = sum(r[f"coverage@{k}"] for r in per_query.values()) / n
    result["per_query"] = per_query
    return result
