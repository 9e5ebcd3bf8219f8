"""Paced ACR call budgets, global across every caller in every process.

Budgets (GCRA, one schedule item per budget in the ledger, `LimitLedger.reserve_pace`): `tps` (InvokeAgentRuntime
into existing sessions, and StopRuntimeSession unless stops have a budget of their own), `session#{endpoint}`
(invokes that open a new session, `session_rate_limit` per endpoint) and, without a pool, `stop` when the
experiment's data-plane budget (`tps_limit`, else the account's data-plane budget) leaves at least its invoke rate
for stops (`dedicated_stop_share`): stops are paced there, at the data-plane budget less the invoke rate, and every
invoke within the invoke rate (`config.invoke_rate_cap`: AgentCore's InvokeAgentRuntime quota per agent, which stops
are not in), so both quotas hold in every sliding second; else stops share `tps` with the invokes as before.
A caller reserves the budget's next start time, sleeps until then and calls.
Calls are spaced `(1 + LATENESS_S) / limit` apart and a caller that wakes up more than `LATENESS_S` after its slot
drops it, so ANY one-second window (aligned or sliding) holds at most `limit` calls of a budget, across every
process, with no burst at a window boundary (`limit + 1` calls span at least `(1 + LATENESS_S) - LATENESS_S`).
When `tps_limit` leaves room for a stop per new session (`dedicated_session_share`), invokes that open a session
take only their `session#{endpoint}` slot: their share of `tps_limit` (the sum of the session budgets) is set
apart and the `tps` schedule paces the rest (stops, calls into existing sessions) at `tps_limit` minus that share;
else a new session also takes a `tps` slot at its start.
Stops are never starved: while they share `tps`, an invoke only reserves a `tps` slot at most `INVOKE_AHEAD_S`
ahead, a stop as far ahead as its wait allows, so a waiting stop is always served within about `INVOKE_AHEAD_S`.
While stops have a budget of their own, the `tps` schedule carries invokes only, and a call into an existing session
reserves as far ahead as a block of them books (`BLOCK_AHEAD_S`): a take that missed its block's start is never
starved by the blocks booked after it.
A dispatcher's SQS batch of warm takes (invokes into warm sessions) books its `tps` starts in ONE write
(`InvokeBlock`: the first take of the batch books them all, consecutive; each take then uses the earliest that is not
yet too late), as a completion batch books its stops (`book_stops`).

With the account pool (`limits.pool`, the default of a deployed stack) the budgets are LEASED: the experiment's
`session` and `tps` schedules carry the spacing the pool granted and the lease's end, which every reservation's
conditional write checks (`LimitLedger.reserve_leased`); a `Pacer` with a `lease` renews it when it runs out
(`Lessee`). New sessions then take one `session` budget whatever the endpoints (account scope), or one per endpoint
at the pool's per-endpoint rate (endpoint scope). The leased `tps` schedule is never faster than the invoke rate
less the new sessions' share (`CapacityLease._tps_rate`); stops get a leased `stop` schedule while the calls granted
are at least twice the invoke rate (`CapacityLease._stops_rate`), else they share `tps`. Without a pool
(`own_runtime`) the budgets are the experiment's own settings, as before the pool.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from rollout_pipeline import ids
from rollout_pipeline.ledger.limits import LimitLedger, PaceView
from rollout_pipeline.metric_names import ACR_THROTTLED, LIMIT_BACKLOG, MetricsRecorder
from rollout_pipeline.ports import AgentRuntime, RuntimeRateExceeded, RuntimeThrottled
from rollout_pipeline.quotas import Budget, NewSessionScope

log = logging.getLogger(__name__)

#: A call may start at most this long after its reserved slot; the spacing leaves room for it.
LATENESS_S: Final = 0.05
#: A caller that wakes up later than this after its slot drops it (the margin covers the call's own latency).
LATE_START_S: Final = LATENESS_S * 0.8
#: How far ahead an invoke may reserve a `tps` slot (stops may reserve as far as they wait).
INVOKE_AHEAD_S: Final = 0.25
#: How long a stop waits for its slot when the caller gives no deadline.
DEFAULT_STOP_WAIT_S: Final = 15.0
#: Stops booked together (`LimitedRuntime.book_stops`) start within this long.
STOP_BOOK_AHEAD_S: Final = 1.0
#: A leased schedule without a lease covering the next start: look again this long later (jittered).
NO_LEASE_PAUSE_S: Final = (0.05, 0.25)
#: New sessions of one process reserved within this long of each other, while their schedule is booked further
#: ahead than that (the wait delays no start), are booked together in one write (`Pacer.reserve_together`): the
#: admission gate lets a batch through at once (`admission.SessionRoom.batch`), whose threads reach their
#: reservation about together, after their dispatch transaction.
TOGETHER_S: Final = 0.03
#: How long a thread waits for the one booking for the others it joined (a bound only: it is always answered).
TOGETHER_WAIT_S: Final = 10.0


class _Together:
    """The reservations of one `Pacer.reserve_together` round: how many joined, and the starts booked for them."""

    def __init__(self) -> None:
        self.count = 0
        self.closed = False
        self.slots: list[float] = []
        self.done = threading.Event()


#: How far ahead an `InvokeBlock` may book its first start, and a call into an existing session reserve its own,
#: when stops have a budget of their own (none waits behind it: the `tps` schedule then carries invokes only); with
#: stops on `tps`, `INVOKE_AHEAD_S`.
BLOCK_AHEAD_S: Final = 1.0
#: An `InvokeBlock` that finds the schedule full within its horizon waits for room and books again at most this many
#: times before its takes reserve one at a time.
BLOCK_TRIES: Final = 4
#: An `InvokeBlock`'s entry for invokes into existing sessions (the `tps` budget, whatever its schedule's name).
TAKES: Final = "takes"
#: The schedule of stops when they have a budget of their own (`dedicated_stop_share`).
STOP_PACE: Final = "stop"
#: A stop tries a leased `stop` schedule this long before it asks again whether the grant still opens it.
STOP_LEASE_TRY_S: Final = 1.0


class Lessee(Protocol):
    """What a leased `Pacer` needs of its experiment's lease in the account pool (`limits.pool.CapacityLease`)."""

    def ensure(self) -> object:
        """Renew the lease if it is about to end."""

    def renew(self, *, force: bool = False) -> object:
        """Renew the lease now (`force`: even if another process just did)."""

    def note_backlog(self) -> None:
        """Rollouts wait for this budget: the next renewal asks for all it can get."""

    def throttled(self, budget: Budget) -> None:
        """AgentCore answered a rate exceeded: back the pool off."""

    def observe(self, budget: str, pace: PaceView) -> None:
        """A read or reservation of the leased schedule `budget` showed `pace` (a renewal by another process)."""

    def scope(self) -> NewSessionScope:
        """Whether new sessions are paced per account (one budget) or per endpoint."""

    def endpoint_rate(self) -> float:
        """Endpoint scope: each endpoint's new sessions/s."""

    def stops_apart(self) -> bool:
        """Whether the grant gives stops a leased schedule of their own (`STOP_PACE`), else they share `tps`."""


