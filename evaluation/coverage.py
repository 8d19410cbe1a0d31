"""Answer coverage for question-answering collections.

Why: QA sets (Natural Questions, TriviaQA, HotpotQA) often come with answer strings
rather than complete relevance judgements; what a reader model needs is a passage that
contains the answer. Following DPR (Karpukhin et al. 2020, "top-k retrieval accuracy"):

    coverage@k = |{q : some gold answer of q occurs in the text of q's top k documents}|
                 / |{q : q has at least one gold answer}|

Matching is SQuAD-style: both sides are normalized (lowercase, punctuation removed, the
articles a/an/the removed, whitespace collapsed) and an answer matches when its
normalized tokens occur as a contiguous token sequence of the normalized text (so "cat"
does not match "concatenate"). A query with answers but no run results counts as not
covered; queries without any usable answer are left out of the denominator.

Answers come from BEIR ``queries.jsonl`` metadata (``metadata.answers``: list, or
``metadata.answer``: string) or a JSON file ``{qid: [answers]}`` (see :func:`load_answers`).
"""

from __future__ import annotations

import json
import logging
import re
import string
from collections.abc import Callable, Mapping, Sequence

from .trec import PathLike, open_text, ranked_docids, read_query_records

logger = logging.getLogger(__name__)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 ``normalize_answer``: lowercase, drop punctuation and articles, squeeze spaces."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def contains_answer(text: str, answers: Sequence[str]) -> bool:
    """True when any normalized answer occurs as a whole-token span of normalized ``text``."""
    haystack = f" {normalize_answer(text)} "
    for ans in answers:
        needle = normalize_answer(ans)
        if needle and f" {needle} " in haystack:
            return True
    return False


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
        logger.warning("%s: no query has metadata.answers or metadata.answer", path)
    return answers


def answer_coverage(
    run: Mapping[str, Mapping[str, float]],
    doc_text: Callable[[str], str] | Mapping[str, str],
    answers: Mapping[str, Sequence[str]],
    ks: Sequence[int] = (5, 10),
) -> dict:
    """Fraction of queries whose top-k documents contain a gold answer.

    Parameters
    ----------
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``; the top k follows trec_eval's order.
    doc_text : Callable[[str], str] or Mapping[str, str]
        The text of a document by id (e.g. title + text from the corpus).
    answers : Mapping[str, Sequence[str]]
        Gold answers by query id (:func:`load_answers`).
    ks : Sequence[int]
        Cutoffs to report.

    Returns
    -------
    dict
        ``{"n_queries": N, "coverage@5": float, "coverage@10": float, ...,
        "per_query": {qid: {"coverage@5": bool, ...}}}``.
    """
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive cutoffs, got {list(ks)}")
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

    usable = {q: [a for a in ans if normalize_answer(a)] for q, ans in answers.items()}
    skipped = [q for q, ans in usable.items() if not ans]
    if skipped:
        logger.info("%d queries have no usable answer and are not counted", len(skipped))
    usable = {q: ans for q, ans in usable.items() if ans}
    if not usable:
        raise ValueError("no query has a non-empty gold answer; check the answers file")

    kmax = max(ks)
    per_query: dict[str, dict[str, bool]] = {}
    for qid, ans in usable.items():
        top = ranked_docids(run.get(qid, {}), kmax)
        # rank of the first document containing an answer, or None
        first = next((i for i, d in enumerate(top, start=1) if contains_answer(get_text(d), ans)), None)
        per_query[qid] = {f"coverage@{k}": first is not None and first <= k for k in ks}
    n = len(per_query)
    result: dict = {"n_queries": n}
    for k in ks:
        result[f"coverage@{k}"] = sum(r[f"coverage@{k}"] for r in per_query.values()) / n
    result["per_query"] = per_query
    return result
