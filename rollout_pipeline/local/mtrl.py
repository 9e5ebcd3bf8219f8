"""A local stand-in of SageMaker's managed multi-turn RL (MTRL), built from its documented contract, driving the MTRL
environment mode on one machine (`examples/mtrl_environment.py --local`, `tests/rft/test_mtrl_environment.py`).

- `JobRuntimeStandIn`: the job runtime on loopback. `POST /v1/chat/completions` (`Sample`) wants the job and
  trajectory headers and a SageMaker bearer token, and passes the body to a model (a marker in the prompt makes it
  fail, `FAIL_MARKER`, or hang until the trajectory is sealed, `HANG_MARKER`: the two kinds of infrastructure
  failure); `POST /complete-rollout` and `/update-reward` take the service model's shapes (`sagemakerjobruntime`)
  from the agent host (bearer) and the MTRL reporter (boto3, SigV4): a trajectory is sealed by its first terminal
  report, a repeated `ClientToken` is a no-op, anything else after it a 409, a reward needs a `ready` trajectory.
  Every call is recorded.
- `MtrlStandIn`: the trainer's side. It invokes the forwarder once per rollout, keeping at most `max_in_flight`
  rollouts in flight (MTRL's `rollout_max_concurrency`, 32-96: invoked and not yet sealed), invokes each one again
  with the same `rolloutId` (a retried invocation, some concurrent with the first) and once more after it ended,
  mixes both event shapes (the object, and the same object as a JSON string in `body`), and seals a trajectory
  failed itself when its deadline passes (MTRL's `rollout_timeout`, 600 s, scaled down).

`run_local_mtrl` puts them together with local mode and the example RFT agent, unchanged, and measures.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Final

from rollout_pipeline.agent.job_runtime import JOB_ARN_HEADER, TRAJECTORY_HEADER
from rollout_pipeline.agent.loopback import JsonRequestHandler, LoopbackServer
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.contracts.mtrl import mtrl_batch_id

#: MTRL's defaults (sagemaker-train 1.27.0, `MultiTurnRLTrainer`): `rollout_timeout` 600 s, and the least
#: `rollout_max_concurrency` (32; the default is 96).
MTRL_ROLLOUT_TIMEOUT_S: Final = 600.0
MTRL_MAX_IN_FLIGHT: Final = 32
FAIL_MARKER: Final = "FAIL-SAMPLE"
HANG_MARKER: Final = "HANG-SAMPLE"
BEARER_PREFIX: Final = "Bearer sagemaker-api-key-"
SIGV4_PREFIX: Final = "AWS4-HMAC-SHA256"
RFT_AGENT: Final = "rollout_pipeline.agent.examples.rft_math_agent"


@dataclass
class JobTrajectory:
    """One trajectory at the stand-in job runtime."""

    status: str | None = None
    rewards: list[float] | None = None
    sealed_at: float | None = None
    samples: int = 0
    #: ClientToken -> the call it was first seen with.
    tokens: dict[str, str] = field(default_factory=dict)
    #: Every report: call, auth, answer.
    reports: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sealed(self) -> bool:
        """Ended for MTRL: failed, or ready with its rewards."""
        return self.status == "failed" or (self.status == "ready" and self.rewards is not None)


class JobRuntimeStandIn(LoopbackServer):
    """The job runtime on loopback (see the module doc). `open(rollout_id)` before invoking the forwarder."""

    def __init__(self, model_url: str, *, job_arn: str, hang_max_s: float = 120.0) -> None:
        self.model_url = model_url.rstrip("/")
        self.job_arn = job_arn
        self.hang_max_s = hang_max_s
        self.changed = threading.Condition()
        self.trajectories: dict[str, JobTrajectory] = {}
        self.samples: list[dict[str, Any]] = []
        super().__init__(self._handler_class(), thread_name="mtrl-job-runtime")

    def open(self, rollout_id: str) -> None:
        with self.changed:
            self.trajectories[rollout_id] = JobTrajectory()

    def seal(self, rollout_id: str, status: str) -> None:
        """MTRL ends the trajectory itself (its deadline passed)."""
        with self.changed:
            trajectory = self.trajectories[rollout_id]
            if not trajectory.sealed:
                trajectory.status, trajectory.sealed_at = status, time.monotonic()
                trajectory.reports.append({"call": "mtrl-deadline", "auth": "mtrl", "answer": 200})
            self.changed.notify_all()

    def snapshot(self) -> dict[str, JobTrajectory]:
        with self.changed:
            return {
                key: JobTrajectory(
                    status=value.status,
                    rewards=None if value.rewards is None else list(value.rewards),
                    sealed_at=value.sealed_at,
                    samples=value.samples,
                    tokens=dict(value.tokens),
                    reports=list(value.reports),
                )
                for key, value in self.trajectories.items()
            }

    # ------------------------------------------------------------------------------------------- the calls

    def report(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """`/complete-rollout` or `/update-reward`: (HTTP status, body)."""
        auth = _auth_kind(headers.get("Authorization") or "")
        job_arn = headers.get(JOB_ARN_HEADER) or body.get("JobArn")
        call = "reward" if path == "/update-reward" else f"complete-{body.get('Status')}"
        with self.changed:
            trajectory = self.trajectories.get(str(body.get("TrajectoryId")))
            if trajectory is None or job_arn != self.job_arn:
                return 404, _error("ResourceNotFoundException", "trajectory not found")
            answer = self._apply(trajectory, call, body)
            trajectory.reports.append({"call": call, "auth": auth, "answer": answer[0], "body": dict(body)})
            self.changed.notify_all()
            return answer

    @staticmethod
    def _apply(trajectory: JobTrajectory, call: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        token = str(body.get("ClientToken") or "")
        if token and trajectory.tokens.get(token) == call:
            return 200, {}
        if call == "reward":
            rewards = body.get("Rewards")
            if trajectory.status != "ready" or trajectory.rewards is not None:
                return 409, _error("ConflictException", f"trajectory not in valid status ({trajectory.status})")
            if not isinstance(rewards, list) or not rewards:
                return 400, _error("ValidationException", "Rewards must be a non-empty list")
            trajectory.rewards = [float(r) for r in rewards]
        else:
            if call not in ("complete-ready", "complete-failed"):
                return 400, _error("ValidationException", f"bad Status in {call}")
            if trajectory.status is not None:
                return 409, _error("ConflictException", f"Cannot transition trajectory from {trajectory.status}")
            trajectory.status = call.removeprefix("complete-")
        if token:
            trajectory.tokens[token] = call
        if trajectory.sealed and trajectory.sealed_at is None:
            trajectory.sealed_at = time.monotonic()
        return 200, {}

    def sample(self, headers: Mapping[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        """`Sample` (`/v1/chat/completions`): checked, recorded, passed to the model."""
        trajectory_id = headers.get(TRAJECTORY_HEADER) or ""
        authorization = headers.get("Authorization") or ""
        with self.changed:
            trajectory = self.trajectories.get(trajectory_id)
            self.samples.append({"trajectory": trajectory_id, "auth": _auth_kind(authorization)})
            if trajectory is None or headers.get(JOB_ARN_HEADER) != self.job_arn:
                return 404, _error("ResourceNotFoundException", "no such job or trajectory")
            if not authorization.startswith(BEARER_PREFIX):
                return 403, _error("AccessDeniedException", "a SageMaker bearer token is required")
            trajectory.samples += 1
        text = raw.decode("utf-8", "replace")
        if FAIL_MARKER in text:
            return 500, _error("InternalServiceError", "the policy model failed")
        if HANG_MARKER in text:
            with self.changed:
                self.changed.wait_for(lambda: self.trajectories[trajectory_id].sealed, timeout=self.hang_max_s)
            return 409, _error("ConflictException", "trajectory not in valid status: it has ended")
        request = urllib.request.Request(
            f"{self.model_url}/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return int(response.status), json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, _error("InternalServiceError", f"model: {exc}")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        runtime = self

        class Handler(JsonRequestHandler):
            def do_POST(self) -> None:
                raw = self.read_body()
                headers = dict(self.headers.items())
                headers = {**headers, **{_canonical(name): value for name, value in headers.items()}}
                path = self.path.split("?", 1)[0]
                if path.endswith("/chat/completions"):
                    status, answer = runtime.sample(headers, raw)
                elif path in ("/complete-rollout", "/update-reward"):
                    try:
                        body = json.loads(raw or b"{}")
                    except json.JSONDecodeError:
                        body = {}
                    status, answer = runtime.report(path, headers, body if isinstance(body, dict) else {})
                else:
                    status, answer = 404, _error("UnknownOperationException", path)
                self._answer(status, answer)

            def _answer(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if "__type" in answer:
                    self.send_header("x-amzn-ErrorType", str(answer["__type"]))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _canonical(name: str) -> str:
    known = {h.lower(): h for h in (JOB_ARN_HEADER, TRAJECTORY_HEADER, "Authorization")}
    return known.get(name.lower(), name)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"__type": kind, "message": message}


def _auth_kind(authorization: str) -> str:
    if authorization.startswith(BEARER_PREFIX):
        return "bearer"
    if authorization.startswith(SIGV4_PREFIX):
        return "sigv4"
    return "none"


# ------------------------------------------------------------------------------------------------ the trainer side


@dataclass
class StandInRun:
    """What the trainer's side did and saw."""

    rollouts: list[str] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    max_in_flight: int = 0
    timed_out_at_mtrl: list[str] = field(default_factory=list)
    #: How long each first invocation took to answer (ms).
    answer_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0


