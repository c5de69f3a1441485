# Developer entry points. Everything runs from the project virtualenv in .venv.

PYTHON3 ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON3) -m venv $(VENV)

# Reinstall only when pyproject.toml changes (or the venv is new).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

demo: venv
	$(BIN)/wsym report --out wsym-report

test: venv
	$(BIN)/python -m pytest -q -n 2 --doctest-modules tests/ wsym/

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
