"""Exactly one terminal state, its event delivered at least once with one event_id, whatever is duplicated,
redelivered or crashes between steps."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.outbox import OUTBOX_LEASE_S
from rollout_pipeline.lifecycle import stops
from rollout_pipeline.lifecycle.completion import Completion, complete_records, handle_result_event
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import LATE_OR_UNKNOWN
from rollout_pipeline.ports import PublishError
from tests.integration.lifecycle_support import (
    PACED_WAIT_S,
    ShiftedClock,
    ack,
    batch_view,
    by_type,
    drive,
    ledger_item,
    make_deps,
    moto_lock,
    paced_until,
    receive_records,
    release,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

BATCH = ids.batch_id_for_upload("in", "datasets/once.jsonl", "v1")
SID = ids.session_id("test-exp", BATCH, "a", 0, 1)


@pytest.fixture
def deps(resources: ExperimentResources, fake: FakeAgentRuntime, clock: ShiftedClock) -> LifecycleDeps:
    return make_deps(resources, fake, clock=clock, reinvoke_grace_s=0.0)


class FlakyPublisher:
    """Fails the first `failures` publish calls (nothing reaches the bus), then delegates."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def publish(self, details: Sequence[Any]) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise PublishError("bus unavailable")
        self.inner.publish(details)


def one_rollout(resources: ExperimentResources, group_size: int = 1) -> None:
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=group_size))


def event_ids(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["detail"]["event_id"] for e in events)


def assert_single_terminal(resources: ExperimentResources, events: list[dict[str, Any]], total: int = 1) -> None:
    types = Counter(e["detail-type"] for e in events)
    assert types["Rollout Completed"] + types["Rollout Failed"] == total
    assert max(event_ids(events).values()) == 1
    assert batch_view(resources, BATCH).terminal == total
    assert slots_in_flight(resources) == 0


