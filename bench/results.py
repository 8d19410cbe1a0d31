"""Shared by the benchmarks: common options, and each one's marked section of bench/RESULTS.md.

A benchmark prints its section; only ``--write`` records it in the tracked RESULTS.md, so
a trial run (or ``make bench``) never leaves a diff behind.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is written by the benchmark named in it; rerun it with --write to refresh.\n"
# Relative to the working directory, as for `funnel eval` (run from the repository root).
DEFAULT_DATA = os.environ.get("FUNNEL_BEIR", os.path.join("..", "shared", "data", "beir"))


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """``--data`` (the BEIR folder, default ``$FUNNEL_BEIR`` or ``../shared/data/beir``) and ``--write``."""
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="folder holding the BEIR datasets, e.g. DATA/scifact/corpus.jsonl "
                        "(default: $FUNNEL_BEIR or %(default)s, relative to the working directory)")
    p.add_argument("--write", action="store_true",
                   help="record this run's section in bench/RESULTS.md (default: print it only)")


def dataset_dir(data: str, name: str) -> str:
    """``data/name``, or exit with what is missing and how to point at it."""
    path = os.path.join(data, name)
    if not os.path.exists(os.path.join(path, "corpus.jsonl")):
        sys.exit(f"error: {path}/corpus.jsonl not found: pass --data BEIR_FOLDER (or set FUNNEL_BEIR); "
                 f"the benchmarks run from the repository root next to ../shared/data/beir")
    return path


def now_stamp() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def render_section(name: str, title: str, body: str, stamp: str | None = None) -> str:
    stamp = stamp or now_stamp()
    return f"<!-- {name}:start -->\n## {title}\n\n_measured {stamp}_\n\n{body}\n<!-- {name}:end -->"


def recorded_section(name: str) -> tuple[str, str] | None:
    """(measured stamp, body) of the ``name`` section recorded in RESULTS.md, or None."""
    text = open(RESULTS).read() if os.path.exists(RESULTS) else ""
    m = re.search(rf"<!-- {re.escape(name)}:start -->\n## [^\n]*\n\n_measured ([^\n]*)_\n\n(.*?)\n"
                  rf"<!-- {re.escape(name)}:end -->", text, re.S)
    return (m.group(1), m.group(2)) if m else None


def write_section(name: str, title: str, body: str, stamp: str | None = None) -> None:
    """Replace (or append) the ``<!-- name:start -->`` ... ``<!-- name:end -->`` block of RESULTS.md."""
    text = open(RESULTS).read() if os.path.exists(RESULTS) else HEADER
    block = render_section(name, title, body, stamp)
    pat = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pat.sub(lambda _: block, text) if pat.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
    with open(RESULTS + ".tmp", "w") as f:
        f.write(text)
    os.replace(RESULTS + ".tmp", RESULTS)


def report(name: str, title: str, body: str, write: bool) -> None:
    """Print the section; with ``write``, also record it in RESULTS.md."""
    print("\n" + render_section(name, title, body))
    if write:
        write_section(name, title, body)
        print(f"\nwrote the {name!r} section of {RESULTS}")
    else:
        print("\nbench/RESULTS.md unchanged (pass --write to record this run)")
