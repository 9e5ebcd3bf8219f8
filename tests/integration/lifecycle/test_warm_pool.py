"""The warm pool over moto and the fake AgentCore: filled ahead of a batch, taken by dispatch with no
change to what the agent receives or writes, kept alive, trimmed, stopped when the experiment is idle, cancelled or
destroyed; a warm session that died never costs its rollout an attempt, and never runs two rollouts."""

from __future__ import annotations

import dataclasses
import io
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.config import ExperimentConfig, is_warmup_payload
from rollout_pipeline.contracts.attempts import attempt_token
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.ledger.items import RolloutRecord
from rollout_pipeline.ledger.warm_items import WarmState
from rollout_pipeline.lifecycle.cancel import cancel_batch
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch
from rollout_pipeline.lifecycle.warm import WarmOffer
from rollout_pipeline.lifecycle.warm_pool import (
    DEMAND_QUIET_S,
    HALT_CANCELLED,
    HALT_IDLE,
    TickResult,
    WarmPool,
    run_pool,
)
from rollout_pipeline.limits.pacing import Pacer
from rollout_pipeline.limits.slots import caps as slot_caps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.quotas import AccountQuotas, PoolSettings
from rollout_pipeline.sdk.cost import batch_cost
from rollout_pipeline.sdk.export import rollout_fields
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ShiftedClock,
    by_type,
    complete_once,
    dispatch_once,
    drive,
    make_deps,
    moto_lock,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

KEY = b"k" * 32


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    """The warm pool on from the start, as deployed: its lifetimes derived for it (a shelf life for warm sessions)."""
    return ExperimentConfig(name="test-exp", group_size=2, tps_limit=50, max_sessions=10, warm_sessions=4)


@pytest.fixture
def acr_time() -> ShiftedClock:
    """The fake AgentCore's own clock (its idle timeout), moved by the test."""
    return ShiftedClock()


@pytest.fixture
def fake(acr_time: ShiftedClock) -> Iterator[FakeAgentRuntime]:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(rewards=1.0), profile=AcrProfile(), clock=acr_time)
    yield runtime
    runtime.close()


def warm_deps(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    warm: int | str = 4,
    clock: ShiftedClock | None = None,
    **settings: object,
) -> LifecycleDeps:
    return make_deps(
        resources,
        fake,
        clock=clock,
        limits={"warm_sessions": warm, "max_sessions": 10, **settings},
        attempt_key=lambda: KEY,
        warm_loop_s=0.0,
    )


def pool_sessions(deps: LifecycleDeps) -> dict[str, WarmState]:
    return {s.session_id: s.state for s in deps.ledger.warm.sessions()}


def warm_queue(resources: ExperimentResources) -> list[dict[str, object]]:
    """The offers on the warm queue now (received and deleted)."""
    return receive_all(resources.warm_queue_url)


def rollout_invokes(fake: FakeAgentRuntime) -> list[str]:
    return [c.outcome for c in fake.invocations() if not c.warmup]


