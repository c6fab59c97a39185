# The product's front door: `make demo` runs the main job, `make test` passes the tests.
# Both set themselves up from a fresh machine (venv + installs) and are idempotent.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dstl-installed
DEMO_ARGS ?= --seconds 20 --verify

.PHONY: setup demo test lint bench readme fuzz mutation clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dstl needs Python 3.11 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m dstl.spi.cli demo $(DEMO_ARGS)

test: setup
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m lint.typecheck

bench: setup
	$(PY) -m bench.dstl_bench $(BENCH_ARGS)

# The fuzz tier runs 20,000 documents per parser in `make test`; this runs ten times more.
FUZZ_EXAMPLES ?= 200000
fuzz: setup
	DSTL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -s -p no:cacheprovider tests/fuzz $(PYTEST_ARGS)

# Mutation testing of the conformance suite (mutmut): the SPI base classes and memory
# against the suite, and local's internals against the suite plus local's tests.
# See mutation/results/*.md for the scores; MUTATION_ARGS="suite" runs one target.
mutation: setup
	$(PY) -m mutation.run $(MUTATION_ARGS)

readme: setup
	$(PY) -m dstl.spi.cli config --update-readme README.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
