"""AgentCore's data plane at local mode's AWS endpoint: `StopRuntimeSession` sent to the moto server by another
process (the CLI's `rollouts cancel`, an SDK trainer's `exp.cancel`) reaches the local pipeline's agent runtime.

In AWS, anyone holding the runtime ARN and a client stops a session where it runs. In local mode the "ACR" lives in
the `LocalPipeline`'s process, registered under its endpoint URL (`adapters.runtime.register_local_runtime`); moto
has no `bedrock-agentcore`. This WSGI middleware answers that service's StopRuntimeSession the way AgentCore does
(botocore's `bedrock-agentcore` model: `POST /runtimes/{agentRuntimeArn}/stopruntimesession`, the session in the
`X-Amzn-Bedrock-AgentCore-Runtime-Session-Id` header; errors as rest-json `x-amzn-ErrorType` + `{"message"}`), with
the runtime registered for this endpoint: an unknown session is `ResourceNotFoundException` (404), a throttled stop
`ThrottlingException` (429). Any other AgentCore call is refused with `ValidationException`: local mode's invokes come
from its own dispatcher, in process. Every other request goes to moto.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any, Final

from rollout_pipeline.adapters.runtime import local_runtime
from rollout_pipeline.ports import RuntimeSessionNotFound, RuntimeThrottled

log = logging.getLogger(__name__)

#: The credential scope of a SigV4-signed AgentCore data-plane request (`.../bedrock-agentcore/aws4_request`).
_SCOPE: Final = "/bedrock-agentcore/aws4_request"
_STOP_PATH: Final = re.compile(r"^/runtimes/(?P<arn>.+)/stopruntimesession/?$")
SESSION_HEADER: Final = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
_SESSION_ENVIRON: Final = "HTTP_" + SESSION_HEADER.upper().replace("-", "_")

StartResponse = Callable[..., Any]


class AgentCoreEndpoint:
    """WSGI middleware: AgentCore data-plane requests to the local runtime registered for `endpoint_url` (set once
    the server knows its port), everything else to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.endpoint_url = ""

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if _SCOPE not in str(environ.get("HTTP_AUTHORIZATION", "")):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        found = _STOP_PATH.match(str(environ.get("PATH_INFO", "")))
        if found is None or environ.get("REQUEST_METHOD") != "POST":
            path = environ.get("PATH_INFO")
            return _error(
                start_response, 400, "ValidationException", f"local mode serves StopRuntimeSession only: {path}"
            )
        session_id = str(environ.get(_SESSION_ENVIRON, ""))
        if not session_id:
            return _error(start_response, 400, "ValidationException", f"missing header {SESSION_HEADER}")
        runtime = local_runtime(self.endpoint_url)
        if runtime is None:
            return _error(start_response, 404, "ResourceNotFoundException", "no local agent runtime at this endpoint")
        try:
            runtime.stop(session_id)
        except RuntimeSessionNotFound as exc:
            return _error(start_response, 404, "ResourceNotFoundException", str(exc))
        except RuntimeThrottled as exc:
            return _error(start_response, 429, "ThrottlingException", str(exc))
        except Exception as exc:  # the local runtime failed: AgentCore's 500
            log.warning("local StopRuntimeSession of %s failed: %s", session_id, exc)
            return _error(start_response, 500, "InternalServerException", str(exc))
        log.info("session %s stopped at the request of another process", session_id)
        body = b"{}"
        start_response(
            "200 OK",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body))), (SESSION_HEADER, session_id)],
        )
        return [body]


_REASONS: Final = {400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error"}


def _error(start_response: StartResponse, status: int, code: str, message: str) -> list[bytes]:
    body = json.dumps({"message": message}).encode()
    start_response(
        f"{status} {_REASONS[status]}",
        [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("x-amzn-ErrorType", code)],
    )
    return [body]
