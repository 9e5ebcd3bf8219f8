"""Cancel: queued rollouts are never dispatched, running ones are stopped, every rollout of the batch ends once
as `Rollout Failed` (cancelled) with its events, slots are freed; cancelling again changes nothing."""

from __future__ import annotations

from collections import Counter

import pytest

from rollout_pipeline import ids
from rollout_pipeline.contracts import BatchCompleted, RolloutFailed
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.cancel import cancel_batch
from rollout_pipeline.lifecycle.completion import Completion, complete_records
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ports import RuntimeThrottled
from tests.integration.lifecycle_support import (
    ShiftedClock,
    ack,
    batch_view,
    by_type,
    make_deps,
    moto_lock,
    paced_until,
    receive_records,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

BATCH = ids.batch_id_for_upload("in", "datasets/cancel.jsonl", "v1")


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return AgentBehaviour(kind="manual")


def test_cancel_ends_every_rollout_once(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    messages = seed_batch(resources, batch_id=BATCH, inputs={"run": {}, "queued": {}, "unsent": {}})
    by_input: dict[str, list[object]] = {}
    for m in messages:
        by_input.setdefault(m.input_id, []).append(m)
    send(resources, by_input["run"])  # type: ignore[arg-type]
    records = receive_records(resources.rollout_queue_url)
    assert set(dispatch_records(records, deps, wait_until=paced_until()).outcomes.values()) == {Dispatch.INVOKED}
    ack(resources.rollout_queue_url, records, [])
    running = set(fake.running)
    assert len(running) == 2
    # One of them already finished before the cancel: it stays succeeded.
    done_sid = ids.session_id("test-exp", BATCH, "run", 1, 1)
    fake.finish(done_sid)
    completions = receive_records(resources.completion_queue_url)
    assert list(complete_records(completions, deps).outcomes.values()) == [Completion.SUCCEEDED]
    ack(resources.completion_queue_url, completions, [])
    send(resources, by_input["queued"])  # type: ignore[arg-type]  # on the queue, not yet dispatched
    # "unsent": ingestion wrote the group but its messages are not out yet.

    report = cancel_batch(BATCH, deps)
    assert (report.found, report.cancelled, report.already_terminal, report.sessions_stopped) == (True, 5, 1, 1)
    assert report.drain_errors == []
    assert fake.running == set()
    assert ids.session_id("test-exp", BATCH, "run", 0, 1) in fake.stopped
    assert slots_in_flight(resources) == 0

    events = trainer_events(resources)
    failed = [RolloutFailed.model_validate(d) for d in by_type(events, "Rollout Failed")]
    assert sorted((f.input_id, f.index) for f in failed) == [
        ("queued", 0),
        ("queued", 1),
        ("run", 0),
        ("unsent", 0),
        ("unsent", 1),
    ]
    assert {f.reason for f in failed} == {"cancelled"}
    assert {f.policy_version for f in failed} == {"v7"}
    never_dispatched = next(f for f in failed if f.input_id == "unsent")
    assert never_dispatched.attempts_used == 0
    assert len(by_type(events, "Group Completed")) == 3
    (batch_done,) = [BatchCompleted.model_validate(d) for d in by_type(events, "Batch Completed")]
    assert (batch_done.succeeded, batch_done.failed, batch_done.failed_by_reason) == (1, 5, {"cancelled": 5})
    assert max(Counter(e["detail"]["event_id"] for e in events).values()) == 1

    # Queued messages reach the dispatcher: nothing is invoked, nothing changes.
    queued = receive_records(resources.rollout_queue_url)
    assert len(queued) == 2
    assert set(dispatch_records(queued, deps, wait_until=paced_until()).outcomes.values()) == {Dispatch.CANCELLED}
    assert len(fake.invocations()) == 2
    # Cancelling again and a late result of the stopped session change nothing.
    again = cancel_batch(BATCH, deps)
    assert (again.cancelled, again.already_terminal) == (0, 6)
    fake.finish(ids.session_id("test-exp", BATCH, "run", 0, 1), AgentBehaviour(rewards=1.0))
    late = receive_records(resources.completion_queue_url)
    assert list(complete_records(late, deps).outcomes.values()) == [Completion.LATE_OR_UNKNOWN]
    assert trainer_events(resources) == []
    batch = batch_view(resources, BATCH)
    assert (batch.status, batch.terminal, batch.failed_by_reason) == ("cancelled", 6, {"cancelled": 5})


def test_cancel_during_invoke_stops_the_new_session(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    """The batch is cancelled between the dispatch transaction and InvokeAgentRuntime: the session that starts
    anyway is stopped at once, and the rollout ends once as cancelled."""

    def cancel_meanwhile(inv: FakeInvocation) -> AgentBehaviour:
        cancel_batch(BATCH, deps)
        return AgentBehaviour(kind="manual")

    fake.behaviour = cancel_meanwhile
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    result = dispatch_records(receive_records(resources.rollout_queue_url), deps, wait_until=paced_until())
    assert list(result.outcomes.values()) == [Dispatch.STOPPED_LATE]
    assert fake.running == set()
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert (item["state"], item["reason"]) == ("failed", "cancelled")
    assert slots_in_flight(resources) == 0
    events = trainer_events(resources)
    assert [f["reason"] for f in by_type(events, "Rollout Failed")] == ["cancelled"]


def test_cancel_of_unknown_batch(resources: ExperimentResources, deps: LifecycleDeps) -> None:
    report = cancel_batch("no-such-batch-000000000000", deps)
    assert report.found is False
    assert report.cancelled == 0


class _StopFails(FakeAgentRuntime):
    """StopRuntimeSession fails with an unexpected error when the outbox is drained (as seen cancelling from a
    machine that cannot reach ACR). The rollout has ended first: stops come after the transition and the event
    (a throttled stop is no error at all: it is counted and retried, see test_lifecycle_stops)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.stop_calls: Counter[str] = Counter()

    def stop(self, session_id: str) -> None:
        self.stop_calls[session_id] += 1
        raise RuntimeError(f"StopRuntimeSession: 500 for {session_id}")


def test_cancel_counts_rollouts_ended_in_the_ledger_even_when_stopping_their_session_fails(
    resources: ExperimentResources,
) -> None:
    runtime = _StopFails(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    messages = seed_batch(resources, batch_id=BATCH, inputs={"run": {}})
    send(resources, messages)
    records = receive_records(resources.rollout_queue_url)
    assert set(dispatch_records(records, deps, wait_until=paced_until()).outcomes.values()) == {Dispatch.INVOKED}
    ack(resources.rollout_queue_url, records, [])

    report = cancel_batch(BATCH, deps)

    assert len(report.drain_errors) == 2, "the failed stops are reported, to be retried"
    assert report.cancelled == 2, "both rollouts did end as cancelled in the ledger"
    for index in (0, 1):
        item = rollout_item(resources, BATCH, "run", index)
        assert (item["state"], item["reason"]) == ("failed", "cancelled")
    runtime.close()


class _StopThrottled(FakeAgentRuntime):
    """StopRuntimeSession answers ThrottlingException: the stop is re-filed for the sweeper, not confirmed."""

    def stop(self, session_id: str) -> None:
        raise RuntimeThrottled(f"StopRuntimeSession: ThrottlingException for {session_id}")


def test_cancel_counts_only_confirmed_stops_as_stopped(resources: ExperimentResources) -> None:
    runtime = _StopThrottled(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"run": {}}))
    records = receive_records(resources.rollout_queue_url)
    assert set(dispatch_records(records, deps, wait_until=paced_until()).outcomes.values()) == {Dispatch.INVOKED}
    ack(resources.rollout_queue_url, records, [])

    report = cancel_batch(BATCH, deps)

    assert (report.cancelled, report.sessions_stopped, report.stops_pending) == (2, 0, 2)
    assert report.drain_errors == []
    for index in (0, 1):
        item = rollout_item(resources, BATCH, "run", index)
        assert (item["state"], item["reason"]) == ("failed", "cancelled")
        assert item.get("stop_sessions"), "left in the outbox for the sweeper"
    runtime.close()
