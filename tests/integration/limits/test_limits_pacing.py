"""Paced call budgets across processes: ANY one-second window (aligned or sliding) stays within each budget, and
stops are served ahead of a backlog of invokes. Real processes share a moto server on loopback (the ledger)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger import pace
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.limits.pacing import (
    BLOCK_AHEAD_S,
    INVOKE_AHEAD_S,
    Clocks,
    LimitedRuntime,
    Pacer,
    call_budgets,
    dedicated_stop_share,
)
from rollout_pipeline.local.moto_server import local_aws_environ, moto_server, patched_environ
from tests.conftest import wait_for
from tests.doubles import ThreadClocks

pytestmark = pytest.mark.timing

REGION = "us-east-1"
ROOT = Path(__file__).resolve().parents[3]

WORKER = """
import json, sys, threading, time
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.limits.pacing import Pacer
table, budget, limit, threads, calls = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ledger = Ledger.open(table).limits
pacer = Pacer(ledger.schedule(budget), budget, limit)
times, lock = [], threading.Lock()
def work():
    for _ in range(calls):
        if pacer.acquire(time.monotonic() + 60):
            with lock:
                times.append(time.time())
ts = [threading.Thread(target=work) for _ in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(times))
"""


def busiest_sliding_window(times: Sequence[float], width: float = 1.0) -> int:
    """The most calls in any window [t, t + width) (it suffices to start windows at calls)."""
    ordered = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + width:
            j += 1
        best = max(best, j - i)
    return best


@pytest.fixture
def table(no_aws_credentials: None) -> Iterator[tuple[str, dict[str, str]]]:
    from rollout_pipeline.adapters import clients
    from rollout_pipeline.local.resources import create_resources

    with moto_server() as url:
        env = local_aws_environ(url, REGION)
        with patched_environ(env):
            clients.reset()
            resources = create_resources(ExperimentConfig(name="pace"), region=REGION, client=clients.client)
            yield resources.table_name, env
        clients.reset()


def test_busiest_sliding_window_helper() -> None:
    assert busiest_sliding_window([0.0, 0.5, 0.99, 1.0, 1.6]) == 3
    assert busiest_sliding_window([0.95, 1.0, 1.05, 1.9]) == 4  # aligned windows would say 1 and 3


def test_two_processes_stay_within_the_limit_in_every_sliding_window(table: tuple[str, dict[str, str]]) -> None:
    name, env = table
    limit, threads, calls = 10, 3, 10
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, name, "tps", str(limit), str(threads), str(calls)],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    times: list[float] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        times.extend(json.loads(out))
    assert len(times) == 2 * threads * calls  # nothing was refused within the wait
    busiest = busiest_sliding_window(times)
    assert busiest <= limit, busiest  # how close the pace comes to the limit is a rate: bench/bench_acr_quotas.py


class RecordingRuntime:
    """Records each call with the time `clock()` gives (the wall clock, or a thread's virtual one)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.calls: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()
        self.clock = clock

    def invoke(self, session_id: str, payload: object) -> None:
        with self.lock:
            self.calls.append((self.clock(), "invoke", session_id))

    def stop(self, session_id: str) -> None:
        with self.lock:
            self.calls.append((self.clock(), "stop", session_id))


class Reservations:
    """Every schedule reservation from now on (`ledger.pace.reserve`), in order: its budget and how many starts it
    asked for (threads record under a lock). Undone by the `monkeypatch` given."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        reserve = pace.reserve

        def counted(table: Any, key: Any, **kwargs: Any) -> pace.Reserved:
            budget = str(key["sk"]["S"]).removeprefix("PACE#")
            with self._lock:
                self.calls.append((budget, int(kwargs.get("count", 1))))
            return reserve(table, key, **kwargs)

        monkeypatch.setattr(pace, "reserve", counted)

    @property
    def budgets(self) -> list[str]:
        return [budget for budget, _count in self.calls]

    @property
    def counts(self) -> list[int]:
        return [count for _budget, count in self.calls]

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()


def pacer(ledger: LimitLedger, budget: str, limit: float, *, clocks: Any = None, **options: Any) -> Pacer:
    """An own budget of `limit` calls/s on `budget`'s schedule item (on the wall and sleep of `clocks`, if given)."""
    timing = None if clocks is None else Clocks(clocks.wall, time.monotonic, clocks.sleep)
    return Pacer(ledger.schedule(budget), budget, limit, clocks=timing, **options)


def test_two_budgets_and_stops_are_not_starved(table: tuple[str, dict[str, str]]) -> None:
    """A backlog of new sessions (4/s on their own budget) and stops on `tps` (6/s, the rest of `tps_limit` 10):
    the stops are not queued behind the backlog, and every sliding second holds at most `tps_limit` calls."""
    name, _env = table
    ledger = Ledger.open(name).limits
    runtime = RecordingRuntime()
    limited = LimitedRuntime(runtime, pacer(ledger, "tps", 6), pacer(ledger, "session#0", 4))

    def invoker(i: int) -> None:
        for j in range(6):
            limited.invoke(f"s-{i}-{j}", {}, time.monotonic() + 60)

    def stopper() -> None:
        deadline = time.monotonic() + 60
        while len(runtime.calls) < 2 and time.monotonic() < deadline:  # the invokes' backlog has started
            time.sleep(0.01)
        for j in range(6):
            limited.stop(f"x-{j}", time.monotonic() + 60)

    workers = [threading.Thread(target=invoker, args=(i,)) for i in range(4)] + [threading.Thread(target=stopper)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    invokes = [at for at, op, _ in runtime.calls if op == "invoke"]
    every = [at for at, _, _ in runtime.calls]
    assert len(invokes) == 24
    assert busiest_sliding_window(invokes) <= 4  # new sessions: session_rate_limit
    assert busiest_sliding_window(every) <= 10  # new sessions + the rest on `tps`: tps_limit
    # Stops are served ahead of the backlog, not after it: all six while a quarter of the invokes are still to come.
    stops = [at for at, op, _ in runtime.calls if op == "stop"]
    assert len(stops) == 6
    assert busiest_sliding_window(stops) <= 6
    assert sum(1 for at in invokes if at > max(stops)) >= 6, runtime.calls


def test_new_sessions_in_a_share_of_their_own_take_no_tps_slot(
    table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """New sessions' share of `tps_limit` is set apart: their invokes
    reserve only their session slot (one ledger write, no `tps` reservation to miss), and every call together
    stays within `tps_limit` (4 new sessions/s + the `tps` schedule's 6/s = 10). Deterministic by construction:
    each thread runs on its own virtual clock (`ThreadClocks`), so no thread wakes late and re-books a lost slot,
    and calls are timed at their booked starts; the threads' order is left to the machine, the ledger's schedule
    decides the starts."""
    name, _env = table
    ledger = Ledger.open(name).limits
    reserved = Reservations(monkeypatch)
    tps_share, _stops = call_budgets(ledger.schedule, data_plane=10, invoke_rate=200, session_rate=4)
    assert tps_share.limit == 6
    clocks = ThreadClocks(time.time())
    tps = pacer(ledger, "tps", tps_share.limit, clocks=clocks)
    session = pacer(ledger, "session#0", 4, clocks=clocks, guess_busy=True)
    runtime = RecordingRuntime(clocks.wall)
    limited = LimitedRuntime(runtime, tps, session)

    def invoker(i: int) -> None:
        for j in range(4):
            limited.invoke(f"s-{i}-{j}", {}, time.monotonic() + 60)

    def stopper() -> None:
        for j in range(6):
            limited.stop(f"x-{j}", time.monotonic() + 60)

    workers = [threading.Thread(target=invoker, args=(i,)) for i in range(3)] + [threading.Thread(target=stopper)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a worker is stuck"
    invokes = [at for at, op, _ in runtime.calls if op == "invoke"]
    assert len(invokes) == 12
    assert len(runtime.calls) == 18
    assert busiest_sliding_window(invokes) <= 4
    assert busiest_sliding_window([at for at, _, _ in runtime.calls]) <= 10
    assert reserved.budgets.count("tps") == 6  # the stops' only: no new session reserved a `tps` slot
    assert reserved.budgets.count("session#0") == 12  # one reservation per new session: none was lost


def test_stops_booked_together_take_one_write_and_keep_the_spacing(
    table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion batch's stops (`Pacer.expect`): the first books their `tps` starts in one write of the schedule;
    each stop then takes the earliest, so they start `interval` apart as if each had reserved its own. A stop with
    none left reserves its own; stops expected much later book when they come, never at a start gone by. On a virtual
    clock (`ThreadClocks`)."""
    name, _env = table
    ledger = Ledger.open(name).limits
    reserved = Reservations(monkeypatch)
    clocks = ThreadClocks(time.time())
    tps = pacer(ledger, "tps", 10, clocks=clocks)
    runtime = RecordingRuntime(clocks.wall)
    limited = LimitedRuntime(runtime, tps, pacer(ledger, "session#0", 4))
    tps.expect(4)
    assert reserved.counts == []
    for j in range(5):
        limited.stop(f"x-{j}", time.monotonic() + 60)
    assert reserved.counts == [4, 1]  # the first booked four; the fifth found none booked
    starts = [at for at, _op, _sid in runtime.calls]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert min(gaps) >= tps.interval_s - 1e-6
    assert busiest_sliding_window(starts) <= 10
    tps.expect(2)
    clocks.sleep(5.0)  # the stops came much later: they book when they come
    limited.stop("late", time.monotonic() + 60)
    limited.stop("later", time.monotonic() + 60)
    assert reserved.counts == [4, 1, 2]
    assert runtime.calls[-2][0] >= clocks.start + 5.0


def test_invokes_booked_as_a_block_take_one_write_and_keep_the_spacing(
    table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatcher's batch of warm takes (`Pacer.expect`): the first take books every expected start in one write
    of the `tps` schedule, the others take the earliest left, so they start `interval` apart as if each had reserved
    its own; once they are used up, a further take reserves its own. On a virtual clock (`ThreadClocks`)."""
    name, _env = table
    ledger = Ledger.open(name).limits
    reserved = Reservations(monkeypatch)
    clocks = ThreadClocks(time.time())
    tps = pacer(ledger, "tps-block", 10, clocks=clocks)  # a schedule no other test booked
    runtime = RecordingRuntime(clocks.wall)
    limited = LimitedRuntime(runtime, tps, pacer(ledger, "session#0", 4))
    tps.expect(4)

    def take(session_id: str) -> None:
        limited.invoke(session_id, {}, time.monotonic() + 60, new_session=False)

    takers = [threading.Thread(target=take, args=(f"w-{i}",)) for i in range(4)]
    for t in takers:
        t.start()
    for t in takers:
        t.join(timeout=60)
    assert reserved.counts == [4]  # one write for the four takes
    starts = sorted(at for at, _op, _sid in runtime.calls)
    assert len(starts) == 4
    assert min(later - earlier for earlier, later in itertools.pairwise(starts)) >= tps.interval_s - 1e-6
    limited.invoke("w-late", {}, time.monotonic() + 60, new_session=False)
    assert reserved.counts[0] == 4
    assert reserved.counts[1:]
    assert set(reserved.counts[1:]) == {1}
    assert busiest_sliding_window([at for at, _op, _sid in runtime.calls]) <= 10


def takes_runtime(table: tuple[str, dict[str, str]], name: str, *, apart: bool) -> tuple[Pacer, Pacer, LimitedRuntime]:
    """`tps` and `stop` budgets of 10/s on a virtual clock, and a runtime whose stops have the `stop` budget of
    their own or share `tps` (`apart`): (tps, stops, runtime)."""
    ledger = Ledger.open(table[0]).limits
    clocks = ThreadClocks(time.time())
    tps = pacer(ledger, f"tps-{name}-{apart}", 10, clocks=clocks)
    stops = pacer(ledger, f"stop-{name}-{apart}", 10, clocks=clocks)
    session = pacer(ledger, f"session-{name}-{apart}", 4)
    return tps, stops, LimitedRuntime(RecordingRuntime(clocks.wall), tps, session, stops=stops if apart else None)


@pytest.mark.parametrize("apart", [False, True])
def test_a_block_of_takes_books_far_ahead_only_while_no_stop_waits_behind_it(
    table: tuple[str, dict[str, str]], apart: bool
) -> None:
    """A batch of warm takes books its `tps` starts up to `BLOCK_AHEAD_S` ahead only while stops are on a schedule of
    their own; through the pool, while the grant keeps the `stop` schedule closed, stops share `tps` and the block
    stays within `INVOKE_AHEAD_S`, so a stop never waits behind a second of takes."""
    tps, stops, limited = takes_runtime(table, "ahead", apart=apart)
    assert limited.stop_pacer is (stops if apart else tps)
    horizons: list[float] = []
    book_block = tps._book_block

    def spied(count: int, until: float, ahead_s: float) -> list[float]:
        horizons.append(ahead_s)
        return book_block(count, until, ahead_s)

    tps._book_block = spied  # type: ignore[method-assign]
    tps.expect(2)
    for i in range(2):
        limited.invoke(f"w-{i}", {}, time.monotonic() + 60, new_session=False)
    assert horizons == [BLOCK_AHEAD_S if apart else INVOKE_AHEAD_S]


@pytest.mark.parametrize("apart", [True, False], ids=["stops_apart", "stops_on_tps"])
def test_a_take_off_its_block_reserves_as_far_ahead_as_the_blocks_book(
    table: tuple[str, dict[str, str]], apart: bool
) -> None:
    """A take whose block's start was gone (its thread came too late, or it had no block) reserves its own `tps`
    start as far ahead as the blocks book theirs while stops have their own schedule (bench_warm: one take limited
    to `INVOKE_AHEAD_S` behind blocks booking a second ahead found no slot for 6 s, the whole burst); while stops
    share `tps`, within `INVOKE_AHEAD_S`, so no stop waits behind it."""
    tps, _stops, limited = takes_runtime(table, "single", apart=apart)
    horizons: list[float | None] = []
    acquire = tps.acquire

    def spied(wait_until: float, max_ahead_s: float | None = None) -> bool:
        horizons.append(max_ahead_s)
        return acquire(wait_until, max_ahead_s)

    tps.acquire = spied  # type: ignore[method-assign]
    limited.invoke("w-alone", {}, time.monotonic() + 60, new_session=False)
    assert horizons == [BLOCK_AHEAD_S if apart else INVOKE_AHEAD_S]


def test_stops_on_a_budget_of_their_own_leave_the_invokes_their_whole_rate(
    table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data-plane budget (`tps_limit`, else the account's) of at least twice the invoke rate: stops are paced on
    `stop` at the rest, never on `tps`, so the invokes (new sessions and calls into existing ones) keep their whole
    rate while stops run, every sliding second holds at most the invoke rate of invokes and the data-plane budget of
    calls. A tighter data-plane budget keeps the shared budgets of before (`tps_limit` 10: the same as `pacers`).
    On a virtual clock (`ThreadClocks`)."""
    name, _env = table
    ledger = Ledger.open(name).limits
    tps, stops = call_budgets(ledger.schedule, data_plane=10, invoke_rate=200, session_rate=4)
    assert stops is None
    assert tps.limit == 6  # invokes and stops share `tps`, the new sessions' share apart
    assert not dedicated_stop_share(15, 8)
    reserved = Reservations(monkeypatch)
    clocks = ThreadClocks(time.time())
    runtime = RecordingRuntime(clocks.wall)
    tps, stops = call_budgets(
        ledger.schedule,
        data_plane=16,
        invoke_rate=8,
        session_rate=2,
        clocks=Clocks(clocks.wall, time.monotonic, clocks.sleep),
    )
    assert stops is not None
    assert stops.limit == pytest.approx(8)
    assert tps.limit == pytest.approx(6)
    session = pacer(ledger, "session#0", 2, clocks=clocks)
    limited = LimitedRuntime(runtime, tps, session, stops=stops)

    def taker(i: int) -> None:
        for j in range(6):
            limited.invoke(f"w-{i}-{j}", {}, time.monotonic() + 60, new_session=False)

    def opener() -> None:
        for j in range(4):
            limited.invoke(f"s-{j}", {}, time.monotonic() + 60)

    def stopper() -> None:
        for j in range(16):
            limited.stop(f"x-{j}", time.monotonic() + 60)

    workers = [threading.Thread(target=taker, args=(i,)) for i in range(2)]
    workers += [threading.Thread(target=opener), threading.Thread(target=stopper)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a worker is stuck"
    invokes = [at for at, op, _ in runtime.calls if op == "invoke"]
    stops = [at for at, op, _ in runtime.calls if op == "stop"]
    assert (len(invokes), len(stops)) == (16, 16)
    assert busiest_sliding_window(invokes) <= 8
    assert busiest_sliding_window(stops) <= 8
    assert busiest_sliding_window([at for at, _, _ in runtime.calls]) <= 16
    assert reserved.budgets.count("stop") >= 16  # every stop on its own budget
    assert set(reserved.budgets) == {"tps", "session#0", "stop"}  # stops never on `tps`: the takes keep its whole rate


def test_new_sessions_reserved_together_take_one_write_at_the_spacing(
    table: tuple[str, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate lets a batch of waiters through at once (`SlotGate._room_batch`); their new sessions, reaching their
    reservation about together while the schedule is booked ahead, take their starts in ONE write
    (`Pacer.reserve_together`: a block at the schedule's spacing), not one each. On a virtual clock per thread;
    the first thread's wait for the others ends once they joined (no timing)."""
    name, _env = table
    ledger = Ledger.open(name).limits
    reserved = Reservations(monkeypatch)
    clocks = ThreadClocks(time.time())
    invokers = 3

    def sleep(seconds: float) -> None:
        round_ = session._together
        if round_ is not None and not round_.closed:  # the first one's wait: until the others joined
            wait_for(lambda: round_.count == invokers, what="every invoker joined the booking")
        clocks.sleep(seconds)

    session = pacer(ledger, "session#0", 4, clocks=Clocks(clocks.wall, time.monotonic, sleep), guess_busy=True)
    for _ in range(4):  # a backlog: the schedule is booked about a second ahead
        assert session.reserve(time.monotonic() + 10) is not None
    reserved.clear()
    runtime = RecordingRuntime(clocks.wall)
    limited = LimitedRuntime(runtime, pacer(ledger, "tps", 10, clocks=clocks), session)
    workers = [
        threading.Thread(target=limited.invoke, args=(f"s-{i}", {}, time.monotonic() + 60)) for i in range(invokers)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers), "an invoker is stuck"
    assert reserved.counts == [invokers]  # main: [1, 1, 1]
    starts = sorted(at for at, op, _ in runtime.calls if op == "invoke")
    assert len(starts) == invokers
    assert all(later - earlier >= session.interval_s - 1e-6 for earlier, later in itertools.pairwise(starts))
    assert busiest_sliding_window(starts) <= 4