class Pacer:
    """One paced call budget (`limit` calls per second), global through the ledger's schedule item. With a `lease`
    the limit is the account pool's grant, carried by the schedule item itself (`LimitLedger.reserve_leased`)."""

    def __init__(
        self,
        ledger: LimitLedger,
        budget: str,
        limit: float,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        guess_busy: bool = False,
        lease: Lessee | None = None,
    ) -> None:
        self.ledger = ledger
        self.budget = budget
        self.interval_s = (1.0 + LATENESS_S) / limit
        self.lease = lease
        #: A leased schedule: no start after this (wall clock s), by the latest view of the item.
        self.lease_until = 0.0
        self._wall = wall
        self._monotonic = monotonic
        self._sleep = sleep
        #: The latest schedule (`tat`, wall clock s) this process has seen or promised: it only moves forward.
        self.tat = 0.0
        #: Recent slowest reservation (a ledger write; a decaying maximum): slots are reserved at least about this
        #: far ahead, so the caller is not already late when the answer arrives.
        self.write_s = 0.01
        #: The last reservation found the schedule busy (ahead of its start): under a backlog shared by several
        #: processes it stays busy, although this process's own `tat` lags behind the others' reservations, so the
        #: next reservation tries the busy case first (one conditional write instead of two).
        self.busy = False
        #: Whether to use `busy` (the session budgets, which waiting rollouts book ahead); the `tps` schedule, near
        #: idle between stops, is guessed by its `tat` alone (measured: 1.3 writes per stop with it, 1.8 without).
        self.guess_busy = guess_busy
        #: The open round of `reserve_together`, if any (others who reserve now join it).
        self._together: _Together | None = None
        self._together_lock = threading.Lock()

    @property
    def limit(self) -> float:
        """Calls per second at most (in any sliding second)."""
        return (1.0 + LATENESS_S) / self.interval_s

    @limit.setter
    def limit(self, value: float) -> None:
        self.interval_s = (1.0 + LATENESS_S) / value

    @property
    def lead_s(self) -> float:
        return min(0.5, 1.5 * self.write_s + 0.01)

    def reserve(self, wait_until: float, max_ahead_s: float | None = None, *, lead_s: float = 0.0) -> float | None:
        """Reserve a start time (wall clock, s) no later than `wait_until` (monotonic) and `max_ahead_s` from now;
        waits while the schedule is further ahead. None if no slot could be had in time. Does not sleep to it."""
        while True:
            now = self._wall()
            budget_left = wait_until - self._monotonic()
            if budget_left <= 0:
                return None
            ahead = budget_left if max_ahead_s is None else min(max_ahead_s, budget_left)
            lead = lead_s or self.lead_s
            slot, tat = self.reserve_at(now + lead, now + lead + ahead)
            if slot is not None:
                return slot
            if self.lease is not None and self._lacks_lease(now + lead):
                self.lease.note_backlog()
                self.lease.renew(force=True)  # at most every so often per process: `CapacityLease.renew`
                pause = random.uniform(*NO_LEASE_PAUSE_S)
            else:
                pause = tat - now - ahead + random.uniform(0.0, self.interval_s)
            if self._monotonic() + pause >= wait_until:
                return None
            self._sleep(max(pause, 0.001))

    def reserve_together(self, wait_until: float, *, lead_s: float = 0.0) -> float | None:
        """`reserve`, for several threads of this process at about the same moment in ONE write when the schedule
        is busy: the first to come waits `TOGETHER_S` for the others, books one start for each in a block (`book`)
        and hands them out in the order they came. A thread whose start could not be booked that way (the block
        failed, or it came alone) reserves its own. An idle schedule is reserved at once (no wait)."""
        lead = lead_s or self.lead_s
        if not (self.busy and self.tat - self._wall() > lead + 2 * TOGETHER_S):
            return self.reserve(wait_until, lead_s=lead_s)
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
                    round_.slots = self.book(round_.count, max(0.0, wait_until - self._monotonic()), lead_s=lead)
            except Exception:  # booking together only saves writes: each reserves its own
                log.warning("could not book %d starts of %s together", round_.count, self.budget, exc_info=True)
            finally:
                round_.done.set()
        else:
            round_.done.wait(TOGETHER_WAIT_S)
        if index < len(round_.slots) and round_.slots[index] >= self._wall() - LATE_START_S:  # not lost yet
            return round_.slots[index]
        return self.reserve(wait_until, lead_s=lead_s)

    def reserve_at(self, not_before: float, latest: float, *, count: int = 1) -> tuple[float | None, float]:
        """One reservation attempt for a start in [not_before, latest] (wall clock, s); returns (slot, tat).
        `count`: that many consecutive starts at the known spacing, in the one write (`slot` is the first)."""
        started = self._monotonic()
        busy_first = self.tat > not_before or (self.guess_busy and self.busy)
        if self.lease is not None:
            answer = self.ledger.reserve_leased(
                self.budget,
                not_before_us=int(not_before * 1e6),
                latest_us=int(latest * 1e6),
                busy_first=busy_first,
                count=count,
                interval_us=max(1, int(self.interval_s * 1e6)),
            )
            self.absorb(answer.pace)
            # After the reservation, not before: a renewal due now starts from the schedule this answer just showed
            # (no read of it); a reservation that lacked the lease renews by force (`reserve`).
            self.lease.ensure()
            slot_us, tat_us = answer.slot_us, answer.pace.tat_us
        else:
            slot_us, tat_us = self.ledger.reserve_pace(
                self.budget,
                not_before_us=int(not_before * 1e6),
                latest_us=int(latest * 1e6),
                interval_us=max(1, int(self.interval_s * 1e6)),
                busy_first=busy_first,
                count=count,
            )
        self.busy = slot_us is None or slot_us > int(not_before * 1e6)
        self.write_s = max(0.97 * self.write_s, self._monotonic() - started)
        self.tat = max(self.tat, tat_us / 1e6)
        return (None if slot_us is None else slot_us / 1e6), tat_us / 1e6

    def book(self, count: int, ahead_s: float, *, lead_s: float = 0.0) -> list[float]:
        """Reserve `count` consecutive starts (wall clock, s) in ONE write, the first within `ahead_s`: for calls
        known to come together (a completion batch's stops, a batch of new sessions: `reserve_together`). [] when
        the schedule gave none that way (full, a spacing changed by a renewal, a lease too short): the calls then
        reserve one at a time."""
        if count < 2:
            return []
        not_before = self._wall() + (lead_s or self.lead_s)
        interval_s = self.interval_s
        latest = not_before + ahead_s
        if self.lease is not None:
            if self._lacks_lease(not_before):
                return []
            # The block's last start must be within the lease, which its write checks as `lease_until` >= `latest`
            # + the block's span (no arithmetic on attributes): a window reaching past the known lease would
            # always be refused.
            latest = min(latest, self.lease_until - (count - 1) * interval_s)
            if latest < not_before:
                return []
        first, _tat = self.reserve_at(not_before, latest, count=count)
        return [] if first is None else [first + i * interval_s for i in range(count)]

    def absorb(self, pace: PaceView) -> None:
        """Take a leased schedule's spacing and lease from a read or a reservation's answer."""
        if pace.interval_us:
            self.interval_s = pace.interval_us / 1e6
        self.lease_until = pace.lease_until_us / 1e6
        if self.lease is not None:
            self.lease.observe(self.budget, pace)

    def _lacks_lease(self, start: float) -> bool:
        return self.lease_until < max(start, self.tat)

    def read_tat(self, pace: PaceView | None = None) -> float:
        """Read the budget's schedule (one strongly consistent GetItem; a leased one renewed after if due: the read
        shows a renewal by another process, which then needs none); returns the latest known `tat`. `pace`: the
        schedule as read just now by another request (`LimitLedger.limits_view`), then no GetItem (unless no
        lease is known yet: the read must come after getting one)."""
        if self.lease is not None:
            if self.lease_until <= self._wall():  # no lease known to this process yet: get one before reading
                self.lease.ensure()
                pace = None
            if pace is None:
                pace = self.ledger.pace(self.budget)
            self.absorb(pace)
            self.tat = max(self.tat, pace.tat_us / 1e6)
            self.lease.ensure()
            return self.tat
        tat_us = self.ledger.pace_tat(self.budget) if pace is None else pace.tat_us
        self.tat = max(self.tat, tat_us / 1e6)
        return self.tat

    def room(self, ahead_s: float) -> int:
        """Calls that could still start within `ahead_s` (at least one interval) from now, by the latest known
        schedule (no read); a leased schedule's no later than its lease."""
        now = self._wall()
        first = max(self.tat, now)
        room = max(0, math.floor((now + self._horizon(ahead_s) - first) / self.interval_s + 1e-9))
        if self.lease is not None:  # no start after the lease's end
            room = min(room, max(0, math.floor((self.lease_until - first) / self.interval_s + 1e-9) + 1))
        return room

    def next_room_s(self, ahead_s: float, calls: int = 1) -> float:
        """Seconds until `room(ahead_s)` is at least `calls`, by the latest known schedule."""
        if self.lease is not None and self._lacks_lease(self._wall()):
            return NO_LEASE_PAUSE_S[0]  # the next read renews the lease
        return max(0.0, self.tat - self._horizon(ahead_s) + calls * self.interval_s - self._wall())

    def _horizon(self, ahead_s: float) -> float:
        return max(ahead_s, self.interval_s)

    def promise(self, calls: int) -> None:
        """Count `calls` about to be reserved by this process in the known schedule (until a read shows them)."""
        if calls > 0:
            self.tat = max(self.tat, self._wall()) + calls * self.interval_s

    def sleep_until(self, slot: float) -> bool:
        """Sleep until `slot`; False if this caller is already more than LATENESS_S late (the slot is lost)."""
        pause = slot - self._wall()
        if pause > 0:
            self._sleep(pause)
        return self._wall() <= slot + LATE_START_S

    def acquire(self, wait_until: float, max_ahead_s: float | None = None) -> bool:
        """Reserve a slot and sleep until it; True when the caller may call now."""
        while True:
            slot = self.reserve(wait_until, max_ahead_s)
            if slot is None:
                return False
            if self.sleep_until(slot):
                return True


