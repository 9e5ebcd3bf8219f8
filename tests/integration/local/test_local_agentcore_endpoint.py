"""AgentCore's StopRuntimeSession at local mode's AWS endpoint: another process's stop (the CLI's `rollouts cancel`,
an SDK trainer's `exp.cancel`) goes through boto3's `bedrock-agentcore` client, over HTTP, to the agent runtime the
running pipeline registered for that endpoint, with AgentCore's errors; nothing reaches moto (which has no AgentCore
and answered "not implemented")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from rollout_pipeline.adapters.acr import AcrAgentRuntime, client_config
from rollout_pipeline.adapters.clients import MAX_POOL_CONNECTIONS
from rollout_pipeline.adapters.runtime import register_local_runtime
from rollout_pipeline.local.moto_server import moto_server
from rollout_pipeline.ports import RuntimeSessionNotFound, RuntimeThrottled

ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/route-local"
SESSION = "local-session-0000000000000000000000001"


class Sessions:
    """A local agent runtime's stops: known sessions stop, `busy` ones are throttled, others are not found."""

    def __init__(self) -> None:
        self.running = {SESSION, "busy-session-000000000000000000000000001"}
        self.stopped: list[str] = []

    def invoke(self, session_id: str, payload: Any) -> None:  # pragma: no cover - never called over HTTP
        raise AssertionError("local mode's invokes stay in process")

    def stop(self, session_id: str) -> None:
        if session_id.startswith("busy"):
            raise RuntimeThrottled("too many stops")
        if session_id not in self.running:
            raise RuntimeSessionNotFound(f"no session {session_id}")
        self.running.discard(session_id)
        self.stopped.append(session_id)


@pytest.fixture
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


def _acr(endpoint: str) -> AcrAgentRuntime:
    client = boto3.client(
        "bedrock-agentcore",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=client_config(MAX_POOL_CONNECTIONS),
    )
    return AcrAgentRuntime(ARN, client)


def test_a_stop_from_another_process_stops_the_session_where_it_runs(endpoint: str) -> None:
    sessions = Sessions()
    register_local_runtime(endpoint, sessions)
    try:
        acr = _acr(endpoint)
        acr.stop(SESSION)
        assert sessions.stopped == [SESSION]
        with pytest.raises(RuntimeSessionNotFound, match="ResourceNotFoundException"):
            acr.stop(SESSION)  # stopped already: AgentCore's 404
        with pytest.raises(RuntimeThrottled, match="ThrottlingException"):
            acr.stop("busy-session-000000000000000000000000001")
    finally:
        register_local_runtime(endpoint, None)


def test_without_a_pipeline_at_the_endpoint_a_stop_finds_no_session(endpoint: str) -> None:
    with pytest.raises(RuntimeSessionNotFound, match="no local agent runtime at this endpoint"):
        _acr(endpoint).stop(SESSION)


def test_other_agentcore_calls_are_refused_not_sent_to_moto(endpoint: str) -> None:
    from rollout_pipeline.ports import RuntimeRejected

    register_local_runtime(endpoint, Sessions())
    try:
        with pytest.raises(RuntimeRejected, match="local mode serves StopRuntimeSession only"):
            _acr(endpoint).invoke(SESSION, {"prompt": "x"})
    finally:
        register_local_runtime(endpoint, None)
