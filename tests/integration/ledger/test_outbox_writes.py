"""The outbox's writes: a completed rollout's publish and its entry are recorded by the writes the stops make
anyway (freeing the slot, a failed stop's re-filing), and every guarantee holds under the faithful profile: one
terminal state, one event (again only after a crash), every session stopped, its slot held until then."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.contracts import RolloutCost, iso
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import Terminal
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH, OUTBOX_STOP
from rollout_pipeline.ledger.rollouts import DISPATCHED, DispatchStart
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.stops import hold_until
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ports import RuntimeThrottled
from tests.integration.lifecycle_support import (
    ShiftedClock,
    by_type,
    complete_once,
    dispatch_once,
    ledger_item,
    moto_lock,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

BATCH = ids.batch_id_for_upload("in", "datasets/outbox.jsonl", "v1")
ROLLOUT_KEY = keys.rollout_key(BATCH, "a", 0)


def one_rollout(resources: ExperimentResources, **options: Any) -> None:
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=1, **options))


def count_rollout_requests(deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Reads and writes (plain updates and transactions, conflicts retried inside each) of the rollout's item."""
    writes: Counter[str] = Counter()
    table = deps.ledger.rollouts.table
    get, update, transact = table.get, table.update, table.transact

    def counted_get(key: Mapping[str, Any]) -> Any:
        if dict(key) == ROLLOUT_KEY:
            writes["read"] += 1
        return get(key)

    def counted_update(key: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        if dict(key) == ROLLOUT_KEY:
            writes["update"] += 1
        return update(key, *args, **kwargs)

    def counted_transact(items: Sequence[Mapping[str, Any]], **kwargs: Any) -> Any:
        if any(body.get("Key") == ROLLOUT_KEY for entry in items for body in entry.values()):
            writes["transaction"] += 1
        return transact(items, **kwargs)

    monkeypatch.setattr(table, "get", counted_get)
    monkeypatch.setattr(table, "update", counted_update)
    monkeypatch.setattr(table, "transact", counted_transact)
    return writes


def test_a_completion_reads_the_rollout_item_once_and_writes_it_twice(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    one_rollout(resources)
    dispatch_once(resources, deps)
    requests = count_rollout_requests(deps, monkeypatch)

    complete_once(resources, deps)

    # One read (not a second one after the terminal transaction: `finish_dispatched`), the terminal transaction,
    # then the slot freed with the entry's clear: no write for the publish, no separate clear (before: 2
    # reads and 4 writes, `outbox_done` and `clear_outbox` on their own).
    assert requests == Counter({"read": 1, "transaction": 2})
    item = ledger_item(resources, ROLLOUT_KEY)
    assert item["state"] == "succeeded"
    for gone in ("outbox", "outbox_id", "outbox_lease", "stop_sessions", "held_slots", keys.OUTBOX_PK):
        assert gone not in item
    assert len(fake.stops()) == 1
    assert slots_in_flight(resources) == 0
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1


@pytest.mark.parametrize("failure", ["throttled", "unexpected"])
def test_a_failed_stop_keeps_the_slot_and_the_publish_is_not_repeated(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    clock: ShiftedClock,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    """A stop that fails (throttled: re-filed by `note_stop_failed`; an unexpected error: the entry given back by
    `return_outbox`) takes the publish out of the entry in that same write: the sweeper's later pass stops the
    session and frees its slot, and publishes nothing again."""
    one_rollout(resources)
    dispatch_once(resources, deps)
    error = RuntimeThrottled("StopRuntimeSession: ThrottlingException") if failure == "throttled" else OSError("x")

    def failing_stop(session_id: str, wait_until: float | None = None) -> None:
        raise error

    monkeypatch.setattr(deps.limits.runtime, "stop", failing_stop)
    assert not complete_once(resources, deps).failures
    monkeypatch.undo()

    published = trainer_events(resources)
    assert len(by_type(published, "Rollout Completed")) == 1  # the trainer did not wait for the stop
    item = ledger_item(resources, ROLLOUT_KEY)
    assert item["outbox"] == {OUTBOX_STOP}
    assert "outbox_lease" not in item
    assert item["held_slots"] == item["stop_sessions"] == {item["session_id"]}
    assert slots_in_flight(resources) == 1  # held until the stop is confirmed
    assert fake.running == {item["session_id"]}

    clock.advance(120 + deps.outbox_age_s)  # past the re-filed entry's backoff
    assert sweep(deps).outbox_drained == 1

    assert trainer_events(resources) == []  # nothing published again
    assert fake.running == set()
    assert slots_in_flight(resources) == 0
    item = ledger_item(resources, ROLLOUT_KEY)
    for gone in ("outbox", "outbox_id", "stop_sessions", "held_slots", keys.OUTBOX_PK):
        assert gone not in item
    assert sweep(deps).outbox_drained == 0


def test_a_slot_freed_meant_to_clear_the_entry_leaves_a_newer_entry(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, clock: ShiftedClock
) -> None:
    """`free_stopped(clear_entry=True)` on an entry that moved on (a later attempt ended meanwhile, adding its
    own publish and stop) releases the stopped session's slot once and keeps the newer entry's actions."""
    one_rollout(resources, max_attempts=2)
    dispatch_once(resources, deps)
    first = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert first is not None
    assert first.session_id
    sid1 = first.session_id
    sid2 = ids.session_id("test-exp", BATCH, "a", 0, 2)
    rollouts = deps.ledger.rollouts
    assert rollouts.requeue_for_retry(
        first, next_session_id=sid2, stop_pending=True, hold_slot_until=hold_until(deps, first)
    )
    old_entry = rollouts.get_rollout(BATCH, "a", 0)  # what the retry's drainer read: {enqueue, stop}, sid1
    assert old_entry is not None
    assert old_entry.outbox_id
    for shard in range(keys.SESSION_SHARDS):  # the first counter with room
        start = rollouts.begin_dispatch(
            exp_id="test-exp",
            batch_id=BATCH,
            input_id="a",
            index=0,
            attempt=2,
            session_id=sid2,
            submitted_at=iso(deps.now()),
            deadline=int(deps.now().timestamp()) + 600,
            max_sessions=resources.config.max_sessions,
            policy_version=None,
            slot_shard=shard,
        )
        if start is not DispatchStart.NO_SLOT:
            break
    assert start is DispatchStart.STARTED
    outcome = Terminal(state="succeeded", finished_at=deps.now(), reward=1.0)
    assert rollouts.finish(
        ids.AttemptRef(BATCH, "a", 0, 2),
        exp_id="test-exp",
        from_state=DISPATCHED,
        outcome=outcome,
        outbox=frozenset({OUTBOX_PUBLISH}),
        session_id=sid2,
        hold_slot_until=hold_until(deps),
    )
    assert slots_in_flight(resources) == 2

    assert deps.ledger.outbox.free_stopped(old_entry, sid1, clear_entry=True)
    assert not deps.ledger.outbox.free_stopped(old_entry, sid1, clear_entry=True)  # once

    assert slots_in_flight(resources) == 1
    item = ledger_item(resources, ROLLOUT_KEY)
    assert item["outbox_id"] != old_entry.outbox_id
    assert {OUTBOX_PUBLISH, OUTBOX_STOP} <= set(item["outbox"])
    assert item["stop_sessions"] == item["held_slots"] == {sid2}


@pytest.mark.parametrize(
    "outcome",
    [
        Terminal(state="succeeded", finished_at=datetime(2026, 11, 24, 6, 30, 1, 123456, UTC), reward=0.5),
        Terminal(state="failed", finished_at=datetime(2026, 11, 24, 6, 30, 2, tzinfo=UTC), reason="x", error="y"),
        Terminal(
            state="succeeded",
            finished_at=datetime(2026, 11, 24, 6, 30, 3, tzinfo=UTC),
            reward=1.0,
            rewards=[1.0, 0.25],
            result_uri="s3://results/k.json",
            result_size=123,
        ),
    ],
)
def test_the_rollout_a_completion_drains_is_the_item_as_written(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    monkeypatch: pytest.MonkeyPatch,
    outcome: Terminal,
) -> None:
    """`finish_dispatched` returns the rollout as its transaction left it without reading it again (one read
    per completion, not two): the same record a strongly consistent read gives."""
    one_rollout(resources)
    dispatch_once(resources, deps)
    rec = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert rec is not None
    assert rec.invoked_at is not None
    reads: list[Any] = []
    get = deps.ledger.rollouts.table.get
    monkeypatch.setattr(deps.ledger.rollouts.table, "get", lambda key: reads.append(key) or get(key))

    after = deps.ledger.rollouts.finish_dispatched(
        rec, outcome=outcome, outbox=frozenset({OUTBOX_PUBLISH}), hold_slot_until=hold_until(deps, rec)
    )

    assert reads == []
    assert after is not None
    assert after == deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert after.outbox == {OUTBOX_PUBLISH, OUTBOX_STOP}
    assert after.held_slots == after.stop_sessions == {rec.session_id}
    assert deps.ledger.rollouts.finish_dispatched(rec, outcome=outcome, outbox=frozenset({OUTBOX_PUBLISH})) is None


#: A value for every type a field of `Terminal` may have: a new field of a new type fails the test below until it
#: is given one here (and so is written, read and mirrored like the others).
EVERY_TYPE: dict[str, Any] = {
    "str": "failed",
    "datetime": datetime(2026, 11, 24, 6, 30, 4, 250000, UTC),
    "str | None": "x-{name}",
    "float | None": 0.625,
    "float | list[float] | None": [0.125, 0.875],
    "int | None": 4321,
    "datetime | None": datetime(2026, 11, 24, 6, 30, 4, 125000, UTC),
    "bool": True,  # `idle` (the agent had finished) and `session_started` (its span is kept)
    "RolloutCost | None": RolloutCost(
        usd=0.001875,
        agentcore_memory_usd=0.00125,
        agentcore_cpu_usd=0.0005,
        pipeline_usd=0.000125,
        cpu="measured",
        cpu_s=20.0,
        session_s=60.0,
        sessions=1,
        session_end="estimated",
        usd_max=0.0025,
        priced_as="AgentCore us-east-1",
    ),
}


def every_field_set() -> Terminal:
    """A terminal outcome with every field of `Terminal` set (a failed one: `reason` is then stored)."""
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(Terminal):
        annotation = str(spec.type)
        assert annotation in EVERY_TYPE, f"Terminal.{spec.name}: give its type ({annotation}) a value in EVERY_TYPE"
        value = EVERY_TYPE[annotation]
        values[spec.name] = value.format(name=spec.name) if isinstance(value, str) and "{" in value else value
    values["reason"] = "agent_error"
    return Terminal(**values)


def test_a_terminal_record_with_every_field_set_is_returned_as_a_read_gives_it(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    """The record `finish_dispatched` returns (and completion publishes from, without reading the item again) is
    the one a read gives, field for field, whatever fields the outcome has: a field written but not mirrored fails
    here, not as an event that lacks it."""
    one_rollout(resources)
    dispatch_once(resources, deps)
    rec = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert rec is not None
    outcome = every_field_set()
    after = deps.ledger.rollouts.finish_dispatched(rec, outcome=outcome, outbox=frozenset({OUTBOX_PUBLISH}))
    read = deps.ledger.rollouts.get_rollout(BATCH, "a", 0)
    assert after is not None
    assert read is not None
    differ = {f.name for f in dataclasses.fields(read) if getattr(after, f.name) != getattr(read, f.name)}
    assert differ == set()
    assert all(getattr(read, name) is not None for name in ("reason", "error", "reward", "rewards", "result_uri"))