class InvokeBlock:
    """The starts of a batch of invokes known to come together, booked per budget in ONE write by the first of them
    to need one (`LimitedRuntime.invoke`'s `block`), consecutive: a dispatcher's SQS batch of warm takes (`expected`
    an int: that many `tps` starts), or a warm-pool fill chunk's warm-ups (`expected` by session budget, e.g.
    `{"session#2": 7}`, with new sessions' invokes in a share of their own). Each invoke uses the earliest start of
    its budget not yet too late (a stale one is dropped, never used late); one that finds none left, or comes too
    late for its start, reserves its own. Thread-safe: the batch's threads share it. `writes` counts its booking
    writes."""

    def __init__(self, expected: int | Mapping[str, int]) -> None:
        self.expected = {TAKES: expected} if isinstance(expected, int) else dict(expected)
        self.starts: dict[str, list[float]] = {}
        self.booked: set[str] = set()
        self.writes = 0
        self.lock = threading.Lock()


class NoCallBudget(RuntimeThrottled):
    """No slot of a call budget could be had before the caller's wait ended: the pipeline's own backlog (the call
    was not made), not an answer of AgentCore."""


class LimitedRuntime:
    """An `AgentRuntime` whose calls first take their budgets: every call a `tps` slot (a stop its `stops` one when
    stops have a budget of their own), an invoke that opens a session also a slot of its session budget (or only
    that one, `sessions_apart`): the experiment's one `session` budget leased from the account pool (account
    scope), else `session#{endpoint}` (the endpoint the session is opened on, `ids.endpoint_index`)."""

    def __init__(
        self,
        runtime: AgentRuntime,
        tps: Pacer,
        sessions: Sequence[Pacer],
        metrics: MetricsRecorder | None = None,
        *,
        sessions_apart: bool = False,
        session: Pacer | None = None,
        lease: Lessee | None = None,
        stops: Pacer | None = None,
    ) -> None:
        self.runtime = runtime
        self.tps = tps
        #: Stops' own budget (`dedicated_stop_share`); None: stops take `tps` slots.
        self.stops = stops
        self.sessions = list(sessions)
        #: The one leased budget of new sessions (account scope).
        self.session = session
        self.lease = lease
        self.metrics = metrics
        #: New sessions' calls are in a share of the data-plane budget set apart: they take no `tps` slot.
        self.sessions_apart = sessions_apart
        #: `tps` starts booked ahead for stops (`book_stops`), earliest first; a stop takes one before reserving.
        self._booked_stops: list[float] = []
        self._booked_lock = threading.Lock()

    def session_pacer(self, session_id: str) -> Pacer:
        """The budget a new session `session_id` takes: the leased `session` one (account scope), else its
        endpoint's (at the pool's per-endpoint rate with a lease)."""
        if self.lease is not None and self.session is not None:
            self.lease.ensure()
            if self.lease.scope() == "account":
                return self.session
        pacer = self.sessions[ids.endpoint_index(session_id, len(self.sessions))]
        if self.lease is not None:
            pacer.limit = self.lease.endpoint_rate()
        return pacer

    def room_pacer(self) -> Pacer | None:
        """The session budget the admission gate's room reads: the leased one (account scope), the only endpoint's
        (one endpoint), else None (several endpoints: no room; see docs/lifecycle.md "Limits")."""
        if self.lease is not None and self.session is not None:
            try:
                scope = self.lease.scope()
            except Exception:  # no pool view yet: the leased budget (the default scope)
                scope = "account"
            if scope == "account":
                return self.session
        return self.sessions[0] if len(self.sessions) == 1 else None

    def _throttled(self, what: str) -> NoCallBudget:
        if self.metrics is not None:
            self.metrics.count(LIMIT_BACKLOG)
        return NoCallBudget(f"no call budget for {what} before the wait budget ran out")

    def _call(self, call: Callable[[], None], budget: Budget) -> None:
        """Make the runtime call; an answer of AgentCore that refuses it for now counts `AcrThrottled` (once), and a
        rate exceeded backs the account pool off (`budget`: the rate it exceeded)."""
        try:
            call()
        except RuntimeThrottled as exc:
            if self.metrics is not None:
                self.metrics.count(ACR_THROTTLED)
            if isinstance(exc, RuntimeRateExceeded) and self.lease is not None:
                self.lease.throttled(budget)
            raise

    def invoke(
        self,
        session_id: str,
        payload: Mapping[str, Any],
        wait_until: float | None = None,
        *,
        new_session: bool = True,
        on_booked: Callable[[float], None] | None = None,
        block: InvokeBlock | None = None,
    ) -> None:
        """InvokeAgentRuntime once both budgets allow. Raises NoCallBudget (no budget in time) and whatever
        the runtime raises. `new_session=False` for a call into an existing session (cold-start retry, warm take):
        with a `block`, at one of the starts its batch booked together (`InvokeBlock`).
        `on_booked(start)` is called once the call's start (wall clock, s) is booked in the schedule (a new session:
        its `session` slot), before the wait for it: the dispatcher keeps the rollout on the admission board until
        then. A start lost by waking too late is booked again (and reported again)."""
        until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_WAIT_S
        booked = on_booked or (lambda _start: None)
        if not new_session:
            ahead_s = INVOKE_AHEAD_S if self.stop_pacer is self.tps else BLOCK_AHEAD_S  # stops wait behind it
            start = None if block is None else self._block_start(block, self.tps, until, ahead_s, key=TAKES)
            on_block = start is not None and self.tps.sleep_until(start)
            if not on_block and not self.tps.acquire(until, ahead_s):
                raise self._throttled("InvokeAgentRuntime")
            booked(self.tps._wall())
            self._call(lambda: self.runtime.invoke(session_id, payload), "calls")
            return
        pacer = self.session_pacer(session_id)
        block_start = None
        if block is not None and self.sessions_apart:  # a warm-up of a fill chunk: its session start from the block
            block_start = self._block_start(block, pacer, until, max(0.0, until - pacer._monotonic()))
        while True:
            slot = block_start
            if slot is None:
                lead_s = pacer.lead_s + (0.0 if self.sessions_apart else self.tps.lead_s)
                if self.sessions_apart:  # the session slot alone: the starts of a batch let through go in one write
                    slot = pacer.reserve_together(until, lead_s=lead_s)
                else:
                    slot = pacer.reserve(until, lead_s=lead_s)
            block_start = None
            if slot is None:
                raise self._throttled("a new session")
            booked(slot)
            if self.sessions_apart:
                if pacer.sleep_until(slot):
                    self._call(lambda: self.runtime.invoke(session_id, payload), "sessions")
                    return
                continue  # this thread woke up too late: the slot is lost
            # Just before it, the same start in the `tps` schedule (or at most LATENESS_S/2 later, else the session
            # slot is lost). Reserving it only now keeps the `tps` schedule free for stops until then.
            pause = slot - self.tps.lead_s - self.tps._wall()
            if pause > 0:
                self.tps._sleep(pause)
            tps_slot, _tat = self.tps.reserve_at(slot, slot + LATENESS_S * 0.5)
            if tps_slot is None:
                self._lost_slot(slot)
                continue
            if not (self.tps.sleep_until(tps_slot) and pacer.sleep_until(slot)):
                continue  # this thread woke up too late: both slots are lost
            self._call(lambda: self.runtime.invoke(session_id, payload), "sessions")
            return

    def _lost_slot(self, slot: float) -> None:
        """A session slot the `tps` budget could not match (stops queued ahead): let its time pass, try again."""
        pause = slot - self.tps._wall()
        if pause > 0:
            self.tps._sleep(pause)

    def _block_start(
        self, block: InvokeBlock, pacer: Pacer, until: float, ahead_s: float, *, key: str | None = None
    ) -> float | None:
        """This invoke's start of `pacer`'s budget from its batch's block: the earliest booked one not yet too late;
        the first of the batch books the block (every invoke of the budget still expected, this one included) in one
        write, the first start within `ahead_s`, waiting (at most `BLOCK_TRIES` times, within `until`) while the
        schedule is full over that horizon. None: no start from the block (the invoke reserves its own). `key`: the
        block's entry (default: the budget's name)."""
        budget = key or pacer.budget
        with block.lock:
            expected = block.expected[budget] = max(0, block.expected.get(budget, 0) - 1)
            latest_late = pacer._wall() - LATE_START_S
            starts = block.starts.get(budget, [])
            while starts:
                start = starts.pop(0)
                if start >= latest_late:
                    return start
            if budget in block.booked or expected < 1:  # booked once (its starts are gone), or this is the last
                return None
            block.booked.add(budget)
            booked = self._book_block(block, pacer, expected + 1, until, ahead_s)
            if not booked:
                return None
            block.starts[budget] = booked[1:]
            return booked[0]

    def _book_block(self, block: InvokeBlock, pacer: Pacer, count: int, until: float, ahead_s: float) -> list[float]:
        """`count` consecutive starts of `pacer` in one write (`Pacer.book`), waiting for room while the schedule is
        full over the horizon. A leased schedule whose lease this process does not know yet (its first block) is
        read first (the lease got or renewed: one GetItem); [] when it still has none."""
        for _ in range(BLOCK_TRIES):
            if pacer.lease is not None and pacer._lacks_lease(pacer._wall() + pacer.lead_s):
                try:
                    pacer.read_tat()
                except Exception:  # the takes' own reservations renew the lease
                    log.warning("could not read the leased schedule before booking invokes", exc_info=True)
                    return []
                if pacer._lacks_lease(pacer._wall() + pacer.lead_s):
                    return []
            try:
                block.writes += 1
                starts = pacer.book(count, ahead_s)
            except Exception:  # booking together only saves writes: the takes reserve one at a time
                log.warning("could not book %d invokes together", count, exc_info=True)
                return []
            if starts:
                return starts
            pause = pacer.next_room_s(ahead_s) + random.uniform(0.0, pacer.interval_s)
            if pacer._monotonic() + pause >= until:
                return []
            pacer._sleep(max(pause, 0.001))
        return []

    def book_stops(self, count: int) -> int:
        """Book `count` `tps` starts for stops about to be made (a completion batch's) in one write of the schedule,
        not one each; the next `stop` calls of this process take them. Returns how many were booked (0: each stop
        reserves its own)."""
        try:
            slots = self.stop_pacer.book(count, STOP_BOOK_AHEAD_S)
        except Exception:  # booking ahead only saves writes: the stops reserve one at a time
            log.warning("could not book %d stops ahead", count, exc_info=True)
            return 0
        with self._booked_lock:
            self._booked_stops = sorted(self._booked_stops + slots)
        return len(slots)

    def _booked_stop(self) -> float | None:
        """The earliest start booked for a stop that is not yet too late to use (stale ones are dropped)."""
        latest_late = self.stop_pacer._wall() - LATE_START_S
        with self._booked_lock:
            while self._booked_stops:
                slot = self._booked_stops.pop(0)
                if slot >= latest_late:
                    return slot
        return None

    @property
    def stop_pacer(self) -> Pacer:
        """The budget stops take: their own (`stops`; a leased one while the grant opens it), else `tps`."""
        if self.stops is None or (self.lease is not None and not self.lease.stops_apart()):
            return self.tps
        return self.stops

    def _acquire_stop(self, until: float) -> bool:
        """A stop's slot on `stop_pacer`. A leased `stop` schedule is tried for at most `STOP_LEASE_TRY_S` at a time:
        a renewal meanwhile may close it (the calls granted fell under twice the invoke rate), and the stop then
        goes to `tps`."""
        while True:
            pacer = self.stop_pacer
            if pacer is self.tps or self.lease is None:
                return pacer.acquire(until)
            if pacer.acquire(min(until, pacer._monotonic() + STOP_LEASE_TRY_S)):
                return True
            if pacer._monotonic() >= until:
                return False

    def stop(self, session_id: str, wait_until: float | None = None) -> None:
        """StopRuntimeSession once its budget allows (`stop_pacer`; on `tps` stops may queue ahead of invokes): at a
        start booked ahead for it (`book_stops`), else one reserved now."""
        until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_WAIT_S
        pacer = self.stop_pacer
        slot = self._booked_stop()
        on_booked = slot is not None and pacer.sleep_until(slot)
        if not on_booked and not self._acquire_stop(until):
            raise self._throttled("StopRuntimeSession")
        self._call(lambda: self.runtime.stop(session_id), "calls")


