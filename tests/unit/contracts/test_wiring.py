"""One composition root and one client factory: lazy clients, the ACR client's settings wherever it is made, the
handler shape, and the shared partial-batch runner."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from rollout_pipeline import topology
from rollout_pipeline.adapters import acr as acr_module
from rollout_pipeline.adapters.clients import ACR_SERVICE, ClientFactory, LazyClient
from rollout_pipeline.config import ConfigError, ExperimentConfig, FunctionEnvironment, HandlerSettings
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ports import SystemClock
from rollout_pipeline.sqs_batch import BatchOutcome, batch_response, run_partial_batch
from rollout_pipeline.wiring import Wiring

SETTINGS = HandlerSettings(
    table_name="t",
    input_bucket="in",
    results_bucket="out",
    rollout_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/q",
    bus_name="bus",
    runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/r",
    experiment=ExperimentConfig(name="wired"),
)


def test_wiring_builds_every_stage_without_creating_a_client() -> None:
    factory = ClientFactory(region="us-east-1")
    wiring = Wiring(SETTINGS, factory)
    deps = wiring.lifecycle()
    ingestion = wiring.ingestion()
    assert wiring.lifecycle() is deps
    assert wiring.ingestion() is ingestion
    assert factory._clients == {}, "wiring must not create boto3 clients (Lambda cold start)"
    assert isinstance(deps.ledger.table.ddb, LazyClient)
    assert isinstance(ingestion.ports.ledger.table.ddb, LazyClient)
    assert deps.settings is ingestion.settings is SETTINGS


def test_one_ledger_type_and_one_clock_for_ingestion_and_the_lifecycle() -> None:
    wiring = Wiring(SETTINGS, ClientFactory(region="us-east-1"))
    deps, ports = wiring.lifecycle(), wiring.ingestion().ports
    assert type(deps.ledger) is type(ports.ledger) is Ledger
    parts = (deps.ledger.batches, deps.ledger.rollouts, deps.ledger.limits)
    assert {id(part.table) for part in parts} == {id(deps.ledger.table)}, "one table gateway under the three parts"
    assert deps.ledger.table.clock is deps.clock is ports.ledger.table.clock is wiring.clock
    other = SystemClock()
    assert wiring.new_lifecycle(clock=other).ledger.table.clock is other, "an overridden clock reaches the ledger"


@pytest.mark.usefixtures("aws_env")
def test_one_acr_client_configuration_for_lambdas_sdk_and_default() -> None:
    from rollout_pipeline.sdk._aws import AwsClients

    for factory in (ClientFactory(), AwsClients(region="us-east-1")):
        runtime = Wiring(SETTINGS, factory).agent_runtime()
        assert isinstance(runtime, acr_module.AcrAgentRuntime)
        config = runtime.acr.meta.config
        assert (config.connect_timeout, config.read_timeout) == (
            acr_module.CONNECT_TIMEOUT_S,
            acr_module.READ_TIMEOUT_S,
        )
        assert config.retries["total_max_attempts"] == 1, type(factory).__name__
        assert factory.client(ACR_SERVICE) is factory.acr()
    # Every other client retries (standard mode).
    assert ClientFactory().client("sqs").meta.config.retries["total_max_attempts"] == 6


@pytest.mark.usefixtures("aws_env")
def test_every_session_reads_each_service_model_once_per_process() -> None:
    """Sessions of their own (credentials, region, hooks) on one botocore data loader: a service model parsed for
    one factory's client is not parsed again for the next factory's (botocore caches each file in its loader), and
    boto3's data folder is searched once."""
    first, second = ClientFactory(region="us-east-1"), ClientFactory(region="eu-west-1")
    assert first.session is not second.session
    loader = first.session._session.get_component("data_loader")
    assert second.session._session.get_component("data_loader") is loader
    first.client("sqs")
    assert len(loader.search_paths) == len(set(loader.search_paths))
    assert second.client("sqs").meta.region_name == "eu-west-1"


def test_the_warm_pools_calls_in_flight_fit_the_sweepers_agentcore_client() -> None:
    """A warm-pool tick has up to `CALLS_IN_FLIGHT` warm-ups (keep-alives, stops) in flight on the sweeper's one
    AgentCore client: its connection pool holds them all (with fewer, calls wait for a connection or open and drop
    one each: 100 warm-ups on 50 connections)."""
    from rollout_pipeline.lifecycle.warm_pool import CALLS_IN_FLIGHT

    factory = ClientFactory(region="us-east-1")
    runtime = Wiring(SETTINGS, factory).agent_runtime()
    assert isinstance(runtime, acr_module.AcrAgentRuntime)
    assert runtime.acr.meta.config.max_pool_connections >= CALLS_IN_FLIGHT
    assert factory.client("dynamodb").meta.config.max_pool_connections >= CALLS_IN_FLIGHT  # their pacing


