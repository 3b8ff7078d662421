# imageforge: `make demo` runs the real pipeline offline against the sample upstream;
# `make test` runs unit and integration tests (installing what they need first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE_IMAGE ?= imageforge/base:bookworm

.PHONY: setup docker test unit integration demo bench lint clean

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

test: setup docker
	$(BIN)/pytest -q tests/unit tests/integration

unit: setup
	$(BIN)/pytest -q tests/unit

integration: setup docker
	$(BIN)/pytest -q tests/integration

demo: setup docker
	scripts/demo.sh

bench: setup docker
	$(BIN)/invoke bench

lint: setup
	$(BIN)/ruff check imageforge stages sample tests tasks.py
	$(BIN)/mypy

clean:
	rm -rf cache/build cache/reports