def dedicated_session_share(tps_limit: float, session_rate_limit: float, endpoints: int) -> bool:
    """Whether new sessions get a share of `tps_limit` of their own (the sum of the session budgets): only when what
    is left still has room for a stop per new session."""
    return tps_limit >= 2 * session_rate_limit * endpoints


def pacers(
    ledger: LimitLedger, tps_limit: float, session_rate_limit: float, endpoints: int
) -> tuple[Pacer, list[Pacer]]:
    """An experiment's own budgets (no account pool): `tps` (less the new sessions' share when
    `dedicated_session_share`) and one `session#{i}` per endpoint."""
    share = session_rate_limit * endpoints if dedicated_session_share(tps_limit, session_rate_limit, endpoints) else 0
    return Pacer(ledger, "tps", tps_limit - share), [
        Pacer(ledger, f"session#{i}", session_rate_limit, guess_busy=True) for i in range(endpoints)
    ]


def dedicated_stop_share(data_plane: float, invoke_rate: float) -> bool:
    """Whether stops get a budget of their own (`STOP_PACE`, the data-plane budget less the invoke rate): only when
    that leaves stops at least the invoke rate (a stop per invoke)."""
    return data_plane >= 2 * invoke_rate


def own_runtime(
    runtime: AgentRuntime,
    ledger: LimitLedger,
    *,
    data_plane: float,
    invoke_rate: float,
    session_rate_limit: float,
    endpoints: int,
    metrics: MetricsRecorder | None = None,
) -> LimitedRuntime:
    """The `LimitedRuntime` of an experiment on its own budgets (no account pool): `data_plane` calls/s in all
    (invokes and stops), of which at most `invoke_rate` InvokeAgentRuntime calls/s (`config.invoke_rate_cap`).
    With `dedicated_stop_share`, every invoke is paced within `invoke_rate` (`pacers`) and stops at the rest;
    else invokes and stops share `pacers` at `min(data_plane, invoke_rate)`, as before stops had a budget."""
    apart = dedicated_stop_share(data_plane, invoke_rate)
    invokes = invoke_rate if apart else min(data_plane, invoke_rate)
    tps, sessions = pacers(ledger, invokes, session_rate_limit, endpoints)
    return LimitedRuntime(
        runtime,
        tps,
        sessions,
        metrics,
        sessions_apart=dedicated_session_share(invokes, session_rate_limit, endpoints),
        stops=Pacer(ledger, STOP_PACE, data_plane - invoke_rate) if apart else None,
    )
