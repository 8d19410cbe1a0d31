"""BEIR retrieval metrics from a TREC run and qrels, computed by pytrec_eval.

Why: published BEIR figures (Pyserini 2CR, the BEIR paper, MTEB) are trec_eval numbers
averaged over *every* query in the qrels. Computing them with the same library and the
same averaging is what makes funnel's numbers comparable to them; the Lucene reference
run in ``shared/data/reference/lucene`` reproduces 0.6789 NDCG@10 on SciFact this way.

Metrics, for a query with graded judgements ``rel(d)`` and ranking ``d_1, d_2, ...``
(score descending, ties by docid descending, as trec_eval sorts):

* ``ndcg@k`` = DCG@k / IDCG@k, DCG@k = sum_{i<=k} rel(d_i) / log2(i + 1)
  (trec_eval ``ndcg_cut_k``, linear gain);
* ``recall@k`` = |relevant in top k| / |relevant| (``recall_k``);
* ``precision@k`` = |relevant in top k| / k (``P_k``);
* ``map@k`` = average precision cut at k (``map_cut_k``);
* ``mrr@k`` = 1 / rank of the first relevant document within the top k, else 0
  (``recip_rank`` on the run cut to k documents).

A document is relevant when its grade is >= 1. The mean is over all qrels queries; a
qrels query missing from the run scores 0 on every metric. Run queries absent from the
qrels are ignored.

Tie order. By default (``ties="trec_eval"``) pytrec_eval receives the run's real scores,
so tied documents are ordered as trec_eval orders them (docid descending) and the figure
is the one trec_eval prints for the written run (`write_run`
writes exact scores, so file and memory agree). ``ties="rank"`` evaluates the system's own
order instead (ties by docid ascending, funnel's rule) by handing pytrec_eval rank-based
scores. The two differ only where scores tie, i.e. on collections with duplicate
documents: funnel's BM25 on NFCorpus prints NDCG@10 0.3206 (trec_eval) vs 0.3218 (rank).
Note that Anserini/Pyserini runs carry no exact ties (its tie-breaking reranker rounds
scores to 4 decimals and perturbs tied ones so that docids sort ascending), so trec_eval
on them gives the docid-ascending figure: Pyserini's published NFCorpus 0.3218. Label
which order a figure uses (`describe_ties`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytrec_eval

from .trec import Qrels, Run, check_ties, ranked_docids

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")

# Our metric name -> pytrec_eval measure family. mrr is computed separately (cut run).
_PYTREC_MEASURES = {"ndcg": "ndcg_cut", "recall": "recall", "precision": "P", "map": "map_cut"}
_METRIC_NAMES = (*_PYTREC_MEASURES, "mrr")


def parse_metric(name: str) -> tuple[str, int]:
    """Split ``"ndcg@10"`` into ``("ndcg", 10)``, validating both parts."""
    base, sep, k_s = name.lower().partition("@")
    if base not in _METRIC_NAMES or not sep or not k_s.isdigit() or int(k_s) < 1:
        raise ValueError(
            f"unknown metric {name!r}; use NAME@K with NAME one of {', '.join(_METRIC_NAMES)} "
            "and K a positive integer, e.g. 'ndcg@10'"
        )
    return base, int(k_s)


def describe_ties(ties: str) -> str:
    """A one-line label for reports and summaries, e.g. ``"trec_eval (score desc, ties by docid desc: ...)"``."""
    return {"trec_eval": "trec_eval (what trec_eval prints for the written runs; BM25 and SIRA runs are "
                         "written as Anserini writes them: scores to 4 decimals, ties apart by docid asc)",
            "rank": "rank (score desc, ties by docid asc: funnel's own order, not trec_eval's re-sort)"}[check_ties(ties)]


def cut_run(run: Mapping[str, Mapping[str, float]], k: int, ties: str = "trec_eval") -> Run:
    """Keep the top ``k`` documents of each query, in the ``ties`` order (trec_eval's by default)."""
    return {qid: {d: float(docs[d]) for d in ranked_docids(docs, k, ties)} for qid, docs in run.items()}


def exclude_self(run: Mapping[str, Mapping[str, float]]) -> Run:
    """Drop, for each query, the document whose id equals the query id.

    BEIR does this for ArguAna (queries are themselves corpus documents), as does
    Pyserini's ``--remove-query``.

    Parameters
    ----------
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``.

    Returns
    -------
    dict[str, dict[str, float]]
        A new run; the input is not modified.
    """
    return {qid: {d: s for d, s in docs.items() if d != qid} for qid, docs in run.items()}


def _as_pytrec(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]],
               ties: str = "trec_eval") -> tuple[Run, Qrels]:
    qrels_ = {str(q): {str(d): int(g) for d, g in docs.items()} for q, docs in qrels.items()}
    run_ = {}
    for q, docs in run.items():
        if str(q) not in qrels_:
            continue
        scores = {str(d): float(s) for d, s in docs.items()}
        if ties == "trec_eval":
            run_[str(q)] = scores  # real scores: trec_eval sorts them itself
        else:
            # Rank-based scores in funnel's order (score desc, docid asc) leave trec_eval no tie to break.
            order = ranked_docids(scores, ties="rank")
            run_[str(q)] = {d: float(len(order) - i) for i, d in enumerate(order)}
    return run_, qrels_