class MtrlStandIn:
    """MTRL's side of the contract (see the module doc): `run(prompts)` drives them through `invoke` (the
    forwarder) and waits until every trajectory is sealed."""

    def __init__(
        self,
        invoke: Callable[[dict[str, Any]], dict[str, Any]],
        runtime: JobRuntimeStandIn,
        *,
        max_in_flight: int = MTRL_MAX_IN_FLIGHT,
        deadline_s: float = MTRL_ROLLOUT_TIMEOUT_S,
        inference_params: Mapping[str, Any] | None = None,
        workers: int = 8,
    ) -> None:
        self.invoke = invoke
        self.runtime = runtime
        self.max_in_flight = max_in_flight
        self.deadline_s = deadline_s
        self.inference_params = dict(inference_params or {"temperature": 1.0, "topP": 0.95, "maxTokens": 64})
        #: Invocations at once (MTRL's rollout workers; a retry of an invocation may take a worker of its own).
        self.workers = workers
        self._started: dict[str, float] = {}
        self._alternate = itertools.count()

    def event(self, rollout_id: str, prompt: str, as_body: bool) -> dict[str, Any]:
        """The invocation MTRL sends: the object, or the same as a JSON string in `body`."""
        event = {
            "prompt": prompt,
            "metadata": {"jobArn": self.runtime.job_arn, "rolloutId": rollout_id},
            "inferenceParams": self.inference_params,
        }
        return {"body": json.dumps(event)} if as_body else event

    def run(self, prompts: Sequence[str], *, rollout_ids: Sequence[str] | None = None) -> StandInRun:
        run = StandInRun()
        started = time.monotonic()
        with (
            ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="mtrl-invoke") as pool,
            ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="mtrl-retry") as retries,
        ):
            invoked: list[Future[tuple[list[str], float]]] = []
            for index, prompt in enumerate(prompts):
                rollout_id = rollout_ids[index] if rollout_ids else f"rollout-{index:04d}"
                self._wait_for_room(run)
                self.runtime.open(rollout_id)
                self._started[rollout_id] = time.monotonic()
                run.rollouts.append(rollout_id)
                run.max_in_flight = max(run.max_in_flight, self._in_flight())
                invoked.append(pool.submit(self._invoke_twice, retries, self.event(rollout_id, prompt, index % 3 == 2)))
            for future in invoked:
                answers, first_ms = future.result()
                run.answers.update(answers)
                run.answer_ms.append(first_ms)
            self._wait_all_sealed(run)
            for rollout_id, prompt in zip(run.rollouts, prompts, strict=True):  # a late retry of each
                run.answers.update([_kind(self.invoke(self.event(rollout_id, prompt, as_body=False)))])
        run.wall_s = time.monotonic() - started
        return run

    def _invoke_twice(self, retries: ThreadPoolExecutor, event: dict[str, Any]) -> tuple[list[str], float]:
        """The invocation, and a retry of it (as if its answer was lost): for every other rollout at the same
        time, else right after it. The answers, and how long the first took (ms)."""
        retry = retries.submit(self.invoke, event) if next(self._alternate) % 2 else None
        started = time.monotonic()
        first = _kind(self.invoke(event))
        first_ms = (time.monotonic() - started) * 1000
        second = _kind(retry.result() if retry is not None else self.invoke(event))
        return [first, second], first_ms

    def _in_flight(self) -> int:
        trajectories = self.runtime.snapshot()
        return sum(1 for rollout_id in self._started if not trajectories[rollout_id].sealed)

    def _wait_for_room(self, run: StandInRun) -> None:
        while self._in_flight() >= self.max_in_flight:
            self._expire(run)
            with self.runtime.changed:
                self.runtime.changed.wait(timeout=0.2)

    def _wait_all_sealed(self, run: StandInRun) -> None:
        while self._in_flight():
            self._expire(run)
            with self.runtime.changed:
                self.runtime.changed.wait(timeout=0.2)

    def _expire(self, run: StandInRun) -> None:
        """MTRL's deadline: a trajectory not sealed `deadline_s` after its invocation is failed by MTRL itself."""
        now = time.monotonic()
        trajectories = self.runtime.snapshot()
        for rollout_id, at in self._started.items():
            if not trajectories[rollout_id].sealed and now - at > self.deadline_s:
                self.runtime.seal(rollout_id, "failed")
                run.timed_out_at_mtrl.append(rollout_id)


