"""``funnel eval``: run modes over a BEIR dataset, measure, compare, check a regression matrix.

Index building is passed in (``ensure_index``) by the CLI, so the query side never imports
the Ray job. Two conventions decide whether a figure is comparable with published ones, and
both are stated in every summary and report:

* **tie order**: BM25 runs are written the way Anserini writes them (scores rounded to 4
  decimals, remaining ties broken by docid ascending with 1e-6 steps,
  `funnel.evaluation.trec.tiebreak`), dense and hybrid runs with their exact scores as
  BEIR and MTEB evaluate them; every run is evaluated as trec_eval evaluates the written
  file (`funnel.evaluation.metrics`), so the figures are the published ones;
* **remove-query** (BEIR ``ignore_identical_ids``, Pyserini ``--remove-query``): drop the
  hit whose doc id is the query id. ``"auto"`` turns it on when at least
  `REMOVE_QUERY_AUTO_SHARE` of the qrels query ids are corpus ids (ArguAna, Quora,
  CQADupStack), which `decide_remove_query` reads from ``corpus.jsonl`` (ids only,
  streamed).

A query the searcher refuses (empty, too long) is skipped, scores 0, and is listed, instead
of aborting the whole evaluation.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection, Iterator
from typing import Callable

from .metrics import describe_ties, evaluate, format_table
from .trec import TIE_ORDERS, PathLike, check_ties, open_text, read_qrels, read_queries, run_as_written, write_run

log = logging.getLogger(__name__)

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
DEFAULT_DATA_ROOT = os.path.join("..", "shared", "data", "beir")
REMOVE_QUERY_CHOICES = ("auto", "on", "off")
REMOVE_QUERY_AUTO_SHARE = 0.5
__all__ = ["METRICS", "REMOVE_QUERY_CHOICES", "TIE_ORDERS", "decide_remove_query", "eval_dataset",
           "iter_corpus_ids", "load_beir", "run_eval", "run_mode"]

# `{"_id": "..."` at the start of a line: read the id without parsing the whole document.
_LEADING_ID = re.compile(r'\s*\{\s*"_id"\s*:\s*"((?:[^"\\]|\\.)*)"')


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


def iter_corpus_ids(path: PathLike) -> Iterator[str]:
    """The ``_id`` of every document of a BEIR ``corpus.jsonl`` (plain or ``.gz``), streamed.

    Only the id is decoded when a line starts with ``{"_id": "..."`` (BEIR's layout), so a
    multi-gigabyte corpus is scanned without parsing its text.
    """
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            m = _LEADING_ID.match(line)
            if m:
                raw = m.group(1)
                yield json.loads(f'"{raw}"') if "\\" in raw else raw
                continue
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg}); expected one document per line") from None
            if not isinstance(rec, dict) or "_id" not in rec:
                raise ValueError(f"{path}:{lineno}: a document needs an '_id', got {line[:120]!r}")
            yield str(rec["_id"])


def _corpus_path(dataset_dir: str) -> str | None:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if os.path.exists(os.path.join(dataset_dir, name)):
            return os.path.join(dataset_dir, name)
    return None


def _normalize_remove_query(value: object) -> str:
    if value is True or value is False:
        return "on" if value else "off"
    if isinstance(value, str) and value.lower() in REMOVE_QUERY_CHOICES:
        return value.lower()
    raise ValueError(f"remove_query must be one of {', '.join(REMOVE_QUERY_CHOICES)} (or True/False), "
                     f"got {value!r}")


def decide_remove_query(setting: object, dataset_dir: str, qids: Collection[str],
                        has_doc: Callable[[str], bool] | None = None) -> tuple[bool, str]:
    """Whether to drop self-hits, and why (for the summary).

    Parameters
    ----------
    setting : {"auto", "on", "off"} or bool
        ``"auto"``: on when at least `REMOVE_QUERY_AUTO_SHARE` of ``qids`` are
        corpus ids.
    dataset_dir : str
        BEIR directory; its ``corpus.jsonl`` ids are streamed (only for ``"auto"``).
    qids : Collection[str]
        The query ids evaluated (the qrels queries).
    has_doc : callable, optional
        ``doc_id -> bool``, used when the directory has no corpus file (e.g. the index).

    Returns
    -------
    (bool, str)
        ``(applied, reason)``, e.g. ``(True, "auto: 1,406 of 1,406 query ids are corpus ids")``.
    """
    mode = _normalize_remove_query(setting)
    if mode != "auto":
        return mode == "on", f"{mode}: requested"
    wanted = set(qids)
    if not wanted:
        return False, "auto: no queries"
    path = _corpus_path(dataset_dir)
    if path is not None:
        found: set[str] = set()
        for doc_id in iter_corpus_ids(path):
            if doc_id in wanted:
                found.add(doc_id)
                if len(found) == len(wanted):
                    break
        n, where = len(found), "corpus ids"
    elif has_doc is not None:
        n, where = sum(1 for q in wanted if has_doc(q)), "ids of indexed documents (no corpus.jsonl)"
    else:
        return False, "auto: no corpus.jsonl to compare query ids with"
    applied = n >= REMOVE_QUERY_AUTO_SHARE * len(wanted)
    return applied, f"auto: {n:,} of {len(wanted):,} query ids are {where}"


def run_mode(searcher, queries: dict[str, str], mode: str, k: int = 100, *, remove_query: bool = False,
             errors: dict[str, str] | None = None, **options) -> dict[str, dict[str, float]]:
    """One mode's run ``{qid: {doc_id: score}}`` as it is written and evaluated.

    Lexical modes' scores go through `funnel.evaluation.trec.tiebreak` (Anserini's
    convention; `run_as_written`), so the figures printed
    equal trec_eval's on the run file written from them.
    """
    run = searcher.search_batch(queries, mode=mode, k=k, remove_query=remove_query, errors=errors, **options)
    return run_as_written({q: dict(hits) for q, hits in run.items()}, mode)


def _skipped_note(mode: str, errors: dict[str, str], n_queries: int, show: int = 3) -> str:
    first = "; ".join(f"{q}: {why}" for q, why in list(errors.items())[:show])
    more = f"; ... and {len(errors) - show} more" if len(errors) > show else ""
    return (f"skipped queries ({mode}): {len(errors):,} of {n_queries:,} could not be run and score 0 "
            f"({first}{more})")


def eval_dataset(searcher, dataset_dir: str, modes: list[str], split: str = "test", k: int = 100,
                 out_dir: str | None = None, answers_path: str | None = None, *,
                 remove_query: object = "auto", ties: str = "trec_eval") -> dict:
    """Metrics per mode, and paired comparisons of every mode against the first.

    A mode the index cannot serve (e.g. ``dense`` without vectors) is reported under
    ``skipped`` with the reason instead of failing the whole evaluation; a query the
    searcher refuses is listed under ``query_errors`` and scores 0. Where the queries
    carry gold answers (``metadata.answers`` in queries.jsonl, or ``answers_path``), answer
    coverage at 5 and 10 is added per mode.

    Parameters
    ----------
    remove_query : {"auto", "on", "off"} or bool
        Drop the hit whose doc id equals the query id (see `decide_remove_query`).
    ties : {"trec_eval", "rank"}
        Tie order of every metric (`funnel.evaluation.metrics.evaluate`).

    Returns
    -------
    dict
        ``dataset, split, metrics {mode: {metric: value}}, comparisons, skipped {mode: why},
        n_answers, ties, remove_query {"applied", "setting", "reason"},
        query_errors {mode: {qid: reason}}, notes`` (the summary lines, also in the report).
    """
    from .coverage import answer_coverage, load_answers
    from funnel.serving.search import ModeUnavailable
    check_ties(ties)
    setting = _normalize_remove_query(remove_query)
    queries, qrels = load_beir(dataset_dir, split)
    name = os.path.basename(os.path.normpath(dataset_dir))
    get_document = getattr(searcher, "get_document", None)
    applied, why = decide_remove_query(setting, dataset_dir, list(qrels),
                                       (lambda d: get_document(d) is not None) if get_document else None)
    notes = [f"tie order: {describe_ties(ties)}", f"remove-query: {'on' if applied else 'off'} ({why})"]
    log.info("%s: %s", name, notes[-1])
    answers = load_answers(answers_path or os.path.join(dataset_dir, "queries.jsonl"))
    answers = {q: a for q, a in answers.items() if q in queries}
    runs, metrics, per_query, skipped, coverage, query_errors = {}, {}, {}, {}, {}, {}
    for mode in list(modes):
        errors: dict[str, str] = {}
        try:
            runs[mode] = run_mode(searcher, queries, mode, k, remove_query=applied, errors=errors)
        except ModeUnavailable as e:
            log.warning("skipping mode %s: %s", mode, e)
            skipped[mode] = str(e)
            continue
        if errors:
            query_errors[mode] = errors
            notes.append(_skipped_note(mode, errors, len(queries)))
            log.warning("%s", notes[-1])
        metrics[mode], per_query[mode] = evaluate(runs[mode], qrels, METRICS, ties=ties)
        if answers:
            def text(doc_id: str) -> str:
                d = searcher.get_document(doc_id) or {}
                return f"{d.get('title', '')}\n{d.get('text', '')}"
            cov = answer_coverage(runs[mode], text, answers, ties=ties)
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
                                            name_a=modes[0], name_b=mode, ties=ties))
    if out_dir and metrics:
        from .report import write_report
        write_report(os.path.join(out_dir, f"{name}.report.md"), metrics, comparisons,
                     os.path.join(out_dir, f"{name}.per-query.png"), notes=notes)
    return {"dataset": name, "split": split, "metrics": metrics, "comparisons": comparisons,
            "skipped": skipped, "n_answers": len(answers), "ties": ties,
            "remove_query": {"applied": applied, "setting": setting, "reason": why},
            "query_errors": query_errors, "notes": notes}


def run_eval(a, ensure_index: Callable[[str, str, bool, int], str]) -> int:
    """CLI entry: ``a`` has dataset, index, modes, split, k, shards, out, check, json, and
    optionally remove_query ("auto", "on", "off"; default "auto") and ties ("trec_eval",
    "rank"; default "trec_eval")."""
    from funnel.serving.search import open_index
    modes = [m.strip() for m in (a.modes or "bm25").split(",") if m.strip()]
    if a.check:
        return _check(a, ensure_index)
    if not a.dataset:
        raise ValueError("--dataset BEIR_DIR is required (or --check MATRIX)")
    need_dense = any(m in ("dense", "hybrid") for m in modes)
    root = ensure_index(a.dataset, a.index, need_dense, a.shards)
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(root)), "eval")
    res = eval_dataset(open_index(root), a.dataset, modes, a.split, a.k, out,
                       remove_query=getattr(a, "remove_query", None) or "auto",
                       ties=getattr(a, "ties", None) or "trec_eval")
    if a.json:
        print(json.dumps({**res, "comparisons": [c.to_dict() for c in res["comparisons"]]}, indent=2))
        return 0
    rows = [{"mode": m, **{k: v for k, v in res["metrics"][m].items()}} for m in modes if m in res["metrics"]]
    print(f"{res['dataset']} ({a.split}, {len(rows) and 'index ' + root})")
    print(format_table(rows), end="")
    for note in res["notes"]:
        print(note)
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
                           a.out or os.path.join(os.path.dirname(os.path.abspath(root)), "eval"),
                           remove_query=getattr(a, "remove_query", None) or "auto",
                           ties=getattr(a, "ties", None) or "trec_eval")
        print(f"{ds}: " + "; ".join(res["notes"]))
        for mode, ms in res["metrics"].items():
            for metric, v in ms.items():
                measured[(ds, mode, metric)] = v
    checks = check_matrix(rows, measured)
    print(format_checks(checks))
    return 1 if any(c.status != "OK" for c in checks) else 0
