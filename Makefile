# The product's front door: `make demo` runs the main job, `make test` passes the tests.
# Both set themselves up from a fresh machine (venv + installs) and are idempotent.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dstl-installed
DEMO_ARGS ?= --seconds 20 --verify

.PHONY: setup demo test lint bench readme clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dstl needs Python 3.11 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all]'
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m dstl.spi.cli demo $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .

bench: setup
	$(PY) -m bench.dstl_bench $(BENCH_ARGS)

readme: setup
	$(PY) -m dstl.spi.cli config --update-readme README.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
