"""The RFT front door: a loopback server inside the session that speaks SageMaker's RFT job-runtime shape.

An agent written for the SageMaker RFT SDK (`sagemaker.train.rft`, PyPI `sagemaker-train` 1.27.0) sends everything
to one endpoint, `metadata["endpoint"]` (else env `RFT_RUNTIME_ENDPOINT`, else SageMaker's job runtime):

- `POST /complete-rollout {"JobArn", "TrajectoryId", "Status"}` and `POST /update-reward {"JobArn", "TrajectoryId",
  "Rewards": [...]}` (the SDK's `RolloutFeedbackClient`): recorded here per trajectory; the first terminal report
  wins (a different later one gets 409, which the SDK logs as non-fatal);
- its model calls at `endpoint + "/v1"` (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, ...): passed
  through to the rollout's model endpoint (`_rollout.base_url`) with `model` rewritten to `_rollout.model_id`,
  responses (streaming included) copied byte for byte as they arrive.

Every request of the agent carries `Authorization: Bearer sagemaker-api-key-...`: a SigV4-presigned URL made from the
session's AWS credentials, i.e. an AWS credential. It is dropped here and never leaves the session; the model call
gets the pipeline's own key instead (`_rollout.api_key`, the capture key, else env `OPENAI_API_KEY`, loaded from the
experiment's model secret at start) and the token-capture wiring of `inference.openai_client_kwargs`.

Each rollout gets its own path, `/rollouts/{trajectory id}`, used as `metadata["endpoint"]`; the root serves too
(trajectory from the body, the `X-Amzn-SageMaker-Trajectory-Id` header, or the only rollout in flight).
It listens on 127.0.0.1 only, on an ephemeral port: never on the session's public port. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Final
from urllib.parse import quote, unquote, urlsplit

from rollout_pipeline.agent.context import RolloutContext
from rollout_pipeline.agent.inference import SAGEMAKER_TRAJECTORY_HEADER, openai_client_kwargs
from rollout_pipeline.agent.loopback import LOOPBACK, JsonRequestHandler, LoopbackServer

logger = logging.getLogger(__name__)

ROLLOUT_PATH_PREFIX: Final = "/rollouts/"
COMPLETE_PATH: Final = "/complete-rollout"
REWARD_PATH: Final = "/update-reward"
MODEL_PATH_PREFIX: Final = "/v1"
#: Statuses `/complete-rollout` takes (the SDK sends "ready" on success, "failed" on an error).
READY: Final = "ready"
FAILED: Final = "failed"
TERMINAL_STATUSES: Final = frozenset({READY, FAILED})
#: What marks the SDK's bearer token (`sagemaker.core.token_generator`): never forwarded, whatever header holds it.
SAGEMAKER_TOKEN_MARK: Final = "sagemaker-api-key-"
#: Headers that describe one connection, not the message (RFC 9110 7.6.1), plus those recomputed here.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
MAX_FEEDBACK_BYTES: Final = 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT_S: Final = 900.0
_CHUNK: Final = 64 * 1024


class UnknownTrajectory(LookupError):
    """A request names no trajectory this session serves (or names none while several are in flight)."""


@dataclass(frozen=True)
class Upstream:
    """Where a rollout's model calls go instead of its own model endpoint (MTRL environment mode: SageMaker's job
    runtime): `base_url`, to which the agent's paths (`/v1/...`) are appended as they are, and `auth()` giving the
    (bearer key, headers) of each call. The body goes unchanged (no `model` rewrite)."""

    base_url: str
    auth: Callable[[], tuple[str, dict[str, str]]]


@dataclass
class TrajectoryRecord:
    """What one rollout's agent reported through the front door. Mutated only under the door's lock."""

    trajectory_id: str
    rollout: RolloutContext
    job_arn: str
    #: Where its model calls go when not to `_rollout.base_url` (None: there).
    upstream: Upstream | None = None
    #: The first terminal status reported (`ready` / `failed`), or None.
    status: str | None = None
    #: The first rewards reported (`/update-reward`), or None.
    rewards: list[float] | None = None
    #: Later reports that disagreed with the first (kept for the result object).
    ignored_reports: list[str] = field(default_factory=list)
    model_calls: int = 0
    model_errors: int = 0

    def snapshot(self) -> dict[str, Any]:
        """The report as plain JSON-able data (for the result object)."""
        return {
            "trajectory_id": self.trajectory_id,
            "job_arn": self.job_arn,
            "reported_status": self.status,
            "reported_rewards": None if self.rewards is None else list(self.rewards),
            "ignored_reports": list(self.ignored_reports),
            "model_calls": self.model_calls,
            "model_errors": self.model_errors,
        }


class _UpstreamPool:
    """Idle keep-alive connections per origin, so model calls do not pay a TCP/TLS handshake each."""

    def __init__(self, timeout_s: float, max_idle: int = 16) -> None:
        self._timeout_s = timeout_s
        self._max_idle = max_idle
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, scheme: str, host: str, port: int) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to the origin and whether it was reused."""
        key = (scheme, host, port)
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop(), True
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout_s), False
        return http.client.HTTPConnection(host, port, timeout=self._timeout_s), False

    def give_back(self, scheme: str, host: str, port: int, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault((scheme, host, port), [])
            if len(idle) < self._max_idle:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            connections = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for connection in connections:
            connection.close()


def _finite_numbers(value: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        return None
    numbers = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float) or not math.isfinite(item):
            return None
        numbers.append(float(item))
    return numbers


def forwarded_headers(incoming: Iterable[tuple[str, str]], wired: Mapping[str, str], api_key: str) -> dict[str, str]:
    """The headers of a model call sent upstream: the agent's own, minus connection headers, any `Authorization`
    and anything carrying a SageMaker bearer token; plus our key and the token-capture headers (`wired`)."""
    headers: dict[str, str] = {}
    for name, value in incoming:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP or lowered == "authorization" or SAGEMAKER_TOKEN_MARK in value:
            continue
        headers[name] = value
    overrides = {"Authorization": f"Bearer {api_key}", **wired}
    lowered_overrides = {name.lower() for name in overrides}
    headers = {name: value for name, value in headers.items() if name.lower() not in lowered_overrides}
    headers.update(overrides)
    return headers


def rewrite_model(body: bytes, model_id: str | None) -> bytes:
    """The request body with `model` set to the rollout's model id (JSON objects only; anything else unchanged)."""
    if not body or not model_id:
        return body
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body
    if not isinstance(parsed, dict) or parsed.get("model") == model_id:
        return body
    parsed["model"] = model_id
    return json.dumps(parsed).encode()


class FrontDoor(LoopbackServer):
    """The loopback front door of one session (see the module docstring). `start()` it, `register` each rollout
    before its agent runs, `unregister` it after; `endpoint_for(trajectory)` is the agent's `metadata.endpoint`."""

    def __init__(
        self, *, port: int = 0, upstream_timeout_s: float = DEFAULT_UPSTREAM_TIMEOUT_S, log_requests: bool = False
    ) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, TrajectoryRecord] = {}
        self._pool = _UpstreamPool(upstream_timeout_s)
        self._log_requests = log_requests
        super().__init__(self._handler_class(), port=port, thread_name="rft-front-door")

    def endpoint_for(self, trajectory_id: str) -> str:
        """The endpoint one rollout's agent gets as `metadata["endpoint"]` (its own path under the root)."""
        return f"{self.root_url}{ROLLOUT_PATH_PREFIX}{quote(trajectory_id, safe='')}"

    def stop(self) -> None:
        super().stop()
        self._pool.close()

    # ------------------------------------------------------------------------------------------ trajectories

    def register(
        self, trajectory_id: str, rollout: RolloutContext, job_arn: str, upstream: Upstream | None = None
    ) -> TrajectoryRecord:
        """Start recording a rollout's reports (its model calls to `upstream` when given). Registering an id again
        starts a fresh record."""
        record = TrajectoryRecord(trajectory_id=trajectory_id, rollout=rollout, job_arn=job_arn, upstream=upstream)
        with self._lock:
            self._records[trajectory_id] = record
        return record

    def unregister(self, trajectory_id: str) -> TrajectoryRecord | None:
        """Stop serving a rollout (later reports get 404, which the SDK logs and ignores); its final record."""
        with self._lock:
            return self._records.pop(trajectory_id, None)

    def record_of(self, trajectory_id: str) -> TrajectoryRecord | None:
        with self._lock:
            return self._records.get(trajectory_id)

    def _resolve(self, named: str | None) -> TrajectoryRecord:
        with self._lock:
            if named:
                record = self._records.get(named)
                if record is None:
                    raise UnknownTrajectory(f"trajectory {named} not found")
                return record
            if len(self._records) == 1:
                return next(iter(self._records.values()))
        raise UnknownTrajectory("no trajectory id: send X-Amzn-SageMaker-Trajectory-Id or use metadata.endpoint")

    def complete(self, trajectory_id: str | None, status: Any) -> tuple[int, dict[str, Any]]:
        """`/complete-rollout`: (HTTP status, body)."""
        if status not in TERMINAL_STATUSES:
            return 400, {"message": f"Status must be one of {sorted(TERMINAL_STATUSES)}, got {status!r}"}
        record = self._resolve(trajectory_id)
        with self._lock:
            if record.status is None or record.status == status:
                record.status = str(status)
                return 200, {}
            note = f"complete-rollout {status} after {record.status}"
            record.ignored_reports.append(note)
        return 409, {"message": f"Cannot transition trajectory {record.trajectory_id}: {note}"}

    def reward(self, trajectory_id: str | None, rewards: Any) -> tuple[int, dict[str, Any]]:
        """`/update-reward`: (HTTP status, body)."""
        numbers = _finite_numbers(rewards)
        if numbers is None:
            return 400, {"message": f"Rewards must be a non-empty list of finite numbers, got {rewards!r}"[:500]}
        record = self._resolve(trajectory_id)
        with self._lock:
            if record.rewards is None or record.rewards == numbers:
                record.rewards = numbers
                return 200, {}
            note = f"update-reward {numbers} after {record.rewards}"
            record.ignored_reports.append(note[:500])
        return 409, {"message": f"Cannot transition trajectory {record.trajectory_id}: rewards already reported"}

    def _count_model_call(self, record: TrajectoryRecord, ok: bool) -> None:
        with self._lock:
            record.model_calls += 1
            if not ok:
                record.model_errors += 1

    # ------------------------------------------------------------------------------------------ HTTP

    def feedback(self, path: str, scoped: str | None, body: bytes) -> tuple[int, dict[str, Any]]:
        """Answer a `complete`/`reward` call (`scoped`: the trajectory of the rollout's own endpoint, if used)."""
        if len(body) > MAX_FEEDBACK_BYTES:
            return 413, {"message": "feedback body too large"}
        try:
            report = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            return 400, {"message": "body is not JSON"}
        if not isinstance(report, dict):
            return 400, {"message": "body must be a JSON object"}
        named = report.get("TrajectoryId") or scoped
        if scoped and named != scoped:
            return 400, {"message": f"TrajectoryId {named} does not match the endpoint's {scoped}"}
        record = self._resolve(str(named) if named else None)
        if report.get("JobArn") and report.get("JobArn") != record.job_arn:
            logger.warning("trajectory %s: JobArn %s differs", record.trajectory_id, report.get("JobArn"))
        if path == COMPLETE_PATH:
            return self.complete(record.trajectory_id, report.get("Status"))
        return self.reward(record.trajectory_id, report.get("Rewards"))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        door = self

        class Handler(JsonRequestHandler):
            #: Headers and body chunks leave at once (no Nagle wait on the agent's delayed ACK: ~40 ms a call).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                if door._log_requests:
                    logger.info("front door: " + format, *args)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

            def _route(self, method: str) -> None:
                split = urlsplit(self.path)
                path, scoped = split.path, None
                if path.startswith(ROLLOUT_PATH_PREFIX):
                    scoped, _, rest = path[len(ROLLOUT_PATH_PREFIX) :].partition("/")
                    scoped, path = unquote(scoped), "/" + rest
                body = self.read_body()
                try:
                    if method == "POST" and path in (COMPLETE_PATH, REWARD_PATH):
                        self.send_json(*door.feedback(path, scoped, body))
                    elif path == MODEL_PATH_PREFIX or path.startswith(MODEL_PATH_PREFIX + "/"):
                        named = scoped or self.headers.get(SAGEMAKER_TRAJECTORY_HEADER)
                        door._forward(
                            self, method=method, record=door._resolve(named), path=path, query=split.query, body=body
                        )
                    else:
                        self.send_json(404, {"message": f"no route {method} {path}"})
                except UnknownTrajectory as exc:
                    self.send_json(404, {"message": str(exc)})

        return Handler

    def _forward(
        self,
        handler: JsonRequestHandler,
        *,
        method: str,
        record: TrajectoryRecord,
        path: str,
        query: str,
        body: bytes,
    ) -> None:
        """Pass one model call through to the rollout's model endpoint (or its `upstream`) and copy the answer back
        as it arrives."""
        try:
            if record.upstream is not None:
                api_key, wired_headers = record.upstream.auth()
                base = urlsplit(record.upstream.base_url.rstrip("/"))
                target = base.path + path
                payload = body
            else:
                wired = openai_client_kwargs(ctx=record.rollout)
                api_key, wired_headers = str(wired["api_key"]), wired.get("default_headers") or {}
                base = urlsplit(str(wired["base_url"]).rstrip("/"))
                target = base.path + path[len(MODEL_PATH_PREFIX) :]
                payload = rewrite_model(body, record.rollout.model_id) if method in ("POST", "PUT") else body
        except Exception as exc:  # a token-capture setting or the upstream's credentials: the agent sees why
            self._count_model_call(record, ok=False)
            handler.send_json(502, {"error": {"message": f"rollout front door: {exc}"}})
            return
        target += f"?{query}" if query else ""
        scheme = base.scheme or "http"
        port = base.port or (443 if scheme == "https" else 80)
        host = base.hostname or LOOPBACK
        headers = forwarded_headers(handler.headers.items(), wired_headers, api_key)
        if payload or method in ("POST", "PUT"):
            headers["Content-Length"] = str(len(payload))
        headers["Host"] = base.netloc
        for attempt in range(2):
            connection, reused = self._pool.take(scheme, host, port)
            try:
                connection.request(method, target or "/", body=payload or None, headers=headers)
                response = connection.getresponse()
            except (http.client.HTTPException, OSError) as exc:
                connection.close()
                if reused and attempt == 0:
                    continue  # a keep-alive connection the server had closed: one fresh try
                self._count_model_call(record, ok=False)
                handler.send_json(502, {"error": {"message": f"model endpoint unreachable: {exc}"}})
                return
            break
        self._count_model_call(record, ok=response.status < 400)
        try:
            _relay(handler, method, response)
        except OSError:
            connection.close()
            handler.close_connection = True
            return
        if response.will_close:
            connection.close()
        else:
            self._pool.give_back(scheme, host, port, connection)


def _relay(handler: BaseHTTPRequestHandler, method: str, response: http.client.HTTPResponse) -> None:
    """Copy status, headers and body of `response` to the agent; the body chunk by chunk as it arrives (no
    decoding: a compressed or streamed body reaches the agent byte for byte)."""
    handler.send_response(response.status, response.reason)
    for name, value in response.getheaders():
        if name.lower() not in _HOP_BY_HOP:
            handler.send_header(name, value)
    length = response.getheader("Content-Length")
    bodyless = method == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
    if bodyless:
        handler.end_headers()
        response.read()
        return
    if length is not None and not response.chunked:
        handler.send_header("Content-Length", length)
        handler.end_headers()
        while chunk := response.read1(_CHUNK):
            handler.wfile.write(chunk)
        handler.wfile.flush()
        response.read()  # marks the response done, so its connection can carry the next call
        return
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    while chunk := response.read1(_CHUNK):
        handler.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        handler.wfile.flush()
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()