def _percentiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"median": round(statistics.median(ordered), 1), "p99": round(p99, 1)}


def _kind(answer: Mapping[str, Any]) -> str:
    return "ok" if answer == {} else str(answer.get("errorType", "unexpected"))


# ------------------------------------------------------------------------------------------------ one run


def prompts_of(rollouts: int, failing: Sequence[str]) -> list[str]:
    """`rollouts` arithmetic prompts, the last ones carrying the failure markers in `failing`."""
    prompts = [f"What is {index % 9 + 1} + {index % 7 + 2}?" for index in range(rollouts)]
    for position, marker in enumerate(failing):
        prompts[rollouts - 1 - position] = f"{marker}: what is 2 + 2?"
    return prompts


def measure(
    run: StandInRun, runtime: JobRuntimeStandIn, prompts: Sequence[str], pipeline: PipelineView
) -> dict[str, Any]:
    """The run's figures. A failure is a rollout the pipeline failed or one the job runtime made fail (a marker):
    MTRL must have heard `failed` for each, and no reward for any."""
    trajectories = runtime.snapshot()
    markers = (FAIL_MARKER, HANG_MARKER)
    failing = {rid for rid, prompt in zip(run.rollouts, prompts, strict=True) if any(m in prompt for m in markers)}
    failures = failing | pipeline.failed
    rewards_for_failures = sum(
        1 for rid in failures for report in trajectories[rid].reports if report["call"] == "reward"
    )
    reports = Counter(report["auth"] for t in trajectories.values() for report in t.reports)
    return {
        "rollouts": len(run.rollouts),
        "completed": sum(1 for t in trajectories.values() if t.status == "ready" and t.rewards is not None),
        "failed_reported_failed": sum(1 for rid in failures if _told_failed(trajectories[rid])),
        "failures": len(failures),
        "zero_rewards_for_failures": rewards_for_failures,
        "duplicate_enqueues": sum(max(0, count - 1) for count in pipeline.enqueued.values()),
        "not_enqueued": sum(1 for rid in run.rollouts if pipeline.enqueued.get(rid, 0) == 0),
        "max_in_flight": run.max_in_flight,
        "timed_out_at_mtrl": len(run.timed_out_at_mtrl),
        "invocations": sum(run.answers.values()),
        "answers": dict(run.answers),
        "answer_ms": _percentiles(run.answer_ms),
        "samples": len(runtime.samples),
        "samples_with_bearer": sum(1 for sample in runtime.samples if sample["auth"] == "bearer"),
        "reports_by_auth": dict(reports),
        "sealed": sum(1 for t in trajectories.values() if t.sealed),
        "wall_s": round(run.wall_s, 2),
        "pipeline": {"outcomes": dict(pipeline.outcomes), "cost_per_rollout_usd": pipeline.cost_per_rollout_usd},
    }


