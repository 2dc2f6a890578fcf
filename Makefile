# Every target bootstraps its own virtual environment from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/vllm-specdec-exporter
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## demo: the main job on a built-in default (report on a bundled 8-engine vLLM dump)
demo: $(STAMP)
	$(CLI) report examples/vllm-v1-dp8-k2.prom

## test: every test
test: $(STAMP)
	$(PY) -m pytest

## bench: performance ratios, measured side by side in one run
bench: $(STAMP)
	$(PY) bench/bench_parse.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
