"""Paced ACR call budgets, global across every caller in every process (docs/lifecycle.md, "Limits"): a `Pacer` is
one budget, a GCRA schedule item (`ledger.pace`) reserved with one conditional write per start (or block of starts);
`LimitedRuntime` is the agent runtime whose calls first take their budgets."""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, Protocol

from rollout_pipeline.ledger import pace
from rollout_pipeline.metric_names import ACR_THROTTLED, LIMIT_BACKLOG, MetricsRecorder
from rollout_pipeline.ports import AgentRuntime, RuntimeQuotaExceeded, RuntimeRateExceeded, RuntimeThrottled
from rollout_pipeline.quotas import START_LATENESS_S

log = logging.getLogger(__name__)

#: Own budgets space their starts (1 + this) / limit apart (a start may be `START_LATENESS_S` late).
LATENESS_S: Final = 0.05
#: How far ahead an invoke may reserve a `tps` start while stops share it (stops reserve as far as they wait).
INVOKE_AHEAD_S: Final = 0.25
#: ... and while stops have their own; calls booked together (`Pacer.expect`) start within this long.
BLOCK_AHEAD_S: Final = 1.0
#: How long a stop waits for its start when the caller gives no deadline.
DEFAULT_STOP_WAIT_S: Final = 15.0
#: Reservations of one process within this long of each other are booked in one write (`Pacer.reserve_together`).
TOGETHER_S: Final = 0.03
#: Calls `expect`ed that find the schedule full within their horizon wait and book again at most this many times.
BLOCK_TRIES: Final = 4
#: The schedules of an experiment's own budgets.
SESSION_PACE: Final = "session"
CALLS_PACE: Final = "tps"
STOP_PACE: Final = "stop"
#: A throttle multiplies a rate by this ...
BACKOFF: Final = 0.75
#: ... at most once this long (the throttles of one overshoot) ...
BACKOFF_HOLD_S: Final = 2.0
#: ... and the rate stays there this long (whoever else uses it likely goes on a while) ...
PROBE_AFTER_S: Final = 20.0
#: ... then climbs back this much of it a second ...
CLIMB_PER_S: Final = 0.02
#: ... and is never cut below this much.
MIN_FACTOR: Final = 0.2
#: A refused call is retried after a pause drawn from [0, min(`RETRY_CAP_S`, this x 2^n)] (full jitter) ...
RETRY_BASE_S: Final = 0.25
#: ... at most this long.
RETRY_CAP_S: Final = 4.0


def retry_pause(attempt: int, rng: random.Random | None = None) -> float:
    """The pause before retry number `attempt` (0-based) of a call AgentCore refused for now (full jitter)."""
    return (rng or random).uniform(0.0, min(RETRY_CAP_S, RETRY_BASE_S * 2**attempt))


def backoff_factor(base: float, at: float, now: float) -> float:
    """The backoff factor at `now` after a decrease to `base` at `at`: `base` for `PROBE_AFTER_S`, then climbing."""
    if at <= 0:
        return 1.0
    return min(1.0, base + CLIMB_PER_S * max(0.0, now - at - PROBE_AFTER_S))


def decreased(base: float, at: float, now: float) -> float | None:
    """The factor after a throttle at `now`; None while the last decrease is under `BACKOFF_HOLD_S` old."""
    if at > 0 and now - at < BACKOFF_HOLD_S:
        return None
    return max(MIN_FACTOR, backoff_factor(base, at, now) * BACKOFF)