def test_duplicated_s3_events_end_the_rollout_once(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    one_rollout(resources)
    records = receive_records(resources.rollout_queue_url)
    ack(resources.rollout_queue_url, records, dispatch_records(records, deps, wait_until=paced_until()).failures)
    completions = receive_records(resources.completion_queue_url)
    assert len(completions) == 1
    # The same S3 event delivered three times (S3 and EventBridge are at-least-once), in one batch and later.
    first = complete_records([*completions, {**completions[0], "messageId": "dup-1"}], deps)
    assert sorted(first.outcomes.values()) == [Completion.LATE_OR_UNKNOWN, Completion.SUCCEEDED]
    again = complete_records([{**completions[0], "messageId": "dup-2"}], deps)
    assert list(again.outcomes.values()) == [Completion.LATE_OR_UNKNOWN]
    assert deps.metrics.drain()[0][LATE_OR_UNKNOWN] == 2
    events = trainer_events(resources)
    assert_single_terminal(resources, events)
    assert len(fake.stops()) == 1  # the duplicates did not even stop the session again


def test_concurrent_duplicate_completions(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    one_rollout(resources, group_size=1)
    records = receive_records(resources.rollout_queue_url)
    dispatch_records(records, deps, wait_until=paced_until())
    (completion,) = receive_records(resources.completion_queue_url)
    import json

    event = json.loads(completion["body"])
    outcomes: list[Completion] = []
    barrier = threading.Barrier(6)

    def worker() -> None:
        barrier.wait()
        outcomes.append(handle_result_event(event, deps))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(Completion.SUCCEEDED) == 1
    assert all(o in (Completion.SUCCEEDED, Completion.LATE_OR_UNKNOWN, Completion.RESUMED) for o in outcomes)
    events = trainer_events(resources)
    assert_single_terminal(resources, [e for e in events if e["detail-type"].startswith("Rollout")])
    assert ledger_item(resources, keys.group_key(BATCH, "a"))["terminal"] == 1


def test_redelivered_rollout_message_never_starts_a_second_session(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    fake.behaviour = AgentBehaviour(kind="manual")
    one_rollout(resources)
    records = receive_records(resources.rollout_queue_url)
    assert list(dispatch_records(records, deps, wait_until=paced_until()).outcomes.values()) == [Dispatch.INVOKED]
    # Redelivery (and a duplicate sent by someone else) while it runs: acknowledged, nothing invoked.
    again = dispatch_records([*records, {**records[0], "messageId": "dup"}], deps, wait_until=paced_until())
    assert list(again.outcomes.values()) == [Dispatch.DUPLICATE, Dispatch.DUPLICATE]
    assert fake.invoked == Counter({SID: 1})
    fake.finish(SID)
    drive(resources, deps)
    # After the end: a redelivery is stale.
    late = dispatch_records(records, deps, wait_until=paced_until())
    assert list(late.outcomes.values()) == [Dispatch.STALE]
    assert fake.invoked == Counter({SID: 1})
    assert_single_terminal(resources, trainer_events(resources))


def test_crash_after_dispatch_record_before_invoke_reinvokes_same_session(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_rollout(resources)
    records = receive_records(resources.rollout_queue_url)

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Lambda killed")

    monkeypatch.setattr(deps.limits.runtime, "invoke", crash)
    result = dispatch_records(records, deps, wait_until=paced_until())
    assert list(result.failures) == [records[0]["messageId"]]  # not acknowledged: SQS redelivers it
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert item["state"] == "dispatched"
    assert "invoked_at" not in item
    monkeypatch.undo()
    release(resources.rollout_queue_url, records)
    redelivered = receive_records(resources.rollout_queue_url)
    assert redelivered[0]["attributes"]["ApproximateReceiveCount"] == "2"
    result = dispatch_records(redelivered, deps, wait_until=paced_until())
    assert list(result.outcomes.values()) == [Dispatch.REINVOKED]
    ack(resources.rollout_queue_url, redelivered, result.failures)
    assert set(fake.invoked) == {SID}
    assert slots_in_flight(resources) in (0, 1)
    drive(resources, deps)
    assert_single_terminal(resources, trainer_events(resources))


def test_crash_after_invoke_before_ledger_update_reuses_the_session(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session started but `invoked_at` was never written: the redelivery invokes the SAME session id."""
    fake.behaviour = AgentBehaviour(kind="manual")
    one_rollout(resources)
    records = receive_records(resources.rollout_queue_url)
    original = deps.ledger.rollouts.mark_invoked
    calls = {"n": 0}

    def crash_once(*args: Any, **kwargs: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("Lambda killed after InvokeAgentRuntime")
        return original(*args, **kwargs)

    monkeypatch.setattr(deps.ledger.rollouts, "mark_invoked", crash_once)
    assert dispatch_records(records, deps, wait_until=time.monotonic() + PACED_WAIT_S).failures
    assert fake.running == {SID}

    # Within the grace period a concurrent duplicate leaves it alone...
    deps.reinvoke_grace_s = 3600
    assert list(dispatch_records(records, deps, wait_until=time.monotonic() + PACED_WAIT_S).outcomes.values()) == [
        Dispatch.DUPLICATE
    ]
    # ...the real redelivery comes after the visibility timeout (> grace) and re-invokes the same session.
    deps.reinvoke_grace_s = 0
    result = dispatch_records(records, deps, wait_until=time.monotonic() + PACED_WAIT_S)
    assert list(result.outcomes.values()) == [Dispatch.REINVOKED]
    assert fake.invoked == Counter({SID: 2})
    assert slots_in_flight(resources) == 1
    fake.finish(SID)
    fake.finish(SID)  # both invocations of the session write the same key: two S3 events, one terminal
    drive(resources, deps)
    assert_single_terminal(resources, trainer_events(resources))


def test_crash_between_state_change_and_publish_redelivery_publishes(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    deps.publisher = FlakyPublisher(deps.publisher, failures=2)
    one_rollout(resources)
    records = receive_records(resources.rollout_queue_url)
    dispatch_records(records, deps, wait_until=paced_until())
    completions = receive_records(resources.completion_queue_url)
    first = complete_records(completions, deps)
    assert list(first.failures) == [completions[0]["messageId"]]  # state changed, event not out: not acked
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert item["state"] == "succeeded"
    # The stop comes after the event now (the result is recorded before it), holding the session's slot.
    assert item["outbox"] == {"publish", "stop"}
    assert item["held_slots"] == {item["session_id"]}
    assert fake.stops() == []
    assert trainer_events(resources) == []
    second = complete_records(completions, deps)  # redelivery: publish fails again
    assert second.failures
    third = complete_records(completions, deps)
    assert list(third.outcomes.values()) == [Completion.RESUMED]
    events = trainer_events(resources)
    assert_single_terminal(resources, events)
    assert {e["detail-type"] for e in events} == {"Rollout Completed", "Group Completed", "Batch Completed"}
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert "outbox" not in item
    assert keys.OUTBOX_PK not in item
    assert len(fake.stops()) == 1
    assert slots_in_flight(resources) == 0


def test_sweeper_drains_an_outbox_whose_message_was_lost(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, clock: ShiftedClock
) -> None:
    deps.publisher = FlakyPublisher(deps.publisher, failures=1)
    one_rollout(resources)
    drive(resources, deps)  # the completion message fails once and is not acked; pretend it is lost
    receive_all_completion = receive_records(resources.completion_queue_url)
    ack(resources.completion_queue_url, receive_all_completion, [])
    assert trainer_events(resources) == []
    assert sweep(deps).outbox_drained == 0  # too young: its owner may still be at it
    clock.advance(deps.outbox_age_s + 1)
    assert sweep(deps).outbox_drained == 1
    assert sweep(deps).outbox_drained == 0
    assert_single_terminal(resources, trainer_events(resources))


def test_publish_succeeded_but_outbox_not_cleared_republishes_same_event_id(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    clock: ShiftedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one_rollout(resources)
    # The process dies right after the publish: before the stop and its write, which records the publish too (no
    # write of its own), and before anything can give the entry back.
    crash = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("crash"))  # noqa: E731
    monkeypatch.setattr(stops, "finish_stops", crash)
    monkeypatch.setattr(deps.ledger.outbox, "return_outbox", crash)
    records = receive_records(resources.rollout_queue_url)
    dispatch_records(records, deps, wait_until=paced_until())
    completions = receive_records(resources.completion_queue_url)
    with pytest.raises(RuntimeError, match="crash"):
        complete_records(completions, deps)
    monkeypatch.undo()
    published = trainer_events(resources)
    assert len(by_type(published, "Rollout Completed")) == 1
    # A redelivery while the dead owner's lease runs changes nothing; the sweeper takes the entry over after it.
    assert list(complete_records(completions, deps).outcomes.values()) == [Completion.LATE_OR_UNKNOWN]
    assert slots_in_flight(resources) == 1
    clock.advance(OUTBOX_LEASE_S + deps.outbox_age_s + 1)
    assert sweep(deps).outbox_drained == 1
    events = published + trainer_events(resources)
    ids_seen = event_ids([e for e in events if e["detail-type"] == "Rollout Completed"])
    assert list(ids_seen.values()) == [2]  # delivered twice, with one event_id: the SDK de-duplicates
    assert batch_view(resources, BATCH).terminal == 1
    assert len(by_type(events, "Group Completed")) == 2
    assert len(fake.stops()) == 1
    assert slots_in_flight(resources) == 0
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert "outbox" not in item
    assert "held_slots" not in item
