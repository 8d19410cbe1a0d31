"""Reports and the regression matrix: OK / FAIL / MISSING statuses, YAML validation, and
a markdown report plus PNG actually written."""

from __future__ import annotations

import pytest

from funnel.evaluation.compare import compare_runs
from funnel.evaluation.metrics import evaluate
from funnel.evaluation.report import (
    check_matrix,
    format_checks,
    load_matrix,
    plot_per_query_diff,
    write_report,
)

MATRIX = """\
- {dataset: scifact, mode: bm25, metric: ndcg@10, expected: 0.6789, tolerance: 0.005}
- {dataset: scifact, mode: bm25, metric: recall@100, expected: 0.9253, tolerance: 0.001}
- {dataset: nfcorpus, mode: bm25, metric: ndcg@10, expected: 0.3218, tolerance: 0.005}
"""


def test_matrix_ok_fail_missing(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    rows = load_matrix(path)
    assert [(r.dataset, r.metric, r.expected) for r in rows] == [
        ("scifact", "ndcg@10", 0.6789), ("scifact", "recall@100", 0.9253), ("nfcorpus", "ndcg@10", 0.3218)]
    measured = {("scifact", "bm25", "ndcg@10"): 0.6789 + 0.005,  # exactly at the tolerance: OK
                ("scifact", "bm25", "recall@100"): 0.9200}
    checks = check_matrix(rows, measured)
    assert [c.status for c in checks] == ["OK", "FAIL", "MISSING"]
    assert checks[2].measured is None and checks[1].measured == 0.92
    table = format_checks(checks)
    assert table.count("\n") == 2 + 3 + 1
    assert "FAIL" in table and "MISSING" in table and table.rstrip().endswith("1 OK, 1 FAIL, 1 MISSING")


@pytest.mark.parametrize("text, message", [
    ("{dataset: x}", "YAML list"),
    ("- {dataset: x, mode: m, metric: ndcg@10, expected: 0.5}", r"missing keys \['tolerance'\]"),
    ("- {dataset: x, mode: m, metric: ndcg@10, expected: high, tolerance: 0.1}", "must be numbers"),
    ("- {dataset: x, mode: m, metric: n, expected: 0.5, tolerance: 0.1}\n"
     "- {dataset: x, mode: m, metric: n, expected: 0.6, tolerance: 0.1}", "row 2: .* pinned twice"),
])
def test_matrix_errors(tmp_path, text, message):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_matrix(path)


def _runs():
    qrels = {f"q{i}": {"rel": 1} for i in range(30)}
    base = {q: {"rel": 1.0 if i % 3 else 5.0, **{f"x{j}": 4.0 - j * 0.1 for j in range(12)}}
            for i, q in enumerate(qrels)}
    better = {q: {**docs, "rel": 10.0} if i % 2 else docs for i, (q, docs) in enumerate(base.items())}
    return qrels, base, better


def test_write_report_and_png(tmp_path):
    qrels, base, better = _runs()
    metrics = {"bm25": evaluate(base, qrels)[0], "hybrid": evaluate(better, qrels)[0]}
    cmp = compare_runs(base, better, qrels, name_a="bm25", name_b="hybrid", permutations=300, bootstrap=300)
    md, png = tmp_path / "report.md", tmp_path / "figs" / "diff.png"
    png.parent.mkdir()
    write_report(md, metrics, [cmp], png)
    text = md.read_text()
    assert "| bm25 " in text and "| hybrid " in text and f"{metrics['hybrid']['ndcg@10']:.4f}" in text
    assert "### hybrid vs bm25" in text and cmp.verdict in text
    assert "![per-query differences](figs/diff.png)" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_plot_per_query_diff(tmp_path):
    qrels, base, better = _runs()
    _, pa = evaluate(base, qrels)
    _, pb = evaluate(better, qrels)
    out = plot_per_query_diff(pa, pb, tmp_path / "d.png", "hybrid - bm25")
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 1000
    flat = plot_per_query_diff({"a": 0.1}, {"a": 0.5, "b": 0.2}, tmp_path / "flat.png", "x")
    assert flat.stat().st_size > 1000
    with pytest.raises(ValueError, match="no queries"):
        plot_per_query_diff({}, {}, tmp_path / "e.png", "x")
