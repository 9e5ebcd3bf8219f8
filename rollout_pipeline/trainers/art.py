"""An ART 0.2.0 `RolloutSession` backend that runs each rollout through the pipeline.

ART's trainer integrations (veRL's `RolloutSessionAgentLoop`, slime's `generate`) run every rollout through a
session class named by import path in config; `rollout_session.factory.make_session` builds it as
`backend(session_id, session_state, **cfg)`. Naming `rollout_pipeline.trainers.art.PipelineSession` there puts the
pipeline under the trainer with no change to ART or to the trainer:

- `run(task)` submits `task["payload"]` as one rollout of the group `task["group_id"]` (the pipeline's `input_id`),
  pointed at the task's `llm` endpoint and model, with `policy_version = task["global_steps"]`; it then waits for
  the pushed `Rollout Completed` / `Rollout Failed` event (no S3 polling) and returns ART's `RolloutDumpResponse`:
  success -> the scalar `reward` the pipeline defines (the number, or the last turn's of a list) and metrics;
  any typed failure -> `exception` = "<reason>: <error>" and no reward (never 0).
- `shutdown()` of a rollout that has not finished cancels it in the pipeline: its session is stopped server-side
  and it ends once as `Rollout Failed` / cancelled. Idempotent, safe before or after `run`.
- The gateway's capture key (`llm.api_key`) is ART's per-rollout session id (both harnesses build it that way). It
  travels as `_rollout.capture_key` (an id, validated as one), reaches the agent as `_rollout.api_key` with
  `_rollout.token_capture = "none"`, which is how the agent helpers
  (`rollout_pipeline.agent.openai_client_kwargs`) and an unmodified ART agent pick the model key. A key that is not
  this session's id could be a long-lived credential, which must never travel in a payload: it is refused.

One event stream per experiment, shared by every instance in every worker process: the experiment's bus. Each
process attaches once per configuration (`attached`): one SDK `RolloutClient` whose single dispatcher thread
long-polls the process's own subscription queue (a bus rule matching only this process's batches, `art-{token}-*`)
and resolves the waiting futures by (batch, input, index); each `event_id` is handed over once. No process ever
receives another's events, so nothing is given back and re-received, and nothing reaches a dead-letter queue for it.
See docs/trainers.md for how that scales and for the veRL / slime configuration.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from agentcore_rl_toolkit.rollout_session.errors import RolloutContractError
from agentcore_rl_toolkit.rollout_session.wire import RolloutDumpResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout_pipeline import ids
from rollout_pipeline.contracts import CAPTURE_KEY, RolloutCompleted, RolloutFailed
from rollout_pipeline.sdk.errors import RolloutFailedError

if TYPE_CHECKING:
    from rollout_pipeline.sdk.client import RolloutClient, RolloutFuture
    from rollout_pipeline.sdk.experiment import Experiment

logger = logging.getLogger(__name__)

__all__ = ["BackendConfig", "PipelineSession", "reset_clients", "to_dump"]

#: The import path to put in ART's `rollout_session_backend.backend`.
BACKEND_PATH: Final = "rollout_pipeline.trainers.art.PipelineSession"
#: Batch name prefix of the rollouts this backend submits (`art-{12 hex}`).
BATCH_NAME: Final = "art"
#: How long `shutdown` waits for a submission still in flight before cancelling what it created.
SUBMIT_WAIT_S: Final = 30.0
#: Retention of a process's private event queue (events of a process that died wait there this long).
SUBSCRIPTION_RETENTION_S: Final = 4 * 24 * 3600
#: At attach, ART subscriptions not seen for this long are pruned: their process is gone (a live one refreshes its
#: `seen-at` at least hourly while it runs rollouts), and their queue has dropped every event it held anyway.
STALE_SUBSCRIPTION_S: Final = SUBSCRIPTION_RETENTION_S


class BackendConfig(BaseModel):
    """The backend's configuration (ART's `rollout_session_backend` minus `backend`). Unknown keys are errors.

    Name the experiment either by `experiment` (reads the `Rollouts-{name}` stack's outputs once per process) or
    by `outputs_file` (a `cdk deploy --outputs-file` JSON, or local mode's outputs). `endpoint_url` points every
    AWS call at one endpoint (local mode's loopback moto server). `max_attempts` defaults to 1: the gateway keys
    captured tokens by ART's session id, so a retried attempt would mix two attempts' turns in one trajectory.
    `private_queue` (default): each process reads its own events from its own subscription queue (see `attached`);
    False reads the experiment's trainer queue (one trainer process only; no CreateQueue/PutRule permission needed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: str | None = None
    outputs_file: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    max_attempts: int = Field(default=1, ge=1, le=10)
    timeout_s: int | None = Field(default=None, ge=10, le=28_800)
    poll_wait_s: float = Field(default=20.0, ge=0, le=20)
    visibility_s: int | None = Field(default=None, ge=0, le=43_200)
    private_queue: bool = True

    def key(self) -> str:
        return self.model_dump_json()


def parse_config(config: Mapping[str, Any]) -> BackendConfig:
    """Validate the backend config; `RolloutContractError` (a `ValueError`) names unknown or bad keys."""
    try:
        parsed = BackendConfig.model_validate(dict(config))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
        )
        known = ", ".join(BackendConfig.model_fields)
        raise RolloutContractError(
            f"rollout_session_backend for {BACKEND_PATH}: {problems} (known keys: backend, {known})"
        ) from None
    if (parsed.experiment is None) == (parsed.outputs_file is None):
        raise RolloutContractError(
            f"rollout_session_backend for {BACKEND_PATH}: set exactly one of `experiment` (the deployed "
            "experiment's name) and `outputs_file` (its stack outputs JSON)"
        )
    return parsed


# ----------------------------------------------------------------------------------- one client per process


@dataclass
class _Attached:
    """This process's link to one experiment: the SDK client (one dispatcher thread), the batch name its rollouts
    are submitted under, and its private subscription (rule + queue), if any."""

    client: RolloutClient
    batch_name: str
    subscription: tuple[str, str] | None


def prune_stale(experiment: Experiment) -> None:
    """Remove ART subscriptions left by killed processes (best effort: a failure is logged, never raised)."""
    from rollout_pipeline.sdk.errors import SdkError

    try:
        results = experiment.subscriptions.prune(STALE_SUBSCRIPTION_S, kinds=(BATCH_NAME,), skip_recent=True)
    except SdkError as exc:
        logger.warning("could not prune stale ART subscriptions: %s", exc)
        return
    for result in results:
        if result.action != "kept":
            logger.info(
                "stale ART subscription %s (%s): %s", result.subscription.name, result.subscription.owner, result.action
            )


_lock = threading.Lock()
_attached: dict[str, _Attached] = {}


def _experiment(config: BackendConfig) -> Experiment:
    from rollout_pipeline.sdk.experiment import Experiment

    if config.outputs_file is not None:
        from rollout_pipeline.sdk.errors import SdkError
        from rollout_pipeline.sdk.experiment import read_outputs_file

        try:
            outputs = read_outputs_file(Path(config.outputs_file), config.experiment)
        except SdkError as exc:
            raise RolloutContractError(str(exc)) from None
        return Experiment.from_outputs(outputs, region=config.region, endpoint_url=config.endpoint_url)
    assert config.experiment is not None
    return Experiment.attach(config.experiment, region=config.region, endpoint_url=config.endpoint_url)


def attached(config: BackendConfig) -> _Attached:
    """This process's attachment for `config`, made on first use.

    With `private_queue` (the default), the process subscribes its own SQS queue to the experiment bus with a rule
    matching only its batches (`art-{process token}-*`), so worker processes never receive, give back and re-receive
    each other's events (each receive counts toward the queue's redrive limit). Otherwise the experiment's trainer
    queue is read, and other consumers' events are given back to them (fine for one process).
    """
    key = config.key()
    with _lock:
        found = _attached.get(key)
        if found is not None and not found.client.closed:
            return found
        from rollout_pipeline.contracts import EVENT_SOURCE
        from rollout_pipeline.sdk.client import RolloutClient

        experiment = _experiment(config)
        batch_name = f"{BATCH_NAME}-{secrets.token_hex(4)}"
        subscription: tuple[str, str] | None = None
        if config.private_queue:
            prune_stale(experiment)
            pattern = {"source": [EVENT_SOURCE], "detail": {"batch_id": [{"prefix": f"{batch_name}-"}]}}
            subscription = experiment.subscriptions.open(
                pattern, suffix=batch_name, retention_s=SUBSCRIPTION_RETENTION_S, kind=BATCH_NAME
            )
        client = RolloutClient(
            experiment,
            timeout_s=config.timeout_s,
            max_attempts=config.max_attempts,
            poll_wait_s=config.poll_wait_s,
            visibility_s=config.visibility_s,
            queue_url=subscription[1] if subscription else None,
            consume_others=subscription is not None,  # a private queue holds only this process's events
        )
        found = _attached[key] = _Attached(client, batch_name, subscription)
        return found


def shared_client(config: BackendConfig) -> RolloutClient:
    """This process's `RolloutClient` for `config` (one dispatcher: one event consumer per process)."""
    return attached(config).client


def reset_clients() -> None:
    """Close every attachment of this process: stop the dispatchers, remove the private subscriptions. Runs at
    interpreter exit; tests call it directly."""
    with _lock:
        found = list(_attached.values())
        _attached.clear()
    from rollout_pipeline.sdk.events import Subscriptions

    for one in found:
        one.client.close()
        if one.subscription is not None:
            Subscriptions(one.client.experiment).close(*one.subscription)


atexit.register(reset_clients)


# ------------------------------------------------------------------------------------------------- the task


def _require_payload(task: Mapping[str, Any]) -> dict[str, Any]:
    payload = task.get("payload")
    if isinstance(payload, dict):
        return dict(payload)
    if "_config" in task:  # slime's task: the payload itself plus `_config` = {base_url, model_id, api_key}
        return {k: v for k, v in task.items() if k != "_config"}
    raise RolloutContractError(
        f"the task has no `payload` dict (got {type(payload).__name__}): author dataset rows with a `payload` "
        "column holding the agent's invoke payload"
    )


def _require_group_id(task: Mapping[str, Any], session_id: str) -> str:
    group_id = task.get("group_id")
    if group_id is None and "_config" in task:
        group_id = session_id  # slime has no group key in the task: one rollout per group, as ART documents
    try:
        return ids.validate_input_id(group_id)
    except ids.InvalidId as exc:
        raise RolloutContractError(f"the task's `group_id` cannot be the pipeline's input id: {exc}") from None


def _require_llm(task: Mapping[str, Any], session_id: str) -> dict[str, str]:
    llm = task.get("llm")
    if not isinstance(llm, Mapping) and isinstance(task.get("_config"), Mapping):
        config = task["_config"]
        llm = {"base_url": config.get("base_url"), "model": config.get("model_id"), "api_key": config.get("api_key")}
    missing = [k for k in ("base_url", "model", "api_key") if not isinstance(llm, Mapping) or not llm.get(k)]
    if missing or not isinstance(llm, Mapping):
        raise RolloutContractError(f"the task's `llm` block is missing {missing}")
    api_key = str(llm["api_key"])
    if api_key != session_id:
        raise RolloutContractError(
            "the task's llm.api_key is not this rollout's session id: only ART's per-rollout capture key may travel "
            "in a payload, never a long-lived credential (give the agent its model key out of band)"
        )
    # LiteLLM-shaped `openai/<name>`; the agent's OpenAI client wants the bare name (as ART's own S3 session).
    return {"base_url": str(llm["base_url"]), "model_id": str(llm["model"]).split("/")[-1], "api_key": api_key}


def policy_version_of(task: Mapping[str, Any]) -> str | None:
    """`task["global_steps"]` (the trainer step whose weights serve the rollout) as the pipeline's policy
    version, or None when the harness gives no step."""
    steps = task.get("global_steps")
    if steps is None or isinstance(steps, bool):
        return None
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)
    return str(steps)


def build_row(task: Mapping[str, Any], session_id: str) -> dict[str, Any]:
    """The dataset row this task becomes: the payload, `id` = the group, `_rollout` = the model to call."""
    payload = _require_payload(task)
    group_id = _require_group_id(task, session_id)
    llm = _require_llm(task, session_id)
    own = payload.pop("_rollout", None)
    rollout = {
        **(own if isinstance(own, Mapping) else {}),
        "base_url": llm["base_url"],
        "model_id": llm["model_id"],
        CAPTURE_KEY: llm["api_key"],  # the agent receives it as `_rollout.api_key` (contracts.build_agent_payload)
        "token_capture": "none",
    }
    return {**payload, "id": group_id, "_rollout": rollout}


# ------------------------------------------------------------------------------------------------- results


def _seconds(start: Any, end: Any) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, float((end - start).total_seconds()))


