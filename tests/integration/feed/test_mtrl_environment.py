"""MTRL environment mode over moto: the forwarder Lambda's handler is idempotent on the rollout id (one batch, one
rollout message, however often and however concurrently MTRL invokes it, and an invocation that crashed mid-way is
taken over), and the MTRL reporter tells the job runtime how each forwarded rollout ended (ready + rewards, or
failed and never a reward), with the agent host's client tokens. The reporter's boto3 adapter is checked against a
loopback job runtime speaking the service model's protocol."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lambdas.mtrl_forwarder import function as forwarder_function
from lambdas.mtrl_reporter import function as reporter_function
from rollout_pipeline.adapters.clients import ClientFactory
from rollout_pipeline.adapters.job_runtime import JOB_RUNTIME_SERVICE, BotoJobRuntime
from rollout_pipeline.config import ExperimentConfig, mtrl_client_token
from rollout_pipeline.contracts import DetailType, FileOptions
from rollout_pipeline.contracts.mtrl import mtrl_batch_id, mtrl_source
from rollout_pipeline.lifecycle.mtrl_report import MtrlReporter
from rollout_pipeline.local.lambda_runtime import LambdaContext
from rollout_pipeline.local.mtrl import JobRuntimeStandIn
from rollout_pipeline.local.resources import LOCAL_ACCOUNT, ExperimentResources
from rollout_pipeline.wiring import Wiring
from tests.conftest import REGION, receive_all

JOB = f"arn:aws:sagemaker:{REGION}:{LOCAL_ACCOUNT}:job/mtrl-it"
EVENT = {
    "prompt": "What is 2 + 3?",
    "metadata": {"jobArn": JOB, "rolloutId": "traj-1"},
    "inferenceParams": {"temperature": 0.5, "maxTokens": 32},
}
FORWARDER_ARN = f"arn:aws:lambda:{REGION}:{LOCAL_ACCOUNT}:function:rollouts-test-exp-mtrl-forwarder"
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish")


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    return ExperimentConfig(name="test-exp", agent_kind="rft", mtrl_environment=True, group_size=4, max_sessions=20)


@pytest.fixture
def wiring(resources: ExperimentResources) -> Wiring:
    return Wiring(resources.settings())


@pytest.fixture(autouse=True)
def no_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")


def _invoke(handler: Any, event: Any) -> dict[str, Any]:
    return dict(handler(event, LambdaContext("mtrl-forwarder", 30.0, invoked_function_arn=FORWARDER_ARN)))


def test_repeated_and_concurrent_invocations_enqueue_one_rollout(
    resources: ExperimentResources, wiring: Wiring
) -> None:
    handler = forwarder_function.bind(wiring.mtrl_forwarder())
    assert _invoke(handler, EVENT) == {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda event: _invoke(handler, event), [EVENT, {"body": json.dumps(EVENT)}] * 3))
    assert answers == [{}] * 6

    messages = receive_all(resources.rollout_queue_url)
    assert len(messages) == 1, messages
    (message,) = messages
    batch_id = mtrl_batch_id(JOB, "traj-1")
    assert (message["batch_id"], message["input_id"], message["group_size"], message["attempt"]) == (
        batch_id,
        "traj-1",
        1,
        1,
    )
    assert message["payload"] == {"prompt": "What is 2 + 3?", "metadata": {"jobArn": JOB, "rolloutId": "traj-1"}}
    assert message["rollout_overrides"] == {"sampling_params": {"temperature": 0.5, "max_tokens": 32}}
    batch = wiring.ledger().batches.read_batch(batch_id)
    assert batch is not None
    assert (batch.rollouts_total, batch.rollouts_enqueued, batch.source) == (1, 1, mtrl_source(JOB, "traj-1"))
    assert batch.options is not None
    assert batch.options.max_attempts == 1


def test_concurrent_first_invocations_race_to_one_batch(resources: ExperimentResources, wiring: Wiring) -> None:
    handler = forwarder_function.bind(wiring.mtrl_forwarder())
    barrier = threading.Barrier(4)

    def invoke(_index: int) -> dict[str, Any]:
        barrier.wait(timeout=30)
        return _invoke(handler, {**EVENT, "metadata": {"jobArn": JOB, "rolloutId": "race"}})

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(invoke, range(4))) == [{}] * 4
    assert len(receive_all(resources.rollout_queue_url)) == 1


def test_an_invocation_that_crashed_mid_way_is_taken_over_by_the_next(
    resources: ExperimentResources, wiring: Wiring
) -> None:
    """A batch created by an invocation that died before writing its row (its lease already expired): the next
    invocation finishes it, and one more enqueues nothing."""
    batch_id = mtrl_batch_id(JOB, "traj-1")
    created = wiring.ledger().batches.create_batch(
        exp_id="test-exp",
        batch_id=batch_id,
        options=FileOptions.defaults(resources.config).model_copy(update={"group_size": 1, "max_attempts": 1}),
        source=mtrl_source(JOB, "traj-1"),
        lease_owner="a-dead-invocation",
        lease_seconds=-1,
    )
    assert created is not None
    handler = forwarder_function.bind(wiring.mtrl_forwarder())
    assert _invoke(handler, EVENT) == {}
    assert _invoke(handler, EVENT) == {}
    assert len(receive_all(resources.rollout_queue_url)) == 1
    batch = wiring.ledger().batches.read_batch(batch_id)
    assert batch is not None
    assert (batch.rollouts_total, batch.rollouts_enqueued) == (1, 1)


def test_a_refusal_writes_nothing(resources: ExperimentResources, wiring: Wiring) -> None:
    handler = forwarder_function.bind(wiring.mtrl_forwarder())
    answer = _invoke(handler, {**EVENT, "metadata": {"jobArn": JOB, "rolloutId": "a/b"}})
    assert answer["errorType"] == "ValidationError"
    other = JOB.replace(LOCAL_ACCOUNT, "999999999999")
    assert _invoke(handler, {**EVENT, "metadata": {"jobArn": other, "rolloutId": "x"}})["errorType"] == "AccessDenied"
    assert receive_all(resources.rollout_queue_url) == []
    assert wiring.ledger().batches.recent_batch_ids() == []


# ------------------------------------------------------------------------------------------------ the reporter


class _Runtime:
    """Records the reports; answers each from `answers` (True: taken, False: already terminal) or raises."""

    def __init__(self, *, taken: bool = True, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.taken = taken
        self.error = error

    def complete_rollout(self, job_arn: str, trajectory_id: str, status: str, client_token: str) -> bool:
        return self._record("complete", job_arn, trajectory_id, status, client_token)

    def update_reward(self, job_arn: str, trajectory_id: str, rewards: Any, client_token: str) -> bool:
        return self._record("reward", job_arn, trajectory_id, list(rewards), client_token)

    def _record(self, *call: Any) -> bool:
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        return self.taken


def _forwarded(wiring: Wiring, rollout_id: str) -> str:
    event = {**EVENT, "metadata": {"jobArn": JOB, "rolloutId": rollout_id}}
    assert _invoke(forwarder_function.bind(wiring.mtrl_forwarder()), event) == {}
    return mtrl_batch_id(JOB, rollout_id)


def _record(detail_type: DetailType, batch_id: str, **detail: Any) -> dict[str, Any]:
    base = {
        "event_id": f"e-{batch_id}",
        "exp_id": "test-exp",
        "batch_id": batch_id,
        "input_id": "x",
        "index": 0,
        "rollout_id": "x#0",
        "timings": {},
    }
    event = {"source": "rollout.pipeline", "detail-type": detail_type.value, "detail": {**base, **detail}}
    return {"messageId": f"m-{batch_id}-{detail_type.name}", "body": json.dumps(event)}


def _completed(batch_id: str, rewards: Any) -> dict[str, Any]:
    return _record(
        DetailType.ROLLOUT_COMPLETED,
        batch_id,
        session_id="s" * 40,
        attempt=1,
        rewards=rewards,
        reward=rewards[-1] if isinstance(rewards, list) else rewards,
        result_uri="s3://b/k",
    )


def _failed(batch_id: str, reason: str) -> dict[str, Any]:
    return _record(DetailType.ROLLOUT_FAILED, batch_id, reason=reason, error="boom", attempts_used=1)


def test_the_reporter_reports_ready_and_rewards_or_failed_and_never_a_reward(
    resources: ExperimentResources, wiring: Wiring
) -> None:
    ok, timed_out, crashed = (_forwarded(wiring, rid) for rid in ("ok-1", "late-1", "crash-1"))
    runtime = _Runtime()
    reporter = MtrlReporter(wiring.ledger(), runtime, "test-exp")
    records = [_completed(ok, [0.0, 1.0]), _failed(timed_out, "timeout"), _failed(crashed, "invoke_rejected")]
    result = reporter.handle_records(records)
    assert result.failures == {}
    assert sorted(result.outcomes.values()) == ["failed", "failed", "ready"]
    assert runtime.calls == [
        ("complete", JOB, "ok-1", "ready", mtrl_client_token(JOB, "ok-1", "complete-ready")),
        ("reward", JOB, "ok-1", [0.0, 1.0], mtrl_client_token(JOB, "ok-1", "reward")),
        ("complete", JOB, "late-1", "failed", mtrl_client_token(JOB, "late-1", "complete-failed")),
        ("complete", JOB, "crash-1", "failed", mtrl_client_token(JOB, "crash-1", "complete-failed")),
    ]


def test_the_reporter_ignores_other_batches_and_retries_on_errors(
    resources: ExperimentResources, wiring: Wiring
) -> None:
    batch = _forwarded(wiring, "ok-2")
    runtime = _Runtime(taken=False)
    reporter = MtrlReporter(wiring.ledger(), runtime, "test-exp")
    other = {**_failed("sdk-0123456789ab", "timeout"), "messageId": "other"}
    result = reporter.handle_records([_failed(batch, "agent_error"), other])
    assert result.outcomes == {f"m-{batch}-ROLLOUT_FAILED": "already terminal", "other": "ignored"}
    failing = MtrlReporter(wiring.ledger(), _Runtime(error=RuntimeError("throttled")), "test-exp")
    handler = reporter_function.bind(failing)
    response = handler({"Records": [_completed(batch, 1.0)]}, LambdaContext("mtrl-reporter", 60.0))
    assert response == {"batchItemFailures": [{"itemIdentifier": f"m-{batch}-ROLLOUT_COMPLETED"}]}


# ------------------------------------------------------------------------------------------------ the boto3 adapter


@pytest.fixture
def job_runtime() -> Iterator[JobRuntimeStandIn]:
    with JobRuntimeStandIn("http://127.0.0.1:9/v1", job_arn=JOB) as runtime:
        runtime.open("t-1")
        yield runtime


def test_the_adapter_speaks_the_service_model_and_takes_conflicts_as_final(
    aws_env: None, job_runtime: JobRuntimeStandIn
) -> None:
    """Real botocore (SigV4, rest-json) against the loopback runtime: tokens make a repeat a no-op, a second
    terminal report is a ConflictException (False), an unknown trajectory a ResourceNotFoundException (False)."""
    client = ClientFactory(region=REGION, endpoint_url=job_runtime.root_url).client(JOB_RUNTIME_SERVICE)
    runtime = BotoJobRuntime(client)
    token = mtrl_client_token(JOB, "t-1", "complete-ready")
    assert runtime.complete_rollout(JOB, "t-1", "ready", token) is True
    assert runtime.complete_rollout(JOB, "t-1", "ready", token) is True, "the same token: a no-op"
    assert runtime.update_reward(JOB, "t-1", [0.5], mtrl_client_token(JOB, "t-1", "reward")) is True
    failed = mtrl_client_token(JOB, "t-1", "complete-failed")
    assert runtime.complete_rollout(JOB, "t-1", "failed", failed) is False
    assert runtime.complete_rollout(JOB, "unknown", "failed", failed) is False
    trajectory = job_runtime.snapshot()["t-1"]
    assert (trajectory.status, trajectory.rewards) == ("ready", [0.5])
    assert {report["auth"] for report in trajectory.reports} == {"sigv4"}
    assert trajectory.reports[0]["body"] == {"TrajectoryId": "t-1", "Status": "ready", "ClientToken": token}
