# memstrata: `make run` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SOURCES := $(sort $(wildcard memstrata/*.py core/*.py actors/*.py layers/*.py storage/*.py bridges/*.py integrations/*.py))
# the editable install links files one by one: re-link when the set of source files changes
SOURCE_SET := $(VENV)/.sources-$(shell echo $(SOURCES) | cksum | cut -d' ' -f1)

.PHONY: setup run test test-slow lint bench bench-scale bench-quality bench-quick bench-deps bench-data clean

setup: $(VENV)/.deps $(SOURCE_SET)

$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,mcp,ray,langgraph,openai-agents,autogen]' --config-settings editable_mode=strict
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
	# the dependency direction and no import cycle between the modules of one package
	$(VENV)/bin/lint-imports

test: lint
	$(VENV)/bin/pytest -m "not slow"

test-slow: setup
	$(VENV)/bin/pytest -m slow

# `make bench`: the 100k figures, limit 10 minutes on the 2-core development machine (one JSON,
# benchmarks/results/latest.json). `make bench-scale`: the 1M figures (latest-scale.json).
# `make bench-quality`: retrieval quality on real corpora, no timings (latest-quality.json). See
# docs/performance.md for the runtime of each. bench and bench-scale install the `bench` extra first
# (LanceDB and pyarrow, for the side-by-side of benchmarks/bench_peers.py; not a dependency of the
# package); bench-quality fetches the code corpora first.
bench: setup bench-deps
	$(PY) benchmarks/run.py

bench-scale: setup bench-deps
	$(PY) benchmarks/run.py --scale

bench-quality: setup bench-data
	$(PY) benchmarks/run.py --quality

bench-quick: setup
	$(PY) benchmarks/run.py --quick

# the `bench` extra's requirements, read from pyproject.toml (memstrata itself is not reinstalled)
bench-deps: $(VENV)/.bench-deps

$(VENV)/.bench-deps: pyproject.toml $(VENV)/.deps
	$(PY) -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench']))" > $(VENV)/.bench-requirements
	$(PY) -m pip install -q -r $(VENV)/.bench-requirements
	touch $@

# Real sources for the code-retrieval quality benchmark, from package registries (fetched once; a
# language whose download fails is skipped by the benchmark with a message).
BENCH_DATA := benchmarks/.data
RUST_DEBS := apt-get download -qq librust-itertools-dev=0.10.3-1 librust-bytes-dev=1.2.1-1 librust-semver-dev=1.0.14-1
GO_DEBS := apt-get download -qq golang-github-gorilla-mux-dev=1.8.0-1 golang-github-google-go-cmp-dev=0.5.9-1 golang-github-spf13-cobra-dev=1.6.1-1
bench-data: $(BENCH_DATA)/.unpacked

$(BENCH_DATA)/.unpacked: benchmarks/_corpus_code.py
	mkdir -p $(BENCH_DATA)/downloads
	-test -f $(BENCH_DATA)/downloads/requests-2.32.3-py3-none-any.whl || $(PY) -m pip download -q --no-deps --only-binary :all: requests==2.32.3 -d $(BENCH_DATA)/downloads
	-ls $(BENCH_DATA)/downloads/librust-semver-dev_*.deb >/dev/null 2>&1 || (cd $(BENCH_DATA)/downloads && $(RUST_DEBS) || (apt-get update -qq && $(RUST_DEBS)))
	-test -f $(BENCH_DATA)/downloads/lodash-4.17.21.tgz || (cd $(BENCH_DATA)/downloads && npm pack -q lodash@4.17.21)
	-ls $(BENCH_DATA)/downloads/golang-github-spf13-cobra-dev_*.deb >/dev/null 2>&1 || (cd $(BENCH_DATA)/downloads && $(GO_DEBS) || (apt-get update -qq && $(GO_DEBS)))
	$(PY) benchmarks/_corpus_code.py unpack $(BENCH_DATA)
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
