"""Every failure reason ends the rollout once, as `Rollout Failed` with that reason, never as reward 0."""

from __future__ import annotations

import pytest

from rollout_pipeline import ids
from rollout_pipeline.contracts import GroupCompleted, RolloutFailed
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.completion import Completion, complete_records
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import LATE_OR_UNKNOWN, TIMED_OUT
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ShiftedClock,
    batch_view,
    by_type,
    dispatch_once,
    drive,
    make_deps,
    moto_lock,
    receive_records,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

BATCH = ids.batch_id_for_upload("in", "datasets/failures.jsonl", "v1")


def run_one(resources: ExperimentResources, deps: LifecycleDeps) -> tuple[RolloutFailed, list[dict[str, object]]]:
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=1))
    drive(resources, deps)
    events = trainer_events(resources)
    (failed,) = [RolloutFailed.model_validate(d) for d in by_type(events, "Rollout Failed")]
    assert by_type(events, "Rollout Completed") == []
    return failed, events


def assert_counted_once(resources: ExperimentResources, reason: str, events: list[dict[str, object]]) -> None:
    batch = batch_view(resources, BATCH)
    assert (batch.terminal, batch.failed, batch.succeeded, batch.reward_count) == (1, 1, 0, 0)
    assert batch.failed_by_reason == {reason: 1}
    (group,) = [GroupCompleted.model_validate(d) for d in by_type(events, "Group Completed")]
    assert group.rewards == [None]
    assert group.failures == {"0": reason}
    assert group.reward_mean is None
    (done,) = by_type(events, "Batch Completed")
    assert done["failed_by_reason"] == {reason: 1}
    assert slots_in_flight(resources) == 0


@pytest.mark.parametrize(
    ("behaviour", "reason", "error_part"),
    [
        (AgentBehaviour(kind="agent_error", error="ValueError: tool crashed"), "agent_error", "tool crashed"),
        (AgentBehaviour(kind="garbage"), "invalid_result", "not valid JSON"),
        (AgentBehaviour(kind="garbage", body=b"[1, 2]"), "invalid_result", "must be a JSON object"),
        (AgentBehaviour(kind="invalid"), "invalid_result", "no 'rewards'"),
        (AgentBehaviour(rewards=[]), "invalid_result", "non-empty list"),
        (AgentBehaviour(rewards=1e300), "invalid_result", "rewards beyond"),
    ],
)
def test_result_failures(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    behaviour: AgentBehaviour,
    reason: str,
    error_part: str,
) -> None:
    fake.behaviour = behaviour
    failed, events = run_one(resources, deps)
    assert failed.reason == reason
    assert error_part in failed.error
    assert failed.attempts_used == 1
    assert failed.result_uri is not None
    assert failed.result_uri.startswith(f"s3://{resources.results_bucket}/test-exp/a/")
    assert failed.event_id == ids.event_id("Rollout Failed", "test-exp", BATCH, "a", 0)
    assert_counted_once(resources, reason, events)
    assert fake.running == set()


def test_oversized_result_is_invalid_without_reading_it_all(
    resources: ExperimentResources, fake: FakeAgentRuntime, clock: ShiftedClock
) -> None:
    settings = resources.settings()
    small = settings.model_copy(
        update={"experiment": settings.experiment.model_copy(update={"result_max_bytes": 1024})}
    )
    deps = make_deps(resources, fake, clock=clock)
    deps.settings = small
    fake.behaviour = AgentBehaviour(extra={"trace": "x" * 5000})
    failed, events = run_one(resources, deps)
    assert failed.reason == "invalid_result"
    assert "larger than the limit of 1024 bytes" in failed.error
    assert_counted_once(resources, "invalid_result", events)


