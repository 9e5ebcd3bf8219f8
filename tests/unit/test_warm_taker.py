"""A dispatcher process's view of the warm pool (`lifecycle.warm.WarmTaker`): a walk from a random point (another after
a collision), and a fresh read once the view proves stale, so a burst that takes the whole pool from several
processes starts every rollout warm. Injected clocks: nothing here waits."""

from __future__ import annotations

import random

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger.warm_items import WarmSession, WarmState
from rollout_pipeline.lifecycle.warm import DEMAND_NOTE_S, EMPTY_RECHECK_S, MAX_TRIES, WarmTaker
from tests.doubles import ManualClock

NOW = 1_000_000.0


class FakePool:
    """The pool's partition: idle sessions, taken by whoever's dispatch transaction comes first."""

    def __init__(self, n: int) -> None:
        self.idle = {f"w{i:04d}": WarmSession(f"w{i:04d}", WarmState.IDLE, NOW, NOW) for i in range(n)}
        self.reads = 0
        self.takes_noted: list[float] = []

    def sessions(self, *, idle_only: bool = False) -> list[WarmSession]:
        self.reads += 1
        return list(self.idle.values())

    def note_take(self, now: float) -> None:
        self.takes_noted.append(now)

    def take(self, session: WarmSession) -> bool:
        return self.idle.pop(session.session_id, None) is not None


def taker(pool: FakePool, clock: ManualClock, seed: int) -> WarmTaker:
    config = ExperimentConfig(name="exp", warm_sessions=len(pool.idle) or 1)
    return WarmTaker(pool, config, wall=lambda: NOW, monotonic=clock, rng=random.Random(seed))  # type: ignore[arg-type]


def dispatch(process: WarmTaker, pool: FakePool) -> bool:
    """One rollout's dispatch as `dispatch._dispatch_warm` tries: True when it started warm."""
    for _ in range(MAX_TRIES):
        session = process.next()
        if session is None:
            return False
        if pool.take(session):
            process.took()
            return True
        process.collided()
    return False


def test_a_burst_from_five_processes_takes_every_warm_session() -> None:
    """1,024 rollouts, 1,024 warm sessions, five dispatcher processes interleaved: every rollout starts warm (before:
    a rotation from a random start in each process ran into the others' runs and gave up after 3 collisions, and
    a view that ran out was not read again for 2 s)."""
    pool, clock = FakePool(1024), ManualClock()
    processes = [taker(pool, clock, seed) for seed in range(5)]
    warm = 0
    for i in range(1024):
        clock.advance(0.01)  # ~1,024 dispatches over 10 s, the processes in turn
        warm += dispatch(processes[i % 5], pool)
    assert warm == 1024
    assert pool.idle == {}
    collisions = sum(p.collisions for p in processes)
    assert sum(p.reads for p in processes) <= 5 + collisions / 2  # a read per two collisions at most


def test_a_stale_view_is_read_again_and_an_empty_pool_is_not_read_in_a_loop() -> None:
    pool, clock = FakePool(4), ManualClock()
    process = taker(pool, clock, 1)
    assert process.next() is not None  # first read: four sessions
    pool.idle.clear()  # another process took them all
    assert dispatch(process, pool) is False  # its stale view's sessions collide, the fresh read shows none
    assert pool.reads == 2
    for _ in range(10):
        clock.advance(EMPTY_RECHECK_S / 5)
        assert process.next() is None
    assert 3 <= pool.reads <= 4  # while the pool has none: once every `EMPTY_RECHECK_S` (two in 10 x 1/5 of it)


def test_processes_walking_their_own_runs_rarely_ask_for_the_same_session() -> None:
    """Five processes, 1,024 sessions, the processes in a random order: each walks a run of the view of its own, so
    a dispatch transaction that finds its session taken by another (a failed write) is rare: random picks collided
    208 times here (every session others took since the view was read), walking 27-42 times."""
    for trial in range(3):
        pool, clock, order = FakePool(1024), ManualClock(), random.Random(trial)
        processes = [taker(pool, clock, seed + 10 * trial) for seed in range(5)]
        warm = 0
        for _ in range(1024):
            clock.advance(0.01)
            warm += dispatch(processes[order.randrange(5)], pool)
        assert warm == 1024
        assert sum(p.collisions for p in processes) <= 64
        assert sum(p.reads for p in processes) <= 25


def test_a_process_tells_the_pool_of_its_takes_at_most_once_per_note_interval() -> None:
    """A take tells the pool (its fill waits while a burst of takes runs at the invoke rate), but one process's
    burst costs one pool write per `DEMAND_NOTE_S`, not one per rollout."""
    pool, clock = FakePool(100), ManualClock()
    process = taker(pool, clock, 3)
    for _ in range(100):
        clock.advance(DEMAND_NOTE_S / 20)  # 100 takes over 5 intervals
        assert dispatch(process, pool)
    assert len(pool.takes_noted) == 5
