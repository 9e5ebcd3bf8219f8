"""Costs through the lifecycle over moto and the fake ACR: the cost each rollout's event carries equals a hand
computation from the price table and the durations the test sets (a clock it moves), the group and batch events
carry the sums, the ledger keeps every session's facts, and the experiment's spend is the sessions' costs to their
confirmed stops. Local mode's runtime: labelled as what the run would cost on AgentCore."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from rollout_pipeline.contracts import BatchCompleted, GroupCompleted, RolloutCompleted, RolloutFailed
from rollout_pipeline.details import rollout_event
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import ESTIMATED_COST
from tests.doubles import ShiftedClock
from tests.integration.lifecycle_support import (
    by_type,
    complete_once,
    dispatch_once,
    make_deps,
    moto_lock,
    seed_batch,
    send,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

#: us-east-1 by hand: one second of an 8 GB session, one CPU-second, the pipeline's cost of one attempt.
MEMORY_USD_PER_S = 8 * 0.00945 / 3600
CPU_USD_PER_S = 0.0895 / 3600
PIPELINE_USD = 28.62e-6


def measured(cpu_by_index: dict[int, float]) -> object:
    """Agents whose host reports `cpu_by_index[index]` CPU seconds (the rest report nothing: bounded CPU)."""

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        index = inv.payload["_rollout"]["index"]
        usage = {"_rollout_usage": {"cpu_s": cpu_by_index[index], "rollouts": 1}} if index in cpu_by_index else {}
        return AgentBehaviour(rewards=1.0, extra=usage)

    return behaviour


def test_each_rollout_costs_what_the_price_table_says_for_its_durations(resources: ExperimentResources) -> None:
    clock = ShiftedClock(frozen=True)
    fake = FakeAgentRuntime(behaviour=measured({0: 12.5, 1: 4.0}))  # type: ignore[arg-type]
    deps = make_deps(resources, fake, clock=clock)  # type: ignore[arg-type]
    messages = seed_batch(resources, batch_id="cost-1", inputs={"a": {"q": 1}, "b": {"q": 2}}, group_size=2)
    send(resources, messages)
    while dispatch_once(resources, deps).outcomes:
        pass
    clock.advance(30)  # every session lives exactly 30 s, to the completion that stops it
    while complete_once(resources, deps).outcomes:
        pass
    events = trainer_events(resources)
    completed = [RolloutCompleted.model_validate(d) for d in by_type(events, "Rollout Completed")]
    assert len(completed) == 4
    for event in completed:
        cost = event.cost
        assert cost is not None
        cpu = {0: 12.5, 1: 4.0}[event.index]
        assert cost.cpu == "measured"
        assert cost.cpu_s == cpu
        assert cost.session_s == 30
        assert cost.sessions == 1
        assert cost.session_end == "estimated"  # published before its stop
        assert cost.agentcore_memory_usd == pytest.approx(30 * MEMORY_USD_PER_S, rel=1e-6)
        assert cost.agentcore_cpu_usd == pytest.approx(cpu * CPU_USD_PER_S, rel=1e-6)
        assert cost.usd == pytest.approx(30 * MEMORY_USD_PER_S + cpu * CPU_USD_PER_S + PIPELINE_USD, rel=1e-6)
        assert cost.usd_max > cost.usd  # if the stop never came: AgentCore's idle timeout
        assert cost.local
        assert cost.priced_as.startswith("local run priced as on AgentCore us-east-1")
    total = sum(e.cost.usd for e in completed if e.cost)
    groups = [GroupCompleted.model_validate(d) for d in by_type(events, "Group Completed")]
    assert len(groups) == 2
    for group in groups:
        assert group.cost is not None
        assert group.cost.rollouts == 2
        assert group.cost.cpu_measured == 2
        members = [e.cost.usd for e in completed if e.input_id == group.input_id and e.cost]
        assert group.cost.usd == pytest.approx(sum(members), rel=1e-9)
    (batch,) = [BatchCompleted.model_validate(d) for d in by_type(events, "Batch Completed")]
    assert batch.cost is not None
    assert batch.cost.rollouts == 4
    assert batch.cost.usd == pytest.approx(total, rel=1e-9)
    assert deps.metrics.drain()[0][ESTIMATED_COST] == pytest.approx(total, rel=1e-9)

    # the stops came at the same moment: the ledger has every session's facts, the spend is the same figure
    ledger = Ledger.open(resources.table_name)
    for rec in ledger.rollouts.batch_rollouts("cost-1"):
        (span,) = rec.spans
        assert span.started_at == clock.now() - timedelta(seconds=30)
        assert span.stopped_at == clock.now()
        assert span.idle
        assert span.cpu_s in (12.5, 4.0)
    in_flight, spent = ledger.experiment.slots_and_spend()
    assert in_flight == 0
    assert spent == pytest.approx(total, rel=1e-6)


def test_without_a_measurement_the_cpu_is_bounded_and_said_so(resources: ExperimentResources) -> None:
    clock = ShiftedClock(frozen=True)
    deps = make_deps(resources, FakeAgentRuntime(), clock=clock)  # type: ignore[arg-type]
    send(resources, seed_batch(resources, batch_id="cost-2", inputs={"a": {"q": 1}}, group_size=1))
    dispatch_once(resources, deps)
    clock.advance(10)
    complete_once(resources, deps)
    (detail,) = by_type(trainer_events(resources), "Rollout Completed")
    cost = RolloutCompleted.model_validate(detail).cost
    assert cost is not None
    assert cost.cpu == "bounded"
    rec = next(Ledger.open(resources.table_name).rollouts.batch_rollouts("cost-2"))
    (span,) = rec.spans
    assert span.ended_at is not None
    busy_s = (span.ended_at - span.started_at).total_seconds()  # dispatch to the result's write
    assert cost.cpu_s == pytest.approx(max(0.0, min(busy_s, 10)) * 2, abs=1e-3)


def test_the_event_carries_the_cost_the_terminal_transition_stored(resources: ExperimentResources) -> None:
    """Priced once: the terminal transition stores its figure on the rollout item, and an event built from the item
    later (a replay), at other prices and after the session's stop, carries that figure unchanged."""
    clock = ShiftedClock(frozen=True)
    deps = make_deps(resources, FakeAgentRuntime(), clock=clock)  # type: ignore[arg-type]
    send(resources, seed_batch(resources, batch_id="cost-once", inputs={"a": {"q": 1}}, group_size=1))
    dispatch_once(resources, deps)
    clock.advance(20)
    complete_once(resources, deps)
    events = trainer_events(resources)
    (detail,) = by_type(events, "Rollout Completed")
    published = RolloutCompleted.model_validate(detail).cost
    assert published is not None
    rec = next(Ledger.open(resources.table_name).rollouts.batch_rollouts("cost-once"))
    assert "cost" in rec.stored
    assert "cost_at" not in rec.stored
    assert len(rec.stored["cost"]) <= 120, "the rollout item stays under 1 KB"
    (span,) = rec.spans
    assert span.stopped_at is not None  # confirmed after the event: the stored figure still says "estimated"
    dearer = replace(deps.prices, vcpu_hour_usd=deps.prices.vcpu_hour_usd * 10, gb_hour_usd=1.0, local=False)
    clock.advance(3600)
    rebuilt = rollout_event(rec, notified_at=None, prices=dearer).cost
    assert rebuilt is not None
    assert rebuilt.model_dump(exclude={"priced_as", "local"}) == published.model_dump(exclude={"priced_as", "local"})
    assert rebuilt.priced_as == dearer.label
    (batch,) = [BatchCompleted.model_validate(d) for d in by_type(events, "Batch Completed")]
    assert batch.cost is not None
    assert batch.cost.usd == published.usd


