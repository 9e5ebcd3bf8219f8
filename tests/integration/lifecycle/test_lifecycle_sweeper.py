"""The sweeper: repeated and concurrent sweeps change nothing twice; the Lambda handlers' edges (poison messages,
the sweeper handler)."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.contracts import RolloutMessage
from rollout_pipeline.fakes import faithful
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.outbox import OUTBOX_ENQUEUE, OUTBOX_STOP
from rollout_pipeline.ledger.rollouts import RolloutRecord
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.lifecycle.stops import PROMPT_RETRY_S
from rollout_pipeline.lifecycle.sweeper import SweepResult, sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import STOP_FAILED
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ShiftedClock,
    by_type,
    dispatch_once,
    ledger_item,
    moto_lock,
    paced_until,
    receive_records,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

BATCH = ids.batch_id_for_upload("in", "datasets/sweeper.jsonl", "v1")


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return AgentBehaviour(kind="hang")


def concurrent_sweeps(deps: LifecycleDeps, n: int) -> list[SweepResult]:
    reports: list[SweepResult] = []
    barrier = threading.Barrier(n)

    def run() -> None:
        barrier.wait()
        reports.append(sweep(deps))

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return reports


def test_concurrent_and_repeated_sweeps_retry_once_and_fail_once(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, clock: ShiftedClock
) -> None:
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}, "c": {}}, max_attempts=2))
    assert Counter(dispatch_once(resources, deps).outcomes.values()) == {Dispatch.INVOKED: 6}
    clock.advance(resources.config.rollout_timeout_s + 1)
    reports = concurrent_sweeps(deps, 4)
    assert sum(r.retried for r in reports) == 6
    assert sum(r.timed_out for r in reports) == 0
    assert all(r.errors == [] for r in reports), [r.errors for r in reports]
    retries = receive_records(resources.rollout_queue_url)
    assert len(retries) == 6  # one retry message per rollout, whoever swept
    assert {RolloutMessage.model_validate_json(r["body"]).attempt for r in retries} == {2}
    assert slots_in_flight(resources) == 0
    assert fake.running == set()
    for _ in range(2):
        assert sweep(deps).expired_seen == 0

    result = dispatch_records(retries, deps, wait_until=paced_until())
    assert Counter(result.outcomes.values()) == {Dispatch.INVOKED: 6}
    clock.advance(resources.config.rollout_timeout_s + 1)
    reports = concurrent_sweeps(deps, 4)
    assert sum(r.timed_out for r in reports) == 6
    for _ in range(2):
        assert sweep(deps) == SweepResult()
    events = trainer_events(resources)
    failed = by_type(events, "Rollout Failed")
    assert len(failed) == 6
    assert {f["reason"] for f in failed} == {"timeout"}
    assert {f["attempts_used"] for f in failed} == {2}
    assert len(by_type(events, "Group Completed")) == 3
    assert len(by_type(events, "Batch Completed")) == 1
    assert max(Counter(e["detail"]["event_id"] for e in events).values()) == 1
    assert fake.running == set()
    assert len({c.session_id for c in fake.invocations()}) == 12  # a new session per attempt
    assert slots_in_flight(resources) == 0


def test_sweeper_handler(resources: ExperimentResources, deps: LifecycleDeps, clock: ShiftedClock) -> None:
    from lambdas import sweeper as sweeper_lambda

    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=1))
    dispatch_once(resources, deps)
    clock.advance(resources.config.rollout_timeout_s + 1)
    context = SimpleNamespace(
        function_name="sweeper",
        memory_limit_in_mb=256,
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:sweeper",
        aws_request_id="r",
    )
    summary: dict[str, Any] = sweeper_lambda.function.bind(deps)({"source": "aws.scheduler"}, context)
    assert summary["timed_out"] == 1
    assert [f["reason"] for f in by_type(trainer_events(resources), "Rollout Failed")] == ["timeout"]


def test_poison_message_fails_alone(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    good = receive_records(resources.rollout_queue_url)
    poison = [
        {"messageId": "bad-json", "body": "{not json"},
        {"messageId": "bad-shape", "body": '{"v": 1, "exp_id": "test-exp"}'},
        {"messageId": "bad-id", "body": good[0]["body"].replace('"input_id":"a"', '"input_id":"../x"')},
    ]
    result = dispatch_records([*poison, *good], deps, wait_until=paced_until())
    assert set(result.failures) == {"bad-json", "bad-shape", "bad-id"}
    assert list(result.outcomes.values()) == [Dispatch.INVOKED]
    assert receive_all(resources.dlq_urls["rollout"]) == []


def test_throttled_stop_stays_pending_across_the_retry_until_done(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    clock: ShiftedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollout_pipeline.ports import RuntimeThrottled

    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=2))
    dispatch_once(resources, deps)
    sid1 = ids.session_id("test-exp", BATCH, "a", 0, 1)

    def throttled(session_id: str, wait_until: float | None = None) -> None:
        raise RuntimeThrottled("StopRuntimeSession: ThrottlingException")

    monkeypatch.setattr(deps.limits.runtime, "stop", throttled)
    clock.advance(resources.config.rollout_timeout_s + 1)
    report = sweep(deps)
    assert report.retried == 1
    # The drain's stop failed: not an error any more (stops are best-effort, counted), it stays in the outbox
    # with the session's slot held...
    assert report.errors == []
    assert deps.metrics.drain()[0][STOP_FAILED] == 1 + len(PROMPT_RETRY_S)  # tried again at once, then left
    assert fake.running == {sid1}
    assert slots_in_flight(resources) == 1
    retries = receive_records(resources.rollout_queue_url)
    assert len(retries) == 1  # ...but the retry went out anyway
    monkeypatch.undo()

    fake.behaviour = AgentBehaviour(rewards=1.0)
    assert list(dispatch_records(retries, deps, wait_until=paced_until()).outcomes.values()) == [Dispatch.INVOKED]
    from tests.integration.lifecycle_support import complete_once

    complete_once(resources, deps)
    assert fake.running == set()  # the second attempt's terminal drain also stopped the first session
    assert sid1 in fake.stopped
    item = ledger_item(resources, keys.rollout_key(BATCH, "a", 0))
    assert item["state"] == "succeeded"
    assert "outbox" not in item
    assert "stop_sessions" not in item
    assert "held_slots" not in item
    assert slots_in_flight(resources) == 0
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1


def test_stop_bookkeeping_retries_a_transaction_holding_the_rollout_item(
    resources: ExperimentResources,
    deps: LifecycleDeps,
    clock: ShiftedClock,
    aws_profile: faithful.FaithfulProfile | None,
) -> None:
    """On AWS a plain write on an item an in-flight transaction holds fails with TransactionConflictException: a
    concurrent sweep's (cancelled) requeue transaction on the same rollout made the owner's drain fail (the flaky
    concurrent-sweeps test). The outbox's stop bookkeeping writes retry such conflicts like every other write."""
    if aws_profile is None:
        pytest.skip("needs the faithful profile")
    aws_profile.hot_threshold, aws_profile.hot_window_s, aws_profile.max_streak = 1, 600.0, 2
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=2))
    dispatch_once(resources, deps)
    clock.advance(resources.config.rollout_timeout_s + 1)
    stale = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert stale is not None
    assert stale.session_id
    sid = stale.session_id
    assert deps.ledger.rollouts.requeue_for_retry(stale, next_session_id="next", stop_pending=True)
    rollout = (resources.table_name, faithful.key_text(keys.rollout_key(BATCH, "a", 0)))

    def held() -> RolloutRecord:
        rec = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
        assert rec is not None
        aws_profile.conflict_rate = 0.0
        assert aws_profile.begin_transaction([rollout]) is None
        aws_profile.conflict_rate = 1.0  # the item is hot: the next two writes on it conflict
        return rec

    deps.ledger.outbox.outbox_done(held(), frozenset({OUTBOX_ENQUEUE}))
    assert ledger_item(resources, keys.rollout_key(BATCH, "a", 0))["outbox"] == {OUTBOX_STOP}
    deps.ledger.outbox.note_stop_failed(held(), next_epoch=1)
    assert ledger_item(resources, keys.rollout_key(BATCH, "a", 0))["stop_tries"] == 1
    assert deps.ledger.outbox.free_stopped(held(), sid)
    assert "stop_sessions" not in ledger_item(resources, keys.rollout_key(BATCH, "a", 0))
    assert aws_profile.stats.plain_conflicts >= 6


