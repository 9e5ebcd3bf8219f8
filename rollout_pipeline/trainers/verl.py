"""verl's agent gateway route: the pipeline as the `agent_runner` of verl's `OpenAICompatibleAgentFramework`.

verl's framework (`verl/experimental/agent_framework`, with its gateway `verl/experimental/agent_gateway`; not in a
verl version yet: docs/trainers.md) runs each sample as a gateway session: it creates the session, awaits
`agent_runner(raw_prompt=..., session=SessionHandle(session_id, base_url), sample_index=...)`, optionally waits for
`POST /sessions/{id}/complete`, then finalizes the session's trajectory (the gateway recorded the token ids, masks
and log-probs of every `/sessions/{id}/v1/chat/completions` call) and scores it with its `reward_fn`.

`VerlGatewayRoute.agent_runner` enqueues the sample through the pipeline and returns at once: one rollout whose
`input_id` is the gateway session id (so every event of the rollout names the session) and whose model URL is the
session's `base_url` (so the agent's model calls go through the gateway, which captures their tokens). The samples
of one `generate_sequences` call arriving together are submitted as one batch (`coalesce_s`). When the rollout's
terminal event arrives, the route POSTs `/sessions/{id}/complete` with its `reward_info` (`reward_info`), which
ends the framework's `wait_for_completion`; `reward_from_info` is the `reward_fn` that reads it. A failed rollout
is `excluded` in its `reward_info` (never a reward of 0) and `reward_from_info` raises for it, so verl drops the
session instead of training on it. (An HTTP sink posts the same body when the gateway is reachable over HTTPS:
docs/trainers.md, "verl's gateway".)

Pitfalls: the framework must wait (`wait_for_completion_after_agent_run=True`, a `completion_timeout` above the
rollout's whole life: its queue wait plus `rollout_timeout_s` x `max_attempts`), or it finalizes an empty session
the moment the runner returns; and the gateway must be reachable from the agents (AgentCore sessions): verl binds it
to the node's address, plain HTTP.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from rollout_pipeline import ids
from rollout_pipeline.contracts import RolloutCompleted, RolloutFailed

if TYPE_CHECKING:
    from rollout_pipeline.sdk.client import RolloutClient, RolloutFuture
    from rollout_pipeline.sdk.experiment import Experiment

log = logging.getLogger(__name__)

#: Batch name of the route's submissions (`verl-{8 hex}-{12 hex}`).
BATCH_NAME: Final = "verl"
#: A `/complete` that fails for want of an answer is tried this many times (a 4xx answer is final).
COMPLETE_TRIES: Final = 5
COMPLETE_TIMEOUT_S: Final = 10.0


class SessionLike(Protocol):
    """What the route reads of verl's `SessionHandle`."""

    session_id: str
    base_url: str | None


Payload = Callable[[Any, int, Mapping[str, Any]], dict[str, Any]]


def messages_payload(raw_prompt: Any, sample_index: int, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The default agent payload: the prompt's OpenAI messages, the sample index and the sample's JSON fields."""
    plain = {k: v for k, v in fields.items() if _is_json(v)}
    return {"messages": raw_prompt, "sample_index": sample_index, **plain}


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def reward_info(event: RolloutCompleted | RolloutFailed) -> dict[str, Any]:
    """What the gateway's `/complete` receives for a rollout's terminal event: the pipeline's reward, or
    `excluded` with the failure's reason (a failure is never a reward of 0)."""
    common = {"rollout_id": event.rollout_id, "batch_id": event.batch_id, "event_id": event.event_id}
    if isinstance(event, RolloutCompleted):
        return {"reward": event.reward, "rewards": event.rewards, "excluded": False, **common}
    return {"reward": None, "excluded": True, "reason": event.reason.value, "error": event.error, **common}


class ExcludedRollout(ValueError):
    """The rollout failed in the pipeline: verl must not train on its session (it is masked, never scored 0)."""


def reward_from_info(context: Any) -> list[float]:
    """A verl `reward_fn`: each trajectory's `reward_info["reward"]`, as the route posted it. Raises
    `ExcludedRollout` for a failed rollout, so verl drops the session (aborts it) instead of scoring it."""
    scores: list[float] = []
    for trajectory in context.trajectories:
        info = trajectory.reward_info or {}
        if info.get("excluded") or info.get("reward") is None:
            raise ExcludedRollout(f"session {trajectory.session_id}: {info.get('reason', 'no reward')}")
        scores.append(float(info["reward"]))
    return scores


def complete_url(base_url: str) -> str:
    """The session's `/complete` URL from its `base_url` (`.../sessions/{id}/v1`)."""
    root = base_url.rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root) + "/complete"


@dataclass
class CompletionTimes:
    """When each session's result was written and when its `/complete` was answered (epoch seconds)."""

    written: dict[str, float] = field(default_factory=dict)
    completed: dict[str, float] = field(default_factory=dict)
    answers: dict[str, int | None] = field(default_factory=dict)


