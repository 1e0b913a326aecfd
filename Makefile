# ftq: `make up` runs the service, `make test` runs the whole suite. Both start with `make install`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ftq-installed
TORCH_CPU := torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install up test lint typecheck openapi openapi-check bench clean

# Idempotent and quick when nothing changed: the stamp is newer than pyproject.toml.
install: $(STAMP) examples/tiny/model/config.json

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel
	@# Without a GPU, take the CPU build of torch first; with one, pip's default (CUDA) build.
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q "torch>=2.6"; \
	else \
		$(BIN)/pip install -q $(TORCH_CPU); \
	fi
	$(BIN)/pip install -q -e ".[train,dev]"
	@touch $(STAMP)

examples/tiny/model/config.json: $(STAMP) trainer/tiny.py
	$(BIN)/python -m trainer.tiny --out examples/tiny

up: install
	$(BIN)/ftq up --host $(HOST) --port $(PORT)

# The same checks as .pre-commit-config.yaml: style, formatting, and the import contracts in pyproject.toml.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo

typecheck: install
	$(BIN)/mypy ftq service worker trainer migrations

openapi: install
	$(BIN)/python -m service.openapi_dump > openapi/openapi.json

openapi-check: install
	$(BIN)/python -m service.openapi_dump | diff -u openapi/openapi.json - \
		|| (echo "openapi/openapi.json is stale: run 'make openapi'" && exit 1)

test: install lint typecheck openapi-check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .ftq examples/tiny
