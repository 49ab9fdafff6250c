# Quick start: `make demo` and `make test` on a fresh machine (Python >= 3.11 as python3).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test lint typecheck unit bench schemas samples clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/agentx inspect traces/sample.arrow
	$(BIN)/agentx validate traces/sample.weka.jsonl

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest -q

test: lint typecheck unit

bench: install
	$(BIN)/python bench/trace_io.py
	$(BIN)/python bench/sim_throughput.py

schemas: install
	$(BIN)/python scripts/make_schemas.py

samples: install
	$(BIN)/python scripts/make_sample_traces.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