def test_a_timed_out_attempt_is_priced_with_the_retry_that_succeeded(
    resources: ExperimentResources, deps: LifecycleDeps
) -> None:
    from rollout_pipeline.lifecycle.sweeper import sweep

    clock = ShiftedClock(frozen=True)
    calls: list[int] = []

    def first_hangs(inv: FakeInvocation) -> AgentBehaviour:
        calls.append(inv.call_no)
        return AgentBehaviour(kind="hang") if inv.payload["_rollout"]["attempt"] == 1 else AgentBehaviour()

    deps = make_deps(resources, FakeAgentRuntime(behaviour=first_hangs), clock=clock)  # type: ignore[arg-type]
    send(
        resources, seed_batch(resources, batch_id="cost-3", inputs={"a": {"q": 1}}, group_size=1, rollout_timeout_s=60)
    )
    dispatch_once(resources, deps)
    clock.advance(61)
    sweep(deps)  # attempt 1 timed out: stopped, retried
    dispatch_once(resources, deps)
    clock.advance(5)
    complete_once(resources, deps)
    (detail,) = by_type(trainer_events(resources), "Rollout Completed")
    cost = RolloutCompleted.model_validate(detail).cost
    assert cost is not None
    assert cost.sessions == 2
    assert cost.session_s == pytest.approx(61 + 5)
    assert cost.pipeline_usd == pytest.approx(2 * PIPELINE_USD)
    assert cost.cpu == "bounded"