def test_a_given_runtime_wins_and_a_local_one_serves_its_endpoint() -> None:
    from rollout_pipeline.adapters.runtime import register_local_runtime

    fake = FakeAgentRuntime()
    assert Wiring(SETTINGS, ClientFactory(), runtime=fake).lifecycle().runtime is fake
    url = "http://127.0.0.1:49999"
    register_local_runtime(url, fake)
    try:
        assert Wiring(SETTINGS, ClientFactory(endpoint_url=url)).agent_runtime() is fake
        assert not isinstance(Wiring(SETTINGS, ClientFactory()).agent_runtime(), FakeAgentRuntime)
    finally:
        register_local_runtime(url, None)
    assert not isinstance(Wiring(SETTINGS, ClientFactory(endpoint_url=url)).agent_runtime(), FakeAgentRuntime)


def test_function_environment_is_declared_once() -> None:
    env = FunctionEnvironment.of(SETTINGS).to_environ()
    assert set(env) == set(FunctionEnvironment.model_fields)
    assert HandlerSettings.from_environ(env) == SETTINGS
    assert set(SETTINGS.to_environ()) == {k for k in env if not k.startswith("POWERTOOLS_")}
    with pytest.raises(ConfigError, match="missing environment variables: TABLE_NAME, EXPERIMENT_CONFIG"):
        FunctionEnvironment.from_environ({k: v for k, v in env.items() if k not in ("TABLE_NAME", "EXPERIMENT_CONFIG")})


# --------------------------------------------------------------------------------------- partial batches


def _records(*ids: str) -> list[Mapping[str, Any]]:
    return [{"messageId": i, "body": i} for i in ids]


@pytest.mark.parametrize("workers", [1, 4])
def test_partial_batch_reports_only_the_records_that_raised(workers: int) -> None:
    def handle(record: Mapping[str, Any]) -> str:
        if str(record["body"]).startswith("bad"):
            raise ValueError(record["body"])
        return str(record["body"]).upper()

    result: BatchOutcome[str] = BatchOutcome()
    run_partial_batch(_records("a", "bad1", "b", "bad2"), handle, result, workers=workers)
    assert result.outcomes == {"a": "A", "b": "B"}
    assert result.failures == {"bad1": "ValueError: bad1", "bad2": "ValueError: bad2"}
    assert batch_response(result.failures) == {
        "batchItemFailures": [{"itemIdentifier": "bad1"}, {"itemIdentifier": "bad2"}]
    }


def test_partial_batch_workers_run_together() -> None:
    """Dispatch's workers wait on shared limits together: a batch of 4 with 4 workers takes one wait, not four."""
    barrier = threading.Barrier(4, timeout=5)
    result: BatchOutcome[int] = BatchOutcome()
    started = time.monotonic()
    run_partial_batch(_records("1", "2", "3", "4"), lambda r: barrier.wait(), result, workers=4)
    assert not result.failures
    assert len(result.outcomes) == 4
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------------------------- handlers


class _Context:
    function_name = "dispatch"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:dispatch"
    aws_request_id = "req"

    def get_remaining_time_in_millis(self) -> int:
        return 100_000


def test_every_function_has_one_shape() -> None:
    import lambdas.completion
    import lambdas.dispatch
    import lambdas.ingest
    import lambdas.sweeper
    from lambdas.glue import PipelineFunction

    modules = {"ingest": lambdas.ingest, "dispatch": lambdas.dispatch, "completion": lambdas.completion}
    modules["sweeper"] = lambdas.sweeper
    assert set(modules) == set(topology.FUNCTION_NAMES)
    for name, module in modules.items():
        assert isinstance(module.function, PipelineFunction)
        assert module.function.name == name
        assert module.handler is module.function.handler


def test_bound_handler_runs_over_the_given_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from lambdas.glue import PipelineFunction, RunResult

    seen: list[Any] = []

    def run(stage: str, event: dict[str, Any], context: Any) -> RunResult:
        seen.append(stage)
        return RunResult({"batchItemFailures": []}, "ran", counts={"Things": 2})

    def build(_wiring: Wiring) -> str:
        raise AssertionError("a bound handler never builds its stage from the environment")

    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    function = PipelineFunction("dispatch", build, run, experiment=lambda stage: stage)
    assert function.bind("explicit")({"Records": []}, _Context()) == {"batchItemFailures": []}
    assert seen == ["explicit"]


@pytest.mark.parametrize("name", [*topology.FUNCTION_NAMES, *topology.MTRL_FUNCTION_NAMES])
def test_a_cold_start_imports_no_boto3_until_a_call_needs_it(name: str) -> None:
    """Importing a handler and building its stage from the environment (what a cold start does before the first
    call) must not import boto3 (~180 ms): the factory's clients are lazy."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **FunctionEnvironment.of(SETTINGS).to_environ(),
        "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    probe = (
        "import importlib, json, sys; m = importlib.import_module(sys.argv[1]); a = 'boto3' in sys.modules; "
        "m.function.stage(); print(json.dumps([a, 'boto3' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, f"lambdas.{name}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, False]
