# burnwatch: `make demo` and `make test` are the two commands; both install into .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-fast bench eval lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "burnwatch needs Python 3.11, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/burnwatch demo

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check detector streams bench tests
	$(BIN)/python -m mypy

test-fast: install
	$(BIN)/python -m pytest -m "not integration"

bench: install
	$(BIN)/python bench/run.py
	$(BIN)/python bench/model.py

eval: install
	$(BIN)/burnwatch eval
	$(BIN)/burnwatch eval --messy
	$(BIN)/burnwatch eval --model --seeds 1,2,3

clean:
	rm -rf $(VENV) .burnwatch .pytest_cache *.egg-info
