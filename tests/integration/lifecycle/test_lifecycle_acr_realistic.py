"""The lifecycle under AgentCore as it really behaves (the fake's AcrProfile): cold starts, unreliable stops,
held slots, late results, limits that fail loudly instead of spinning. No behaviour here depends on moto quirks:
the ledger is only read through its own items, the fake ACR is the only thing that runs sessions."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.completion import complete_records
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.lifecycle.stops import PROMPT_RETRY_S, STOP_TRIES
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import (
    ACR_THROTTLED,
    COLD_START_RETRIED,
    LIMIT_BACKLOG,
    NEW_SESSIONS,
    STOP_FAILED,
)
from rollout_pipeline.ports import RuntimeSessionNotFound, RuntimeThrottled
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    PACED_WAIT_S,
    ShiftedClock,
    ack,
    by_type,
    complete_once,
    dispatch_once,
    drive,
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

BATCH = ids.batch_id_for_upload("in", "datasets/real.jsonl", "v1")


def in_flight(resources: ExperimentResources) -> int:
    return slots_in_flight(resources)


@pytest.fixture
def real(resources: ExperimentResources) -> Iterator[FakeAgentRuntime]:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"), profile=AcrProfile())
    yield runtime
    runtime.close()


def test_cold_start_is_retried_on_the_same_session(resources: ExperimentResources) -> None:
    fake = FakeAgentRuntime(
        behaviour=AgentBehaviour(rewards=1.0), profile=AcrProfile(cold_start_share=1.0, cold_start_ready_s=0.3)
    )
    deps = make_deps(resources, fake, cold_start_wait_s=0.4)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED]
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    assert [(c.session_id, c.outcome) for c in fake.invocations()] == [(sid, "cold_start"), (sid, "reinvoked")]
    counts = deps.metrics.drain()[0]
    assert (counts[COLD_START_RETRIED], counts[NEW_SESSIONS]) == (1, 1)
    drive(resources, deps)
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1
    assert fake.running == set()
    assert in_flight(resources) == 0
    fake.close()


def test_an_agent_that_cannot_start_fails_the_rollout_at_once_and_its_session_is_stopped(
    resources: ExperimentResources,
) -> None:
    """AgentCore's "Runtime initialization time exceeded" (a container that exited or never became ready): no
    cold-start retry, no new attempt, no requeue; Rollout Failed `agent_error` with what AgentCore said."""
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(kind="cannot_start"), profile=AcrProfile())
    deps = make_deps(resources, fake, cold_start_wait_s=0.05)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=3))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.START_FAILED]
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    assert [(c.session_id, c.outcome) for c in fake.invocations()] == [(sid, "cannot_start")]
    assert sid in fake.stopped  # the microVM was made: stopped, its slot freed on the confirmed stop
    assert in_flight(resources) == 0
    (failed,) = by_type(trainer_events(resources), "Rollout Failed")
    assert failed["reason"] == "agent_error"
    assert failed["attempts_used"] == 1
    assert "Runtime initialization time exceeded" in failed["error"]
    drive(resources, deps)
    assert len(fake.invocations()) == 1
    assert fake.running == set()
    fake.close()


def test_cold_start_given_up_ends_the_attempt_and_stops_its_session(resources: ExperimentResources) -> None:
    fake = FakeAgentRuntime(profile=AcrProfile(cold_start_share=1.0, cold_start_ready_s=3600))
    deps = make_deps(resources, fake, cold_start_wait_s=0.05, cold_start_retries=2)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=2))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.COLD_START_FAILED]
    sid1 = ids.session_id("test-exp", BATCH, "a", 0, 1)
    assert sid1 in fake.stopped  # given up on: stopped, its slot freed on the confirmed stop
    assert in_flight(resources) == 0
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert (item["state"], item["attempt"]) == ("queued", 2)  # the normal "attempts left?" path
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.COLD_START_FAILED]
    (failed,) = by_type(trainer_events(resources), "Rollout Failed")
    assert failed["reason"] == "invoke_rejected"
    assert "cold start" in failed["error"]
    assert fake.running == set()
    assert in_flight(resources) == 0
    assert len([c for c in fake.invocations() if c.outcome == "cold_start"]) == 6  # 2 attempts x (1 + 2 retries)


def test_result_is_published_before_the_stop_and_the_slot_waits_for_it(
    resources: ExperimentResources, real: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ShiftedClock()
    deps = make_deps(resources, real, clock=clock)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    dispatch_once(resources, deps)
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)

    def throttled(session_id: str) -> None:
        raise RuntimeThrottled("ThrottlingException: rate exceeded")

    monkeypatch.setattr(real, "stop", throttled)
    real.finish(sid)
    assert list(complete_once(resources, deps).outcomes.values()) == ["succeeded"]
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1  # out, whatever the stop says
    assert deps.metrics.drain()[0][STOP_FAILED] == 1 + len(PROMPT_RETRY_S)  # tried again at once, then left
    assert in_flight(resources) == 1  # the session still counts at AgentCore: so does its slot
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert item["outbox"] == {"stop"}
    assert item["held_slots"] == {sid}
    monkeypatch.undo()
    clock.advance(deps.outbox_age_s + 120)  # past the backoff: the sweeper retries the stop
    assert sweep(deps).outbox_drained == 1
    assert sid in real.stopped
    assert in_flight(resources) == 0
    assert "outbox" not in (rollout_item(resources, BATCH, "a", 0) or {})


def test_a_slot_whose_stop_never_works_is_held_until_the_sessions_maximum_lifetime(
    resources: ExperimentResources, real: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle timeout reaps only an idle session; a busy one runs until `max_lifetime_s` after its start, so
    its slot is held that long (the idle timeout alone would let `max_sessions` be exceeded at AgentCore)."""
    config = resources.config
    assert config.max_lifetime_s > config.idle_timeout_s + 300
    clock = ShiftedClock()
    started = clock.now().timestamp()
    deps = make_deps(resources, real, clock=clock)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    dispatch_once(resources, deps)
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    calls: list[str] = []

    def conflict(session_id: str) -> None:
        calls.append(session_id)
        raise RuntimeThrottled("ConflictException")

    monkeypatch.setattr(real, "stop", conflict)
    real.finish(sid)
    complete_once(resources, deps)
    for _ in range(12):  # bounded passes (6 over about 2 min, each with its prompt re-tries), then no more calls
        clock.advance(60)
        sweep(deps)
    assert len(calls) == STOP_TRIES * (1 + len(PROMPT_RETRY_S))
    assert in_flight(resources) == 1
    clock.advance(started + config.idle_timeout_s + 120 - clock.now().timestamp())
    sweep(deps)
    assert in_flight(resources) == 1  # past the idle timeout, but the session may still be busy
    clock.advance(started + config.max_lifetime_s + 120 - clock.now().timestamp())
    sweep(deps)  # past its maximum lifetime: AgentCore ended it, the slot is free
    assert in_flight(resources) == 0
    assert "outbox" not in (rollout_item(resources, BATCH, "a", 0) or {})


