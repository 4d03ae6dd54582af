# The README's two commands are `make run` and `make test`; everything else is for developers.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.floodwall-installed
# What the venv installs: this checkout, editable. `make release-check` sets it to the built wheel.
INSTALL ?= -e '.[dev,all,bench,docs]'

.PHONY: install run test lint unit bench docs release-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(INSTALL)
	touch $(STAMP)

install: $(STAMP)

## run: the main job on the embedded default (in-memory state, no server needed)
run: $(STAMP)
	$(PY) -m floodwall demo

## test: lint, types and the whole suite (starts its own Redis, Redis Cluster and PostgreSQL)
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n 2 --dist loadgroup

unit: $(STAMP)
	$(PY) -m pytest -m "not integration"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## bench: side-by-side benchmarks against the peer libraries; writes docs/benchmarks.md
bench: $(STAMP)
	$(PY) benchmarks/run.py --write docs/benchmarks.md

## docs: the documentation site, warnings as errors (into build/site)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

## release-check: build sdist and wheel, twine check, install each into a clean venv; in the
## unpacked sdist, `make run` and `make test` on the installed wheel (what CI runs)
release-check:
	.ci/release-check

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis dist build