def evaluate(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    ties: str = "trec_eval",
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Evaluate a run against qrels with pytrec_eval, BEIR-style.

    Parameters
    ----------
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``, e.g. from `funnel.evaluation.trec.read_run`.
    qrels : Mapping[str, Mapping[str, int]]
        ``{qid: {docid: grade}}``.
    metrics : Sequence[str]
        Names ``NAME@K`` with NAME in ndcg, recall, precision, map, mrr.
    ties : {"trec_eval", "rank"}
        ``"trec_eval"`` (default): what trec_eval prints for the run as written (ties by
        docid descending). ``"rank"``: the run's own order (ties by docid ascending). They
        differ only where scores tie; see the module docstring.

    Returns
    -------
    mean : dict[str, float]
        Each metric averaged over all qrels queries.
    per_query : dict[str, dict[str, float]]
        ``{qid: {metric: value}}`` for every qrels query (0 where the run has no
        documents for it).
    """
    if not qrels:
        raise ValueError("qrels are empty; pass the judgements for the queries you ran")
    check_ties(ties)
    parsed = [(m, *parse_metric(m)) for m in metrics]
    run_, qrels_ = _as_pytrec(run, qrels, ties)
    missing = [q for q in qrels_ if not run_.get(q)]
    if missing:
        logger.info("%d of %d qrels queries have no run results; they score 0", len(missing), len(qrels_))

    # One evaluator for the trec_eval measures, one per distinct mrr cutoff.
    measures: dict[str, str] = {}  # our name -> pytrec_eval result key
    cutoffs: dict[str, set[int]] = {}
    mrr_ks: dict[str, int] = {}
    for name, base, k in parsed:
        if base == "mrr":
            mrr_ks[name] = k
        else:
            family = _PYTREC_MEASURES[base]
            cutoffs.setdefault(family, set()).add(k)
            measures[name] = f"{family}_{k}"

    results: dict[str, dict[str, float]] = {}  # qid -> pytrec key -> value
    if cutoffs:
        spec = {f"{fam}.{','.join(str(k) for k in sorted(ks))}" for fam, ks in cutoffs.items()}
        results = pytrec_eval.RelevanceEvaluator(qrels_, spec).evaluate(run_)
    mrr_results: dict[int, dict[str, dict[str, float]]] = {}
    for k in sorted(set(mrr_ks.values())):
        mrr_results[k] = pytrec_eval.RelevanceEvaluator(qrels_, {"recip_rank"}).evaluate(cut_run(run_, k, ties))

    per_query: dict[str, dict[str, float]] = {}
    for qid in qrels_:
        row: dict[str, float] = {}
        for name, base, k in parsed:
            if base == "mrr":
                row[name] = float(mrr_results[k].get(qid, {}).get("recip_rank", 0.0))
            else:
                row[name] = float(results.get(qid, {}).get(measures[name], 0.0))
        per_query[qid] = row
    n = len(per_query)
    mean = {name: sum(r[name] for r in per_query.values()) / n for name, _, _ in parsed}
    return mean, per_query


def _fmt_cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, float):
        return format(value, floatfmt)
    return "" if value is None else str(value).replace("|", "\\|")


def format_table(
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    floatfmt: str = ".4f",
) -> str:
    """Render rows of dicts as a GitHub markdown table.

    Parameters
    ----------
    rows : Iterable[Mapping[str, Any]]
        One mapping per table row, e.g. ``{"mode": "bm25", "ndcg@10": 0.6789}``.
    columns : Sequence[str], optional
        Column order; by default the keys in order of first appearance.
    floatfmt : str
        Format spec for float cells.

    Returns
    -------
    str
        The table, one line per row, ending with a newline; numbers right-aligned.
    """
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    if not columns:
        raise ValueError("format_table needs at least one column; pass rows or columns")
    cells = [[_fmt_cell(r.get(c), floatfmt) for c in columns] for r in rows]
    numeric = [bool(rows) and all(isinstance(r.get(c), (int, float)) for r in rows if r.get(c) is not None)
               for c in columns]
    widths = [max(3, len(str(c)), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line([str(c) for c in columns]), sep, *(line(r) for r in cells)]) + "\n"