class VerlGatewayRoute:
    """The pipeline behind verl's agent framework (see the module doc). One per trainer process; `close()` at
    the end (or `with`)."""

    def __init__(
        self,
        experiment: Experiment,
        *,
        model_id: str | None = None,
        payload: Payload = messages_payload,
        timeout_s: int | None = None,
        max_attempts: int = 1,
        coalesce_s: float = 0.05,
        poll_wait_s: float = 20.0,
        client: RolloutClient | None = None,
    ) -> None:
        from rollout_pipeline.sdk.client import RolloutClient

        self.experiment = experiment
        self.model_id = model_id or experiment.config.model_id
        self.payload = payload
        self.coalesce_s = coalesce_s
        self.batch_name = f"{BATCH_NAME}-{secrets.token_hex(4)}"
        self.client = client or RolloutClient(
            experiment, timeout_s=timeout_s, max_attempts=max_attempts, poll_wait_s=poll_wait_s
        )
        self.times = CompletionTimes()
        #: The batches the route submitted (one per coalesced group of samples).
        self.batch_ids: list[str] = []
        self._lock = threading.Lock()
        self._pending: list[tuple[dict[str, Any], concurrent.futures.Future[RolloutFuture]]] = []
        self._flush: threading.Timer | None = None
        self._posts = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="verl-complete")

    # ---------------------------------------------------------------------------------------------- runner

    async def agent_runner(self, *, raw_prompt: Any, session: SessionLike, sample_index: int, **fields: Any) -> None:
        """verl's `agent_runner`: enqueue the sample as one rollout pointed at the session's gateway URL and return
        once it is submitted (the rollout runs in the pipeline; its `/complete` comes when its event does)."""
        row = self.row(raw_prompt, session, sample_index, fields)
        base_url = str(session.base_url)
        future = await asyncio.wrap_future(self._enqueue(row))
        future.add_done_callback(lambda done: self._posts.submit(self._complete, base_url, done))

    def row(
        self, raw_prompt: Any, session: SessionLike, sample_index: int, fields: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The dataset row of one sample: `id` = the gateway session, `_rollout` = the session's model URL."""
        if not session.base_url:
            raise ValueError(f"gateway session {session.session_id} has no base_url: the agent cannot reach it")
        input_id = ids.validate_input_id(session.session_id)
        body = dict(self.payload(raw_prompt, sample_index, fields))
        body.pop("_rollout", None)
        return {**body, "id": input_id, "_rollout": {"base_url": session.base_url, "model_id": self.model_id}}

    def _enqueue(self, row: dict[str, Any]) -> concurrent.futures.Future[RolloutFuture]:
        done: concurrent.futures.Future[RolloutFuture] = concurrent.futures.Future()
        with self._lock:
            self._pending.append((row, done))
            if self._flush is None:
                self._flush = threading.Timer(self.coalesce_s, self._submit)
                self._flush.daemon = True
                self._flush.start()
        return done

    def _submit(self) -> None:
        with self._lock:
            taken, self._pending, self._flush = self._pending, [], None
        if not taken:
            return
        try:
            futures = self.client.submit_many([row for row, _ in taken], name=self.batch_name)
        except BaseException as exc:  # every sample of the batch fails: the framework aborts their sessions
            for _, done in taken:
                done.set_exception(exc)
            return
        if futures:
            self.batch_ids.append(futures[0].batch_id)
        for (_, done), future in zip(taken, futures, strict=True):
            done.set_result(future)

    # ---------------------------------------------------------------------------------------------- sink

    def _complete(self, base_url: str, future: RolloutFuture) -> None:
        event = future.event
        if event is None:  # cancelled before any outcome: the framework's own timeout ends the session
            return
        session_id = event.input_id
        if event.timings.finished_at is not None:
            self.times.written[session_id] = event.timings.finished_at.timestamp()
        body = json.dumps({"reward_info": reward_info(event)}).encode()
        status = post_json(complete_url(base_url), body)
        self.times.completed[session_id] = time.time()
        self.times.answers[session_id] = status
        if status is None or status >= 300:
            log.warning("session %s: /complete answered %s", session_id, status)

    def close(self) -> None:
        """Submit what waits, stop the client (its subscription goes) and finish the posts in flight."""
        self._submit()
        self.client.close()
        self._posts.shutdown(wait=True)

    def __enter__(self) -> VerlGatewayRoute:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def post_json(
    url: str, body: bytes, *, tries: int = COMPLETE_TRIES, sleep: Callable[[float], None] = time.sleep
) -> int | None:
    """POST a JSON body; the status, or None when no answer came after `tries` (a 5xx is tried again too)."""
    status: int | None = None
    for attempt in range(tries):
        request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=COMPLETE_TIMEOUT_S) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            status = int(exc.code)
            if status < 500:
                return status
        except OSError:
            status = None
        sleep(min(2.0, 0.1 * 2**attempt))
    return status


def gateway_sink(gateway_url: str, *, name: str = "verl", batch_prefix: str | None = BATCH_NAME) -> dict[str, Any]:
    """The `sinks` entry that posts `/complete` from EventBridge instead (the gateway at `gateway_url`, reachable
    over HTTPS): the same `reward_info` as `reward_info` builds, per detail type."""
    common = {"rollout_id": "$.detail.rollout_id", "batch_id": "$.detail.batch_id", "event_id": "$.detail.event_id"}
    return {
        "name": name,
        "url": gateway_url.rstrip("/") + "/sessions/{$.detail.input_id}/complete",
        "events": ["Rollout Completed", "Rollout Failed"],
        "batch_prefix": batch_prefix,
        "bodies": {
            "Rollout Completed": {
                "reward_info": {"reward": "$.detail.reward", "rewards": "$.detail.rewards", "excluded": False, **common}
            },
            "Rollout Failed": {
                "reward_info": {
                    "reward": None,
                    "excluded": True,
                    "reason": "$.detail.reason",
                    "error": "$.detail.error",
                    **common,
                }
            },
        },
    }


__all__: Sequence[str] = [
    "ExcludedRollout",
    "VerlGatewayRoute",
    "complete_url",
    "gateway_sink",
    "messages_payload",
    "reward_from_info",
    "reward_info",
]
