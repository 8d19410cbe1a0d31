"""Evaluation reports and the pinned-metric regression matrix.

Why: a change to funnel is judged by (1) a markdown report that puts every mode's
metrics side by side and tests each mode against the first (the baseline) with
`funnel.evaluation.compare`, with a plot of where the per-query differences lie; and
(2) a regression matrix in the style of Pyserini's ``2cr/beir.yaml``: each row pins
``expected`` for a (dataset, mode, metric) and passes when

    |measured - expected| <= tolerance        (status OK, else FAIL; MISSING if unmeasured)

The per-query plot shows d_i = m_B(q_i) - m_A(q_i) sorted ascending, one bar per query:
bars above zero are queries where B is better.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from .compare import Comparison
from .metrics import format_table
from .trec import PathLike

logger = logging.getLogger(__name__)

STATUSES = ("OK", "FAIL", "MISSING")
_MATRIX_KEYS = ("dataset", "mode", "metric", "expected", "tolerance")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def _values(per_query: Mapping[str, object], metric: str) -> dict[str, float]:
    """Accept ``{qid: float}`` or ``{qid: {metric: float}}`` (as `evaluate` returns)."""
    out = {}
    for q, v in per_query.items():
        out[q] = float(v[metric]) if isinstance(v, Mapping) else float(v)  # type: ignore[arg-type]
    return out


def _draw_diff(ax, diffs: Sequence[float], label: str, metric: str) -> None:
    ordered = sorted(diffs)
    eps = 1e-12  # float noise is a tie, not a win
    colors = ["tab:green" if d > eps else "tab:red" if d < -eps else "tab:gray" for d in ordered]
    ax.bar(range(len(ordered)), ordered, width=1.0, color=colors)
    ax.axhline(0.0, color="black", linewidth=0.6)
    up, down = sum(d > eps for d in ordered), sum(d < -eps for d in ordered)
    ax.set_title(f"{label}: {up} better, {down} worse, {len(ordered) - up - down} tied")
    ax.set_xlabel("queries, sorted by difference")
    ax.set_ylabel(f"{metric} difference")
    ax.set_xlim(-0.5, max(len(ordered), 1) - 0.5)


def plot_per_query_diff(
    per_query_a: Mapping[str, object],
    per_query_b: Mapping[str, object],
    png_path: PathLike,
    label: str,
    metric: str = "ndcg@10",
) -> Path:
    """Save a sorted bar plot of per-query ``metric`` differences B - A.

    Parameters
    ----------
    per_query_a, per_query_b : Mapping
        ``{qid: value}`` or ``{qid: {metric: value}}``; a query missing on one side is 0.
    png_path : str or PathLike
        Output PNG.
    label : str
        Plot title, e.g. ``"hybrid - bm25"``.
    metric : str
        Which metric to take from nested per-query dicts.

    Returns
    -------
    Path
        ``png_path``.
    """
    a, b = _values(per_query_a, metric), _values(per_query_b, metric)
    qids = list(dict.fromkeys([*a, *b]))
    if not qids:
        raise ValueError("no queries to plot; pass per-query metrics from evaluate()")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    try:
        _draw_diff(ax, [b.get(q, 0.0) - a.get(q, 0.0) for q in qids], label, metric)
        fig.tight_layout()
        fig.savefig(png_path, dpi=100)
    finally:
        plt.close(fig)
    return Path(png_path)


def _comparison_section(c: Comparison) -> list[str]:
    m, r = c.mcnemar, c.randomization
    label = f"success@{c.k} ({c.success})"
    lines = [f"### {c.name_b} vs {c.name_a}", "", c.verdict, ""]
    lines.append(format_table([
        {label: f"{c.name_a} right", f"{c.name_b} right": c.a, f"{c.name_b} wrong": c.b},
        {label: f"{c.name_a} wrong", f"{c.name_b} right": c.c, f"{c.name_b} wrong": c.d},
    ]))
    lines.append(format_table([
        {"test": "McNemar exact (min(b, c))", "statistic": float(min(m.b, m.c)), "p": f"{m.exact_p:.3g}"},
        {"test": "McNemar chi2", "statistic": m.chi2, "p": f"{m.chi2_p:.3g}"},
        {"test": "McNemar chi2, continuity corrected", "statistic": m.chi2_cc, "p": f"{m.chi2_cc_p:.3g}"},
        {"test": f"randomization on {r.metric} (mean diff; {r.permutations} flips, seed {r.seed})",
         "statistic": r.mean_diff, "p": f"{r.p_value:.3g}"},
    ]))
    lines.append(f"Mean {r.metric}: {c.name_a} {r.mean_a:.4f}, {c.name_b} {r.mean_b:.4f}; "
                 f"difference {r.mean_diff:+.4f}, {r.ci_level:.0%} bootstrap CI "
                 f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}]. McNemar p used: {m.method} "
                 f"(exact when b+c < {m.exact_threshold}).")
    for title, flipped in (("Improved", c.improved), ("Got worse", c.worsened)):
        shown = ", ".join(f"{f.qid}" + (f" ({f.text[:60]})" if f.text else "") for f in flipped[:15])
        lines += ["", f"{title} ({len(flipped)}): " + (shown or "none") + (" ..." if len(flipped) > 15 else "")]
    return lines + [""]


def write_report(
    path_md: PathLike,
    metrics_by_mode: Mapping[str, Mapping[str, float]],
    comparisons: Sequence[Comparison],
    png_path: PathLike | None,
    notes: Sequence[str] = (),
) -> Path:
    """Write the markdown evaluation report (and its per-query difference plot).

    Parameters
    ----------
    path_md : str or PathLike
        Output markdown file.
    metrics_by_mode : Mapping[str, Mapping[str, float]]
        ``{mode: mean metrics}`` in display order; the first mode is the baseline.
    comparisons : Sequence[Comparison]
        Each other mode compared with the baseline (`compare_runs`).
    png_path : str or PathLike or None
        Where to draw one panel per comparison; linked from the report. ``None`` skips it.
    notes : Sequence[str]
        Settings that decide how the figures compare with published ones (tie order,
        remove-query, skipped queries), listed under the metrics table.

    Returns
    -------
    Path
        ``path_md``.
    """
    if not metrics_by_mode:
        raise ValueError("metrics_by_mode is empty; evaluate at least one mode")
    baseline = next(iter(metrics_by_mode))
    for c in comparisons:
        if c.name_a != baseline:
            logger.warning("comparison %s vs %s is not against the baseline %s", c.name_b, c.name_a, baseline)
    lines = ["# Evaluation report", "", "## Metrics", ""]
    lines.append(format_table([{"mode": mode, **dict(vals)} for mode, vals in metrics_by_mode.items()]))
    if notes:
        lines += [f"- {n}" for n in notes] + [""]
    if comparisons:
        lines += [f"## Paired comparisons against {baseline}", ""]
        if png_path is not None:
            plt = _pyplot()
            fig, axes = plt.subplots(len(comparisons), 1, figsize=(8, 3.2 * len(comparisons)), squeeze=False)
            try:
                for ax, c in zip(axes[:, 0], comparisons):
                    _draw_diff(ax, [b - a for _, a, b in c.per_query], f"{c.name_b} - {c.name_a}",
                               c.randomization.metric)
                fig.tight_layout()
                fig.savefig(png_path, dpi=100)
            finally:
                plt.close(fig)
            rel = os.path.relpath(Path(png_path).resolve(), Path(path_md).resolve().parent)
            lines += [f"![per-query differences]({Path(rel).as_posix()})", ""]
        for c in comparisons:
            lines += _comparison_section(c)
    Path(path_md).write_text("\n".join(lines), encoding="utf-8")
    return Path(path_md)


@dataclass(frozen=True)
class MatrixRow:
    """One pinned expectation of the regression matrix."""

    dataset: str
    mode: str
    metric: str
    expected: float
    tolerance: float


@dataclass(frozen=True)
class CheckRow:
    """A matrix row with what was measured: status is OK, FAIL or MISSING."""

    dataset: str
    mode: str
    metric: str
    expected: float
    tolerance: float
    measured: float | None
    status: str


def load_matrix(path_yaml: PathLike) -> list[MatrixRow]:
    """Read a regression matrix: a YAML list of ``{dataset, mode, metric, expected, tolerance}``."""
    with open(path_yaml, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path_yaml}: not valid YAML: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(f"{path_yaml}: expected a YAML list of rows with keys {', '.join(_MATRIX_KEYS)}")
    rows, seen = [], set()
    for i, entry in enumerate(data, start=1):
        where = f"{path_yaml}: row {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping with keys {', '.join(_MATRIX_KEYS)}, got {entry!r}")
        missing = [k for k in _MATRIX_KEYS if k not in entry]
        extra = [k for k in entry if k not in _MATRIX_KEYS]
        if missing or extra:
            raise ValueError(f"{where}: missing keys {missing}, unknown keys {extra}; "
                             f"each row needs exactly {', '.join(_MATRIX_KEYS)}")
        try:
            expected, tolerance = float(entry["expected"]), float(entry["tolerance"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected and tolerance must be numbers, got {entry!r}") from None
        if tolerance < 0:
            raise ValueError(f"{where}: tolerance must be >= 0, got {tolerance}")
        row = MatrixRow(str(entry["dataset"]), str(entry["mode"]), str(entry["metric"]), expected, tolerance)
        key = (row.dataset, row.mode, row.metric)
        if key in seen:
            raise ValueError(f"{where}: {key} is pinned twice; keep one row per (dataset, mode, metric)")
        seen.add(key)
        rows.append(row)
    return rows


def check_matrix(
    rows: Sequence[MatrixRow],
    measured: Mapping[tuple[str, str, str], float],
) -> list[CheckRow]:
    """Compare measured metrics with the matrix.

    Parameters
    ----------
    rows : Sequence[MatrixRow]
        From `load_matrix`.
    measured : Mapping[tuple[str, str, str], float]
        ``{(dataset, mode, metric): value}``.

    Returns
    -------
    list[CheckRow]
        One per row, in order; see `format_checks` to print them.
    """
    out = []
    for r in rows:
        value = measured.get((r.dataset, r.mode, r.metric))
        if value is None:
            status = "MISSING"
        else:
            value = float(value)
            status = "OK" if abs(value - r.expected) <= r.tolerance + 1e-12 else "FAIL"
        out.append(CheckRow(r.dataset, r.mode, r.metric, r.expected, r.tolerance, value, status))
    return out


def format_checks(checks: Sequence[CheckRow]) -> str:
    """A markdown table of `check_matrix` results, with a summary line."""
    table = format_table(
        [{"dataset": c.dataset, "mode": c.mode, "metric": c.metric, "expected": c.expected,
          "measured": c.measured, "diff": None if c.measured is None else c.measured - c.expected,
          "tolerance": c.tolerance, "status": c.status} for c in checks],
        columns=["dataset", "mode", "metric", "expected", "measured", "diff", "tolerance", "status"])
    counts = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in STATUSES)
    return table + counts + "\n"