class Clocks(NamedTuple):
    """The clocks limits wait on: wall clock (epoch s), monotonic and sleep."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class _Together:
    def __init__(self) -> None:
        self.count = 0
        self.closed = False
        self.slots: list[float] = []
        self.done = threading.Event()


class Pacer:
    """One paced call budget, global through its schedule item. `limit`: calls per second of an own budget (for an
    item that carries its own spacing, the rate assumed until it is known). `on_item(item)` sees every answer of the
    item; `on_unspaced()` gives an item without a spacing one; `on_backlog()` hears that callers wait."""

    def __init__(
        self,
        schedule: pace.PaceSchedule,
        budget: str,
        limit: float = 0.0,
        *,
        clocks: Clocks | None = None,
        guess_busy: bool = False,
        on_item: Callable[[Mapping[str, Any]], None] | None = None,
        on_unspaced: Callable[[], object] | None = None,
        on_backlog: Callable[[], None] = lambda: None,
    ) -> None:
        self.schedule, self.item_spacing, self.budget = schedule, schedule.item_spacing, budget
        self._base_interval_s = (1.0 + LATENESS_S) / limit if limit > 0 else 1.0
        self._wall, self._monotonic, self._sleep = clocks or Clocks()
        self.on_item, self.on_unspaced, self.on_backlog = on_item, on_unspaced, on_backlog
        self._backoff = (1.0, 0.0)
        #: The latest `tat` (wall clock s) this process has seen or promised: it only moves forward.
        self.tat = 0.0
        #: Recent slowest reservation (a decaying maximum): starts are reserved at least about this far ahead.
        self.write_s = 0.01
        #: The last reservation found the schedule busy: the next tries the busy case first (one write, not two).
        self.busy = False
        self.guess_busy = guess_busy
        self._together: _Together | None = None
        self._together_lock = threading.Lock()
        self._room_lock = threading.RLock()
        #: Calls announced to come together (`expect`) and the starts booked for them in one write.
        self._expected = 0
        self._booked: list[float] = []
        self._booked_lock = threading.Lock()
        self._item_interval_us = 0

    @property
    def interval_s(self) -> float:
        """The spacing of starts now: the item's own, or an own budget's after this process's backoff."""
        if self.item_spacing:
            return self._item_interval_us / 1e6 if self._item_interval_us else self._base_interval_s
        base, at = self._backoff
        return self._base_interval_s / backoff_factor(base, at, self._wall())

    @property
    def interval_us(self) -> int:
        """`interval_s` in whole microseconds, as the item stores it."""
        return self._item_interval_us if self.item_spacing else max(1, int(self.interval_s * 1e6))

    def know_spacing(self) -> None:
        """Learn an item-spaced schedule's spacing before booking a block at it (giving it one when it has none)."""
        if not self.item_spacing or self._item_interval_us:
            return
        self.read_tat()
        if not self._item_interval_us and self.on_unspaced is not None:
            self.on_unspaced()
            self.read_tat()

    @property
    def limit(self) -> float:
        """Calls per second at most (in any sliding second)."""
        return (1.0 + LATENESS_S) / self.interval_s

    @property
    def lead_s(self) -> float:
        return min(0.5, 1.5 * self.write_s + 0.01)

    def throttled(self) -> None:
        """AgentCore throttled a call of this own budget: this process slows its rate."""
        base, at = self._backoff
        lower = decreased(base, at, self._wall())
        if lower is not None:
            self._backoff = (lower, self._wall())

    def reserve(
        self, wait_until: float, max_ahead_s: float | None = None, *, lead_s: float = 0.0, not_before: float = 0.0
    ) -> float | None:
        """Reserve a start (wall clock s) in [`not_before`, `max_ahead_s` from now] before `wait_until`, or None."""
        while True:
            now = self._wall()
            budget_left = wait_until - self._monotonic()
            if budget_left <= 0:
                return None
            ahead = budget_left if max_ahead_s is None else min(max_ahead_s, budget_left)
            first = max(now + (lead_s or self.lead_s), not_before)
            slot, tat = self.reserve_at(first, now + (lead_s or self.lead_s) + ahead)
            if slot is not None:
                return slot
            pause = tat - now - ahead + random.uniform(0.0, self.interval_s)
            if self._monotonic() + pause >= wait_until:
                return None
            self._sleep(max(pause, 0.001))

    def reserve_together(self, wait_until: float, *, lead_s: float = 0.0, not_before: float = 0.0) -> float | None:
        """`reserve`, for the threads of this process that come within `TOGETHER_S` in ONE write when their starts
        are ahead anyway (a start wanted now is reserved at once); one not booked that way reserves its own."""
        lead = lead_s or self.lead_s
        if max(self.tat if self.busy else 0.0, not_before) - self._wall() <= lead + 2 * TOGETHER_S:
            return self.reserve(wait_until, lead_s=lead_s, not_before=not_before)
        with self._together_lock:
            round_ = self._together
            leader = round_ is None or round_.closed
            if leader:
                round_ = self._together = _Together()
            assert round_ is not None
            index = round_.count
            round_.count += 1
        if leader:
            try:
                self._sleep(TOGETHER_S)
                with self._together_lock:
                    round_.closed = True
                    self._together = None
                if round_.count > 1:
                    ahead = max(0.0, wait_until - self._monotonic())
                    round_.slots = self.book(round_.count, ahead, lead_s=lead, not_before=not_before)
            except Exception:  # booking together only saves writes: each reserves its own
                log.warning("could not book %d starts of %s together", round_.count, self.budget, exc_info=True)
            finally:
                round_.done.set()
        else:
            round_.done.wait(DEFAULT_STOP_WAIT_S)
        if index < len(round_.slots) and round_.slots[index] >= self._wall() - START_LATENESS_S:  # not lost yet
            return round_.slots[index]
        return self.reserve(wait_until, lead_s=lead_s, not_before=not_before)

    def expect(self, calls: int) -> None:
        """The next `calls` calls of this budget come together (a batch's warm takes, warm-ups or stops): the first
        of them books a start for each in ONE write (`booked_start`)."""
        with self._booked_lock:
            self._expected = max(0, calls)

    def booked_start(self, until: float, ahead_s: float) -> float | None:
        """A start booked for this call among the calls `expect`ed (the first of them books all, within `ahead_s`);
        None: none is left, the call reserves its own."""
        if not (self._expected or self._booked or self._booked_lock.locked()):  # none expected, none booking
            return None
        with self._booked_lock:
            expected, self._expected = max(0, self._expected - 1), 0
            while self._booked and self._booked[0] < self._wall() - START_LATENESS_S:  # too late to use
                self._booked.pop(0)
            start = self._booked.pop(0) if self._booked else None
            if start is not None or expected < 1:
                self._expected = expected
                return start
            booked = self._book_block(expected + 1, until, ahead_s)  # the others wait for it on the lock
            self._booked = booked[1:]
            return booked[0] if booked else None

    def _book_block(self, count: int, until: float, ahead_s: float) -> list[float]:
        for _ in range(BLOCK_TRIES):
            try:
                self.know_spacing()
                starts = self.book(count, ahead_s)
            except Exception:  # booking together only saves writes: the calls reserve one at a time
                log.warning("could not book %d starts of %s together", count, self.budget, exc_info=True)
                return []
            if starts:
                return starts
            pause = self.next_room_s(ahead_s) + random.uniform(0.0, self.interval_s)
            if self._monotonic() + pause >= until:
                return []
            self._sleep(max(pause, 0.001))
        return []

    def reserve_at(self, not_before: float, latest: float, *, count: int = 1) -> tuple[float | None, float]:
        """One reservation of `count` consecutive starts in [not_before, latest] (wall clock, s): (first, tat)."""
        for _ in range(2):
            started = self._monotonic()
            answer = self.schedule.reserve(
                not_before_us=int(not_before * 1e6),
                latest_us=int(latest * 1e6),
                busy_first=self.tat > not_before or (self.guess_busy and self.busy),
                count=count,
                interval_us=self.interval_us,
            )
            self.write_s = max(0.97 * self.write_s, self._monotonic() - started)
            view = self.absorb(answer.values)
            if answer.slot_us is None and self.item_spacing and not view.interval_us and self.on_unspaced is not None:
                self.on_unspaced()  # the item has no spacing yet: get it one, and try again
                continue
            self.busy = answer.slot_us is None or answer.slot_us > int(not_before * 1e6)
            return (None if answer.slot_us is None else answer.slot_us / 1e6), view.tat_us / 1e6
        return None, self.tat

    def book(self, count: int, ahead_s: float, *, lead_s: float = 0.0, not_before: float = 0.0) -> list[float]:
        """Reserve `count` consecutive starts (wall clock s) in ONE write, the first within `ahead_s`; [] when none."""
        if count < 2 or (self.item_spacing and not self._item_interval_us):
            return []
        first = max(self._wall() + (lead_s or self.lead_s), not_before)
        interval_s = self.interval_s
        start, _tat = self.reserve_at(first, first + ahead_s, count=count)
        return [] if start is None else [start + i * interval_s for i in range(count)]

    def absorb(self, item: Mapping[str, Any]) -> pace.PaceView:
        """Take a read or an answer of the item: its `tat` and its own spacing."""
        view = pace.PaceView.of(item)
        if self.item_spacing and view.interval_us:
            self._item_interval_us = view.interval_us
        self.tat = max(self.tat, view.tat_us / 1e6)
        if item and self.on_item is not None:
            self.on_item(item)
        return view

    def read_tat(self, item: Mapping[str, Any] | None = None) -> float:
        """The schedule's `tat` (wall clock s): read, or as given by a read made just now with other items."""
        self.absorb(self.schedule.read().values if item is None else item)
        return self.tat

    def room(self, ahead_s: float) -> int:
        """Calls that could still start within `ahead_s` (at least one interval), by the known schedule."""
        booked_ahead = max(0.0, self.tat - self._wall())
        return max(0, math.floor((max(ahead_s, self.interval_s) - booked_ahead) / self.interval_s + 1e-6))

    def next_room_s(self, ahead_s: float, calls: int = 1) -> float:
        """Seconds until `room(ahead_s)` is at least `calls`, by the latest known schedule."""
        return max(0.0, self.tat - max(ahead_s, self.interval_s) + calls * self.interval_s - self._wall())

    def promise(self, calls: int) -> None:
        """Count `calls` about to be reserved by this process in the known schedule."""
        with self._room_lock:
            if calls > 0:
                self.tat = max(self.tat, self._wall()) + calls * self.interval_s

    def claim(self) -> bool:
        """For a newly received rollout: True (one start promised) if the schedule is idle now (one read)."""
        with self._room_lock:
            self.read_tat()
            if self.room(0.0) <= 0:
                self.on_backlog()
                return False
            self.promise(1)
            return True

    def read_room(self, ahead_s: float, item: Mapping[str, Any] | None = None, *, wanted: int = 1) -> int:
        """`room(ahead_s)` after a read of the schedule (or `item`, read just now with other items); room for fewer
        than `wanted` tells `on_backlog`."""
        with self._room_lock:
            self.read_tat(item)
            room = self.room(ahead_s)
            if room < max(1, wanted):
                self.on_backlog()
            return room

    def sleep_until(self, slot: float) -> bool:
        """Sleep until `slot`; False if this caller is more than `START_LATENESS_S` late (the start is lost)."""
        pause = slot - self._wall()
        if pause > 0:
            self._sleep(pause)
        return self._wall() <= slot + START_LATENESS_S

    def acquire(self, wait_until: float, max_ahead_s: float | None = None) -> bool:
        """Reserve a start and sleep until it; True when the caller may call now."""
        while True:
            slot = self.reserve(wait_until, max_ahead_s)
            if slot is None:
                return False
            if self.sleep_until(slot):
                return True