def test_a_sweep_stops_at_its_deadline_and_the_next_one_goes_on(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a mass expiry one sweep must not outlast its Lambda's timeout every minute: it stops starting new
    rollouts at `wait_until` and the next run picks up the rest (each expiry takes 100 s of an injected clock, so
    the machine's own speed, a few seconds at worst, never decides)."""
    from rollout_pipeline.lifecycle import sweeper
    from tests.integration.lifecycle_support import make_deps

    clock = ShiftedClock()
    deps = make_deps(resources, fake, clock=clock)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}, "c": {}}, max_attempts=2))
    assert Counter(dispatch_once(resources, deps).outcomes.values()) == {Dispatch.INVOKED: 6}
    clock.advance(resources.config.rollout_timeout_s + 1)
    expire = sweeper._expire

    def slow_expire(*args: Any, **kwargs: Any) -> None:
        expire(*args, **kwargs)
        clock.monotonic_offset += 100.0

    monkeypatch.setattr(sweeper, "_expire", slow_expire)

    first = sweep(deps, wait_until=clock.monotonic() + 250.0)
    assert first.out_of_time
    assert (first.expired_seen, first.retried) == (3, 3), "started 0 s, 100 s and 200 s in; not at 300 s"
    assert first.errors == []
    second = sweep(deps, wait_until=clock.monotonic() + 36000.0)
    assert not second.out_of_time
    assert second.retried == 3
    assert len(receive_records(resources.rollout_queue_url)) == 6, "each rollout retried once over the two runs"

    late = sweep(deps, wait_until=clock.monotonic() - 1)  # no time at all: nothing started
    assert late.out_of_time
    assert late.expired_seen == late.outbox_drained == late.released == 0