def test_rejected_invoke_fails_the_rollout_and_frees_the_slot(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    fake.behaviour = AgentBehaviour(kind="reject")
    failed, events = run_one(resources, deps)
    assert failed.reason == "invoke_rejected"
    assert "ValidationException" in failed.error
    assert failed.session_id == ids.session_id("test-exp", BATCH, "a", 0, 1)
    assert_counted_once(resources, "invoke_rejected", events)
    assert fake.running == set()
    assert receive_all(resources.dlq_urls["rollout"]) == []


def test_timeout_retries_with_a_new_session_then_fails(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, clock: ShiftedClock
) -> None:
    fake.behaviour = AgentBehaviour(kind="hang")
    send(
        resources,
        seed_batch(
            resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=1, max_attempts=2, rollout_timeout_s=60
        ),
    )
    assert set(dispatch_once(resources, deps).outcomes.values()) == {Dispatch.INVOKED}
    sid1 = ids.session_id("test-exp", BATCH, "a", 0, 1)
    assert fake.running == {sid1}

    assert sweep(deps).expired_seen == 0  # not due yet
    clock.advance(61)
    report = sweep(deps)
    assert (report.retried, report.timed_out) == (1, 0)
    assert sid1 in fake.stopped
    assert fake.running == set()
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert (item["state"], item["attempt"]) == ("queued", 2)
    assert slots_in_flight(resources) == 0
    assert sweep(deps).expired_seen == 0  # repeated sweep: nothing due, nothing resent

    # The retry message (attempt 2) is on the rollout queue, exactly once.
    records = receive_records(resources.rollout_queue_url)
    assert len(records) == 1
    assert '"attempt":2' in records[0]["body"]
    from tests.integration.lifecycle_support import release

    release(resources.rollout_queue_url, records)
    assert set(dispatch_once(resources, deps).outcomes.values()) == {Dispatch.INVOKED}
    sid2 = ids.session_id("test-exp", BATCH, "a", 0, 2)
    assert sid2 != sid1
    assert fake.running == {sid2}
    assert fake.payloads[sid2]["_rollout"]["attempt"] == 2
    assert fake.payloads[sid2]["q"] == 1

    clock.advance(61)
    assert sweep(deps).timed_out == 1
    for _ in range(3):
        assert sweep(deps).expired_seen == 0
    assert fake.running == set()
    events = trainer_events(resources)
    (failed,) = [RolloutFailed.model_validate(d) for d in by_type(events, "Rollout Failed")]
    assert failed.reason == "timeout"
    assert failed.attempts_used == 2
    assert failed.session_id == sid2
    assert_counted_once(resources, "timeout", events)
    counts, _ = deps.metrics.drain()
    assert counts[TIMED_OUT] == 2

    # A late result of attempt 1 changes nothing.
    fake.finish(sid1, AgentBehaviour(rewards=1.0))
    outcomes = complete_records(receive_records(resources.completion_queue_url), deps).outcomes
    assert list(outcomes.values()) == [Completion.LATE_OR_UNKNOWN]
    assert deps.metrics.drain()[0][LATE_OR_UNKNOWN] == 1
    assert trainer_events(resources) == []
    assert_counted_once(resources, "timeout", events)


def test_unknown_and_foreign_results_change_nothing(resources: ExperimentResources, deps: LifecycleDeps) -> None:
    from rollout_pipeline.adapters import clients

    s3 = clients.client("s3")
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    for key in ("junk.json", "test-exp/a/not-a-session.json", f"other-exp/a/{sid}.json", f"test-exp/a/{sid}.json"):
        s3.put_object(Bucket=resources.results_bucket, Key=key, Body=b'{"rewards": 1}')
    records = receive_records(resources.completion_queue_url)
    assert len(records) == 4
    result = complete_records([*records, {"messageId": "x", "body": '{"not": "an event"}'}], deps)
    assert result.failures == {}
    assert set(result.outcomes.values()) == {Completion.LATE_OR_UNKNOWN}
    assert deps.metrics.drain()[0][LATE_OR_UNKNOWN] == 5
    assert trainer_events(resources) == []
