"""The boto3 ACR adapter: request shape, response stream read and closed, error mapping (botocore Stubber:
nothing leaves the process)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from rollout_pipeline import ids
from rollout_pipeline.adapters import acr as acr_module
from rollout_pipeline.adapters import clients
from rollout_pipeline.adapters.acr import AcrAgentRuntime
from rollout_pipeline.ports import (
    RuntimeColdStart,
    RuntimeOutcomeUnknown,
    RuntimeRejected,
    RuntimeSessionNotFound,
    RuntimeStartFailed,
    RuntimeThrottled,
)

ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/rollouts_test-abc"
SID = "batch-0123456789ab-0-1-0123456789abcdef"


@pytest.fixture
def acr(aws_env: None) -> Iterator[tuple[AcrAgentRuntime, Stubber]]:
    client = boto3.client("bedrock-agentcore", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield AcrAgentRuntime(ARN, acr_client=client), stubber
        stubber.assert_no_pending_responses()


class TrackingBody(StreamingBody):  # type: ignore[misc]
    """Remembers how much was read and whether it was closed."""

    closed_by_reader = False
    bytes_read = 0

    def read(self, amt: int | None = None) -> bytes:
        data: bytes = super().read(amt)
        TrackingBody.bytes_read += len(data)
        return data

    def close(self) -> None:
        TrackingBody.closed_by_reader = True
        super().close()


def test_invoke_sends_json_bytes_and_reads_the_stream(acr: tuple[AcrAgentRuntime, Stubber]) -> None:
    runtime, stubber = acr
    raw = b'{"status": "processing"}'
    body = TrackingBody(io.BytesIO(raw), len(raw))
    payload = {"prompt": "hi", "_rollout": {"exp_id": "e", "input_id": "q", "s3_bucket": "b"}}
    stubber.add_response(
        "invoke_agent_runtime",
        {"response": body, "statusCode": 200, "contentType": "application/json", "runtimeSessionId": SID},
        {
            "agentRuntimeArn": ARN,
            "runtimeSessionId": SID,
            "payload": json.dumps(payload, separators=(",", ":")).encode(),
        },
    )
    runtime.invoke(SID, payload)
    assert TrackingBody.closed_by_reader
    assert TrackingBody.bytes_read == len(raw)  # read to the end


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("ThrottlingException", 429, RuntimeThrottled),
        ("ServiceQuotaExceededException", 402, RuntimeThrottled),
        ("RetryableConflictException", 409, RuntimeThrottled),
        ("InternalServerException", 500, RuntimeThrottled),
        ("SomethingNew", 503, RuntimeThrottled),
        ("ValidationException", 400, RuntimeRejected),
        ("AccessDeniedException", 403, RuntimeRejected),
        ("ResourceNotFoundException", 404, RuntimeRejected),
        # A cold start (the session exists; the same id succeeds after ~2 s): retried, not a rejection.
        ("RuntimeClientError", 424, RuntimeColdStart),
    ],
)
def test_invoke_errors_map_to_port_errors(
    acr: tuple[AcrAgentRuntime, Stubber], code: str, status: int, kind: type[Exception]
) -> None:
    runtime, stubber = acr
    stubber.add_client_error("invoke_agent_runtime", service_error_code=code, http_status_code=status)
    with pytest.raises(kind, match=code):
        runtime.invoke(SID, {"a": 1})


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        # How AgentCore answers a session whose container exited or never became healthy (a crash at import too):
        # no retry of the session can help, so the rollout fails (`agent_error`) instead of retrying for hours.
        (
            "Runtime initialization time exceeded. Please make sure that initialization completes in 30s.",
            RuntimeStartFailed,
        ),
        # The start-up race ART retries: the container is up a moment later.
        ("Received error (500) from runtime", RuntimeColdStart),
    ],
)
def test_a_container_that_cannot_start_is_told_from_a_cold_start(
    acr: tuple[AcrAgentRuntime, Stubber], message: str, kind: type[Exception]
) -> None:
    runtime, stubber = acr
    stubber.add_client_error(
        "invoke_agent_runtime", service_error_code="RuntimeClientError", service_message=message, http_status_code=424
    )
    with pytest.raises(kind, match="RuntimeClientError"):
        runtime.invoke(SID, {"a": 1})
    assert issubclass(kind, RuntimeStartFailed) != issubclass(kind, RuntimeColdStart)


def test_agent_error_status_in_the_response(acr: tuple[AcrAgentRuntime, Stubber]) -> None:
    runtime, stubber = acr
    raw = b'{"error": "Missing required rollout config field"}'
    stubber.add_response(
        "invoke_agent_runtime",
        {
            "response": StreamingBody(io.BytesIO(raw), len(raw)),
            "statusCode": 400,
            "runtimeSessionId": SID,
            "contentType": "application/json",
        },
    )
    with pytest.raises(RuntimeRejected, match="400"):
        runtime.invoke(SID, {})


def test_stop_not_found_is_reported_other_errors_map(acr: tuple[AcrAgentRuntime, Stubber]) -> None:
    runtime, stubber = acr
    expected: dict[str, Any] = {"agentRuntimeArn": ARN, "runtimeSessionId": SID}
    stubber.add_response("stop_runtime_session", {"runtimeSessionId": SID, "statusCode": 200}, expected)
    runtime.stop(SID)
    # AgentCore has answered NotFound while the container kept running: the caller decides (stops module).
    stubber.add_client_error(
        "stop_runtime_session", service_error_code="ResourceNotFoundException", http_status_code=404
    )
    with pytest.raises(RuntimeSessionNotFound):
        runtime.stop(SID)
    stubber.add_client_error("stop_runtime_session", service_error_code="ConflictException", http_status_code=409)
    with pytest.raises(RuntimeThrottled):
        runtime.stop(SID)
    stubber.add_client_error("stop_runtime_session", service_error_code="ThrottlingException", http_status_code=429)
    with pytest.raises(RuntimeThrottled):
        runtime.stop(SID)
    stubber.add_client_error("stop_runtime_session", service_error_code="AccessDeniedException", http_status_code=403)
    with pytest.raises(RuntimeRejected):
        runtime.stop(SID)


def test_unknown_errors_are_not_throttling_and_read_timeouts_are_never_resent(
    acr: tuple[AcrAgentRuntime, Stubber],
) -> None:
    from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

    assert isinstance(
        acr_module.classify_error(ConnectTimeoutError(endpoint_url="x"), "InvokeAgentRuntime"), RuntimeThrottled
    )
    assert isinstance(
        acr_module.classify_error(ReadTimeoutError(endpoint_url="x"), "InvokeAgentRuntime"), RuntimeOutcomeUnknown
    )
    boom = KeyError("bug")
    assert acr_module.classify_error(boom, "InvokeAgentRuntime") is boom


def test_client_has_timeouts_and_no_sdk_retries(aws_env: None) -> None:
    config = clients.ClientFactory().acr().meta.config
    assert (config.connect_timeout, config.read_timeout) == (acr_module.CONNECT_TIMEOUT_S, 60.0)
    assert config.retries["total_max_attempts"] == 1


def test_sessions_follow_their_endpoint(aws_env: None) -> None:
    client = boto3.client("bedrock-agentcore", region_name="us-east-1")
    runtime = AcrAgentRuntime(ARN, acr_client=client, endpoints=2)
    sids = [f"batch-0123456789ab-{i}-1-0123456789abcdef" for i in range(20)]
    by_endpoint = {ids.endpoint_index(s, 2) for s in sids}
    assert by_endpoint == {0, 1}  # spread
    with Stubber(client) as stubber:
        for sid in sids:
            target: dict[str, Any] = {"agentRuntimeArn": ARN, "runtimeSessionId": sid}
            if ids.endpoint_index(sid, 2) == 1:
                target["qualifier"] = "rollouts_1"
            stubber.add_response("stop_runtime_session", {"runtimeSessionId": sid, "statusCode": 200}, target)
            runtime.stop(sid)
        stubber.assert_no_pending_responses()
