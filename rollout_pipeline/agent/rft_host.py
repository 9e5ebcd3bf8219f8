"""The RFT host: serves an agent written for the SageMaker RFT SDK, unchanged, as a rollout-pipeline agent.

Such an agent (PyPI `sagemaker-train` 1.27.0, `sagemaker.train.rft`) is a `BedrockAgentCoreApp` whose
`@app.entrypoint` is decorated with `@sagemaker_rft_handler`. Run as it is, it answers `/invocations` only when the
rollout ends, sends its reward to SageMaker's job runtime and writes no result object, so the pipeline would time
out every rollout. The host instead:

1. imports the author's module (`modules.load_entrypoint`: its `__main__` block and `app.run()` do not run) and
   takes the function its app registered with `@app.entrypoint` (`app.handlers["main"]`, the RFT decorator inside);
2. serves it through `RolloutApp` (ART's `AgentCoreRLApp` plus the rollout context): `/invocations` answers at
   once, `/ping` says `HealthyBusy` while it runs, the result object `{exp_id}/{input_id}/{session_id}.json` is
   written as for any ART agent;
3. runs the front door (`rft_door.FrontDoor`) on 127.0.0.1 and points `RFT_RUNTIME_ENDPOINT` and every request's
   `metadata["endpoint"]` at it: feedback is recorded per trajectory, model calls go to the rollout's model;
4. builds the RFT request from the pipeline's unchanged payload (`rft_request`) and maps what the agent did to the
   result object (`rft_result`): reward reported or returned -> success; a raise or `{"status": "error"}` ->
   `agent_error` with the agent's message; no reward -> a result without `rewards` (`invalid_result`).

The same adapter serves any `BedrockAgentCoreApp` entrypoint, including ART's `AgentCoreRuntimeApp` (its user function
is `handlers["main"]` too); an ART `AgentCoreRLApp` found in the module is served as it is. The process that does it
is the agent host (`rollout_pipeline.agent.host`, which every agent process runs):

    python -m rollout_pipeline.agent.host --agent-module my_rft_agent --agent-kind rft [--host 0.0.0.0 --port 8080]

This module does not import `sagemaker`: only the author's module does.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from rollout_pipeline.agent.context import current_rollout
from rollout_pipeline.agent.job_runtime import JobRuntimeClient, mtrl_target_of
from rollout_pipeline.agent.modules import Entrypoint, load_entrypoint
from rollout_pipeline.agent.rft_door import FAILED, FrontDoor, TrajectoryRecord, Upstream
from rollout_pipeline.config import JOB_ARN_ENV, MTRL_RUNTIME_ENV

logger = logging.getLogger(__name__)

#: Where the SDK's `RolloutFeedbackClient` sends feedback when the metadata names no endpoint.
RFT_RUNTIME_ENDPOINT_ENV: Final = "RFT_RUNTIME_ENDPOINT"
DEFAULT_REGION: Final = "us-east-1"
#: `_rollout.sampling_params` key -> the camel-case name of RFT's `inferenceParams`.
CAMEL_CASE: Final = {"max_tokens": "maxTokens", "top_p": "topP", "temperature": "temperature"}
MAX_RESPONSE_CHARS: Final = 10_000


# ------------------------------------------------------------------------------------------------ the request


def inference_params_of(sampling: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """RFT's `inferenceParams` (camel case: `temperature`, `maxTokens`, `topP`, other keys as they are) and
    `inference_params` (snake case, as `_rollout.sampling_params` has them) from the rollout's sampling params."""
    snake = {key: value for key, value in sampling.items() if value is not None}
    camel = {CAMEL_CASE.get(key, key): value for key, value in snake.items()}
    return camel, snake


def rft_request(
    payload: Mapping[str, Any], *, trajectory_id: str, job_arn: str, endpoint: str, region: str
) -> dict[str, Any]:
    """The request an RFT entrypoint gets, from the pipeline's payload (the row's fields plus `_rollout`).

    - the row's top-level fields, as they are (public RFT agents read `prompt`, `question`, ...);
    - `instance`: the row's own `instance` if it has one, else the row's fields (without `_rollout`);
    - `metadata`: job ARN, trajectory id (= the ACR session id), endpoint (the front door) and region, in both
      casings the SDK reads (`jobArn`/`job_arn`, `trajectoryId`/`trajectory_id`/`rolloutId`), over the row's own
      `metadata` keys if it has any;
    - `inferenceParams` (camel case) and `inference_params` (snake case) from `_rollout.sampling_params`;
    - `_rollout` unchanged.
    """
    row = {key: value for key, value in payload.items() if key != "_rollout"}
    rollout = payload.get("_rollout")
    rollout = rollout if isinstance(rollout, Mapping) else {}
    sampling = rollout.get("sampling_params")
    camel, snake = inference_params_of(sampling if isinstance(sampling, Mapping) else {})
    own_metadata = row.get("metadata")
    metadata = {
        **(own_metadata if isinstance(own_metadata, Mapping) else {}),
        "jobArn": job_arn,
        "job_arn": job_arn,
        "trajectoryId": trajectory_id,
        "trajectory_id": trajectory_id,
        "rolloutId": trajectory_id,
        "endpoint": endpoint,
        "region": region,
    }
    instance = row["instance"] if isinstance(row.get("instance"), Mapping) else dict(row)
    return {
        **row,
        "instance": instance,
        "metadata": metadata,
        "inferenceParams": camel,
        "inference_params": snake,
        "_rollout": dict(rollout),
    }


