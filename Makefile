# The two commands of README.md: `make run` and `make test`; `make lock` regenerates the locks.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Every install is from a lock file: the whole tree pinned, each file checked against its hash.
PIP_INSTALL := $(PY) -m pip install --require-hashes
RUNTIME_STAMP := $(VENV)/.installed-runtime
TEST_STAMP := $(VENV)/.installed-test
# The tools (pip-audit, pip-tools) live in a venv of their own, never in .venv.
TOOLS_VENV := .ci/venv
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(TOOLS_VENV)/bin/pip-compile --generate-hashes \
	--allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade)

.PHONY: run test test-faults bench lint hooks lock tools clean

$(VENV)/bin/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# The runtime set only: what a deployment needs (requirements.txt).
$(RUNTIME_STAMP): requirements.txt | $(VENV)/bin/python
	@echo "Installing the runtime dependencies (requirements.txt) into $(VENV)..."
	$(PIP_INSTALL) -r requirements.txt
	touch $@

# The test set on top (requirements-test.txt, constrained by requirements.txt).
$(TEST_STAMP): requirements-test.txt $(RUNTIME_STAMP)
	@echo "Installing the test dependencies (requirements-test.txt) into $(VENV)..."
	$(PIP_INSTALL) -r requirements-test.txt
	touch $@

run: $(RUNTIME_STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py runservice

# The suite on TEST_WORKERS processes (pytest-xdist), a test file per process at a time (each
# process starts its own throwaway PostgreSQL, Redis and Spark); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test-faults: $(TEST_STAMP)
	$(PY) -m pytest -m faults

bench: $(RUNTIME_STAMP)
	$(PY) benchmarks/bench_stream_ids.py

$(TOOLS_VENV)/.installed: requirements-ci.txt
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --require-hashes -r requirements-ci.txt
	touch $@

tools: $(TOOLS_VENV)/.installed

# Lint and import order (ruff), types (mypy, strict on the pure protocol core): pyproject.toml.
lint: tools
	$(TOOLS_VENV)/bin/ruff check .
	$(TOOLS_VENV)/bin/mypy

# The same two checks before each commit (.pre-commit-config.yaml), from the same venv.
hooks: tools
	$(TOOLS_VENV)/bin/pre-commit install

# Regenerate the three lock files from their top-level lists (*.in). Existing pins are kept
# unless a *.in asks for another version; `make lock UPGRADE=1` moves everything to the newest
# versions allowed. Needs the package index (no run-time step ever does).
lock: tools
	$(PIP_COMPILE) -o requirements.txt requirements.in
	$(PIP_COMPILE) -o requirements-test.txt requirements-test.in
	$(PIP_COMPILE) -o requirements-ci.txt requirements-ci.in

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
