# Contract commands: `make demo` and `make test` (both set up the machine first).
SHELL := /bin/bash
.DEFAULT_GOAL := test

VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-long lint demo dashboard-screenshot fuzz-topologies clean-net test-install

## setup: Debian packages, .venv (Ryu, PySpark, the project) and a running Open vSwitch
setup:
	bash scripts/setup.sh

## test: unit and integration tests (integration = marker `integration`, needs root)
test: setup
	@rc=0; $(PY) -m pytest tests -m "not long" --durations=25 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

## test-long: the further variants of the slowest tests (marker `long`), kept out of `make test`
test-long: setup
	@rc=0; $(PY) -m pytest tests -m long --durations=10 || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-long: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

## lint: ruff, read-only
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

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

## test-install: `pip install .[zk]` into a fresh Python 3.11 venv outside the repository
## (as docs/deploy.md says), then start typhoon-agent and typhoon-controller from it
test-install:
	bash scripts/check_install.sh

## clean-net: remove leftover emulation state, like `mn -c`. Machine-wide: it deletes
## EVERY Open vSwitch bridge and Mininet link and kills every ryu-manager, not only ours.
clean-net:
	mn -c
