# `make run` and `make test` do all set-up themselves on a machine with Python 3.11+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-fast lint bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/rdu-cluster simulate

# Two pytest-xdist workers (JOBS=N for more): the tests that share the Ray instance or the
# validate report run on one worker each (--dist loadgroup; tests/conftest.py groups them).
JOBS ?= 2
# Compiled modules cached in __pycache__ (gitignored) even where the environment sets
# PYTHONDONTWRITEBYTECODE: else every test process (workers, subprocess CLI runs, Ray's socket
# actors) compiles every module it imports, and pytest rewrites every test module's asserts anew
# (collection 5.4 -> 2.3 s of CPU a process, measured on a 2-core machine).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

test: $(STAMP)
	$(PYTEST) -q -n $(JOBS) --dist loadgroup

# The edit loop: every test but the end-to-end ones marked slow (`make test` runs those too).
test-fast: $(STAMP)
	$(PYTEST) -q -n $(JOBS) --dist loadgroup -m "not slow"

# ruff, and mypy (mypy.ini) with no error in any package.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy chip interconnect partitioning workloads rdu_cluster

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