# ------------------------------------------------------------------------------------------------ the outcome


def _json_safe(value: Any) -> Any:
    """`value` as JSON data (anything JSON cannot hold becomes its `str`), so a metric never fails the save."""
    return json.loads(json.dumps(value, default=str, allow_nan=True))


def _reward_shape(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, list) and bool(value)


def rft_result(returned: Any, report: TrajectoryRecord) -> dict[str, Any]:
    """The result object's body for what an RFT entrypoint returned and reported (it did not raise).

    - `{"status": "error", "error": msg}` (or ART's `status_code` other than 200) returned, or `failed` reported
      -> `status_code` 500 with the agent's message (`agent_error`), never a reward of 0;
    - a reward reported (`/update-reward`) -> `rewards` = it: one reported value as a number, several as the per-turn
      list (a returned `reward` of the same values keeps its own shape). The first terminal report wins: when the
      returned `reward` differs from the reported one, the reported one (what SageMaker would train on) is used;
    - else a returned `reward` (number or list), else a returned ART-style `rewards`;
    - else no reward: `status_code` 200 without `rewards`, which the completion stage reads as `invalid_result`.

    The pipeline's scalar reward of a list is its last element (`contracts.results.scalar_reward`), as for ART.
    The agent's returned dict is kept (metrics); `rft` says what was reported through the front door.
    """
    body: dict[str, Any]
    if isinstance(returned, Mapping):
        body = _json_safe(dict(returned))
    elif returned is None:
        body = {}
    else:
        body = {"response": str(returned)[:MAX_RESPONSE_CHARS]}
    body["rft"] = report.snapshot()
    error = _agent_error(returned, report)
    if error is not None:
        body.update({"status_code": 500, "stop_reason": error})
        return body
    returned_reward = returned.get("reward") if isinstance(returned, Mapping) else None
    rewards: Any = None
    if report.rewards is not None:
        rewards = report.rewards[0] if len(report.rewards) == 1 else list(report.rewards)
        as_list = returned_reward if isinstance(returned_reward, list) else [returned_reward]
        if _reward_shape(returned_reward) and as_list == report.rewards:
            rewards = returned_reward
    elif _reward_shape(returned_reward):
        rewards = returned_reward
    elif isinstance(returned, Mapping) and "rewards" in returned:
        rewards = body["rewards"]
    body["status_code"] = 200
    body.setdefault("stop_reason", "end_turn")
    if rewards is None:
        body.pop("rewards", None)
        body["rft"]["outcome"] = "no reward reported or returned"
    else:
        body["rewards"] = _json_safe(rewards)
    return body


def _agent_error(returned: Any, report: TrajectoryRecord) -> str | None:
    if isinstance(returned, Mapping) and returned.get("status") == "error":
        return f"agent returned status 'error': {returned.get('error') or 'unknown error'}"[:2000]
    status_code = returned.get("status_code") if isinstance(returned, Mapping) else None
    if isinstance(status_code, int) and not isinstance(status_code, bool) and status_code != 200:
        return f"agent returned status_code {status_code}: {returned.get('stop_reason') or ''}".strip()[:2000]
    if report.status == FAILED:
        return "agent reported the rollout failed (complete-rollout status 'failed')"
    return None


# ------------------------------------------------------------------------------------------------ serving