@pytest.mark.parametrize("prompt_retry", [True, False], ids=["prompt-retry", "next-pass"])
def test_stop_not_found_while_running_is_confirmed_only_by_a_second_answer(
    resources: ExperimentResources, real: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch, prompt_retry: bool
) -> None:
    clock = ShiftedClock()
    deps = make_deps(resources, real, clock=clock)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    dispatch_once(resources, deps)
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    original = real.stop
    answers = iter([RuntimeSessionNotFound("ResourceNotFoundException")])

    def first_not_found(session_id: str) -> None:
        answer = next(answers, None)
        if answer is not None:
            raise answer  # AgentCore's NotFound while the container keeps running
        original(session_id)

    monkeypatch.setattr(real, "stop", first_not_found)
    real.finish(sid)
    # Without time for a prompt re-try (the wait budget), the entry waits for the sweeper's next pass.
    wait_s = PACED_WAIT_S if prompt_retry else 0.1
    records = receive_records(resources.completion_queue_url)
    ack(
        resources.completion_queue_url,
        records,
        complete_records(records, deps, wait_until=time.monotonic() + wait_s).failures,
    )
    if not prompt_retry:
        assert sid in real.running  # a single NotFound confirms nothing
        assert in_flight(resources) == 1
        clock.advance(deps.outbox_age_s + 60)
        sweep(deps)
    assert sid in real.stopped
    assert in_flight(resources) == 0


