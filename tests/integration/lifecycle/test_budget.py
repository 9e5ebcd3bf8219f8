"""The budget over moto and the fake ACR: 40 rollouts with a budget that runs out after about 15 pause dispatch
(only what was dispatched finishes; nothing fails, nothing is dead-lettered, the rest stays queued), `Budget Warning`
and `Budget Exhausted` are published once each, and `rollouts budget set` resumes dispatch until every rollout ended
exactly once. Held rollouts never count toward `max_limit_wait_s`; a batch's own budget holds only that batch."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.contracts import BudgetExhausted, BudgetWarning, DetailType, FileOptions, RolloutCompleted
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import BUDGET_HELD, BUDGET_USED_PERCENT
from rollout_pipeline.sdk.replay import batch_events, experiment_events
from tests.conftest import REGION
from tests.doubles import ShiftedClock
from tests.integration.conftest import queue_depth
from tests.integration.lifecycle.test_costs import CPU_USD_PER_S, MEMORY_USD_PER_S, PIPELINE_USD
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

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

#: Every rollout lives 60 s (the test's clock) and reports 1 CPU-second: what each adds to the spend.
ROLLOUT_USD = 60 * MEMORY_USD_PER_S + 1.0 * CPU_USD_PER_S + PIPELINE_USD
USAGE = {"_rollout_usage": {"cpu_s": 1.0, "rollouts": 1}}


def budget_deps(resources: ExperimentResources, clock: ShiftedClock, **settings: object) -> LifecycleDeps:
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(extra=USAGE))
    # the session rate and call rate do not bind here: a round starts what the free slots allow. The experiment
    # keeps its own limits (`pool=None`): through the account pool, its share of new sessions starts at the
    # minimum and follows demand on the wall clock, so rounds started 0-3 of 5 free slots. A result's write
    # time is its S3 event's (real time) while the test's clock runs 60 s a round ahead of it: the idle timeout is
    # the longest, so a session's bound (its result's write plus the idle timeout) never falls before its start
    # and every rollout costs its 60 s, however many rounds pass before it runs.
    limits = {"max_sessions": 5, "session_rate_limit": 1000, "tps_limit": 1000, "idle_timeout_s": 28_800, **settings}
    return make_deps(resources, fake, clock=clock, limits=limits, budget_recheck_s=0, pool=None)  # type: ignore[arg-type]


def one_round(
    resources: ExperimentResources, deps: LifecycleDeps, clock: ShiftedClock, *, fill: bool = False
) -> Counter[Dispatch]:
    """One dispatcher pass over the queue (up to the free slots, the rest held or waiting), 60 s, the results.
    It stops receiving once every slot is taken: the rest would only wait at the gate and be re-sent. `fill`: it
    receives `max_sessions` at a time (as many as the slots a round frees), each with time to pass the gate (a
    burst's settling, a poll), so a round starts what the slots allow however loaded the machine; else 10 at a
    time, the ones without a slot given back after 0.3 s (the gate orders the 10 in hand: group order)."""
    outcomes: Counter[Dispatch] = Counter()
    queued = queue_depth(resources.rollout_queue_url)
    per_receive, wait_s = (deps.config.max_sessions, 2.0) if fill else (10, 0.3)
    for _ in range(-(-40 // per_receive)):  # every message of the queue seen once: 40 at most
        result = dispatch_once(resources, deps, wait_s=wait_s, max_messages=per_receive)
        outcomes.update(result.outcomes.values())
        seen = sum(outcomes.values())
        if not result.outcomes or seen >= queued or outcomes[Dispatch.INVOKED] >= deps.config.max_sessions:
            break
    clock.advance(60)
    while complete_once(resources, deps).outcomes:
        pass
    return outcomes


def test_a_spent_budget_pauses_dispatch_and_raising_it_completes_the_batch_exactly_once(
    resources: ExperimentResources,
) -> None:
    clock = ShiftedClock(frozen=True)
    budget = 14.5 * ROLLOUT_USD  # runs out after about 15 rollouts
    deps = budget_deps(resources, clock, budget_usd=budget)
    inputs = {f"q{i:02d}": {"i": i} for i in range(10)}
    send(resources, seed_batch(resources, batch_id="budget-1", inputs=inputs, group_size=4))
    ledger = Ledger.open(resources.table_name)
    dispatched = 0
    rounds = 0
    while True:
        rounds += 1
        outcomes = one_round(resources, deps, clock, fill=True)
        dispatched += outcomes[Dispatch.INVOKED]
        if outcomes[Dispatch.HELD_BUDGET]:
            break
        assert rounds < 40  # a loaded machine starts fewer per round (each waits 0.3 s at most for the session rate)
    # paused: what was dispatched finished, nothing more started, nothing failed, nothing dead-lettered
    assert 15 <= dispatched <= 19  # spent once 15 ended; a round starts at most max_sessions (5) more
    assert outcomes[Dispatch.INVOKED] == 0
    states = Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("budget-1"))
    assert states["succeeded"] == dispatched
    assert set(states) <= {"succeeded", "queued"}  # queued: a dispatch the harness' short waits gave back
    assert queue_depth(resources.rollout_queue_url) == 40 - dispatched  # the rest: queued
    assert queue_depth(resources.dlq_urls["rollout"]) == 0
    counts = deps.metrics.drain()[0]
    assert counts[BUDGET_HELD] >= 40 - dispatched
    _in_flight, spent = ledger.experiment.slots_and_spend()
    assert spent == pytest.approx(dispatched * ROLLOUT_USD, rel=1e-6)
    assert spent >= budget

    for _ in range(3):  # still paused: held again and again, announced once
        outcomes = one_round(resources, deps, clock, fill=True)
        assert outcomes[Dispatch.INVOKED] == 0
        assert outcomes[Dispatch.HELD_BUDGET] >= 40 - dispatched  # re-sent with no delay here: seen again at once
        assert queue_depth(resources.rollout_queue_url) == 40 - dispatched
        sweep(deps)
    events = trainer_events(resources)
    (warning,) = [BudgetWarning.model_validate(d) for d in by_type(events, "Budget Warning")]
    (exhausted,) = [BudgetExhausted.model_validate(d) for d in by_type(events, "Budget Exhausted")]
    assert (warning.scope, warning.batch_id, warning.budget_usd) == ("experiment", "", budget)
    assert warning.spent_usd >= 0.8 * budget
    assert exhausted.budget_usd == budget
    assert exhausted.spent_usd >= budget
    assert exhausted.rollouts_waiting == 40 - dispatched
    assert exhausted.waiting_by_batch == {"budget-1": 40 - dispatched}
    completed = by_type(events, "Rollout Completed")
    # a stream of the batch made now (a trainer started after the pause) gets both, as published, from the ledger
    budget_types = [DetailType.BUDGET_WARNING, DetailType.BUDGET_EXHAUSTED]
    assert [e.detail for e in experiment_events(ledger, detail_types=budget_types)] == [warning, exhausted]
    assert list(batch_events(ledger, "budget-1", detail_types=budget_types)) == []  # the experiment's, not the batch's

    # `rollouts budget set` raises it: dispatch resumes where it stopped, until every rollout ended exactly once
    experiment_args = ["-e", "test-exp", "--region", REGION, "--outputs-file", str(outputs_file(resources))]
    assert main(["budget", "set", *experiment_args, "1"]) == EXIT_OK
    for _ in range(60):  # bounded; a handful of rounds on an idle machine
        one_round(resources, deps, clock, fill=True)
        if queue_depth(resources.rollout_queue_url) == 0:
            break
    completed += by_type(trainer_events(resources), "Rollout Completed")
    ids_ = Counter(RolloutCompleted.model_validate(d).rollout_id for d in completed)
    assert len(ids_) == 40
    states = Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("budget-1"))
    assert states == {"succeeded": 40}
    assert {rec.attempt for rec in ledger.rollouts.batch_rollouts("budget-1")} == {1}
    fake = deps.runtime
    assert isinstance(fake, FakeAgentRuntime)
    assert len(fake.invocations("started")) == 40  # one session per rollout, each started once
    assert fake.invocations("reinvoked") == []
    assert queue_depth(resources.dlq_urls["rollout"]) == 0
    assert by_type(trainer_events(resources), "Budget Exhausted") == []  # no new announcement under 1 USD
    assert list(experiment_events(ledger, detail_types=budget_types)) == []  # raised: none in force
    assert deps.metrics.drain()[1][BUDGET_USED_PERCENT]


def outputs_file(resources: ExperimentResources) -> object:
    import json
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "outputs.json"
    path.write_text(json.dumps({f"Rollouts-{resources.config.name}": resources.stack_outputs()}))
    return path


def test_held_rollouts_do_not_count_toward_max_limit_wait(resources: ExperimentResources) -> None:
    from rollout_pipeline.fakes.acr import FakeInvocation

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        hangs = inv.payload["_rollout"]["input_id"] == "blocker"
        return AgentBehaviour(kind="hang" if hangs else "success", extra=USAGE)

    clock = ShiftedClock(frozen=True)
    fake = FakeAgentRuntime(behaviour=behaviour)
    limits = {"max_sessions": 1, "max_limit_wait_s": 60}
    deps = make_deps(resources, fake, clock=clock, limits=limits, budget_recheck_s=0)  # type: ignore[arg-type]
    send(resources, seed_batch(resources, batch_id="spender", inputs={"x": {}}, group_size=1))
    assert dispatch_once(resources, deps).outcomes.popitem()[1] == Dispatch.INVOKED
    clock.advance(60)
    complete_once(resources, deps)
    ledger = Ledger.open(resources.table_name)
    assert ledger.experiment.slots_and_spend() == (0, pytest.approx(ROLLOUT_USD, rel=1e-6))  # something spent
    send(resources, seed_batch(resources, batch_id="blocker", inputs={"blocker": {}}, group_size=1))
    assert dispatch_once(resources, deps).outcomes.popitem()[1] == Dispatch.INVOKED  # the one slot stays taken
    (message,) = seed_batch(resources, batch_id="budget-2", inputs={"a": {}}, group_size=1)
    # it already waited 50 s for limits before its budget ran out
    send(resources, [message.model_copy(update={"waiting_since": clock.now() - timedelta(seconds=50)})])
    ledger.experiment.set_budget(1e-6, clock.now().isoformat())
    for _ in range(5):  # held for 10 minutes
        assert dispatch_once(resources, deps).outcomes.popitem()[1] == Dispatch.HELD_BUDGET
        clock.advance(120)
    ledger.experiment.set_budget(10.0, clock.now().isoformat())
    outcome = dispatch_once(resources, deps, wait_s=0.3).outcomes.popitem()[1]
    # no slot: it waits for limits again, 50 s + this wait, not 650 s: re-sent, not failed as throttled (a loaded
    # machine may spend the 0.3 s before the gate: re-sent for want of time, which counts the same wait)
    assert outcome in (Dispatch.REQUEUED_LIMIT, Dispatch.REQUEUED_NO_TIME)


def test_a_batch_budget_holds_that_batch_only(resources: ExperimentResources) -> None:
    clock = ShiftedClock(frozen=True)
    deps = budget_deps(resources, clock, max_sessions=1)  # one rollout at a time: each sees the batch's cost so far
    ledger = Ledger.open(resources.table_name)
    send(resources, seed_batch(resources, batch_id="capped", inputs={"a": {}, "b": {}}, group_size=2))
    send(resources, seed_batch(resources, batch_id="free", inputs={"c": {}, "d": {}}, group_size=2))
    options = FileOptions(group_size=2, rollout_timeout_s=900, max_attempts=2, budget_usd=1.5 * ROLLOUT_USD)
    clients.client("dynamodb").update_item(
        TableName=resources.table_name,
        Key={"pk": {"S": "B#capped"}, "sk": {"S": "BATCH"}},
        UpdateExpression="SET #o = :o",
        ExpressionAttributeNames={"#o": "options"},
        ExpressionAttributeValues={":o": {"S": options.model_dump_json()}},
    )
    for _ in range(40):  # bounded
        one_round(resources, deps, clock)
        if Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("free"))["succeeded"] == 4:
            break
    capped = Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("capped"))
    assert capped["succeeded"] == 2  # its budget, 1.5 rollouts, is spent after the second
    assert queue_depth(resources.rollout_queue_url) == 2
    (exhausted,) = [BudgetExhausted.model_validate(d) for d in by_type(trainer_events(resources), "Budget Exhausted")]
    assert (exhausted.scope, exhausted.batch_id) == ("batch", "capped")
    from rollout_pipeline.sdk import Experiment

    Experiment.from_outputs(resources.stack_outputs(), region=REGION).set_budget(1.0, batch="capped")
    for _ in range(40):  # bounded
        one_round(resources, deps, clock)
        if Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("capped"))["succeeded"] == 4:
            break
    assert Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("capped"))["succeeded"] == 4


@pytest.mark.parametrize("gate_saw_room", [True, False], ids=["no-slot-in-the-transaction", "at-the-gate"])
def test_a_rollout_that_waited_for_a_slot_looks_at_the_budget_again(
    resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch, gate_saw_room: bool
) -> None:
    """A rollout waits for a slot, at the gate or after the dispatch transaction found none (the gate saw room by
    another process's view); the rollout that freed it spent the rest of the budget: the waiting one is held, not
    started (only what was in flight ends)."""
    import time

    from rollout_pipeline.lifecycle.dispatch import dispatch_body

    clock = ShiftedClock(frozen=True)
    deps = budget_deps(resources, clock, max_sessions=1, budget_usd=0.9 * ROLLOUT_USD)  # spent by the first
    first, second = seed_batch(resources, batch_id="waits", inputs={"a": {}, "b": {}}, group_size=1)
    assert dispatch_body(first.model_dump_json(), deps, wait_until=time.monotonic() + 5) is Dispatch.INVOKED

    def first_ends(_until: float, _key: str) -> bool:
        clock.advance(60)
        while complete_once(resources, deps).outcomes:
            pass
        return True

    monkeypatch.setattr(deps.limits.gate, "must_queue", lambda _key: not gate_saw_room)
    monkeypatch.setattr(deps.limits.gate, "wait", first_ends)
    assert dispatch_body(second.model_dump_json(), deps, wait_until=time.monotonic() + 5) is Dispatch.HELD_BUDGET
    ledger = Ledger.open(resources.table_name)
    assert Counter(rec.state.value for rec in ledger.rollouts.batch_rollouts("waits")) == {"succeeded": 1}