class NoCallBudget(RuntimeThrottled):
    """No start of a call budget could be had before the caller's wait ended (the call was not made)."""


class AccountBudget(Protocol):
    """What `LimitedRuntime` needs of the account's schedule (`limits.account.AccountSchedule`)."""

    pacer: Pacer

    def throttled(self) -> None: ...

    def quota_exceeded(self) -> None: ...

    def backed_off_at(self) -> float: ...


class LimitedRuntime:
    """An `AgentRuntime` whose calls first take their budgets: a new session its `session` start (then the
    `account`'s), a call into an existing session a `tps` start, a stop its `stops` start (or `tps`)."""

    def __init__(
        self,
        runtime: AgentRuntime,
        tps: Pacer,
        session: Pacer,
        metrics: MetricsRecorder | None = None,
        *,
        account: AccountBudget | None = None,
        stops: Pacer | None = None,
    ) -> None:
        self.runtime = runtime
        self.tps = tps
        self.session = session
        self.account = account
        self.stops = stops
        self.stop_pacer = stops or tps  #: what a stop paces on
        self.metrics = metrics

    def _throttled(self, what: str) -> NoCallBudget:
        if self.metrics is not None:
            self.metrics.count(LIMIT_BACKLOG)
        return NoCallBudget(f"no call budget for {what} before the wait budget ran out")

    def _call(self, call: Callable[[], None], *, new_session: bool) -> None:
        """Make the runtime call; a refusal for now backs off the budget it names."""
        try:
            call()
        except RuntimeThrottled as exc:
            if self.metrics is not None:
                self.metrics.count(ACR_THROTTLED)
            if isinstance(exc, RuntimeQuotaExceeded) and new_session and self.account is not None:
                self.account.quota_exceeded()
            elif isinstance(exc, RuntimeRateExceeded):
                if new_session and self.account is not None:
                    self.account.throttled()
                elif not new_session:
                    self.tps.throttled()
            raise

    def invoke(
        self,
        session_id: str,
        payload: Mapping[str, Any],
        wait_until: float | None = None,
        *,
        new_session: bool = True,
        on_booked: Callable[[float], None] | None = None,
    ) -> None:
        """InvokeAgentRuntime once its budgets allow; raises NoCallBudget (no start in time) and whatever the
        runtime raises. `new_session=False`: a call into an existing session. `on_booked(start)`: once a new
        session's start is booked."""
        until = wait_until if wait_until is not None else self.tps._monotonic() + DEFAULT_STOP_WAIT_S
        booked = on_booked or (lambda _start: None)
        if not new_session:
            ahead_s = INVOKE_AHEAD_S if self.stops is None else BLOCK_AHEAD_S  # stops wait behind it
            start = self.tps.booked_start(until, ahead_s)
            on_block = start is not None and self.tps.sleep_until(start)
            if not on_block and not self.tps.acquire(until, ahead_s):
                raise self._throttled("InvokeAgentRuntime")
            booked(self.tps._wall())
            self._call(lambda: self.runtime.invoke(session_id, payload), new_session=False)
            return
        share = self.session.booked_start(until, until - self.session._monotonic())
        while True:
            reserved_at, start = self.session._wall(), self._session_start(until, share)
            share = None
            if start is None:
                raise self._throttled("a new session")
            booked(start)
            on_time = self.session.sleep_until(start)
            old_spacing = self.account is not None and self.account.backed_off_at() >= reserved_at  # booked before
            if on_time and not old_spacing:  # a start booked before the account's backoff is left unused
                self._call(lambda: self.runtime.invoke(session_id, payload), new_session=True)
                return

    def _session_start(self, until: float, share: float | None) -> float | None:
        lead = self.session.lead_s + (0.0 if self.account is None else self.account.pacer.lead_s)
        start = share if share is not None else self.session.reserve_together(until, lead_s=lead)
        if start is None:
            return None
        if self.account is not None:
            start = self.account.pacer.reserve_together(until, not_before=start)
        return start

    def stop(self, session_id: str, wait_until: float | None = None) -> None:
        """StopRuntimeSession once its budget allows: at a start booked with the stops `expect`ed, else one reserved
        now."""
        pacer = self.stop_pacer
        until = wait_until if wait_until is not None else pacer._monotonic() + DEFAULT_STOP_WAIT_S
        slot = pacer.booked_start(until, BLOCK_AHEAD_S)
        on_booked = slot is not None and pacer.sleep_until(slot)
        if not on_booked and not pacer.acquire(until):
            raise self._throttled("StopRuntimeSession")
        self._call(lambda: self.runtime.stop(session_id), new_session=False)


def dedicated_stop_share(data_plane: float, invoke_rate: float) -> bool:
    """Whether stops get a budget of their own: when the data-plane budget less the invoke rate is at least that."""
    return data_plane >= 2 * invoke_rate


def call_budgets(
    schedule: Callable[[str], pace.PaceSchedule],
    *,
    data_plane: float,
    invoke_rate: float,
    session_rate: float,
    clocks: Clocks | None = None,
) -> tuple[Pacer, Pacer | None]:
    """An experiment's own data-plane budgets, (`tps`, `stop` or None): `data_plane` calls/s in all, at most
    `invoke_rate` invokes, less the new sessions' share (`session_rate`, at most half) that `session` paces."""
    apart = dedicated_stop_share(data_plane, invoke_rate)
    invokes = invoke_rate if apart else min(data_plane, invoke_rate)

    def pacer(budget: str, limit: float) -> Pacer:
        return Pacer(schedule(budget), budget, limit, clocks=clocks)

    tps = pacer(CALLS_PACE, invokes - min(session_rate, invokes / 2))
    return tps, pacer(STOP_PACE, data_plane - invoke_rate) if apart else None
