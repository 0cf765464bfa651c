# The front door. Each target does its own set-up on a fresh Debian-like machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
STACK := deploy/local/stack.sh

.PHONY: venv test test-unit lint format demo bench schemas up down clean

$(STAMP): pyproject.toml
	@t0=$$(date +%s); \
	$(PYTHON) -m venv $(VENV) && \
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip && \
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,lint,console,browser-test,registry]' && \
	touch $@ && echo "[venv] ready in $$(( $$(date +%s) - t0 )) s"

venv: $(STAMP)

## Full suite against real Kafka and PostgreSQL (started here unless SAGA_TEST_* point elsewhere).
## tests/run.py starts the services, runs pytest, and ends whatever a killed or hung run left.
test: venv
	deploy/local/browser.sh
	deploy/local/promtool.sh >/dev/null
	$(BIN)/python -m tests.run --split --durations=15

test-unit: venv
	deploy/local/promtool.sh >/dev/null
	$(BIN)/pytest tests/unit

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy processor sagas schemas tests benchmarks demo devstack.py

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## Brings the stack up, runs the processor with the example sagas, stops what it started.
demo: venv
	$(BIN)/python -m demo

## One JSON report per run in .local/bench/. The Quix Streams peer (the `bench` extra) gets a
## virtualenv of its own: it pins an older confluent-kafka than the engine is measured with.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed-stamp: pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV) && \
	$(BENCH_VENV)/bin/pip install -q --disable-pip-version-check -e '.[bench]' && touch $@

bench: venv $(BENCH_VENV)/.installed-stamp
	$(BIN)/python -m benchmarks
	$(BIN)/python -m benchmarks.console_queries

## JSON Schema per message in schemas/json, and the AsyncAPI 3 document of every topic.
schemas: venv
	$(BIN)/python -m schemas.export schemas/json
	$(BIN)/saga-processor schemas schemas sagas --output schemas/json/asyncapi.json

up:
	$(STACK) up --untracked --registry
	@$(STACK) env

down:
	$(STACK) down --all

clean: down
	rm -rf $(VENV) $(BENCH_VENV) .local
