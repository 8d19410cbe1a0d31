"""The ``funnel`` command's surface: help with defaults and choices, --version, -v anywhere,
and a start-up that imports nothing heavy."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import pytest

from funnel.serving.frontends.cli import build_parser, main

COMMANDS = ("build", "search", "get", "list", "eval", "compare", "demo", "verify", "serve", "mcp", "gc", "reindex")


def option_entries(help_text: str) -> dict[str, str]:
    """``{first option string: its whole help entry}`` from argparse's help output."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        m = re.match(r"  (-[-\w]+)", line)
        if m:
            current = m.group(1)
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def help_of(command: str, capsys) -> str:
    assert main([command, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_states_its_default(command, capsys):
    entries = option_entries(help_of(command, capsys))
    assert "-v" in entries and "-h" in entries
    missing = [opt for opt, text in entries.items()
               if opt not in ("-h",) and not opt.startswith("--no-")
               and not re.search(r"\(default: .+?\)|\(required|same as", text)]
    assert not missing, f"{command}: options without a stated default: {missing}"


def test_choices_come_from_the_registries(demo_index_1, capsys):
    from funnel.evaluation.evaluate import REMOVE_QUERY_CHOICES
    from funnel.serving.lexical.bm25 import LENGTH_NORMS
    from funnel.serving.hybrid import FUSIONS, HybridConfig
    from funnel.serving.search import open_index
    modes = list(open_index(demo_index_1).modes())
    s = option_entries(help_of("search", capsys))
    assert f"retrieval mode: {', '.join(modes)} (default: hybrid where the index has vectors, else bm25)" in s["--mode"]
    assert f"{', '.join(FUSIONS)} (default: the index's, else {HybridConfig().fusion})" in s["--fusion"]
    assert f"else {HybridConfig().alpha:g})" in s["--alpha"] and "else 0.05,0.02" in s["--top-rank-bonus"]
    assert ", ".join(LENGTH_NORMS) in s["--length-norm"]
    e = option_entries(help_of("eval", capsys))
    assert e["--remove-query"].startswith("--remove-query {" + ",".join(REMOVE_QUERY_CHOICES) + "}")
    assert "(default: auto)" in e["--remove-query"] and ", ".join(modes) in e["--modes"]
    b = option_entries(help_of("build", capsys))
    assert "(default: auto" in b["--shards"] and "(default: all-MiniLM-L6-v2)" in b["--embed-model"]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"funnel {importlib.metadata.version('funnel')}\n"


@pytest.mark.parametrize("argv", [
    ["search", "IX", "q"], ["build", "--corpus", "c", "--out", "o"], ["compare", "a", "b", "--qrels", "q"],
    ["eval", "--dataset", "d"], ["serve", "IX"], ["verify", "IX"],
])
def test_verbose_before_or_after_the_subcommand(argv):
    p = build_parser()
    assert p.parse_args(argv).verbose is False
    assert p.parse_args(["-v", *argv]).verbose is True
    assert p.parse_args([*argv, "-v"]).verbose is True
    assert p.parse_args([*argv, "--verbose"]).verbose is True


def test_usage_errors_exit_2_without_a_traceback(capsys):
    assert main(["search"]) == 2
    assert "the following arguments are required: index" in capsys.readouterr().err
    assert main(["search", "IX", "q", "--k1", "high"]) == 2
    assert "argument --k1: invalid float value: 'high'" in capsys.readouterr().err
    assert main(["search", "IX", "q", "--fusion", "max"]) == 2
    assert "invalid choice: 'max' (choose from 'rrf', 'convex')" in capsys.readouterr().err
    assert main(["search", "IX", "q", "--top-rank-bonus", "0.1"]) == 2
    assert "expected two numbers like 0.05,0.02" in capsys.readouterr().err


def test_start_up_imports_nothing_heavy():
    code = ("import sys, json; from funnel.serving.frontends.cli import build_parser; build_parser(); "
            "print(json.dumps(sorted(m for m in ('ray', 'pyarrow', 'duckdb', 'torch', 'faiss', 'fastapi', "
            "'sentence_transformers', 'funnel.serving.search', 'funnel.serving.hybrid') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
