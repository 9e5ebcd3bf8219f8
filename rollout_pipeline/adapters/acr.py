"""Amazon Bedrock AgentCore Runtime adapter (ports.AgentRuntime) over boto3 `bedrock-agentcore`.

`invoke` = InvokeAgentRuntime(agentRuntimeArn, runtimeSessionId, payload=JSON bytes), the response stream read
fully and closed; `stop` = StopRuntimeSession (an unknown session counts as stopped). Errors map to the ports'
RuntimeThrottled (retry later) and RuntimeRejected (the rollout fails with `invoke_rejected`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from rollout_pipeline.adapters.clients import client
from rollout_pipeline.ports import RuntimeRejected, RuntimeThrottled

RETRYABLE_CODES: Final = frozenset(
    {
        "ThrottlingException",
        "ServiceQuotaExceededException",
        "RetryableConflictException",
        "InternalServerException",
        "ServiceUnavailableException",
        "TooManyRequestsException",
    }
)
REJECTED_CODES: Final = frozenset(
    {"ValidationException", "AccessDeniedException", "ResourceNotFoundException", "RuntimeClientError"}
)


def classify_error(exc: Exception, operation: str) -> RuntimeThrottled | RuntimeRejected:
    """Map a botocore exception to the port's error kinds (unknown 5xx and transport errors are retryable)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = str((response.get("Error") or {}).get("Code") or "")
        status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        message = f"{operation}: {code or status}: {(response.get('Error') or {}).get('Message') or exc}"
        if code in RETRYABLE_CODES or status == 429 or status >= 500:
            return RuntimeThrottled(message)
        return RuntimeRejected(message)
    name = type(exc).__name__
    if name in ("ParamValidationError", "ValidationError"):
        return RuntimeRejected(f"{operation}: {exc}")
    return RuntimeThrottled(f"{operation}: {name}: {exc}")  # connection/read timeouts: try again later


class AcrAgentRuntime:
    """The real ACR runtime of one experiment (`runtime_arn`); the boto3 client is created on first use."""

    def __init__(self, runtime_arn: str, acr_client: Any | None = None, qualifier: str | None = None) -> None:
        self.runtime_arn = runtime_arn
        self.qualifier = qualifier
        self._client = acr_client

    @property
    def acr(self) -> Any:
        if self._client is None:
            self._client = client("bedrock-agentcore")
        return self._client

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """Start the rollout in session `session_id` (ART agents answer at once and work in the background)."""
        kwargs: dict[str, Any] = {
            "agentRuntimeArn": self.runtime_arn,
            "runtimeSessionId": session_id,
            "payload": json.dumps(payload, separators=(",", ":")).encode(),
        }
        if self.qualifier:
            kwargs["qualifier"] = self.qualifier
        try:
            resp = self.acr.invoke_agent_runtime(**kwargs)
        except Exception as exc:
            raise classify_error(exc, "InvokeAgentRuntime") from exc
        body = b""
        stream = resp.get("response")
        if stream is not None:
            try:
                body = stream.read()
            finally:
                stream.close()
        status = int(resp.get("statusCode") or 200)
        if status >= 500 or status == 429:
            raise RuntimeThrottled(f"InvokeAgentRuntime: agent answered {status}: {body[:300]!r}")
        if status >= 400:
            raise RuntimeRejected(f"InvokeAgentRuntime: agent answered {status}: {body[:300]!r}")

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession; a session ACR does not know (already gone) counts as stopped."""
        kwargs: dict[str, Any] = {"agentRuntimeArn": self.runtime_arn, "runtimeSessionId": session_id}
        if self.qualifier:
            kwargs["qualifier"] = self.qualifier
        try:
            self.acr.stop_runtime_session(**kwargs)
        except Exception as exc:
            code = str(((getattr(exc, "response", None) or {}).get("Error") or {}).get("Code") or "")
            if code == "ResourceNotFoundException":
                return
            raise classify_error(exc, "StopRuntimeSession") from exc


#: Short alias.
AcrRuntime = AcrAgentRuntime