def test_a_batch_after_a_pause_starts_every_rollout_in_a_warm_session(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=4)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.target, tick.warmed, tick.idle) == (4, 4, 4)
    warm = pool_sessions(deps)
    assert list(warm.values()) == [WarmState.IDLE] * 4
    assert all(ids.is_warm_session_id(sid, "test-exp") for sid in warm)
    assert slots_in_flight(resources) == 4  # warm sessions count against max_sessions
    assert fake.warmups == 4
    assert not fake.written

    send(resources, seed_batch(resources, inputs={"q1": {"prompt": "one"}, "q2": {"prompt": "two"}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM] * 4
    assert rollout_invokes(fake) == ["reinvoked"] * 4  # into the warm sessions: no new session, no cold start
    assert fake.warm_reuses == 4
    assert max(fake.rollouts_in.values()) == 1
    assert pool_sessions(deps) == {}
    assert slots_in_flight(resources) == 4  # the warm sessions' slots became the rollouts'
    for sid in warm:  # what the agent receives: the same payload, its session's id and token
        rollout = fake.payloads[sid]["_rollout"]
        assert rollout["session_id"] == sid
        assert rollout["attempt"] == 1
        assert rollout["attempt_token"] == attempt_token(KEY, "test-exp", sid)
        assert not is_warmup_payload(fake.payloads[sid])
    drive(resources, deps)
    completed = by_type(trainer_events(resources), "Rollout Completed")
    assert len(completed) == 4
    assert {c["session_id"] for c in completed} == set(warm)  # result keys {exp}/{input}/{warm session}.json
    assert all(c["attempt"] == 1 and c["timings"]["session_warmed_at"] for c in completed)
    assert set(fake.written.values()) == {ids.result_key("test-exp", c["input_id"], c["session_id"]) for c in completed}
    assert fake.running == set()
    assert slots_in_flight(resources) == 0
    item = rollout_item(resources, "batch-1", "q1", 0)  # the export (and the batch report) say it started warm
    assert item is not None
    assert rollout_fields(RolloutRecord.of_values(item))["session_warmed_at"]


def test_a_rollout_run_in_a_warm_session_records_its_stop_and_adds_it_to_the_spend(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=2)
    WarmPool(deps).tick(budget_s=10)
    send(resources, seed_batch(resources, inputs={"q1": {"prompt": "one"}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM] * 2
    drive(resources, deps)

    records = [RolloutRecord.of_values(rollout_item(resources, "batch-1", "q1", index) or {}) for index in (0, 1)]
    assert all(rec.session_id and ids.is_warm_session_id(rec.session_id) for rec in records)
    spans = [rec.span(1) for rec in records]
    assert all(span is not None and span.stopped_at is not None for span in spans), "each warm session's stop"
    batch = deps.ledger.batches.read_batch("batch-1")
    assert batch is not None
    priced = batch_cost(batch, records, deps.prices, deps.now())
    assert priced.stops_pending == 0  # `rollouts cost` shows no stop pending, and the figure no longer grows
    _in_flight, spent = deps.ledger.experiment.slots_and_spend()
    assert spent == pytest.approx(priced.now.usd, rel=1e-6)  # every session priced to its confirmed stop
    assert spent > 0, "the budget's spend counts the warm sessions"


def board_writes(deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The waiting keys each write of this process's place on the admission board published."""
    published: list[list[str]] = []
    put = deps.ledger.limits.put_waiting

    def spy(process: str, keys: list[str], *, now_us: int) -> None:
        published.append(list(keys))
        put(process, keys, now_us=now_us)

    monkeypatch.setattr(deps.ledger.limits, "put_waiting", spy)
    return published


def test_a_batch_the_pool_covers_is_not_put_on_the_admission_board(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    deps = warm_deps(resources, fake, warm=4)
    WarmPool(deps).tick(budget_s=10)
    published = board_writes(deps, monkeypatch)
    send(resources, seed_batch(resources, inputs={"q1": {}, "q2": {}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM] * 4
    assert published == []  # no slot wait ahead: no board write (and no clear) for the SQS batch


def test_offers_of_sessions_gone_from_the_pool_are_refused_and_their_rollouts_go_on_the_admission_board(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two of four offered sessions are stopped after their offers were sent: the SQS batch holds four offers (no
    board write at receipt), two takes fail their condition (the offers are deleted, no new session is taken in
    their place), and their rollouts take new sessions, on the board before their slots are decided."""
    deps = warm_deps(resources, fake, warm=4)
    WarmPool(deps).tick(budget_s=10)
    gone = sorted(pool_sessions(deps))[:2]
    assert deps.ledger.warm.begin_stop(gone) == gone  # taken out of the pool after their offers were sent
    published = board_writes(deps, monkeypatch)
    send(resources, seed_batch(resources, inputs={"q1": {}, "q2": {}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED] * 2 + [Dispatch.WARM] * 2
    assert published  # the two that took new sessions were on the board before their slots were decided
    assert all(len(keys) <= 2 for keys in published)
    assert (deps.warm.counts["taken"], deps.warm.counts["refused"]) == (2, 2)
    assert warm_queue(resources) == []  # every offer used or refused is deleted


def test_without_a_warm_session_the_rollout_takes_a_new_one_and_the_pool_holds_back(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=1)
    WarmPool(deps).tick(budget_s=10)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED, Dispatch.WARM]
    assert deps.ledger.warm.pool().demand_at > 0  # a rollout wanted the new-session budget
    tick = WarmPool(deps).tick(budget_s=10)
    assert tick.warmed == 0  # no fill while rollouts want new sessions
    drive(resources, deps)
    assert [e["attempt"] for e in by_type(trainer_events(resources), "Rollout Completed")] == [1, 1]


def test_while_rollouts_take_warm_sessions_the_pool_does_not_refill(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    """A warm-up is an invocation: a refill during a burst of takes would spend the invoke rate the takes run at
    (AgentCore's 200/s per agent), so it waits until `DEMAND_QUIET_S` after the last take, then refills."""
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=4, clock=clock)
    WarmPool(deps).tick(budget_s=10)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM] * 2
    assert deps.ledger.warm.pool().took_at > 0
    assert deps.ledger.warm.pool().demand_at == 0  # no rollout wanted a new session
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.target, tick.idle, tick.warmed) == (4, 2, 0)  # two short, held back
    clock.advance(DEMAND_QUIET_S + 0.5)
    assert WarmPool(deps).tick(budget_s=10).warmed == 2
    drive(resources, deps)


def test_a_rollout_whose_warm_session_idled_out_and_restarts_succeeds_on_its_first_attempt(
    resources: ExperimentResources, fake: FakeAgentRuntime, acr_time: ShiftedClock
) -> None:
    """AgentCore reaped the warm session (its idle timeout, by its own clock) and, as a public measurement saw, an
    invoke of the ended id starts a new microVM under it and answers 200 (docs/aws-facts.md): the rollout runs in
    it, cold, on its first attempt, with nothing of the warm session's state."""
    fake.profile = dataclasses.replace(AcrProfile(), ended_session_invoke="restarts")
    deps = warm_deps(resources, fake, warm=1)
    WarmPool(deps).tick(budget_s=10)
    (warm,) = pool_sessions(deps)
    acr_time.advance(901)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM]
    assert [(c.session_id, c.outcome) for c in fake.invocations() if not c.warmup] == [(warm, "started")]
    assert fake.restarted == {warm}
    drive(resources, deps)
    (done,) = by_type(trainer_events(resources), "Rollout Completed")
    assert (done["attempt"], done["session_id"]) == (1, warm)
    assert fake.running == set()
    assert slots_in_flight(resources) == 0


@pytest.mark.parametrize("death", ["idled_out", "not_found", "failed_keep_alive"])
def test_a_rollout_whose_warm_session_died_succeeds_on_its_first_attempt(
    resources: ExperimentResources, fake: FakeAgentRuntime, acr_time: ShiftedClock, death: str
) -> None:
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=1, clock=clock)
    WarmPool(deps).tick(budget_s=10)
    (warm,) = pool_sessions(deps)
    if death == "idled_out":  # AgentCore reaped it (its idle timeout, by its own clock) and answers NotFound
        acr_time.advance(901)
    elif death == "not_found":  # AgentCore lost it
        fake.lose(warm)
    else:  # its keep-alive went unanswered, and then AgentCore reaped it before the pool knew
        clock.advance(deps.config.idle_timeout_s * 0.5 + 1)
        fake.warmup_behaviour = AgentBehaviour(kind="throttle")
        tick = WarmPool(deps).tick(budget_s=5)
        assert (tick.kept_alive, tick.dropped) == (0, 0)
        assert warm in pool_sessions(deps)
        fake.lose(warm)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED]
    new = ids.session_id("test-exp", "batch-1", "q1", 0, 1)
    assert [(c.session_id, c.outcome) for c in fake.invocations() if not c.warmup] == [
        (warm, "not_found"),
        (new, "started"),
    ]
    item = rollout_item(resources, "batch-1", "q1", 0)
    assert item is not None
    assert (item["state"], item["attempt"], item["session_id"]) == ("dispatched", 1, new)
    drive(resources, deps)
    (done,) = by_type(trainer_events(resources), "Rollout Completed")
    assert (done["attempt"], done["session_id"], done["timings"]["session_warmed_at"]) == (1, new, None)
    assert fake.running == set()
    assert slots_in_flight(resources) == 0  # the dead session's slot was freed by its confirmed stop (2 NotFound)
    assert pool_sessions(deps) == {}
    assert (
        sdk_experiment(resources).capacity.warm_pool().dropped == 1
    )  # the trainer sees the session the rollout found dead


def sdk_experiment(resources: ExperimentResources) -> Any:
    from rollout_pipeline.sdk import Experiment
    from tests.conftest import REGION

    return Experiment.from_outputs(resources.stack_outputs(), region=REGION)


def lived(
    deps: LifecycleDeps, clock: ShiftedClock, acr_time: ShiftedClock, seconds: float, step: float
) -> list[TickResult]:
    """`seconds` pass for the pipeline and AgentCore alike, the pool ticking every `step`."""
    ticks = []
    for _ in range(int(seconds // step)):
        clock.advance(step)
        acr_time.advance(step)
        ticks.append(WarmPool(deps).tick(budget_s=30))
    return ticks


@pytest.fixture
def lifetimes(fake: FakeAgentRuntime, experiment_config: ExperimentConfig) -> ExperimentConfig:
    """The fake ends every session at the experiment's `max_lifetime_s`, as AgentCore does."""
    fake.profile = dataclasses.replace(AcrProfile(), max_lifetime_s=experiment_config.max_lifetime_s)
    return experiment_config


def test_a_warm_session_whose_life_no_longer_covers_a_rollout_is_stopped_and_replaced(
    resources: ExperimentResources, fake: FakeAgentRuntime, acr_time: ShiftedClock, lifetimes: ExperimentConfig
) -> None:
    """AgentCore ends a session `max_lifetime_s` after its start, busy or idle. A warm session is kept alive and
    offered only while `age + rollout_timeout_s + 600 <= max_lifetime_s`; then the pool stops it and warms another
    (kept alive on, it would have been offered to rollouts its lifetime then killed, and revived by a keep-alive as a
    new session outside the new-session budget)."""
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=1, clock=clock, warm_idle_stop_s=86_400)  # no work, and no idle halt
    WarmPool(deps).tick(budget_s=10)
    (old,) = pool_sessions(deps)
    shelf = lifetimes.warm_shelf_life_s
    ticks = lived(deps, clock, acr_time, shelf + 300, step=300)
    assert sum(t.kept_alive for t in ticks) >= shelf // lifetimes.idle_timeout_s  # alive until its shelf life ends
    assert sum(t.stopped for t in ticks) == 1
    assert sum(t.warmed for t in ticks) == 1
    (new,) = pool_sessions(deps)
    assert new != old
    assert old in fake.stopped
    born = fake.born[old]
    assert all(c.at - born <= shelf for c in fake.invocations() if c.session_id == old)  # never kept alive past it
    assert fake.lifetime_ends == set()  # the pipeline stopped it before AgentCore ended it
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM]
    assert [c.session_id for c in fake.invocations() if not c.warmup] == [new]
    drive(resources, deps)
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1


def test_a_warm_session_taken_at_the_end_of_its_shelf_life_outlives_its_rollout(
    resources: ExperimentResources, fake: FakeAgentRuntime, acr_time: ShiftedClock, lifetimes: ExperimentConfig
) -> None:
    """The oldest warm session a rollout may take still has `rollout_timeout_s` + 600 s to live: a rollout that runs
    to its deadline in it is never killed by the session's lifetime. (The idle timeout is the lifetime here: one
    offer covers the whole shelf life, no keep-alive re-offers it with a delay SQS counts in real time.)"""
    fake.profile = dataclasses.replace(fake.profile or AcrProfile(), idle_timeout_s=lifetimes.max_lifetime_s)
    clock = ShiftedClock()
    deps = warm_deps(
        resources, fake, warm=1, clock=clock, idle_timeout_s=lifetimes.max_lifetime_s, warm_idle_stop_s=86_400
    )
    WarmPool(deps).tick(budget_s=10)
    (warm,) = pool_sessions(deps)
    clock.advance(lifetimes.warm_shelf_life_s - 30)
    acr_time.advance(lifetimes.warm_shelf_life_s - 30)
    assert WarmPool(deps).tick(budget_s=10).idle == 1  # still offered, no keep-alive needed (idle timeout: its life)
    assert pool_sessions(deps) == {warm: WarmState.IDLE}
    fake.behaviour = AgentBehaviour(kind="manual")
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM]
    acr_time.advance(lifetimes.rollout_timeout_s - 1)  # the agent works until just before its deadline
    assert fake.active_sessions() == 1
    assert fake.lifetime_ends == set()
    fake.finish(warm)
    drive(resources, deps)
    (done,) = by_type(trainer_events(resources), "Rollout Completed")
    assert (done["attempt"], done["session_id"]) == (1, warm)


@pytest.mark.timing
def test_keep_alives_run_concurrently(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    """Keep-alives of many idle sessions are in flight together (paced by the invoke budget), not one at a time:
    each here waits until all of them have arrived (one at a time, the first would wait forever)."""
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=6, clock=clock)
    WarmPool(deps).tick(budget_s=10)
    arrived = threading.Barrier(6, timeout=60)

    def keep_alive(call: FakeInvocation) -> AgentBehaviour:
        if call.session_invocations:  # a keep-alive (the warm-up was the first)
            arrived.wait()
        return AgentBehaviour()

    fake.warmup_behaviour = keep_alive
    clock.advance(deps.config.warm_stale_after_s / 2 + 1)
    tick = WarmPool(deps).tick(budget_s=60)
    assert (tick.kept_alive, tick.dropped, tick.stopped) == (6, 0, 0)


def test_with_the_shortest_idle_timeout_warm_sessions_are_kept_alive_not_rewarmed(
    resources: ExperimentResources, fake: FakeAgentRuntime, acr_time: ShiftedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At `idle_timeout_s` 120 (the least the pool accepts) a warm session is offered for 60 s after each keep-alive,
    and kept alive 30 s in: with ticks 20 s apart (the sweeper's), no session goes stale and none is warmed again
    (a keep-alive due at half the idle timeout came when the session was already stale: the pool stopped and
    re-warmed its sessions in a loop). Each keep-alive offers the session again from when its last offer ends:
    its offers follow one another, never two at once, never a gap."""
    fake.profile = dataclasses.replace(AcrProfile(), idle_timeout_s=120.0)
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=2, clock=clock, idle_timeout_s=120)
    sent: list[tuple[float, WarmOffer]] = []  # (when the offer becomes visible, the offer)
    send_all = deps.queue.send_all

    def spy(url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        sent.extend((clock.now().timestamp() + delay_seconds, WarmOffer.of("", b)) for b in bodies)
        send_all(url, bodies, delay_seconds)

    monkeypatch.setattr(deps.queue, "send_all", spy)
    WarmPool(deps).tick(budget_s=10)
    ticks = lived(deps, clock, acr_time, 300, step=20)
    assert sum(t.warmed for t in ticks) == 0
    assert sum(t.stopped + t.dropped for t in ticks) == 0
    assert sum(t.kept_alive for t in ticks) >= 2 * 300 // 60
    assert fake.reaped == set()
    for session in pool_sessions(deps):
        windows = sorted((shown, o.offer_until) for shown, o in sent if o.session_id == session)
        assert len(windows) >= 300 // 60
        assert all(abs(end - next_shown) <= 1.0 for (_s, end), (next_shown, _e) in itertools.pairwise(windows))


def test_a_keep_alive_that_finds_its_session_gone_drops_it(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=2, clock=clock)
    WarmPool(deps).tick(budget_s=10)
    first, second = sorted(pool_sessions(deps))
    fake.lose(first)
    clock.advance(deps.config.idle_timeout_s * 0.5 + 1)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.kept_alive, tick.dropped, tick.warmed) == (1, 1, 1)  # the dead one dropped, one warmed in its place
    sessions = pool_sessions(deps)
    assert first not in sessions
    assert second in sessions
    assert len(sessions) == 2
    assert [c.outcome for c in fake.invocations() if c.session_id == second] == ["warmup", "keepalive"]
    assert slots_in_flight(resources) == 2


def test_trimmed_to_the_setting_and_stopped_when_idle_past_it_then_resumed_by_a_batch(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=3, clock=clock)
    WarmPool(deps).tick(budget_s=10)
    assert len(pool_sessions(deps)) == 3
    trimmed = warm_deps(resources, fake, warm=1, clock=clock)
    assert WarmPool(trimmed).tick(budget_s=10).stopped == 2
    assert len(pool_sessions(deps)) == 1
    assert slots_in_flight(resources) == 1
    clock.advance(deps.config.warm_idle_stop_s + 1)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.halted, tick.stopped) == (HALT_IDLE, 1)
    assert pool_sessions(deps) == {}
    assert fake.running == set()
    assert slots_in_flight(resources) == 0
    assert WarmPool(deps).tick(budget_s=10).warmed == 0  # halted: nothing started
    state = deps.ledger.warm.pool()
    assert state.stopped_unused == 3
    assert state.unused_idle_s >= deps.config.warm_idle_stop_s
    clock.advance(1)
    send(resources, seed_batch(resources, batch_id="batch-2", inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED]  # work again: a new session
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.halted, tick.target, tick.warmed) == (None, 3, 0)  # resumed; no fill while rollouts want sessions
    drive(resources, deps)
    clock.advance(5)
    assert WarmPool(deps).tick(budget_s=10).warmed == 3


class CountedCapacity:
    """25 new sessions a second (the account's quota) within the experiment's share; its asks counted."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self.deps = deps
        self.asks = 0

    def new_sessions_now(self) -> int:
        self.asks += 1
        return 25

    def sessions_to_hold(self) -> int:
        return self.deps.max_sessions()


def test_a_fill_chunk_takes_its_slots_on_several_counters_and_asks_the_capacity_once_in_a_while(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    deps = warm_deps(resources, fake, warm=8)  # max_sessions 10: a slot counter's cap is 0 or 1
    chunks: list[int] = []
    add = deps.ledger.warm.add_warming

    def counted(sessions: list[str], **kwargs: object) -> bool:
        chunks.append(len(sessions))
        return add(sessions, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(deps.ledger.warm, "add_warming", counted)
    capacity = CountedCapacity(deps)
    pool = WarmPool(deps, capacity)
    pool.capacity_recheck_s = 3600.0  # one ask for the whole fill, however slow the machine
    tick = pool.tick(budget_s=10)
    assert (tick.target, tick.warmed) == (8, 8)
    assert chunks == [8]  # one transaction for the chunk, its slots on eight counters (one a counter before)
    assert capacity.asks == 1  # not one per chunk
    counts = deps.ledger.limits.slot_counts()
    assert sum(counts) == 8
    assert all(count <= cap for count, cap in zip(counts, slot_caps(10), strict=True))


def account_active_sessions(deps: LifecycleDeps, active: int) -> None:
    """The account pool's active-session quota set to `active` (no reserve): the experiment's share of it."""
    assert deps.limits.account is not None
    deps.limits.account.pool.write_settings(PoolSettings(AccountQuotas(active_sessions=active), reserve=0.0))


def test_the_fill_takes_slots_within_the_experiments_share_of_the_account_pool(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=8)  # max_sessions 10
    account_active_sessions(deps, 6)
    tick = WarmPool(deps).tick(budget_s=10)  # this process's first grant comes with the tick
    assert (tick.target, tick.warmed) == (6, 6)
    assert slots_in_flight(resources) == 6 == deps.max_sessions()
    counts = deps.ledger.limits.slot_counts()
    assert all(count <= cap for count, cap in zip(counts, slot_caps(6), strict=True))  # the caps dispatch takes by


class ShareThatShrinks:
    """A share of 10 sessions when the tick reads it, 3 once the fill runs (another experiment renewed meanwhile)."""

    def __init__(self) -> None:
        self.reads = 0

    def new_sessions_now(self) -> int:
        return 2

    def sessions_to_hold(self) -> int:
        self.reads += 1
        return 10 if self.reads == 1 else 3


def test_the_fill_follows_a_share_that_shrinks_while_it_runs(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=8)
    tick = WarmPool(deps, ShareThatShrinks()).tick(budget_s=10)
    assert (tick.target, tick.warmed) == (8, 3)
    assert slots_in_flight(resources) == 3


def test_idle_warm_sessions_give_back_a_share_that_shrank(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=4)
    account_active_sessions(deps, 10)
    WarmPool(deps).tick(budget_s=10)
    assert len(pool_sessions(deps)) == 4
    rollouts = deps.ledger.limits.take_slot(10, 9, 4)  # four rollouts run in sessions of their own
    assert deps.ledger.table.transact([rollouts]) is None
    account_active_sessions(deps, 6)
    assert deps.limits.membership is not None
    deps.limits.membership.renew(force=True)
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.stopped, tick.idle) == (2, 2)  # 4 rollouts + 2 warm = the share
    assert slots_in_flight(resources) == 6


def test_automatic_size_aims_at_the_last_batch(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    deps = warm_deps(resources, fake, warm="auto")
    assert WarmPool(deps).tick(budget_s=10).target == 0  # no batch yet: nothing to aim at
    deps.ledger.warm.note_busy(time.time(), last_batch=("batch-0", 6))
    tick = WarmPool(deps).tick(budget_s=10)
    assert (tick.target, tick.warmed) == (6, 6)
    deps.ledger.warm.note_busy(time.time(), last_batch=("batch-9", 40))
    assert WarmPool(deps).tick(budget_s=10).target == 10  # capped by max_sessions


def test_a_cancelled_experiment_leaves_no_warm_session_running(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    deps = warm_deps(resources, fake, warm=3)
    WarmPool(deps).tick(budget_s=10)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))
    dispatch_once(resources, deps)  # one rollout runs in a warm session
    report = cancel_batch("batch-1", deps)
    assert (report.cancelled, report.warm_sessions_stopped) == (1, 2)
    assert fake.running == set()
    assert pool_sessions(deps) == {}
    assert slots_in_flight(resources) == 0
    assert deps.ledger.warm.pool().halted == HALT_CANCELLED
    assert WarmPool(deps).tick(budget_s=10).warmed == 0


def test_a_destroyed_experiment_leaves_no_warm_session_running(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    from rollout_pipeline.sdk import Experiment
    from tests.conftest import REGION

    deps = warm_deps(resources, fake, warm=3)
    WarmPool(deps).tick(budget_s=10)
    experiment = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    assert experiment.stop_warm_pool(runtime=fake, reason="destroyed") == 3
    assert fake.running == set()
    assert slots_in_flight(resources) == 0
    ticks = run_pool(deps, until=time.monotonic() + 1)
    assert ticks[-1].halted == "destroyed"
    assert ticks[-1].warmed == 0
    assert pool_sessions(deps) == {}


def test_a_warm_session_never_runs_two_rollouts(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    deps = warm_deps(resources, fake, warm=1)
    WarmPool(deps).tick(budget_s=10)
    (warm,) = pool_sessions(deps)
    others = [warm_deps(resources, fake, warm=1) for _ in range(4)]  # four dispatcher processes, one view each
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=4))
    results: list[list[Dispatch]] = []

    def run(d: LifecycleDeps) -> None:
        results.append(list(dispatch_once(resources, d).outcomes.values()))

    threads = [threading.Thread(target=run, args=(d,)) for d in others]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    outcomes = sorted(o for r in results for o in r)
    assert outcomes.count(Dispatch.WARM) == 1
    assert len(outcomes) == 4
    assert fake.rollouts_in[warm] == 1
    assert max(fake.rollouts_in.values()) == 1
    drive(resources, deps)
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 4


def test_a_result_without_the_request_copy_is_mapped_by_the_claim(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    """An agent that writes its own result with only the top-level token (docs/agent.md): the claim the dispatch
    wrote maps the warm session to its attempt; a result naming another rollout's attempt is ignored."""
    deps = warm_deps(resources, fake, warm=2)
    WarmPool(deps).tick(budget_s=10)
    fake.behaviour = AgentBehaviour(kind="manual")
    send(resources, seed_batch(resources, inputs={"q1": {}, "q2": {}}, group_size=1))
    dispatch_once(resources, deps)
    sessions = {p["_rollout"]["input_id"]: sid for sid, p in fake.payloads.items()}
    from rollout_pipeline.adapters.s3 import S3ObjectStore

    store, bucket = S3ObjectStore(), resources.results_bucket
    token = attempt_token(KEY, "test-exp", sessions["q1"])
    body = b'{"status_code": 200, "rewards": 0.5, "attempt_token": "' + token.encode() + b'"}'
    store.put_bytes(bucket, ids.result_key("test-exp", "q1", sessions["q1"]), body)
    forged = {"payload": {"_rollout": {"batch_id": "batch-1", "index": 0, "attempt": 1}}, "rewards": 1.0}
    forged["attempt_token"] = attempt_token(KEY, "test-exp", sessions["q1"])
    store.put_bytes(bucket, ids.result_key("test-exp", "q2", sessions["q1"]), str(forged).replace("'", '"').encode())
    for _ in range(3):
        complete_once(resources, deps)
    (done,) = by_type(trainer_events(resources), "Rollout Completed")
    assert (done["input_id"], done["reward"], done["session_id"]) == ("q1", 0.5, sessions["q1"])
    item = rollout_item(resources, "batch-1", "q2", 0)
    assert item is not None
    assert item["state"] == "dispatched"


@pytest.fixture
def on_fake(monkeypatch: pytest.MonkeyPatch, fake: FakeAgentRuntime) -> None:
    """The SDK's own calls to AgentCore (stops) go to the fake."""
    from rollout_pipeline.sdk import Experiment

    original = Experiment.wiring
    monkeypatch.setattr(Experiment, "wiring", lambda self, runtime=None: original(self, runtime or fake))


@pytest.mark.usefixtures("on_fake")
def test_rollouts_destroy_stops_the_warm_pool_before_the_stack_goes(
    resources: ExperimentResources, fake: FakeAgentRuntime, tmp_path: Path
) -> None:
    from rollout_pipeline.sdk import Experiment
    from tests.conftest import REGION
    from tests.fake_cdk import FakeCdkProject

    deps = warm_deps(resources, fake, warm=2)
    WarmPool(deps).tick(budget_s=10)
    project = FakeCdkProject(tmp_path / "project")
    out = io.StringIO()
    Experiment.from_outputs(resources.stack_outputs(), region=REGION).destroy(project_dir=project.root, out=out)
    assert "stopped 2 warm session(s) of the warm pool" in out.getvalue()  # warm sessions are not work: no --force
    assert project.verbs() == ["destroy"]
    assert fake.running == set()
    assert pool_sessions(deps) == {}
    assert deps.ledger.warm.pool().halted == "destroyed"


@pytest.mark.usefixtures("on_fake")
def test_an_update_stops_the_warm_pool_first(
    resources: ExperimentResources, fake: FakeAgentRuntime, tmp_path: Path
) -> None:
    """Warm sessions run the image being replaced: an update stops them (the pool refills with the next batch's
    work) and does not count them as work in flight."""
    from tests.fake_cdk import FakeCdkProject
    from tests.integration.ops.test_upgrade_guard import DIFFERS, STACK, update
    from tests.integration.sdk.test_sdk_submit import _deploy_stack

    deps = warm_deps(resources, fake, warm=2)
    WarmPool(deps).tick(budget_s=10)
    project = FakeCdkProject(tmp_path / "project")
    project.script({"diff": {"exit": 1, "lines": DIFFERS}, "deploy": {"outputs": {STACK: resources.stack_outputs()}}})
    _deploy_stack(resources.stack_outputs())
    deployment, out = update(resources, project, max_sessions=resources.config.max_sessions + 1)
    deployment.deploy(yes=True)
    assert project.verbs() == ["diff", "deploy"]
    assert "stopped 2 warm session(s)" in out.getvalue()
    assert fake.running == set()
    assert deps.ledger.warm.pool().halted == "stopped"


def test_an_update_refused_leaves_the_warm_pool_running(
    resources: ExperimentResources, fake: FakeAgentRuntime, tmp_path: Path
) -> None:
    """The refusal is decided before the warm pool is stopped: a refused update changes nothing."""
    from rollout_pipeline.sdk import SdkError
    from tests.fake_cdk import FakeCdkProject
    from tests.integration.ops.test_upgrade_guard import DIFFERS, STACK, update
    from tests.integration.sdk.test_sdk_submit import _deploy_stack

    deps = warm_deps(resources, fake, warm=2)
    WarmPool(deps).tick(budget_s=10)
    send(resources, seed_batch(resources, inputs={"q1": {}}, group_size=1))  # work in flight: a queued rollout
    project = FakeCdkProject(tmp_path / "project")
    project.script({"diff": {"exit": 1, "lines": DIFFERS}, "deploy": {"outputs": {STACK: resources.stack_outputs()}}})
    _deploy_stack(resources.stack_outputs())
    deployment, out = update(resources, project, max_sessions=resources.config.max_sessions + 1)
    with pytest.raises(SdkError, match="in flight"):
        deployment.deploy(yes=True)
    assert project.verbs() == ["diff"]
    assert "warm session" not in out.getvalue()
    assert list(pool_sessions(deps).values()) == [WarmState.IDLE] * 2
    assert len(fake.running) == 2


def test_a_spent_budget_starts_nothing_warm_or_cold(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    clock = ShiftedClock()
    deps = warm_deps(resources, fake, warm=2, clock=clock)
    send(resources, seed_batch(resources, batch_id="spender", inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.INVOKED]
    drive(resources, deps)
    assert deps.ledger.experiment.slots_and_spend()[1] > 0  # something spent
    clock.advance(5)
    deps.ledger.experiment.set_budget(1e-9, clock.now().isoformat())
    assert WarmPool(deps).tick(budget_s=10).warmed == 0  # paused: no warm session started
    deps.ledger.experiment.set_budget(100.0, clock.now().isoformat())
    assert WarmPool(deps).tick(budget_s=10).warmed == 2
    deps.ledger.experiment.set_budget(1e-9, clock.now().isoformat())
    send(resources, seed_batch(resources, batch_id="batch-2", inputs={"q1": {}}, group_size=1))
    assert list(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.HELD_BUDGET]  # not taken warm
    assert list(pool_sessions(deps).values()) == [WarmState.IDLE] * 2
    assert fake.warm_reuses == 0


@pytest.fixture
def booked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every reservation write of a pace schedule, as (budget, starts booked in it)."""
    writes: list[tuple[str, int]] = []
    reserve_at = Pacer.reserve_at

    def spy(pacer: Pacer, not_before: float, latest: float, *, count: int = 1) -> tuple[float | None, float]:
        writes.append((pacer.budget, count))
        return reserve_at(pacer, not_before, latest, count=count)

    monkeypatch.setattr(Pacer, "reserve_at", spy)
    return writes


def test_a_batch_the_pool_covers_books_its_takes_starts_in_one_write(
    resources: ExperimentResources, fake: FakeAgentRuntime, booked: list[tuple[str, int]]
) -> None:
    """The SQS batch's warm takes reserve their `tps` starts together (`Pacer.expect`): one conditional write for the
    batch, not one per take; each take then starts at one of them."""
    deps = warm_deps(resources, fake, warm=4)
    WarmPool(deps).tick(budget_s=10)
    booked.clear()  # the fill's own writes
    send(resources, seed_batch(resources, inputs={"q1": {}, "q2": {}}, group_size=2))
    assert sorted(dispatch_once(resources, deps).outcomes.values()) == [Dispatch.WARM] * 4
    assert rollout_invokes(fake) == ["reinvoked"] * 4
    # The first take books the four starts in one write; a take that came more than 40 ms after its start (a loaded
    # machine) would book its own, never use it late.
    assert booked[0] == ("tps", 4), booked


def test_a_fill_chunk_books_its_warm_ups_session_starts_in_one_write(
    resources: ExperimentResources, fake: FakeAgentRuntime, booked: list[tuple[str, int]]
) -> None:
    """A fill chunk's warm-ups reserve their new-session starts together (`Pacer.expect` on the session budget): one
    conditional write for the chunk's sessions on the experiment's session budget, not one per warm-up."""
    deps = warm_deps(resources, fake, warm=4)
    pool = WarmPool(deps, CountedCapacity(deps))  # 25 new sessions a second: one chunk of four
    pool.capacity_recheck_s = 3600.0
    tick = pool.tick(budget_s=10)
    assert (tick.warmed, fake.warmups) == (4, 4)
    sessions = [count for budget, count in booked if budget.startswith("session")]
    assert sessions[0] == 4, booked  # a warm-up more than 40 ms late for its start would book its own
