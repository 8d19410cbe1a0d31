"""Each benchmark's command line: ``--help`` prints usage and runs nothing.

``make bench`` runs every ``bench/bench_*.py``; a benchmark that ignored ``--help`` (and
started a ten-minute run) or rewrote the tracked ``bench/RESULTS.md`` without ``--write``
would surprise whoever tried it. The defaults must be paths relative to the repository
(``../shared/data/beir``), never one machine's absolute path.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHES = sorted((REPO / "bench").glob("bench_*.py"))
RESULTS = REPO / "bench" / "RESULTS.md"


def test_there_are_benchmarks():
    assert {p.name for p in BENCHES} >= {"bench_lexical.py", "bench_dense.py", "bench_hybrid.py"}


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_help_prints_usage_and_runs_nothing(bench, tmp_path):
    before = hashlib.sha256(RESULTS.read_bytes()).hexdigest()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no FUNNEL_BEIR: show the real default
    p = subprocess.run([sys.executable, str(bench), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: {bench.name}")
    assert "--write" in p.stdout  # RESULTS.md is rewritten only when asked
    if re.search(r"--data\b(?!-)", p.stdout):
        assert "../shared/data/beir" in p.stdout  # the default, relative
    assert str(REPO.parent) + "/" not in p.stdout  # no absolute default (a folder named workloads is not one)
    assert list(tmp_path.iterdir()) == []  # built nothing, wrote nothing
    assert hashlib.sha256(RESULTS.read_bytes()).hexdigest() == before


def test_results_are_printed_not_written_without_write(tmp_path, monkeypatch, capsys):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import results
    finally:
        sys.path.remove(str(REPO / "bench"))
    target = tmp_path / "RESULTS.md"
    target.write_text(results.HEADER + "\n<!-- x:start -->\n## old\n<!-- x:end -->\n")
    monkeypatch.setattr(results, "RESULTS", str(target))
    results.report("x", "A title", "| a | b |", write=False)
    assert "old" in target.read_text() and "| a | b |" in capsys.readouterr().out
    results.report("x", "A title", "| a | b |", write=True)
    text = target.read_text()
    assert "old" not in text and text.count("<!-- x:start -->") == 1 and "## A title" in text


def test_scale_write_keeps_the_recorded_runs_as_supplements():
    """``bench_scale.py --write`` records a new run above the ones already recorded: the old
    main run becomes the first supplement (its command, its date, no plots line: the new run
    redraws the plots), the supplements it carried follow unchanged."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import bench_scale
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert bench_scale.carried_runs(None) == ""
    old = ("Machine: x. Command: `.venv/bin/python bench/bench_scale.py --sizes 1m`. All figures below.\n\n"
           "### Build\n\n| docs | system |\n|---:|---|\n| 1,000,000 | funnel |\n\n"
           "### Queries\n\n| docs | k |\n|---:|---:|\n| 1,000,000 | 10 |\n\n"
           "Plots: `bench/plots/scale_qps.png`.\n\n"
           f"{bench_scale.SUPPLEMENT}\n\nCommand: `older` (its own run).\n\n| 3,000,000 | pisa |")
    got = bench_scale.carried_runs(("2026-11-23 23:52", old))
    assert got.count(bench_scale.SUPPLEMENT) == 2
    first, second = got.split(bench_scale.SUPPLEMENT)[1:]
    assert "`.venv/bin/python bench/bench_scale.py --sizes 1m`" in first and "2026-11-23 23:52" in first
    assert "#### Build" in first and "#### Queries" in first and "| 1,000,000 | 10 |" in first
    assert "Plots:" not in got and "Machine:" not in got
    assert "Command: `older`" in second and "| 3,000,000 | pisa |" in second
