# llm-cluster — `make plan` (offline plan of a stack) and `make test` (every test).
# Both set themselves up on a fresh machine: .venv, pinned requirements, and (as root) the Debian
# packages the tests drive for real (promtool, shellcheck, graphviz; the gateway's nginx + Lua module are
# the image's own pinned packages, fetched by the tests into /var/cache/llm-cluster/gateway-nginx).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= prod
CONFIG ?=
PLAN_ARGS ?=
ADVISE_ARGS ?= --runbook
PYTEST_ARGS ?=
POOL ?=
ROLLOUT_ARGS ?=
# make loadtest: served name (default: each pool's first), concurrency, requests per model, extra options.
MODEL ?=
PARALLEL ?= 64
NUMBER ?= 512
LOADTEST_ARGS ?=
LOADTEST_VENV ?= .venv-loadtest

.PHONY: plan advise rollout test test-fast lint system-deps mutation mutation-sweep mutation-planted flakes bench loadtest clean lab lab-down

$(VENV)/.runtime: requirements.txt
	@test -x $(VENV)/bin/pip || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

$(VENV)/.test: requirements.txt requirements-test.txt $(VENV)/.runtime
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-test.txt
	@touch $@

## plan: the offline plan of Pulumi.$(STACK).yaml (or CONFIG=path). The planner exits 0 ok, 1 policy
## violation, 2 invalid config; GNU make reports a failed recipe as its own status 2 after printing
## "Error 1" or "Error 2" — scripts that must tell them apart run `.venv/bin/python -m plan` directly.
plan: $(VENV)/.runtime
	@$(PY) -m plan $(if $(CONFIG),--config $(CONFIG),--stack $(STACK)) $(PLAN_ARGS)

## advise: what Pulumi.$(STACK).yaml's GPU nodes can run and how: the runbook's model table judged row by row,
## each with the best deployment (ADVISE_ARGS: --model NAME, --goal concurrency|context|nodes, --context N,
## --format json, --write-pool NAME; without --runbook every catalog model)
advise: $(VENV)/.runtime
	@$(PY) -m plan.advise --stack $(STACK) $(ADVISE_ARGS)

## rollout: roll a change out to POOL of Pulumi.$(STACK).yaml instance by instance (Automation API, the
## `pulumi` CLI on PATH; ROLLOUT_ARGS=--dry-run prints the steps, --max-unavailable N)
rollout: $(VENV)/.runtime
	@test -n "$(POOL)" || { echo "make rollout needs POOL=<pool>" >&2; exit 2; }
	@$(PY) -m ops.rollout --stack $(STACK) --pool $(POOL) $(ROLLOUT_ARGS)

## system-deps: Debian packages the real-tool tests use (installs them when root, else says what to install)
system-deps:
	@bash .ci/system-deps

## lint: ruff (lint and format) and the import contracts of pyproject.toml (layers one way, no circle)
lint: $(VENV)/.test
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/lint-imports --no-cache --no-logo

## test: lint, then every test tier, real tools included: the lab tier in its own pytest beside the others (a
## worker per CPU); tests/checks/tiers.py says how, PYTEST_ARGS go to both
test: lint $(VENV)/.test system-deps
	$(PY) tests/checks/tiers.py $(PYTEST_ARGS)

## test-fast: every tier but the real-tool and lab tiers (markers set in tests/conftest.py), for the edit
## loop: no system packages, no lint, a worker per CPU (pytest-xdist), under 3 minutes on two cores
test-fast: $(VENV)/.test
	$(PY) -m pytest -q -n auto -m "not realtool and not lab" $(PYTEST_ARGS) tests

## mutation: mutmut over one product module (MODULE=plan/redact.py; TESTS= to choose the test files, else those
## naming it; FUNCTIONS= to run only those functions' mutants; ISOLATION=forkserver for tests not safe to fork): its mutants, killed, equivalent (tests/checks/mutmut_equivalents.py), survivors and score; exit 1
## while a survivor is untriaged. Work files in mutants/ (kept: a rerun mutates only changed files)
mutation: $(VENV)/.test
	@test -n "$(MODULE)" || { echo "make mutation needs MODULE=<path/to/module.py> (make mutation-sweep: every module; make mutation-planted: the planted-bug list)" >&2; exit 2; }
	nice -n 10 $(PY) tests/checks/mutmut_module.py $(MODULE) $(if $(TESTS),--tests $(TESTS)) $(if $(FUNCTIONS),--functions $(FUNCTIONS)) $(if $(ISOLATION),--isolation $(ISOLATION))

## mutation-sweep: make mutation over every module of tests/checks/mutmut_module.py's SWEEP, one after another
mutation-sweep: $(VENV)/.test
	nice -n 10 $(PY) tests/checks/mutmut_module.py --sweep $(if $(ISOLATION),--isolation $(ISOLATION))

## mutation-planted: the hand-written planted bugs (Python, and the gateway's Lua per handler on the deployed
## nginx), one at a time in a copy of the tree; the tests that must catch each run (score printed)
mutation-planted: $(VENV)/.test system-deps
	$(PY) tests/checks/mutation.py $(WORDS)

## flakes: the suite in random order, three runs with both cores kept busy (RUNS=, LOAD= to change)
flakes: $(VENV)/.test system-deps
	$(PY) tests/checks/flakes.py --runs $(or $(RUNS),3) --load $(or $(LOAD),2)

## bench: the benchmarks' figures (printed, never asserted)
bench: $(VENV)/.test system-deps
	@for b in bench/*.py; do echo "== $$b"; $(PY) -m bench.$$(basename $$b .py) || exit 1; done

$(LOADTEST_VENV)/.ready: requirements-loadtest.txt
	@test -x $(LOADTEST_VENV)/bin/pip || { rm -rf $(LOADTEST_VENV) && $(PYTHON) -m venv $(LOADTEST_VENV); }
	$(LOADTEST_VENV)/bin/pip install -q --disable-pip-version-check -r requirements-loadtest.txt
	@touch $@

## loadtest: evalscope perf through the gateway of Pulumi.$(STACK).yaml, per model; report in build/loadtest/$(STACK)/
loadtest: $(VENV)/.runtime $(LOADTEST_VENV)/.ready
	@$(PY) -m ops.loadtest --stack $(STACK) $(if $(MODEL),--model '$(MODEL)') --parallel $(PARALLEL) \
		--number $(NUMBER) --evalscope $(LOADTEST_VENV)/bin/evalscope $(LOADTEST_ARGS)

## lab: the rehearsal lab (root): test hosts, stand-in images, the lab stack brought up on them (lab/README.md)
LAB_STACK ?= lab
lab: $(VENV)/.test system-deps
	$(PY) -m lab up --stack $(LAB_STACK)

## lab-down: remove the lab; fails when anything (namespace, link, mount, process, file) is left behind
lab-down: $(VENV)/.runtime
	$(PY) -m lab down

clean:
	rm -rf build .pytest_cache mutants
