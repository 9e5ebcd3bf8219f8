"""Ports: the small interfaces the logic is written against.

The boto3 adapters in `rollout_pipeline.adapters` implement them for AWS (and moto); `fakes.acr` and local
mode's `local.acr` implement `AgentRuntime` where moto has nothing. DynamoDB is not behind a port: the ledger's
conditional transactions are its logic, tested against moto's real DynamoDB semantics.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    bucket: str
    key: str
    size: int
    version_id: str | None = None
    etag: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    last_modified: datetime | None = None


class ObjectNotFound(LookupError):
    """The object (or the requested version of it) does not exist."""


class ObjectReader(Protocol):
    """The bounded read of one object (what reading a result needs). A missing object raises `ObjectNotFound`."""

    def get_bytes(self, bucket: str, key: str, max_bytes: int) -> tuple[bytes, int]:
        """Read at most `max_bytes` (+1 to detect overflow); return (body, full object size)."""
        ...

    def get_tail(self, bucket: str, key: str, max_bytes: int) -> bytes:
        """Read the last `max_bytes` of a non-empty object (all of it when it is smaller)."""
        ...


class ObjectStore(ObjectReader, Protocol):
    """S3 as the pipeline uses it. Reads of a missing object raise `ObjectNotFound`."""

    def head(self, bucket: str, key: str, version_id: str | None = None) -> ObjectInfo: ...

    def iter_bytes(
        self, bucket: str, key: str, version_id: str | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        """Stream the object in chunks; memory stays bounded by `chunk_size`."""
        ...

    def put_bytes(
        self,
        bucket: str,
        key: str,
        body: bytes,
        content_type: str = "application/json",
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        """Write an object; return its version id if the bucket is versioned."""
        ...


class MessageQueue(Protocol):
    """SQS as the pipeline uses it."""

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        """Send every body (batches of 10, partial failures retried); raise if any is still unsent."""
        ...

    def receive(self, queue_url: str, max_messages: int) -> list[tuple[str, str]]:
        """Up to `max_messages` (at most 10) messages now (a short poll): (receipt handle, body) each."""
        ...

    def delete(self, queue_url: str, receipts: Sequence[str]) -> None:
        """Delete received messages (best effort: one not deleted comes back after its visibility timeout)."""
        ...

    def release(self, queue_url: str, receipts: Sequence[str]) -> None:
        """Make received messages visible again at once (best effort, as `delete`)."""
        ...


class EventPublisher(Protocol):
    """The experiment's EventBridge bus."""

    def publish(self, details: Sequence[Any]) -> None:
        """Publish event details (contracts models); raise `PublishError` if any entry was not accepted."""
        ...


class BusSubscriptions(Protocol):
    """The private subscriptions on the experiment's bus (a rule and a queue of one name: `bus_subscriptions`), for
    removing those whose owner is gone."""

    def listed(self) -> list[tuple[str, str]]:
        """(name, description) of every subscription rule on the bus."""
        ...

    def seen_tag(self, name: str) -> str | None:
        """The `seen-at` tag of the subscription's queue; None when the queue (or the tag) is gone."""
        ...

    def remove(self, name: str) -> None:
        """Remove the rule's target, the rule and the queue; parts already gone are skipped."""
        ...


class PublishError(RuntimeError):
    """Some events were not accepted by the bus; the caller keeps its outbox entry and retries later."""


class RuntimeThrottled(RuntimeError):
    """ACR refused for now (throttling, quota, retryable conflict, 5xx): retry later without losing work."""


class RuntimeRateExceeded(RuntimeThrottled):
    """ACR refused because a RATE quota was exceeded (ThrottlingException, 429: the account's new sessions, the
    agent's invokes or the account's data-plane calls), not a busy session or a full active-session quota: the budget
    it names backs off."""


class RuntimeQuotaExceeded(RuntimeThrottled):
    """ACR refused a new session because the account holds as many active sessions as it may
    (ServiceQuotaExceededException, 402; "maxVms"): retry later, with fewer sessions at once."""


class RuntimeRejected(RuntimeError):
    """ACR refused for good (validation, access denied, not found): the rollout fails with `invoke_rejected`."""


class RuntimeColdStart(RuntimeError):
    """InvokeAgentRuntime raced the session's container start-up (`RuntimeClientError`, HTTP 424). The session
    exists anyway: retry the SAME session id after a short wait, and stop the session if you give up."""


class RuntimeStartFailed(RuntimeError):
    """The session's agent cannot start: its container exited or never became ready (AgentCore answers
    `RuntimeClientError` (424) "Runtime initialization time exceeded"; local mode: the agent process exited or missed
    its readiness deadline, its output's tail in the message). Retrying cannot help: the rollout fails at once as
    `agent_error`, and its session is stopped like any ended attempt's."""


class RuntimeOutcomeUnknown(RuntimeError):
    """InvokeAgentRuntime may or may not have reached the session (a read timeout after sending): never send the
    payload again (a second rollout in one microVM); the attempt's deadline decides."""


class RuntimeSessionNotFound(RuntimeError):
    """StopRuntimeSession answered `ResourceNotFoundException`. Usually the session is gone, but AgentCore has
    answered it while the container kept running: a stop confirmed only after a second NotFound is safer."""


class AgentRuntime(Protocol):
    """Amazon Bedrock AgentCore Runtime: start a rollout in a session, stop a session."""

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """InvokeAgentRuntime with `runtimeSessionId=session_id`. Raises RuntimeThrottled, RuntimeRejected,
        RuntimeColdStart, RuntimeStartFailed or RuntimeOutcomeUnknown."""
        ...

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession. Raises RuntimeThrottled (retry later), RuntimeRejected, or RuntimeSessionNotFound
        (AgentCore's ResourceNotFound: an adapter that knows the session is gone may return instead)."""
        ...


class JobRuntimeReports(Protocol):
    """SageMaker's job runtime, for what MTRL needs to hear about a rollout (`adapters.job_runtime`): each call
    returns True when the runtime took it, False when the trajectory is already terminal or unknown there (a
    repeat, or MTRL gave up on it); it raises for anything worth a retry."""

    def complete_rollout(self, job_arn: str, trajectory_id: str, status: str, client_token: str) -> bool: ...

    def update_reward(self, job_arn: str, trajectory_id: str, rewards: Sequence[float], client_token: str) -> bool: ...


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
