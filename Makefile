# The two commands of README.md: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-faults bench clean

$(STAMP): requirements.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "$(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py runservice

test: $(STAMP)
	$(PY) -m pytest

test-faults: $(STAMP)
	$(PY) -m pytest -m faults

bench: $(STAMP)
	$(PY) benchmarks/bench_stream_ids.py

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