def _told_failed(trajectory: JobTrajectory) -> bool:
    """The environment (the agent host or the MTRL reporter), not MTRL's own deadline, sealed it failed."""
    reports = trajectory.reports
    return any(r["call"] == "complete-failed" and r["answer"] == 200 and r["auth"] != "mtrl" for r in reports)


@dataclass
class PipelineView:
    """The forwarded rollouts as the pipeline recorded them."""

    #: Rollouts enqueued per MTRL rollout id (the batch's `rollouts_enqueued`).
    enqueued: dict[str, int] = field(default_factory=dict)
    #: Terminal events by outcome (`succeeded`, or the failure reason).
    outcomes: Counter[str] = field(default_factory=Counter)
    #: MTRL rollout ids the pipeline failed.
    failed: set[str] = field(default_factory=set)
    cost_per_rollout_usd: float | None = None


def run_local_mtrl(
    *,
    rollouts: int = 40,
    failing: Sequence[str] = (FAIL_MARKER, HANG_MARKER),
    time_scale: float = 0.1,
    max_in_flight: int = MTRL_MAX_IN_FLIGHT,
    rollout_timeout_s: int = 10,
    work_dir: Path | None = None,
) -> dict[str, Any]:
    """MTRL's stand-in, the forwarder and the example RFT agent (unchanged) in local mode, with a fake model: the
    figures of `measure`, plus what the pipeline saw (`pipeline`: failure reasons, cost per rollout)."""
    from rollout_pipeline.agent.testing import FakeModelServer
    from rollout_pipeline.local.pipeline import REGION, LocalPipeline, LocalSettings
    from rollout_pipeline.local.resources import LOCAL_ACCOUNT

    job_arn = f"arn:aws:sagemaker:{REGION}:{LOCAL_ACCOUNT}:job/mtrl-local-stand-in"
    prompts = prompts_of(rollouts, failing)
    with (
        FakeModelServer("The answer is 6") as model,
        JobRuntimeStandIn(model.base_url, job_arn=job_arn, hang_max_s=MTRL_ROLLOUT_TIMEOUT_S * time_scale) as runtime,
    ):
        settings = LocalSettings(
            experiment="mtrl-local",
            group_size=1,
            model_url=model.base_url,
            model_id="fake-model",
            max_sessions=8,
            max_attempts=1,
            rollout_timeout_s=rollout_timeout_s,
            isolation="shared",
            sweep_interval_s=1.0,
            agent_module=RFT_AGENT,
            agent_kind="rft",
            experiment_settings={"mtrl_environment": True, "agent_kind": "rft"},
            mtrl_runtime_url=runtime.root_url,
            work_dir=work_dir,
        )
        with LocalPipeline(settings) as pipeline:
            standin = MtrlStandIn(
                pipeline.invoke_mtrl_forwarder,
                runtime,
                max_in_flight=max_in_flight,
                deadline_s=MTRL_ROLLOUT_TIMEOUT_S * time_scale,
            )
            run = standin.run(prompts)
            view = _pipeline_view(pipeline, {mtrl_batch_id(job_arn, rid): rid for rid in run.rollouts})
            figures = measure(run, runtime, prompts, view)
            figures["sessions_left"] = len(pipeline.active_sessions())
    return figures


def _pipeline_view(pipeline: Any, rollout_of: Mapping[str, str]) -> PipelineView:
    """What the ledger and the events say of the forwarded rollouts (`rollout_of`: MTRL rollout id by batch)."""
    view = PipelineView()
    ledger = pipeline.wiring.ledger().batches
    for batch_id, rollout_id in rollout_of.items():
        batch = ledger.read_batch(batch_id)
        view.enqueued[rollout_id] = batch.rollouts_enqueued if batch is not None else 0
    events = pipeline.experiment.events(
        batch_id=list(rollout_of),
        detail_types=[DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED],
        timeout=30.0,
        max_events=len(rollout_of),
        from_start=True,
    )
    costs: list[float] = []
    with events:
        for event in events:
            detail = event.detail
            reason = getattr(detail, "reason", None)
            view.outcomes[str(reason or "succeeded")] += 1
            if reason is not None:
                view.failed.add(rollout_of[detail.batch_id])
            if detail.cost is not None:
                costs.append(detail.cost.usd)
    view.cost_per_rollout_usd = round(statistics.fmean(costs), 6) if costs else None
    return view
