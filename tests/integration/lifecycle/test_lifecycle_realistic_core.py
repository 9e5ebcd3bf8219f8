"""The core lifecycle scenarios under AgentCore as it really behaves (the fake's realistic `AcrProfile`, seeded, with
more cold starts and failing stops than the 5% / 2% default so that every run meets them): a batch to the end, a
timeout retried on a new session, a cancel. Whatever AgentCore answers, every result is published once and every
session is stopped promptly, with no slot leaked. (`ROLLOUTS_FAKE_ACR=realistic` runs every lifecycle module
under the default realistic profile.)"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.cancel import cancel_batch
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import COLD_START_RETRIED
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ShiftedClock,
    batch_view,
    by_type,
    complete_once,
    dispatch_once,
    make_deps,
    moto_lock,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

SEED = 20261122
BATCH = ids.batch_id_for_upload("in", "datasets/realistic-core.jsonl", "v1")


def profile(**overrides: Any) -> AcrProfile:
    """The realistic profile, seeded, 30% of first invokes cold and 30% of stops failing."""
    values: dict[str, Any] = {
        "seed": SEED,
        "cold_start_share": 0.3,
        "cold_start_ready_s": 0.3,
        "stop_failure_share": 0.3,
    }
    values.update(overrides)
    return AcrProfile.realistic(**values)


@pytest.fixture
def fake() -> Iterator[FakeAgentRuntime]:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(rewards=1.0), profile=profile())
    yield runtime
    runtime.close()


@pytest.fixture
def deps(resources: ExperimentResources, fake: FakeAgentRuntime, clock: ShiftedClock) -> LifecycleDeps:
    return make_deps(resources, fake, clock=clock, cold_start_wait_s=0.4)


def assert_all_stopped(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    """Every session opened is stopped (failed stops included), no slot is held, nothing is dead-lettered."""
    opened = {c.session_id for c in fake.invocations() if c.outcome in ("started", "cold_start")}
    assert fake.running == set()
    assert opened <= fake.stopped
    assert slots_in_flight(resources) == 0
    for name in ("rollout", "completion"):
        assert receive_all(resources.dlq_urls[name]) == []


def test_a_batch_completes_with_cold_starts_and_failing_stops(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    def rewards(inv: FakeInvocation) -> AgentBehaviour:
        rollout = inv.payload["_rollout"]
        return AgentBehaviour(rewards=float(rollout["index"]), delay_s=0.05)

    fake.behaviour = rewards
    groups, size = 6, 4
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={f"q{i}": {} for i in range(groups)}, group_size=size))
    deadline = time.monotonic() + 240  # bounded; about 30 s on an idle machine
    while time.monotonic() < deadline:
        dispatch_once(resources, deps)
        complete_once(resources, deps)
        if batch_view(resources, BATCH).terminal >= groups * size:
            break
    for _ in range(20):  # the last results of the agents that were still running
        if not complete_once(resources, deps).outcomes:
            break
    events = trainer_events(resources)
    assert len(by_type(events, "Rollout Completed")) == groups * size
    assert by_type(events, "Rollout Failed") == []
    assert sorted(g["input_id"] for g in by_type(events, "Group Completed")) == sorted(f"q{i}" for i in range(groups))
    assert all(g["rewards"] == [float(i) for i in range(size)] for g in by_type(events, "Group Completed"))
    assert len(by_type(events, "Batch Completed")) == 1
    assert max(Counter(e["detail"]["event_id"] for e in events).values()) == 1
    # AgentCore's faults happened and were absorbed: cold starts retried on their own session, failed stops retried.
    cold = [c.session_id for c in fake.invocations() if c.outcome == "cold_start"]
    assert cold
    assert deps.metrics.drain()[0][COLD_START_RETRIED] >= len(cold)
    assert all(c.outcome in ("started", "cold_start", "reinvoked") for c in fake.invocations())
    assert fake.stop_failed_running
    assert_all_stopped(resources, fake)
    for i in range(groups):
        for index in range(size):
            item = rollout_item(resources, BATCH, f"q{i}", index)
            assert item is not None
            assert item["state"] == "succeeded"
            assert "outbox" not in item


def test_a_timed_out_attempt_is_retried_and_every_session_stopped(
    resources: ExperimentResources, clock: ShiftedClock
) -> None:
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(kind="hang"), profile=profile(stop_failure_share=1.0))
    deps = make_deps(resources, fake, clock=clock, cold_start_wait_s=0.4)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}, max_attempts=2))
    dispatch_once(resources, deps)
    assert len(fake.running) == 4
    clock.advance(resources.config.rollout_timeout_s + 1)
    assert sweep(deps).retried == 4
    assert fake.running == set()  # stopped by the sweep itself, though every first stop failed
    assert fake.stop_failed_running == fake.stopped
    fake.behaviour = AgentBehaviour(rewards=1.0)
    dispatch_once(resources, deps)
    deadline = time.monotonic() + 60
    completed: list[dict[str, Any]] = []
    while time.monotonic() < deadline and len(completed) < 4:
        complete_once(resources, deps)
        completed += by_type(trainer_events(resources), "Rollout Completed")
    assert sorted(c["attempt"] for c in completed) == [2, 2, 2, 2]
    assert_all_stopped(resources, fake)
    fake.close()


def test_a_cancel_stops_every_running_session_at_once(resources: ExperimentResources) -> None:
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"), profile=profile(stop_failure_share=1.0))
    deps = make_deps(resources, fake, cold_start_wait_s=0.4)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}, "c": {}}))
    dispatch_once(resources, deps)
    assert len(fake.running) == 6
    report = cancel_batch(BATCH, deps)
    assert (report.cancelled, report.drain_errors) == (6, [])
    assert fake.stop_failed_running == fake.stopped  # each stop failed once and was retried at once
    assert_all_stopped(resources, fake)
    failed = by_type(trainer_events(resources), "Rollout Failed")
    assert sorted(f["reason"] for f in failed) == ["cancelled"] * 6
    fake.close()
