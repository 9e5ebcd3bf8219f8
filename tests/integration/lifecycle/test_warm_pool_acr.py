"""The warm pool through the real ACR adapter (boto3 `bedrock-agentcore`, botocore's Stubber: nothing leaves the
process): its warm-ups and keep-alives are InvokeAgentRuntime calls on the session's own `runtimeSessionId` and
endpoint, and AgentCore's real answers (botocore's model: RuntimeClientError 424, ThrottlingException 429,
ResourceNotFoundException 404) do what docs/lifecycle.md says: a 424 warm-up is retried on the same session, a
throttled keep-alive keeps the session, a NotFound keep-alive drops it and its stop is confirmed by a second
NotFound."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from rollout_pipeline.adapters.acr import AcrAgentRuntime
from rollout_pipeline.config import ExperimentConfig, is_warmup_payload
from rollout_pipeline.lifecycle.warm_pool import WarmPool
from rollout_pipeline.local.resources import ExperimentResources
from tests.doubles import ShiftedClock
from tests.integration.lifecycle_support import make_deps, moto_lock, slots_in_flight

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/rollouts_test-abc"


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    """The warm pool on from the start, as deployed (its lifetimes derived for it)."""
    return ExperimentConfig(name="test-exp", max_sessions=4, endpoints=2, warm_sessions=1)


@pytest.fixture
def stubbed() -> Iterator[tuple[AcrAgentRuntime, Stubber, list[dict[str, Any]]]]:
    client = boto3.client("bedrock-agentcore", region_name="us-east-1")
    sent: list[dict[str, Any]] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        sent.append({"operation": model.name, **params})

    client.meta.events.register("before-parameter-build.bedrock-agentcore", record)
    with Stubber(client) as stubber:
        yield AcrAgentRuntime(ARN, acr_client=client, endpoints=2), stubber, sent
        stubber.assert_no_pending_responses()


def answered(stubber: Stubber) -> None:
    raw = b'{"status": "warm"}'
    stubber.add_response(
        "invoke_agent_runtime",
        {"response": StreamingBody(io.BytesIO(raw), len(raw)), "statusCode": 200, "contentType": "application/json"},
    )


def test_warm_ups_and_keep_alives_are_invokes_of_the_same_session_and_aws_errors_are_handled(
    resources: ExperimentResources, stubbed: tuple[AcrAgentRuntime, Stubber, list[dict[str, Any]]]
) -> None:
    runtime, stubber, sent = stubbed
    clock = ShiftedClock()
    limits = {"warm_sessions": 1, "max_sessions": 4, "endpoints": 2}
    deps = make_deps(resources, runtime, clock=clock, limits=limits)  # type: ignore[arg-type]
    # The warm-up meets the container's start-up (424), then answers on the same session.
    stubber.add_client_error(
        "invoke_agent_runtime",
        service_error_code="RuntimeClientError",
        service_message="Received error (500) from runtime",
        http_status_code=424,
    )
    answered(stubber)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.warmed, tick.warmup_failures, tick.idle) == (1, 0, 1)
    (session,) = deps.ledger.warm.sessions()
    warm = session.session_id

    # A keep-alive (due halfway to the end of its offer) throttled: the session stays, kept alive next tick.
    clock.advance(deps.config.idle_timeout_s * 0.5 + 1)
    stubber.add_client_error("invoke_agent_runtime", service_error_code="ThrottlingException", http_status_code=429)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.kept_alive, tick.dropped) == (0, 0)
    assert [s.session_id for s in deps.ledger.warm.sessions()] == [warm]

    # The next keep-alive finds it gone (ResourceNotFoundException): dropped, its stop confirmed by a second
    # NotFound, its slot given back, and a new session warmed in its place.
    stubber.add_client_error(
        "invoke_agent_runtime", service_error_code="ResourceNotFoundException", http_status_code=404
    )
    gone = "ResourceNotFoundException"
    for _ in range(2):
        stubber.add_client_error("stop_runtime_session", service_error_code=gone, http_status_code=404)
    answered(stubber)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.dropped, tick.warmed) == (1, 1)
    (replacement,) = deps.ledger.warm.sessions()
    assert replacement.session_id != warm
    assert slots_in_flight(resources) == 1

    on_warm = [c for c in sent if c["runtimeSessionId"] == warm]
    assert [c["operation"] for c in on_warm] == ["InvokeAgentRuntime"] * 4 + ["StopRuntimeSession"] * 2
    target = runtime._target(warm)  # the session's own endpoint, the same for every call
    assert all(c.get("qualifier") == target.get("qualifier") and c["agentRuntimeArn"] == ARN for c in on_warm)
    invokes = [json.loads(c["payload"]) for c in on_warm if c["operation"] == "InvokeAgentRuntime"]
    assert all(is_warmup_payload(p) for p in invokes)  # answered by the agent host, never a rollout
