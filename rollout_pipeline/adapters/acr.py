"""Amazon Bedrock AgentCore Runtime adapter (ports.AgentRuntime) over boto3 `bedrock-agentcore`.

`invoke` = InvokeAgentRuntime(agentRuntimeArn, runtimeSessionId, payload=JSON bytes, qualifier=the session's
endpoint), the response stream read (at most `MAX_RESPONSE_BYTES`) and closed; `stop` = StopRuntimeSession on the
same endpoint. The client has explicit connect/read timeouts and NO botocore retries: a retry of InvokeAgentRuntime
re-sends the payload into the same session (a second rollout in one microVM) and bypasses the global limiter, so
the application retries, inside the limiter. Errors map to the ports' kinds:

- ThrottlingException, TooManyRequestsException and 429 -> `RuntimeRateExceeded` (a rate quota: retry later, and
  the budget it names backs off); ServiceQuotaExceededException (402: the account's active sessions, "maxVms") ->
  `RuntimeQuotaExceeded` (retry later, with fewer sessions at once); (Retryable)ConflictException, 5xx, and
  connection failures before the request was sent -> `RuntimeThrottled` (retry later);
- RuntimeClientError (424) "Runtime initialization time exceeded" (the container exited or never became healthy: a
  crash at import answers this too) -> `RuntimeStartFailed` (the rollout fails as `agent_error`, never retried);
- any other RuntimeClientError (424, cold start) -> `RuntimeColdStart` (retry the same session id after a short wait);
- a read timeout after the request was sent -> `RuntimeOutcomeUnknown` (never re-sent: the deadline decides);
- ResourceNotFoundException on stop -> `RuntimeSessionNotFound`;
- Validation/AccessDenied/ResourceNotFound on invoke and other 4xx -> `RuntimeRejected`;
- anything else is re-raised unchanged (an unknown error is not throttling).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from rollout_pipeline import ids
from rollout_pipeline.ports import (
    RuntimeColdStart,
    RuntimeOutcomeUnknown,
    RuntimeQuotaExceeded,
    RuntimeRateExceeded,
    RuntimeRejected,
    RuntimeSessionNotFound,
    RuntimeStartFailed,
    RuntimeThrottled,
)

RETRYABLE_CODES: Final = frozenset(
    {
        "ThrottlingException",
        "ServiceQuotaExceededException",
        "RetryableConflictException",
        "ConflictException",
        "InternalServerException",
        "ServiceUnavailableException",
        "TooManyRequestsException",
    }
)
#: The codes of a RATE quota exceeded (new sessions, data-plane calls), as opposed to a busy session or a full quota.
RATE_CODES: Final = frozenset({"ThrottlingException", "TooManyRequestsException"})
COLD_START_CODES: Final = frozenset({"RuntimeClientError"})
#: How AgentCore words a RuntimeClientError for a container that exited or never became ready within its 30 s
#: (docs/aws-facts.md): not a race with the start-up, so no retry of the session can help.
START_FAILED_MESSAGE: Final = "initialization time exceeded"
#: botocore transport errors raised before the request reached AgentCore: safe to send again.
NOT_SENT_ERRORS: Final = frozenset({"ConnectTimeoutError", "EndpointConnectionError", "ConnectionError"})
#: ...and after it may have reached it: never re-sent.
MAYBE_SENT_ERRORS: Final = frozenset({"ReadTimeoutError", "ConnectionClosedError", "ResponseStreamingError"})
#: Client timeouts (s). ART agents answer `/invocations` at once, so a long read means something is wrong.
CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 60.0
#: The longest one call can take (connect, then read): a caller starts an invoke only if it can end in its time.
MAX_CALL_S: Final = CONNECT_TIMEOUT_S + READ_TIMEOUT_S
#: The invoke response is read up to this many bytes (an ART agent answers a few hundred).
MAX_RESPONSE_BYTES: Final = 64 * 1024


def classify_error(exc: Exception, operation: str) -> Exception:
    """Map a botocore exception to the port's error kinds; anything unknown is returned unchanged."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = str((response.get("Error") or {}).get("Code") or "")
        status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        message = f"{operation}: {code or status}: {(response.get('Error') or {}).get('Message') or exc}"
        if code in COLD_START_CODES or status == 424:
            if START_FAILED_MESSAGE in message.lower():
                return RuntimeStartFailed(message)
            return RuntimeColdStart(message)
        if code == "ResourceNotFoundException" and operation == "StopRuntimeSession":
            return RuntimeSessionNotFound(message)
        if code in RATE_CODES or (status == 429 and not code):
            return RuntimeRateExceeded(message)
        if code == "ServiceQuotaExceededException" or (status == 402 and not code):
            return RuntimeQuotaExceeded(message)
        if code in RETRYABLE_CODES or status in (402, 409, 429) or status >= 500:
            return RuntimeThrottled(message)
        if 400 <= status < 500:  # ValidationException 400, AccessDenied 403, ResourceNotFound 404 (botocore model)
            return RuntimeRejected(message)
        return exc
    name = type(exc).__name__
    if name in ("ParamValidationError", "ValidationError"):
        return RuntimeRejected(f"{operation}: {exc}")
    if name in NOT_SENT_ERRORS:
        return RuntimeThrottled(f"{operation}: {name}: {exc}")
    if name in MAYBE_SENT_ERRORS:
        return RuntimeOutcomeUnknown(f"{operation}: {name}: {exc}")
    return exc


