# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= runs/demo

.PHONY: setup demo test lint typecheck clean bench

setup: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints-cpu.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m areal.demo --output-dir $(DEMO_DIR)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: $(STAMP) lint typecheck
	$(PY) -m pytest -q -m "not gpu" tests

bench: $(STAMP)
	$(PY) bench/generate.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
