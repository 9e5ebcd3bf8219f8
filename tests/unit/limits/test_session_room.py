"""The session budget's room (`Pacer.read_room`, `Pacer.claim`): when the new-session RATE binds (free slots), new
rollouts wait in the ordered gate and it lets through only what the budgets can start within `ADMIT_AHEAD_S`, lowest
keys first."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rollout_pipeline.limits.admission import ADMIT_AHEAD_S, ROOM_BATCH_S, SlotGate
from rollout_pipeline.limits.pacing import LATENESS_S, Clocks, Pacer
from tests.conftest import wait_for
from tests.doubles import FakeSchedules, ManualClock

pytestmark = pytest.mark.timing


def _room(schedules: FakeSchedules, rate: float, now: list[float]) -> Pacer:
    return Pacer(schedules, "session#0", rate, clocks=Clocks(wall=lambda: now[0]))  # type: ignore[arg-type]


def _gate(session: Pacer, in_flight: int, **clocks: Any) -> SlotGate:
    """A gate of one process (no admission board) with `in_flight` of 100 slots taken; each poll reads the session
    schedule with the counters, as `SlotShards.in_flight_and_board` does."""
    return SlotGate(
        lambda: (in_flight, [], {session.budget: session.schedule.read().values}), lambda: 100, session, **clocks
    )


def test_room_is_what_the_schedule_can_start_within_the_horizon() -> None:
    schedules, now = FakeSchedules(), [1000.0]
    room = _room(schedules, 5.0, now)
    interval = (1 + LATENESS_S) / 5.0
    assert room.read_room(ADMIT_AHEAD_S) == int(ADMIT_AHEAD_S / interval)  # idle: a horizon's worth
    schedules.tat_us = int((now[0] + ADMIT_AHEAD_S) * 1e6)  # booked to the horizon
    assert room.read_room(ADMIT_AHEAD_S) == 0
    now[0] += 3 * interval  # time passes: three starts' worth of room again
    assert room.read_room(ADMIT_AHEAD_S) == 3


def test_a_schedule_read_with_the_slot_counters_costs_no_read_of_its_own() -> None:
    """The gate's poll reads the schedules in its Query of the counters (`LimitLedger.limits_view`): the room
    takes the session budget's from there; one the Query did not find ({}) was never used (idle)."""
    schedules, now = FakeSchedules(), [1000.0]
    room = _room(schedules, 5.0, now)
    interval = (1 + LATENESS_S) / 5.0
    booked = {"tat": int((now[0] + ADMIT_AHEAD_S - 2 * interval) * 1e6)}
    assert room.read_room(ADMIT_AHEAD_S, booked) == 2
    assert room.read_room(ADMIT_AHEAD_S, {}) == 2  # no newer news: the known schedule holds
    assert schedules.reads == 0
    assert room.read_room(ADMIT_AHEAD_S) == 2  # without them: one read
    assert schedules.reads == 1


def test_a_slow_budget_still_has_room_for_one_when_idle() -> None:
    schedules, now = FakeSchedules(), [1000.0]
    room = _room(schedules, 0.2, now)  # one start every 6 s: longer than the horizon
    assert room.read_room(ADMIT_AHEAD_S) == 1


def test_a_new_rollout_claims_only_an_idle_budget_and_counts_its_claim() -> None:
    schedules, now = FakeSchedules(), [1000.0]
    room = _room(schedules, 5.0, now)
    assert room.claim()  # idle: straight to its slot
    assert not room.claim()  # the first claim booked the next start: the second rollout queues in the gate
    assert schedules.reads == 2  # each claim reads the schedule (another process may have booked it)
    now[0] += 1.0
    assert room.claim()
    now[0] += 1.0
    schedules.tat_us = int((now[0] + 0.5) * 1e6)  # another process booked ahead
    assert not room.claim()


def test_let_through_sessions_count_as_booked() -> None:
    schedules, now = FakeSchedules(), [1000.0]
    room = _room(schedules, 5.0, now)
    per_horizon = int(ADMIT_AHEAD_S / ((1 + LATENESS_S) / 5.0))
    assert room.read_room(ADMIT_AHEAD_S) == per_horizon
    room.promise(per_horizon - 2)
    assert room.room(ADMIT_AHEAD_S) == 2  # no read: what this process let through is booked
    assert room.read_room(ADMIT_AHEAD_S) == 2  # and a read of the (still empty) schedule does not undo it