def client_config(max_pool_connections: int) -> Any:
    """The botocore config of the `bedrock-agentcore` client: explicit timeouts, botocore retries off (see the
    module doc). `clients.ClientFactory.acr()` makes the client with it."""
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": 1},
        max_pool_connections=max_pool_connections,
    )


class AcrAgentRuntime:
    """The real ACR runtime of one experiment (`runtime_arn`), its sessions spread over `endpoints` endpoints
    (`ids.endpoint_index`; endpoint 0 is DEFAULT and sent without a qualifier), through `acr_client` (a client
    factory's `acr()`, or its `lazy` stand-in: `wiring.Wiring.agent_runtime`)."""

    #: The longest an invoke can take (`lifecycle.deps.LifecycleDeps.invoke_time_s` reads it).
    max_invoke_s: float = MAX_CALL_S

    def __init__(
        self,
        runtime_arn: str,
        acr_client: Any,
        qualifier: str | None = None,
        endpoints: int = 1,
    ) -> None:
        self.runtime_arn = runtime_arn
        self.qualifier = qualifier
        self.endpoints = endpoints
        self.acr = acr_client

    def _target(self, session_id: str) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"agentRuntimeArn": self.runtime_arn, "runtimeSessionId": session_id}
        index = ids.endpoint_index(session_id, self.endpoints)
        qualifier = self.qualifier if index == 0 else ids.endpoint_name(index)
        if qualifier:
            kwargs["qualifier"] = qualifier
        return kwargs

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """Start the rollout in session `session_id` (ART agents answer at once and work in the background)."""
        kwargs = self._target(session_id)
        kwargs["payload"] = json.dumps(payload, separators=(",", ":")).encode()
        try:
            resp = self.acr.invoke_agent_runtime(**kwargs)
        except Exception as exc:
            mapped = classify_error(exc, "InvokeAgentRuntime")
            if mapped is exc:
                raise
            raise mapped from exc
        body = b""
        stream = resp.get("response")
        if stream is not None:
            try:
                body = stream.read(MAX_RESPONSE_BYTES)
            finally:
                stream.close()
        status = int(resp.get("statusCode") or 200)
        if status >= 500 or status == 429:
            raise RuntimeThrottled(f"InvokeAgentRuntime: agent answered {status}: {body[:300]!r}")
        if status == 424:
            text = f"InvokeAgentRuntime: agent answered {status}: {body[:300]!r}"
            raise (RuntimeStartFailed if START_FAILED_MESSAGE.encode() in body.lower() else RuntimeColdStart)(text)
        if status >= 400:
            raise RuntimeRejected(f"InvokeAgentRuntime: agent answered {status}: {body[:300]!r}")

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession on the session's endpoint (ResourceNotFound -> RuntimeSessionNotFound)."""
        try:
            self.acr.stop_runtime_session(**self._target(session_id))
        except Exception as exc:
            mapped = classify_error(exc, "StopRuntimeSession")
            if mapped is exc:
                raise
            raise mapped from exc
