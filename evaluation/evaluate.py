"""``funnel eval``: run modes over a BEIR dataset, measure, compare, check a regression matrix.

Index building is passed in (``ensure_index``) by the CLI, so the query side never imports
the Ray job. Runs exclude a document whose id equals the query id (BEIR does this for
ArguAna; harmless elsewhere).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable

from .metrics import evaluate, exclude_self, format_table
from .trec import read_qrels, read_queries, write_run

log = logging.getLogger(__name__)

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
DEFAULT_DATA_ROOT = os.path.join("..", "shared", "data", "beir")


def load_beir(dataset_dir: str, split: str = "test") -> tuple[dict[str, str], dict]:
    qrels_path = os.path.join(dataset_dir, "qrels", f"{split}.tsv")
    if not os.path.exists(qrels_path):
        raise FileNotFoundError(f"{qrels_path} not found: --dataset must be a BEIR directory with "
                                f"qrels/{split}.tsv (or pass --split)")
    qrels = read_qrels(qrels_path)
    queries = read_queries(os.path.join(dataset_dir, "queries.jsonl"))
    missing = [q for q in qrels if q not in queries]
    if missing:
        raise ValueError(f"{len(missing)} qrels queries are missing from queries.jsonl (e.g. {missing[:3]})")
    return {q: queries[q] for q in qrels}, qrels


def run_mode(searcher, queries: dict[str, str], mode: str, k: int = 100) -> dict[str, dict[str, float]]:
    run = searcher.search_batch(queries, mode=mode, k=k)
    return exclude_self({q: dict(hits) for q, hits in run.items()})


def eval_dataset(searcher, dataset_dir: str, modes: list[str], split: str = "test", k: int = 100,
                 out_dir: str | None = None, answers_path: str | None = None) -> dict:
    """Metrics per mode, and paired comparisons of every mode against the first.

    A mode the index cannot serve (e.g. ``dense`` without vectors) is reported under
    ``skipped`` with the reason instead of failing the whole evaluation. Where the queries
    carry gold answers (``metadata.answers`` in queries.jsonl, or ``answers_path``), answer
    coverage at 5 and 10 is added per mode.
    """
    from .coverage import answer_coverage, load_answers
    from funnel.serving.search import ModeUnavailable
    queries, qrels = load_beir(dataset_dir, split)
    name = os.path.basename(os.path.normpath(dataset_dir))
    answers = load_answers(answers_path or os.path.join(dataset_dir, "queries.jsonl"))
    answers = {q: a for q, a in answers.items() if q in queries}
    runs, metrics, per_query, skipped, coverage = {}, {}, {}, {}, {}
    for mode in list(modes):
        try:
            runs[mode] = run_mode(searcher, queries, mode, k)
        except ModeUnavailable as e:
            log.warning("skipping mode %s: %s", mode, e)
            skipped[mode] = str(e)
            continue
        metrics[mode], per_query[mode] = evaluate(runs[mode], qrels, METRICS)
        if answers:
            def text(doc_id: str) -> str:
                d = searcher.get_document(doc_id) or {}
                return f"{d.get('title', '')}\n{d.get('text', '')}"
            cov = answer_coverage(runs[mode], text, answers)
            coverage[mode] = {key: v for key, v in cov.items() if key.startswith("coverage@")}
            metrics[mode].update(coverage[mode])
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            write_run(os.path.join(out_dir, f"{name}.{mode}.trec"), runs[mode], tag=f"funnel-{mode}")
    modes = [m for m in modes if m in runs]
    comparisons = []
    if len(modes) > 1:
        from .compare import compare_runs
        for mode in modes[1:]:
            comparisons.append(compare_runs(runs[modes[0]], runs[mode], qrels, queries=queries, k=10,
                                            name_a=modes[0], name_b=mode))
    if out_dir:
        from .report import write_report
        write_report(os.path.join(out_dir, f"{name}.report.md"), metrics, comparisons,
                     os.path.join(out_dir, f"{name}.per-query.png"))
    return {"dataset": name, "split": split, "metrics": metrics, "comparisons": comparisons,
            "skipped": skipped, "n_answers": len(answers)}


def run_eval(a, ensure_index: Callable[[str, str, bool, int], str]) -> int:
    """CLI entry: ``a`` has dataset, index, modes, split, k, shards, out, check, json."""
    from funnel.serving.search import open_index
    modes = [m.strip() for m in (a.modes or "bm25").split(",") if m.strip()]
    if a.check:
        return _check(a, ensure_index)
    if not a.dataset:
        raise ValueError("--dataset BEIR_DIR is required (or --check MATRIX)")
    need_dense = any(m in ("dense", "hybrid") for m in modes)
    root = ensure_index(a.dataset, a.index, need_dense, a.shards)
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(root)), "eval")
    res = eval_dataset(open_index(root), a.dataset, modes, a.split, a.k, out)
    if a.json:
        print(json.dumps({**res, "comparisons": [c.to_dict() for c in res["comparisons"]]}, indent=2))
        return 0
    rows = [{"mode": m, **{k: v for k, v in res["metrics"][m].items()}} for m in modes if m in res["metrics"]]
    print(f"{res['dataset']} ({a.split}, {len(rows) and 'index ' + root})")
    print(format_table(rows))
    for mode, why in res["skipped"].items():
        print(f"skipped {mode}: {why}")
    for c in res["comparisons"]:
        print()
        print(c.verdict)
    print(f"\nruns and report in {out}")
    return 0


def _check(a, ensure_index) -> int:
    from .report import check_matrix, format_checks, load_matrix
    from funnel.serving.search import open_index
    rows = load_matrix(a.check)
    data_root = os.environ.get("FUNNEL_BEIR", DEFAULT_DATA_ROOT)
    measured = {}
    by_dataset: dict[str, set[str]] = {}
    for r in rows:
        by_dataset.setdefault(r.dataset, set()).add(r.mode)
    for ds, modes in sorted(by_dataset.items()):
        ddir = os.path.join(data_root, ds)
        need_dense = any(m in ("dense", "hybrid") for m in modes)
        root = ensure_index(ddir, None, need_dense, a.shards)
        res = eval_dataset(open_index(root), ddir, sorted(modes), a.split, a.k,
                           a.out or os.path.join(os.path.dirname(os.path.abspath(root)), "eval"))
        for mode, ms in res["metrics"].items():
            for metric, v in ms.items():
                measured[(ds, mode, metric)] = v
    checks = check_matrix(rows, measured)
    print(format_checks(checks))
    return 1 if any(c.status != "OK" for c in checks) else 0
