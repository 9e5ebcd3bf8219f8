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

from rollout_pipeline.adapters.acr import AcrAgentRuntime
from rollout_pipeline.ports import RuntimeRejected, RuntimeThrottled

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
        ("RuntimeClientError", 424, RuntimeRejected),
    ],
)
def test_invoke_errors_map_to_port_errors(
    acr: tuple[AcrAgentRuntime, Stubber], code: str, status: int, kind: type[Exception]
) -> None:
    runtime, stubber = acr
    stubber.add_client_error("invoke_agent_runtime", service_error_code=code, http_status_code=status)
    with pytest.raises(kind, match=code):
        runtime.invoke(SID, {"a": 1})


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


def test_stop_of_unknown_session_is_success_other_errors_map(acr: tuple[AcrAgentRuntime, Stubber]) -> None:
    runtime, stubber = acr
    expected: dict[str, Any] = {"agentRuntimeArn": ARN, "runtimeSessionId": SID}
    stubber.add_response("stop_runtime_session", {"runtimeSessionId": SID, "statusCode": 200}, expected)
    runtime.stop(SID)
    stubber.add_client_error(
        "stop_runtime_session", service_error_code="ResourceNotFoundException", http_status_code=404
    )
    runtime.stop(SID)
    stubber.add_client_error("stop_runtime_session", service_error_code="ThrottlingException", http_status_code=429)
    with pytest.raises(RuntimeThrottled):
        runtime.stop(SID)
    stubber.add_client_error("stop_runtime_session", service_error_code="AccessDeniedException", http_status_code=403)
    with pytest.raises(RuntimeRejected):
        runtime.stop(SID)