def test_failed_stops_are_retried_at_once_not_left_for_the_sweeper(resources: ExperimentResources) -> None:
    """Every session's first stop fails (NotFound while running, Conflict or throttled, as AgentCore answers): the
    completion retries each at once, so no session outlives its rollout waiting for a sweep."""
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(rewards=1.0), profile=AcrProfile.realistic(stop_failure_share=1.0))
    deps = make_deps(resources, fake)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={f"q{i}": {} for i in range(3)}))
    drive(resources, deps)
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 6
    assert fake.running == set()
    assert len(fake.stopped) == 6
    assert in_flight(resources) == 0
    assert fake.stop_failed_running == fake.stopped  # each was refused once, then stopped
    answers = Counter(c.outcome for c in fake.stops())
    assert answers["not_found_running"] + answers["conflict"] + answers["throttled"] == 6
    assert deps.metrics.drain()[0][STOP_FAILED] == answers["conflict"] + answers["throttled"]  # NotFound: no failure
    fake.close()


def test_sweeper_completes_an_expired_attempt_whose_result_exists(
    resources: ExperimentResources, real: FakeAgentRuntime
) -> None:
    clock = ShiftedClock()
    deps = make_deps(resources, real, clock=clock)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=2))
    dispatch_once(resources, deps)
    sid = ids.session_id("test-exp", BATCH, "a", 0, 1)
    real.finish(sid, AgentBehaviour(rewards=0.5))
    assert len(receive_all(resources.completion_queue_url)) == 1  # its event is lost (or very late)
    clock.advance(resources.config.rollout_timeout_s + 5)
    report = sweep(deps)
    assert (report.completed_late, report.retried, report.timed_out) == (1, 0, 0)
    (done,) = by_type(trainer_events(resources), "Rollout Completed")
    assert (done["reward"], done["attempt"]) == (0.5, 1)
    assert in_flight(resources) == 0
    assert real.invocations("started") == real.invocations()[:1]  # never retried


def test_waiting_for_limits_too_often_fails_loudly_as_throttled(
    resources: ExperimentResources, real: FakeAgentRuntime
) -> None:
    deps = make_deps(resources, real, limits={"max_sessions": 1, "max_limit_requeues": 2})
    first, second = seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}, group_size=1)
    send(resources, [first])
    outcomes = list(dispatch_once(resources, deps).outcomes.values())  # takes the only slot (paced: may wait)
    send(resources, [second])
    for _ in range(6):
        result = dispatch_once(resources, deps, wait_s=0.3)  # the slot stays taken: never reaches the pacing
        outcomes.extend(result.outcomes.values())
        if Dispatch.THROTTLED in outcomes:
            break
    assert outcomes.count(Dispatch.INVOKED) == 1
    assert outcomes.count(Dispatch.REQUEUED_LIMIT) == 2
    assert outcomes[-1] == Dispatch.THROTTLED
    (failed,) = by_type(trainer_events(resources), "Rollout Failed")
    assert failed["reason"] == "throttled"
    assert "re-sent 2 times" in failed["error"]
    assert receive_records(resources.rollout_queue_url) == []  # no spin left behind
    assert in_flight(resources) == 1  # only the running one


class Broken(FakeAgentRuntime):
    def invoke(self, session_id: str, payload: Any) -> None:
        raise KeyError("a bug, not a throttle")


def test_unknown_invoke_errors_are_not_throttling(resources: ExperimentResources) -> None:
    fake = Broken()
    deps = make_deps(resources, fake)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    records = receive_records(resources.rollout_queue_url)
    result = dispatch_records(records, deps, wait_until=paced_until())
    ack(resources.rollout_queue_url, records, result.failures)
    assert list(result.failures.values()) == ["KeyError: 'a bug, not a throttle'"]  # redelivered, then DLQ
    counts = deps.metrics.drain()[0]
    assert ACR_THROTTLED not in counts
    assert LIMIT_BACKLOG not in counts


def test_completion_batch_is_recorded_and_published_before_any_stop(
    resources: ExperimentResources, real: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    deps = make_deps(resources, real)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={f"q{i}": {} for i in range(4)}, group_size=1))
    dispatch_once(resources, deps)
    published: list[float] = []
    stopped: list[float] = []
    original_publish, original_stop = deps.publisher.publish, real.stop

    def publish(details: Any) -> None:
        original_publish(details)
        published.append(time.monotonic())

    def slow_stop(session_id: str) -> None:
        time.sleep(0.3)
        stopped.append(time.monotonic())
        original_stop(session_id)

    monkeypatch.setattr(deps.publisher, "publish", publish)
    monkeypatch.setattr(real, "stop", slow_stop)
    for sid in list(real.running):
        real.finish(sid)
    records = receive_records(resources.completion_queue_url)
    assert len(records) == 4
    complete_records(records, deps)
    assert len(published) == 4
    assert len(stopped) == 4
    assert max(published) < min(stopped)  # no result waited for a stop
    assert in_flight(resources) == 0