def event_metrics(event: RolloutCompleted | RolloutFailed | None) -> dict[str, float]:
    """Scalar metrics from the pipeline's event: attempt, queue wait, run time, notification delay (seconds)."""
    if event is None:
        return {}
    t = event.timings
    values = {
        "pipeline/attempt": float(event.attempt if isinstance(event, RolloutCompleted) else event.attempts_used),
        "pipeline/queue_s": _seconds(t.submitted_at, t.dispatched_at),
        "pipeline/run_s": _seconds(t.dispatched_at, t.finished_at),
        "pipeline/notify_s": _seconds(t.finished_at, t.notified_at),
    }
    return {k: v for k, v in values.items() if v is not None}


def _numeric(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        return {}
    return {str(k): float(v) for k, v in metrics.items() if isinstance(v, bool | int | float)}


def _coordinates(event: RolloutCompleted | RolloutFailed) -> dict[str, Any]:
    return {
        "batch_id": event.batch_id,
        "input_id": event.input_id,
        "rollout_id": event.rollout_id,
        "session_id": event.session_id,
        "policy_version": event.policy_version,
        "result_uri": event.result_uri,
        "event_id": event.event_id,
    }


def to_dump(event: RolloutCompleted | RolloutFailed, result: Mapping[str, Any] | None = None) -> RolloutDumpResponse:
    """ART's dump for a terminal pipeline event: success -> the pipeline's scalar reward (also as
    `task_output["reward"]`, where slime reads it); failure -> `exception` "<reason>: <error>", no reward: the
    rollout is excluded (`task_output["excluded"]`), which ART's `is_successful()` False carries to veRL's
    `on_rollout_failure` and slime's abort path."""
    metrics = {**(_numeric(result.get("metrics")) if result else {}), **event_metrics(event)}
    if isinstance(event, RolloutCompleted):
        output = {**dict(result or {}), "reward": event.reward, "excluded": False, "pipeline": _coordinates(event)}
        return RolloutDumpResponse(metrics=metrics, task_output=output, reward=event.reward, exception=None)
    output = {"reason": event.reason.value, "error": event.error, "excluded": True, "pipeline": _coordinates(event)}
    return RolloutDumpResponse(
        metrics=metrics, task_output=output, reward=None, exception=f"{event.reason.value}: {event.error}"
    )


# ------------------------------------------------------------------------------------------------- session


class PipelineSession:
    """ART `RolloutSession` (`setup`, `run`, `shutdown`, async context manager) over the pipeline.

    Built by ART's factory as `PipelineSession(session_id, session_state, **config)`; `config` is
    `BackendConfig` (unknown keys raise `RolloutContractError`). One instance runs one rollout.
    """

    def __init__(self, session_id: str, session_state: Any, **config: Any) -> None:
        self.config = parse_config(config)
        if not session_id:
            raise RolloutContractError("PipelineSession needs a non-empty session id")
        self.session_id = session_id
        self.session_state = session_state
        self._submission: asyncio.Future[list[RolloutFuture]] | None = None
        self._future: RolloutFuture | None = None

    async def __aenter__(self) -> PipelineSession:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    async def _record(self, values: Mapping[str, Any]) -> None:
        update = getattr(self.session_state, "update", None)
        if update is None:
            return
        outcome = update(dict(values))
        if asyncio.iscoroutine(outcome):
            await outcome

    async def setup(self, task: dict[str, Any]) -> None:
        """Check the task and attach to the experiment (once per process). Nothing starts here: the pipeline
        starts the session when its global limits admit the rollout, inside `run`."""
        build_row(task, self.session_id)
        client = await asyncio.to_thread(shared_client, self.config)
        await self._record({"backend": BACKEND_PATH, "experiment": client.exp_id})

    async def run(self, task: dict[str, Any]) -> RolloutDumpResponse:
        """Submit the task as one rollout and return its dump once the pipeline pushed its terminal event."""
        if self._submission is not None:
            raise RolloutContractError("a PipelineSession runs one rollout; make a new session for the next")
        row = build_row(task, self.session_id)
        policy_version = policy_version_of(task)
        link = await asyncio.to_thread(attached, self.config)
        # Shielded: a run cancelled mid-submission must still leave `shutdown` the future to cancel.
        self._submission = asyncio.ensure_future(
            asyncio.to_thread(
                link.client.submit_many, [row], name=link.batch_name, owns_batch=True, policy_version=policy_version
            )
        )
        (future,) = await asyncio.shield(self._submission)
        self._future = future
        await self._record({"batch_id": future.batch_id, "group_id": row["id"], "policy_version": policy_version})
        try:
            result = await future.result_async()
        except RolloutFailedError as exc:
            if isinstance(exc.event, RolloutFailed):
                return to_dump(exc.event)
            raise
        event = future.event
        assert isinstance(event, RolloutCompleted)
        return to_dump(event, result)

    async def shutdown(self) -> None:
        """Cancel the rollout in the pipeline if it has not finished (its session is stopped server-side).
        Idempotent; a no-op before `run` and after a finished one."""
        submission, self._submission = self._submission, None
        future, self._future = self._future, None
        if future is None and submission is not None:
            try:
                (future,) = await asyncio.wait_for(asyncio.shield(submission), SUBMIT_WAIT_S)
            except BaseException as exc:  # the submission failed or never returned: nothing to cancel
                logger.warning("session %s: no rollout to cancel (%s)", self.session_id, exc)
                return
        if future is not None and not future.done():
            await future.cancel_async()
            await self._record({"cancelled": True})
