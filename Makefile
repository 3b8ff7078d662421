# imageforge: `make demo` runs the real pipeline offline against the sample upstream;
# `make test` runs unit and integration tests (installing what they need first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE_IMAGE ?= imageforge/base:bookworm

.PHONY: setup docker host-tools test unit integration test-cold mutation demo demo-real bench bench-real lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Docker Engine + buildx + the containerd image store, and the local base image.
docker:
	scripts/setup-host.sh
	scripts/base-image.sh $(BASE_IMAGE)

# The sample upstream's unit tests build its aws-ofi-nccl (autotools) on the host; the
# signature tests make and check OpenPGP signatures with gpg.
host-tools:
	scripts/host-tools.sh

# Spread over JOBS workers (one per core plus one by default: a worker waiting on a daemon
# restart, a registry or a container leaves its core to the others; on 2 cores 3 workers took
# 29 min where 2 took 33); tests/conftest.py says what runs where.
JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
XDIST = -n $(JOBS) --dist loadfile --no-loadscope-reorder

test: setup host-tools docker
	$(BIN)/pytest -q $(XDIST) --durations=30 --junitxml=cache/reports/make-test.xml \
		tests/unit tests/integration
	$(BIN)/python scripts/test_durations.py cache/reports/make-test.xml --top 12

# `make test` as on a machine that has never built anything: a fresh clone run against a
# Docker engine of its own with an empty data root (scripts/cold_test.py; needs root).
test-cold: setup
	$(BIN)/python scripts/cold_test.py JOBS=$(JOBS)

unit: setup host-tools
	$(BIN)/pytest -q $(XDIST) tests/unit

integration: setup docker
	$(BIN)/pytest -q $(XDIST) tests/integration

# Mutation testing (scripts/mutation.py): mutmut mutates every function of the modules that
# carry the promises ([tool.mutmut] in pyproject.toml) and runs the unit tests covering each;
# then the known mutants of scripts/mutants.py. Prints the score and the survivors; fails on a
# survivor that no tests/mutation-equivalent/*.toml entry accepts. Verdicts are cached in mutants/
# per function: FRESH=1 forgets them (after weakening a test), REPORT=1 only prints them.
mutation: setup
	$(BIN)/python scripts/mutation.py $(if $(FRESH),--fresh) $(if $(REPORT),--report)

demo: setup docker
	scripts/demo.sh

# Seed 000's image from real NCCL, nccl-tests, aws-ofi-nccl, CUDA 13 and Debian's fabric
# libraries (needs PyPI and Debian's mirror the first time; ONLY_FUNCS=... for a quick NCCL).
demo-real: setup docker
	scripts/demo-real.sh

bench: setup docker
	$(BIN)/invoke bench

# An EFA bump on the real efa-nccl image, imageforge against seed 000's linear Dockerfile.
bench-real: setup docker
	$(BIN)/python -m bench.real

lint: setup
	$(BIN)/ruff check imageforge stages sample realparts bench sbom scripts tests tasks.py
	$(BIN)/mypy

clean:
	rm -rf cache/build cache/reports