async def call_entrypoint(handler: Callable[..., Any], request: dict[str, Any], context: Any) -> Any:
    """Call the author's entry function as `BedrockAgentCoreApp` would: `(payload)` or `(payload, context)`,
    awaited when async, in a worker thread (with this context's variables) when sync."""
    try:
        parameters = list(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        parameters = []
    args = (request, context) if len(parameters) >= 2 and parameters[1] == "context" else (request,)
    if inspect.iscoroutinefunction(handler):
        result = await handler(*args)
    else:
        result = await asyncio.to_thread(handler, *args)
        if inspect.isawaitable(result):
            result = await result
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        raise TypeError("the entrypoint streams (a generator): the RFT host needs a function that returns its result")
    return result


def mtrl_rewards(result: Mapping[str, Any]) -> list[float] | None:
    """What MTRL is told of a rollout's result object (`rft_result`): its rewards for a success with rewards, else
    None (the trajectory is failed: an agent error or no reward is never a reward of 0)."""
    if result.get("status_code") != 200 or "rewards" not in result:
        return None
    rewards = result["rewards"]
    return [float(r) for r in rewards] if isinstance(rewards, list) else [float(rewards)]


class RftHost:
    """One agent process: the author's entrypoint, the front door and the settings every rollout shares.

    With `job_runtime` (MTRL environment mode: `config.MTRL_RUNTIME_ENV` set), a rollout whose row names an MTRL job
    and trajectory (`job_runtime.mtrl_target_of`) runs as that trajectory: the agent's `metadata` names MTRL's
    ids, its model calls go to the job runtime (`rft_door.Upstream`), and once it has returned (or raised) the host
    tells MTRL the outcome of the result object: ready and its rewards, or failed, never `[0.0]`
    (`JobRuntimeClient.report`). Other rollouts run as without it."""

    def __init__(
        self,
        entry: Entrypoint,
        door: FrontDoor,
        *,
        job_arn: str = "",
        region: str = DEFAULT_REGION,
        job_runtime: JobRuntimeClient | None = None,
    ) -> None:
        self.entry = entry
        self.door = door
        self.job_arn = job_arn
        self.region = region
        self.job_runtime = job_runtime

    async def rollout(self, payload: dict[str, Any], context: Any) -> dict[str, Any]:
        """One rollout (registered with `RolloutApp.rollout_entrypoint`, which sets the rollout context)."""
        ctx = current_rollout()
        runtime = self.job_runtime
        target = mtrl_target_of(payload) if runtime is not None else None
        upstream: Upstream | None = None
        if target is not None and runtime is not None:
            trajectory_id, job_arn = target.rollout_id, target.job_arn
            upstream = Upstream(runtime.url, functools.partial(runtime.model_headers, target))
        else:
            trajectory_id, job_arn = ctx.session_id or str(uuid.uuid4()), ctx.job_arn or self.job_arn
        self.door.register(trajectory_id, ctx, job_arn, upstream)
        request = rft_request(
            payload,
            trajectory_id=trajectory_id,
            job_arn=job_arn,
            endpoint=self.door.endpoint_for(trajectory_id),
            region=self.region,
        )
        try:
            returned = await call_entrypoint(self.entry.handler, request, context)
        except Exception:
            if target is not None and runtime is not None:  # the SDK sent failed + [0.0] to the door: failed only
                await asyncio.to_thread(runtime.report, target, None)
            raise
        finally:
            report = self.door.unregister(trajectory_id)
        assert report is not None
        result = rft_result(returned, report)
        if target is not None and runtime is not None:
            result["rft"]["mtrl"] = await asyncio.to_thread(runtime.report, target, mtrl_rewards(result))
        return result

    def app(self) -> Any:
        """A `RolloutApp` serving `rollout` at `/invocations`."""
        from rollout_pipeline.agent.app import RolloutApp

        app = RolloutApp()

        async def rollout(payload: dict[str, Any], context: Any) -> dict[str, Any]:
            return await self.rollout(payload, context)

        rollout.__name__ = f"rft_{getattr(self.entry.handler, '__name__', 'entrypoint')}"
        app.rollout_entrypoint(rollout)
        return app


def region_of(environ: Mapping[str, str]) -> str:
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def start_front_door() -> FrontDoor:
    """Start the front door and point `RFT_RUNTIME_ENDPOINT` (where the SDK's `RolloutFeedbackClient` reports when
    the metadata names no endpoint) at it. Done before the author's module is imported: it may read the variable."""
    door = FrontDoor().start()
    os.environ[RFT_RUNTIME_ENDPOINT_ENV] = door.root_url
    return door


def rft_app(entry: Entrypoint, door: FrontDoor, environ: Mapping[str, str] | None = None) -> Any:
    """The `RolloutApp` serving `entry` (a `BedrockAgentCoreApp` entrypoint) through the RFT adapter and `door`."""
    env = os.environ if environ is None else environ
    region = region_of(env)
    runtime_url = env.get(MTRL_RUNTIME_ENV)
    job_runtime = JobRuntimeClient(runtime_url, region) if runtime_url else None
    host = RftHost(entry, door, job_arn=env.get(JOB_ARN_ENV, ""), region=region, job_runtime=job_runtime)
    logger.info(
        "RFT host: %s:%s (%s), front door %s%s",
        entry.module,
        entry.app_name,
        "sagemaker_rft_handler" if entry.is_rft else "plain entrypoint",
        door.root_url,
        f", MTRL rollouts to {runtime_url}" if runtime_url else "",
    )
    return host.app()


def start_host(
    spec: str, *, environ: Mapping[str, str] | None = None, argv: Sequence[str] = ()
) -> tuple[Any, FrontDoor, Entrypoint]:
    """Start the front door, import the author's module (`modules.load_entrypoint`) and build the app to serve.

    Returns (app, door, entrypoint); an ART `AgentCoreRLApp` module gets its own app back, unwrapped."""
    door = start_front_door()
    try:
        entry = load_entrypoint(spec, argv)
    except BaseException:
        door.stop()
        raise
    if entry.is_art_rollout_app:
        logger.info("%s serves an ART AgentCoreRLApp: served as it is", spec)
        return entry.app, door, entry
    return rft_app(entry, door, environ), door, entry
