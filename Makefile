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

# A real replay of 8 sample sessions on 4 lanes against the built-in simulator (its clock and the
# recorded think times both run 20x faster, so the demo takes about half a minute).
demo: install
	$(BIN)/agentx replay traces/sample.arrow --sessions 8 --concurrency 4 \
		--sim-time-scale 0.05 --delay-scale 0.05 --out runs/demo

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