def test_a_refused_invoke_costs_no_session(resources: ExperimentResources) -> None:
    refusing = FakeAgentRuntime(behaviour=AgentBehaviour(kind="reject"))
    deps = make_deps(resources, refusing, clock=ShiftedClock(frozen=True))  # type: ignore[arg-type]
    send(resources, seed_batch(resources, batch_id="cost-4", inputs={"a": {"q": 1}}, group_size=1))
    dispatch_once(resources, deps)
    (detail,) = by_type(trainer_events(resources), "Rollout Failed")
    cost = RolloutFailed.model_validate(detail).cost
    assert cost is not None
    assert cost.sessions == 0
    assert cost.usd == 0


# ------------------------------------------------------------------------------------------------ runaway guard


def test_a_session_whose_stops_keep_failing_is_stopped_once_overdue_counted_and_its_cost_shows(
    resources: ExperimentResources,
) -> None:
    """AgentCore refuses a finished session's stop for minutes (the fake's failing stops): past the rollout's
    deadline plus `session_grace_s` the sweeper stops it (it no longer only waits for its maximum lifetime), counts
    it once in `SessionsOverdue`, and its whole life is in the experiment's spend and `Experiment.cost`."""
    from dataclasses import replace

    from rollout_pipeline.fakes.acr import AcrProfile
    from rollout_pipeline.lifecycle.stops import STOP_TRIES
    from rollout_pipeline.lifecycle.sweeper import sweep
    from rollout_pipeline.metric_names import SESSIONS_OVERDUE
    from rollout_pipeline.sdk import Experiment
    from tests.conftest import REGION

    profile = AcrProfile(stop_failure_share=1.0, stop_failures_in_a_row=10_000, stop_failure_kinds=("conflict",))
    usage = {"_rollout_usage": {"cpu_s": 1.0, "rollouts": 1}}
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(extra=usage), profile=profile)
    clock = ShiftedClock(frozen=True)
    settings = {"rollout_timeout_s": 60, "session_grace_s": 600, "max_lifetime_s": 3600, "idle_timeout_s": 900}
    deps = make_deps(resources, fake, clock=clock, limits=settings)  # type: ignore[arg-type]
    send(resources, seed_batch(resources, batch_id="runaway", inputs={"a": {}}, group_size=1, rollout_timeout_s=60))
    dispatch_once(resources, deps)
    complete_once(resources, deps)  # the result is recorded and published; its stop fails
    (sid,) = fake.running_sessions()
    for _ in range(12):  # the stop's passes: then nothing but its end would have come (held until its lifetime)
        clock.advance(50)
        sweep(deps)
    assert fake.stop_failures[sid] == STOP_TRIES * 3
    assert sid in fake.running_sessions()
    counts = deps.metrics.drain()[0]
    assert SESSIONS_OVERDUE not in counts  # 600 s after the result: not yet past 60 s + 600 s
    clock.advance(70)  # 670 s: overdue
    sweep(deps)
    assert fake.stop_failures[sid] > STOP_TRIES * 3, "the sweeper stops an overdue session again"
    assert deps.metrics.drain()[0][SESSIONS_OVERDUE] == 1
    fake.profile = replace(profile, stop_failures_in_a_row=1)  # AgentCore takes stops again
    clock.advance(61)  # the next pass, at most a minute later
    sweep(deps)
    assert sid not in fake.running_sessions()
    assert SESSIONS_OVERDUE not in deps.metrics.drain()[0], "counted once"
    ledger = Ledger.open(resources.table_name)
    rec = next(ledger.rollouts.batch_rollouts("runaway"))
    assert not rec.stop_sessions
    assert not rec.held_slots
    (span,) = rec.spans
    assert span.stopped_at == clock.now()
    lived = (clock.now() - span.started_at).total_seconds()
    assert lived == 12 * 50 + 70 + 61
    in_flight, spent = ledger.experiment.slots_and_spend()
    assert in_flight == 0
    assert spent == pytest.approx(lived * MEMORY_USD_PER_S + 1.0 * CPU_USD_PER_S + PIPELINE_USD, rel=1e-6)
    (published,) = by_type(trainer_events(resources), "Rollout Completed")
    assert RolloutCompleted.model_validate(published).cost.session_s < 5  # type: ignore[union-attr]
    report = Experiment.from_outputs(resources.stack_outputs(), region=REGION).cost("runaway")
    (batch,) = report.batches
    assert batch.now is not None
    assert batch.published is not None
    assert batch.now.usd == pytest.approx(spent, rel=1e-6)
    assert batch.now.usd > 50 * batch.published.usd
