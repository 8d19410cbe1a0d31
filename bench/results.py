"""Shared helper: each benchmark rewrites its own marked section of bench/RESULTS.md."""

from __future__ import annotations

import datetime
import os
import re

RESULTS = os.path.join(os.path.dirname(__file__), "RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is written by the benchmark named in it; rerun it to refresh.\n"


def write_section(name: str, title: str, body: str) -> None:
    text = open(RESULTS).read() if os.path.exists(RESULTS) else HEADER
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = f"<!-- {name}:start -->\n## {title}\n\n_measured {stamp}_\n\n{body}\n<!-- {name}:end -->"
    pat = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pat.sub(lambda _: block, text) if pat.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
    with open(RESULTS + ".tmp", "w") as f:
        f.write(text)
    os.replace(RESULTS + ".tmp", RESULTS)
