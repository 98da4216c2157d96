# Contract commands: `make demo` and `make test` (both set up the machine first).
SHELL := /bin/bash
.DEFAULT_GOAL := test

VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-stress test-long test-mutants lint demo dashboard-screenshot fuzz-topologies clean-net test-install test-osken

## setup: Debian packages, .venv (Ryu, PySpark, the project) and a running Open vSwitch
setup:
	bash scripts/setup.sh

## test: unit and integration tests (integration = marker `integration`, needs root).
## tests/unit on 2 processes (pytest-xdist: pure tests, no shared machine state), then the
## rest in one; both always run, the first failing exit code is the target's
test: setup
	@rc=0; $(PY) -m pytest tests/unit -n 2 -m "not long" --durations=10 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no unit tests" >&2; rc=1; fi; \
	rest=0; $(PY) -m pytest tests --ignore=tests/unit -m "not long" --durations=25 || rest=$$?; \
	if [ $$rest -eq 5 ]; then echo "make test: pytest collected no tests" >&2; rest=1; fi; \
	if [ $$rc -eq 0 ]; then rc=$$rest; fi; \
	exit $$rc

## test-stress: tests/unit, tests/runtime and the most timing-sensitive integration files
## (reconfiguration, fault detector, guarantees, live debugger, autoscaler, agent; listed in
## scripts/test_stress.sh) with a CPU hog on core 0, pytest started like CI starts it: in
## the background, own session, stdin closed, SIGINT ignored. Exit code: pytest's (5 fails)
test-stress: setup
	bash scripts/test_stress.sh

## test-long: the further variants of the slowest tests (marker `long`), kept out of `make test`
test-long: setup
	@rc=0; $(PY) -m pytest tests -m long --durations=10 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-long: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

## test-mutants: break a mechanism on purpose (no SIGNAL flush, fields routed as shuffle,
## rollback to the start, no mirror copy, equal load-balancer weights), each in a copy of
## the tree; the named tests must fail on every mutant and pass on the unmodified copy
test-mutants: setup
	$(PY) scripts/mutants.py

## lint: ruff and mypy (strict on typhoon/wire, typhoon/runtime, controller/rules), read-only
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## demo: wordcount on 3 emulated hosts (sdn) with the four control-plane apps; demo-report.json
demo: setup
	$(VENV)/bin/typhoon run topologies/wordcount.yaml --transport sdn --hosts 3 \
		--arg source.count=300000 --report demo-report.json \
		--app apps/fault_detector.py --app apps/live_debugger.py \
		--app apps/load_balancer.py --app apps/autoscaler.py

## dashboard-screenshot: docs/dashboard.png, the web dashboard (GET /dashboard) during a run
## like `make demo` (the four apps, a live-debugger session), drawn by headless Chromium
dashboard-screenshot: setup
	$(PY) scripts/dashboard_screenshot.py --out docs/dashboard.png

## fuzz-topologies: N generated topologies (seeds FIRST..FIRST+N-1) over sdn and tcp, each
## checked against its exact result; prints the seed of every failure (replay: --seed S)
N ?= 200
FIRST ?= 0
fuzz-topologies: setup
	$(PY) -m mininet_env.differential --seeds $(N) --first $(FIRST)

## test-install: fresh venvs outside the repository (as docs/deploy.md says): `pip install
## .[spark,zk]` (os-ken) and `.[ryu,zk]` (Ryu) on Python 3.11, `.[zk]` on Python 3.12 if there
## is one (PYTHON312=/path); typhoon --version, typhoon-agent and typhoon-controller from each
test-install:
	bash scripts/check_install.sh

## test-osken: the controller's integration tests on os-ken instead of Ryu (the dev venv has
## both; controller/framework/backend.py): the daemon, two switches, all apps in one controller, wordcount
## over 3 emulated hosts, a killed worker replaced by the fault detector
OSKEN_TESTS := tests/integration/test_daemons.py tests/integration/test_stack_smoke.py \
	tests/integration/test_all_apps.py \
	tests/integration/test_sdn_dataplane.py::test_wordcount_on_three_hosts_equals_reference \
	tests/integration/test_fault_detector.py::test_split_worker_killed_is_routed_around_and_replaced
test-osken: setup
	TYPHOON_CONTROLLER_BACKEND=os-ken $(PY) -m pytest $(OSKEN_TESTS) -m "not long" --durations=10

## clean-net: remove leftover emulation state, like `mn -c`. Machine-wide: it deletes
## EVERY Open vSwitch bridge and Mininet link and kills every ryu-manager, not only ours.
clean-net:
	mn -c