def test_the_gate_lets_through_only_the_room_lowest_keys_first() -> None:
    schedules, now = FakeSchedules(), [time.time()]
    room = _room(schedules, 5.0, now)
    # Booked to the horizon: no room until the test moves the schedule.
    schedules.tat_us = int((now[0] + 10) * 1e6)
    gate = _gate(room, 50, sleep=lambda _s: time.sleep(0.02))
    admitted: list[str] = []
    lock = threading.Lock()

    def waiter(key: str) -> None:
        if gate.wait(time.monotonic() + 10, key):
            with lock:
                admitted.append(key)

    keys = [f"k{n}" for n in (5, 3, 4, 1, 2)]  # arrival order is not key order
    threads = [threading.Thread(target=waiter, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    wait_for(lambda: len(gate.queued()) == len(keys) and gate.polls >= 2, what="every waiter queued, two polls")
    assert admitted == []  # 50 slots are free, but the session budget has no room
    assert gate.must_queue("k0")  # and a newly received rollout queues too (the budget is busy)
    interval = (1 + LATENESS_S) / 5.0
    with lock:  # time passes: the schedule has room for two starts
        now[0] += 10 - ADMIT_AHEAD_S + 2 * interval + 0.01
    wait_for(lambda: len(admitted) >= 2, what="two admissions")
    time.sleep(0.2)  # a third admission would show up now (the gate counted its two as booked)
    assert sorted(admitted) == ["k1", "k2"]
    now[0] += 10  # everything drains
    for t in threads:
        t.join(timeout=5)
    assert sorted(admitted) == ["k1", "k2", "k3", "k4", "k5"]


def test_while_the_rate_binds_the_gate_lets_a_batch_through_per_poll_not_one_each() -> None:
    """Room for one start at a time would cost a poll, a board write and a wake-up per rollout: the gate waits until
    the schedule has room for a batch of starts (`ROOM_BATCH_S` worth) and lets them through together,
    while the schedule is still booked at least half the horizon ahead (no start goes unused)."""
    clock = ManualClock(1_000.0)
    schedules = FakeSchedules()
    room = Pacer(schedules, "session#0", 5.0, clocks=Clocks(wall=clock))  # type: ignore[arg-type]
    interval = (1 + LATENESS_S) / 5.0
    assert int(ROOM_BATCH_S / interval) == 2
    schedules.tat_us = int((clock.t + ADMIT_AHEAD_S) * 1e6)  # booked to the horizon
    let_through: list[tuple[int, float]] = []
    promise = room.promise

    def counted(sessions: int) -> None:
        let_through.append((sessions, room.tat - clock.t))  # how far ahead the schedule was booked then
        promise(sessions)

    room.promise = counted  # type: ignore[method-assign,assignment]
    keys = [f"k{n}" for n in range(6)]

    def sleep(seconds: float) -> None:
        # Time moves only once every waiter is queued and every one let through has left: the test's clock must
        # not run ahead of the threads (a poll would count waiters that hold a ticket and have not woken yet).
        wait_for(
            lambda: (
                len(gate.queued()) + len(admitted) == len(keys)
                and len(admitted) == sum(sessions for sessions, _ahead in let_through)
            ),
            what="every waiter queued, every one let through gone",
        )
        clock.sleep(seconds)

    gate = _gate(room, 0, monotonic=clock.monotonic, sleep=sleep)
    admitted: list[str] = []
    lock = threading.Lock()

    def waiter(key: str) -> None:
        if gate.wait(clock.t + 60, key):
            with lock:
                admitted.append(key)

    threads = [threading.Thread(target=waiter, args=(key,)) for key in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(admitted) == keys
    assert [sessions for sessions, _ahead in let_through] == [2, 2, 2]  # main: one at a time, a poll each
    assert all(ahead >= ADMIT_AHEAD_S / 2 for _sessions, ahead in let_through)
    assert gate.polls <= 6
