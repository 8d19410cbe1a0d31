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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytrec_eval

from .trec import Qrels, Run, ranked_docids

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


def cut_run(run: Mapping[str, Mapping[str, float]], k: int) -> Run:
    """Keep the top ``k`` documents of each query, in trec_eval's ranking order."""
    return {qid: {d: float(docs[d]) for d in ranked_docids(docs, k)} for qid, docs in run.items()}


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


def _as_pytrec(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> tuple[Run, Qrels]:
    qrels_ = {str(q): {str(d): int(g) for d, g in docs.items()} for q, docs in qrels.items()}
    # Rank-based scores in funnel's order (score desc, docid asc): trec_eval would otherwise
    # re-break exact ties by docid descending and evaluate a ranking nobody produced.
    run_ = {}
    for q, docs in run.items():
        if str(q) not in qrels_:
            continue
        order = ranked_docids({str(d): float(s) for d, s in docs.items()})
        run_[str(q)] = {d: float(len(order) - i) for i, d in enumerate(order)}
    return run_, qrels_


def evaluate(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Evaluate a run against qrels with pytrec_eval, BEIR-style.

    Parameters
    ----------
    run : Mapping[str, Mapping[str, float]]
        ``{qid: {docid: score}}``, e.g. from :func:`funnel.evaluation.trec.read_run`.
    qrels : Mapping[str, Mapping[str, int]]
        ``{qid: {docid: grade}}``.
    metrics : Sequence[str]
        Names ``NAME@K`` with NAME in ndcg, recall, precision, map, mrr.

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
    parsed = [(m, *parse_metric(m)) for m in metrics]
    run_, qrels_ = _as_pytrec(run, qrels)
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
        mrr_results[k] = pytrec_eval.RelevanceEvaluator(qrels_, {"recip_rank"}).evaluate(cut_run(run_, k))

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
