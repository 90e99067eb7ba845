# memstrata: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SOURCES := $(sort $(wildcard memstrata/*.py actors/*.py layers/*.py storage/*.py bridges/*.py))
# the editable install links files one by one: re-link when the set of source files changes
SOURCE_SET := $(VENV)/.sources-$(shell echo $(SOURCES) | cksum | cut -d' ' -f1)

.PHONY: setup run test test-slow lint bench bench-quick clean

setup: $(VENV)/.deps $(SOURCE_SET)

$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,mcp]' --config-settings editable_mode=strict
	touch $@

$(SOURCE_SET): $(VENV)/.deps
	rm -f $(VENV)/.sources-*
	$(PY) -m pip install -q --no-deps -e . --config-settings editable_mode=strict
	touch $@

run: setup
	$(VENV)/bin/memstrata demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd $(VENV) && ./bin/mypy --config-file ../pyproject.toml -p memstrata

test: lint
	$(VENV)/bin/pytest -m "not slow"

test-slow: setup
	$(VENV)/bin/pytest -m slow

bench: setup
	$(PY) benchmarks/run.py

bench-quick: setup
	$(PY) benchmarks/run.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
