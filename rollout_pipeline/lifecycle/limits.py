"""Global limits shared by every caller in every process: paced ACR call budgets and session slots.

Budgets (GCRA, one schedule item per budget in the ledger, `LimitLedger.reserve_pace`): `tps` (every
InvokeAgentRuntime and StopRuntimeSession, `tps_limit`) and `session#{endpoint}` (invokes that open a new session,
`session_rate_limit` per endpoint). A caller reserves the budget's next start time, sleeps until then and calls.
Calls are spaced `(1 + LATENESS_S) / limit` apart and a caller that wakes up more than `LATENESS_S` after its slot
drops it, so ANY one-second window (aligned or sliding) holds at most `limit` calls of a budget, across every
process, with no burst at a window boundary (`limit + 1` calls span at least `(1 + LATENESS_S) - LATENESS_S`).
When `tps_limit` leaves room for a stop per new session (`dedicated_session_share`), invokes that open a session
take only their `session#{endpoint}` slot: their share of `tps_limit` (the sum of the session budgets) is set
apart and the `tps` schedule paces the rest (stops, calls into existing sessions) at `tps_limit` minus that share;
else a new session also takes a `tps` slot at its start.
Stops are never starved: an invoke only reserves a `tps` slot at most `INVOKE_AHEAD_S` ahead, a stop as far ahead
as its wait allows, so a waiting stop is always served within about `INVOKE_AHEAD_S`.
Sessions: `keys.SESSION_SHARDS` counters `LIMIT/SESSIONS#{i}` whose caps sum to `max_sessions` (`SlotShards`); a
slot is taken on a counter with room in the dispatch transaction and given back (on any counter: the sum stays
exact) only once the attempt's session is confirmed stopped or reaped by AgentCore (see `ledger.rollouts` and
`lifecycle.stops`). Each counter sees 1/32 of the slot transactions, so none is a hot item.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from rollout_pipeline import ids
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.limits import LimitLedger, shard_cap
from rollout_pipeline.lifecycle.metrics import ACR_THROTTLED, LIMIT_BACKLOG, MetricsRecorder
from rollout_pipeline.ports import AgentRuntime, RuntimeThrottled

#: A call may start at most this long after its reserved slot; the spacing leaves room for it.
LATENESS_S: Final = 0.05
#: How far ahead an invoke may reserve a `tps` slot (stops may reserve as far as they wait).
INVOKE_AHEAD_S: Final = 0.25
#: How long a stop waits for its slot when the caller gives no deadline.
DEFAULT_STOP_WAIT_S: Final = 15.0

#: One process's entry on the admission board: (process, heartbeat in epoch microseconds, its waiting keys).
BoardEntry = tuple[str, int, list[str]]


class Pacer:
    """One paced call budget (`limit` calls per second), global through the ledger's schedule item."""

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
    ) -> None:
        self.ledger = ledger
        self.budget = budget
        self.limit = limit
        self.interval_s = (1.0 + LATENESS_S) / limit
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
            pause = tat - now - ahead + random.uniform(0.0, self.interval_s)
            if self._monotonic() + pause >= wait_until:
                return None
            self._sleep(max(pause, 0.001))

    def reserve_at(self, not_before: float, latest: float) -> tuple[float | None, float]:
        """One reservation attempt for a start in [not_before, latest] (wall clock, s); returns (slot, tat)."""
        started = self._monotonic()
        slot_us, tat_us = self.ledger.reserve_pace(
            self.budget,
            not_before_us=int(not_before * 1e6),
            latest_us=int(latest * 1e6),
            interval_us=max(1, int(self.interval_s * 1e6)),
            busy_first=self.tat > not_before or (self.guess_busy and self.busy),
        )
        self.busy = slot_us is None or slot_us > int(not_before * 1e6)
        self.write_s = max(0.97 * self.write_s, self._monotonic() - started)
        self.tat = max(self.tat, tat_us / 1e6)
        return (None if slot_us is None else slot_us / 1e6), tat_us / 1e6

    def read_tat(self) -> float:
        """Read the budget's schedule (one strongly consistent GetItem); returns the latest known `tat`."""
        self.tat = max(self.tat, self.ledger.pace_tat(self.budget) / 1e6)
        return self.tat

    def room(self, ahead_s: float) -> int:
        """Calls that could still start within `ahead_s` (at least one interval) from now, by the latest known
        schedule (no read)."""
        now = self._wall()
        return max(0, math.floor((now + self._horizon(ahead_s) - max(self.tat, now)) / self.interval_s + 1e-9))

    def next_room_s(self, ahead_s: float) -> float:
        """Seconds until `room(ahead_s)` is at least one, by the latest known schedule."""
        return max(0.0, self.tat - self._horizon(ahead_s) + self.interval_s - self._wall())

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
        return self._wall() <= slot + LATENESS_S * 0.8

    def acquire(self, wait_until: float, max_ahead_s: float | None = None) -> bool:
        """Reserve a slot and sleep until it; True when the caller may call now."""
        while True:
            slot = self.reserve(wait_until, max_ahead_s)
            if slot is None:
                return False
            if self.sleep_until(slot):
                return True


class SlotShards:
    """Which session-slot counter a dispatch takes its slot on: a process's view of every counter's room (cap minus
    count: `LimitLedger.slot_counts`, refreshed by each read of the sessions in flight, with this process's own
    takes and failures since), and the next counter with room in a rotation that starts at random in each process,
    so the dispatches a process starts at once (an SQS batch's) take distinct counters (chosen at random, 10
    dispatches over 16 counters met on one ~3 times per batch). The transaction stays the arbiter: a counter found
    full is marked so and another is chosen."""

    def __init__(self, ledger: LimitLedger, max_sessions: int, *, rng: random.Random | None = None) -> None:
        self.ledger = ledger
        self._caps = [shard_cap(max_sessions, i) for i in range(keys.SESSION_SHARDS)]
        self._room = list(self._caps)  # until the first read: every counter empty
        self._cursor = (rng or random).randrange(keys.SESSION_SHARDS)
        self._lock = threading.Lock()

    def in_flight(self) -> int:
        """Read every counter (one Query): the sessions in flight; refreshes the view."""
        return self._absorb(self.ledger.slot_counts())

    def in_flight_and_board(self) -> tuple[int, list[BoardEntry]]:
        """The sessions in flight and the admission board, in one Query (`LimitLedger.slots_and_board`); refreshes
        the view."""
        counts, board = self.ledger.slots_and_board()
        return self._absorb(counts), board

    def _absorb(self, counts: Sequence[int]) -> int:
        with self._lock:
            self._room = [cap - count for cap, count in zip(self._caps, counts, strict=True)]
        return sum(counts)

    def choose(self) -> int:
        """The next counter with room by the view in this process's rotation; the next with a cap when none has."""
        with self._lock:
            for usable in (self._room, self._caps):
                for step in range(keys.SESSION_SHARDS):
                    shard = (self._cursor + step) % keys.SESSION_SHARDS
                    if usable[shard] > 0:
                        self._cursor = shard + 1
                        return shard
            return 0

    def taken(self, shard: int) -> None:
        """This process took a slot on `shard`."""
        with self._lock:
            self._room[shard] -= 1

    def full(self, shard: int) -> None:
        """A take on `shard` failed its cap: no room there until the next read."""
        with self._lock:
            self._room[shard] = 0

    def room(self) -> int:
        """Free slots by the view (no read)."""
        with self._lock:
            return sum(max(0, room) for room in self._room)


class NoCallBudget(RuntimeThrottled):
    """No slot of a call budget could be had before the caller's wait ended: the pipeline's own backlog (the call
    was not made), not an answer of AgentCore."""


class LimitedRuntime:
    """An `AgentRuntime` whose calls first take their budgets: every call a `tps` slot, an invoke that opens a
    session also a `session#{endpoint}` slot (the endpoint the session is opened on, `ids.endpoint_index`)."""

    def __init__(
        self,
        runtime: AgentRuntime,
        tps: Pacer,
        sessions: Sequence[Pacer],
        metrics: MetricsRecorder | None = None,
        *,
        sessions_apart: bool = False,
    ) -> None:
        self.runtime = runtime
        self.tps = tps
        self.sessions = list(sessions)
        self.metrics = metrics
        #: New sessions' calls are in a share of `tps_limit` set apart (`pacers`): they take no `tps` slot.
        self.sessions_apart = sessions_apart

    def _throttled(self, what: str) -> NoCallBudget:
        if self.metrics is not None:
            self.metrics.count(LIMIT_BACKLOG)
        return NoCallBudget(f"no call budget for {what} before the wait budget ran out")

    def _call(self, call: Callable[[], None]) -> None:
        """Make the runtime call; an answer of AgentCore that refuses it for now counts `AcrThrottled` (once)."""
        try:
            call()
        except RuntimeThrottled:
            if self.metrics is not None:
                self.metrics.count(ACR_THROTTLED)
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
        """InvokeAgentRuntime once both budgets allow. Raises NoCallBudget (no budget in time) and whatever
        the runtime raises. `new_session=False` for a call into an existing session (cold-start retry).
        `on_booked(start)` is called once the call's start (wall clock, s) is booked in the schedule (a new session:
        its `session#` slot), before the wait for it: the dispatcher keeps the rollout on the admission board until
        then. A start lost by waking too late is booked again (and reported again)."""
        until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_WAIT_S
        booked = on_booked or (lambda _start: None)
        if not new_session:
            if not self.tps.acquire(until, INVOKE_AHEAD_S):
                raise self._throttled("InvokeAgentRuntime")
            booked(self.tps._wall())
            self._call(lambda: self.runtime.invoke(session_id, payload))
            return
        pacer = self.sessions[ids.endpoint_index(session_id, len(self.sessions))]
        while True:
            slot = pacer.reserve(until, lead_s=pacer.lead_s + (0.0 if self.sessions_apart else self.tps.lead_s))
            if slot is None:
                raise self._throttled("a new session")
            booked(slot)
            if self.sessions_apart:
                if pacer.sleep_until(slot):
                    self._call(lambda: self.runtime.invoke(session_id, payload))
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
            self._call(lambda: self.runtime.invoke(session_id, payload))
            return

    def _lost_slot(self, slot: float) -> None:
        """A session slot the `tps` budget could not match (stops queued ahead): let its time pass, try again."""
        pause = slot - self.tps._wall()
        if pause > 0:
            self.tps._sleep(pause)

    def stop(self, session_id: str, wait_until: float | None = None) -> None:
        """StopRuntimeSession once the `tps` budget allows (stops may queue ahead of invokes)."""
        until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_WAIT_S
        if not self.tps.acquire(until):
            raise self._throttled("StopRuntimeSession")
        self._call(lambda: self.runtime.stop(session_id))


def dedicated_session_share(tps_limit: float, session_rate_limit: float, endpoints: int) -> bool:
    """Whether new sessions get a share of `tps_limit` of their own (the sum of the session budgets): only when what
    is left still has room for a stop per new session."""
    return tps_limit >= 2 * session_rate_limit * endpoints


def pacers(
    ledger: LimitLedger, tps_limit: float, session_rate_limit: float, endpoints: int
) -> tuple[Pacer, list[Pacer]]:
    """The experiment's budgets: `tps` (less the new sessions' share when `dedicated_session_share`) and one
    `session#{i}` per endpoint."""
    share = session_rate_limit * endpoints if dedicated_session_share(tps_limit, session_rate_limit, endpoints) else 0
    return Pacer(ledger, "tps", tps_limit - share), [
        Pacer(ledger, f"session#{i}", session_rate_limit, guess_busy=True) for i in range(endpoints)
    ]


#: A new rollout is admitted (takes a slot, then reserves its session start) only while the session budgets still
#: have room within this horizon; beyond it, rollouts wait in the ordered `SlotGate`, so the budget's own queue
#: stays short and admission order, not first-come reservations, decides which group's sessions start first.
ADMIT_AHEAD_S: Final = 2.0


class SessionRoom:
    """Room for new sessions in one `session#{endpoint}` budget within `ahead_s`, as this process knows it: its
    reads of the schedule, its own reservations, and the sessions it let through since."""

    def __init__(self, session: Pacer, ahead_s: float = ADMIT_AHEAD_S) -> None:
        self.session = session
        self.ahead_s = ahead_s
        self._lock = threading.Lock()

    def claim(self) -> bool:
        """For a newly received rollout: True (and the room counted as taken) if the session budget is idle (its
        next start is not ahead of now; one read of the schedule). A busy budget sends the rollout to the ordered
        gate, which admits up to `ahead_s`: so processes that start at once let through one rollout each, not a
        horizon's worth each in no particular order."""
        with self._lock:
            self.session.read_tat()
            if self.session.room(0.0) <= 0:
                return False
            self.session.promise(1)
            return True

    def read(self) -> int:
        """Room now (reads the schedule)."""
        with self._lock:
            self.session.read_tat()
            return self.session.room(self.ahead_s)

    def promise(self, sessions: int) -> None:
        """`sessions` waiters were let through: count them in the known schedule."""
        with self._lock:
            self.session.promise(sessions)

    def next_room_s(self) -> float:
        """Seconds until the known schedule has room for one more session."""
        return self.session.next_room_s(self.ahead_s)


#: A process's entry on the admission board older than this is ignored (its process crashed or stalled), so a dead
#: waiter holds the others back at most this long.
BOARD_STALE_S: Final = 5.0
#: A process re-publishes its waiters at least this often while it has any (its heartbeat).
BOARD_HEARTBEAT_S: Final = 1.0
#: A process reads the board for a newly received message at most this often (a cached view is used between).
BOARD_READ_S: Final = 1.0
#: At most this many waiting keys per process are published (a Lambda holds 10 messages at a time).
BOARD_MAX_KEYS: Final = 32
#: The slot gate's poller polls every `LEAD_POLL_S` (jittered) while one of its waiters ranks among the first
#: `LEAD_RANKS` keys of every live waiter (by its latest view of the board): the next slots to free are theirs, and
#: seeing one ~0.25 s sooner is ~0.25 s more of that slot's time used. The others poll every 0.2-1 s. At most
#: `LEAD_RANKS` processes lead by one view of the board, so the fast polls are bounded per second, not per waiter
#: (measured in docs/benchmarks.md, "Group order through the release window": 1 and 2 ranks).
LEAD_RANKS: Final = 2
LEAD_POLL_S: Final = (0.05, 0.25)
#: A burst's start: a process that had no rollout in hand for `BOARD_STALE_S` (or never had one) takes no slot for
#: this long after it receives, so the dispatchers that received the same burst at about the same time have put
#: their rollouts on the board before anyone decides; the first decision then sees every one of them. It covers the
#: dispatch function's SQS batching window (1 s, `topology.FUNCTIONS`): Lambda may invoke one dispatcher that long
#: after another received part of the same burst, so a shorter settle would let the first one decide without it.
BOARD_SETTLE_S: Final = 1.0


class AdmissionBoard:
    """The waiting rollouts of EVERY dispatcher process, through the ledger (`LIMIT/WAIT#{process}` items: the
    sorted admission keys of a process's waiters and a heartbeat). Entries older than `BOARD_STALE_S` are ignored."""

    def __init__(
        self,
        ledger: LimitLedger,
        process: str | None = None,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.process = process or uuid.uuid4().hex
        self._wall = wall
        self._published: list[str] | None = None
        self._published_at = 0.0
        self._lock = threading.Lock()
        self._others: list[str] = []
        self._read_at = -1e18

    def publish(self, waiting: Sequence[str]) -> None:
        """Publish this process's waiting keys if they changed or the heartbeat is due; clear when none."""
        keys = sorted(waiting)[:BOARD_MAX_KEYS]
        if not keys and not self._published:
            return
        now = self._wall()
        if keys == self._published and (not keys or now - self._published_at < BOARD_HEARTBEAT_S):
            return
        if keys:
            self.ledger.put_waiting(self.process, keys, now_us=int(now * 1e6))
        else:
            self.ledger.clear_waiting(self.process)
        self._published, self._published_at = keys, now

    def others(self, max_age_s: float = 0.0) -> list[str]:
        """The live waiting keys of the OTHER processes, sorted; read again when the cached view is older than
        `max_age_s` (0: always)."""
        with self._lock:
            now = self._wall()
            if now - self._read_at >= max_age_s:
                self._absorb(self.ledger.waiting_board(), now)
            return self._others

    def absorb(self, board: Sequence[BoardEntry]) -> None:
        """Take `board`, read just now with something else (`LimitLedger.slots_and_board`), as the cached view."""
        with self._lock:
            self._absorb(board, self._wall())

    def cached(self, max_age_s: float) -> list[str] | None:
        """The live waiting keys of the other processes by the latest view (no read), sorted; None when that view
        is older than `max_age_s`."""
        with self._lock:
            return self._others if self._wall() - self._read_at <= max_age_s else None

    def _absorb(self, board: Sequence[BoardEntry], now: float) -> None:
        live = [
            key
            for process, heartbeat_us, keys in board
            if process != self.process and now - heartbeat_us / 1e6 <= BOARD_STALE_S
            for key in keys
        ]
        self._others, self._read_at = sorted(live), now


class SlotGate:
    """Dispatcher threads of one process waiting for a session slot: ONE of them polls the shared counter
    (strongly consistent GetItem, every 0.2-1 s, jittered) and, when it sees free slots, lets waiters try the
    dispatch transaction: the waiters FIRST IN GROUP ORDER (`priority`: batch submission time, batch, the group's
    line, index), so a GRPO group's rollouts are admitted together and groups in submission order. With a `board`
    (`AdmissionBoard`) that order holds across every dispatcher process: the poller publishes its waiters' keys and
    lets through only those of its waiters that rank among the first `free` keys of ALL live waiters. The others
    sleep. The transaction stays the only arbiter, so a waiter let through for nothing just waits again. Saves N-1
    polls per process and the herd of transactions that N independent pollers would start when one slot frees.
    With a `room` (`SessionRoom`), `free` is also bounded by the session budgets' room within `ADMIT_AHEAD_S`, so the
    same order holds when the new-session RATE binds rather than `max_sessions`.
    With a `board` and `in_flight_and_board` (the counters and the board in one read), every poll also refreshes the
    board's view, and a poller whose waiters lead the board (`LEAD_RANKS`) polls every `LEAD_POLL_S`: the next free
    slots are seen sooner by the processes they go to, while the others keep the slow pace."""

    def __init__(
        self,
        in_flight: Callable[[], int],
        max_sessions: int,
        *,
        board: AdmissionBoard | None = None,
        room: SessionRoom | None = None,
        in_flight_and_board: Callable[[], tuple[int, list[BoardEntry]]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._in_flight = in_flight
        self._in_flight_and_board = in_flight_and_board if board is not None else None
        self.max_sessions = max_sessions
        self.board = board
        self.room = room
        self._monotonic = monotonic
        self._sleep = sleep
        self._cond = threading.Condition()
        self._tickets = 0
        self._queue: list[tuple[str, int]] = []  # (admission key, arrival), sorted
        self._seq = 0
        self._polling = False
        self.polls = 0
        #: Pauses between polls taken at the lead pace (`LEAD_POLL_S`).
        self.lead_polls = 0
        #: Keys of rollouts received and not yet past the gate (`hold`): on the board from receipt on.
        self._held: Counter[str] = Counter()
        #: When the current burst began (monotonic; None: nothing held yet) and when the last one ended.
        self._burst_since: float | None = None
        self._empty_since: float | None = None
        self._closed = False

    def close(self) -> None:
        """End every wait now and every later one at once, as if its `wait_until` had passed (the waiters take
        their "no slot in time" path: the message is re-sent). For a process shutting down (local mode's Ctrl-C)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def hold(self, keys: Sequence[str]) -> list[Held]:
        """Rollouts just received (their admission keys), before any of them is decided: they go on the board at
        once (one write), so a process deciding meanwhile ranks them. The first hold after `BOARD_STALE_S` with
        nothing in hand starts a burst: for `BOARD_SETTLE_S` this process lets nothing through (`settle_s`).
        Release each returned `Held` once its rollout is past the gate (or never reaches it)."""
        if not keys:
            return []
        with self._cond:
            now = self._monotonic()
            if not self._in_hand() and (self._empty_since is None or now - self._empty_since > BOARD_STALE_S):
                self._burst_since = now
            self._held.update(keys)
        if self.board is not None:
            self._publish()
        return [Held(self, key) for key in keys]

    def _release(self, key: str) -> None:
        with self._cond:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
            self._note_empty()
            cleared = not self._in_hand()
        if cleared and self.board is not None:
            self._publish()  # the last rollout in hand takes the process off the board

    def _in_hand(self) -> bool:
        return bool(self._queue or self._held)

    def _note_empty(self) -> None:
        if not self._in_hand():
            self._empty_since = self._monotonic()

    def settle_s(self) -> float:
        """Seconds left of the current burst's settling time (0 without a board: there is no one to wait for)."""
        if self.board is None or self._burst_since is None:
            return 0.0
        return max(0.0, self._burst_since + BOARD_SETTLE_S - self._monotonic())

    def must_queue(self, priority: str) -> bool:
        """Whether a newly received rollout must wait in the gate instead of taking a slot at once: a waiter
        anywhere (this process, or another on the board: a view at most `BOARD_READ_S` old) comes before
        `priority`, a burst is still settling (`settle_s`), or (with a `room`) the session budget is busy
        (`SessionRoom.claim`)."""
        if self.settle_s() > 0:
            return True
        with self._cond:
            if self._queue and self._queue[0][0] < priority:  # the queue is sorted: its head is the earliest
                return True
        if self.board is not None:
            try:
                others = self.board.others(BOARD_READ_S)
            except Exception:  # no board view: the transaction decides, as without a board
                others = []
            if others and others[0] < priority:
                return True
        try:
            return self.room is not None and not self.room.claim()
        except Exception:  # no view of the budgets: the pacer still holds the rate
            return False

    def wait(self, wait_until: float, priority: str = "") -> bool:
        """Block until a slot looks free for this waiter (True) or `wait_until` (monotonic) passes (False).
        `priority` (an admission key, `dispatch.admission_key`) sorts waiters, lowest first."""
        with self._cond:
            self._seq += 1
            key = (priority, self._seq)
            bisect.insort(self._queue, key)
            try:
                while True:
                    if self._tickets > 0 and self._queue.index(key) < self._tickets:
                        self._tickets -= 1
                        return True
                    remaining = wait_until - self._monotonic()
                    if remaining <= 0 or self._closed:
                        return False
                    if self._polling:
                        self._cond.wait(timeout=min(remaining, 1.0))
                        continue
                    self._polling = True
                    self._cond.release()
                    try:
                        free = self._poll(wait_until)
                    finally:
                        self._cond.acquire()
                        self._polling = False
                    if free:
                        granted = min(free, len(self._queue))
                        if self.room is not None:
                            self.room.promise(granted - min(self._tickets, granted))
                        self._tickets = granted
                        self._cond.notify_all()
                    else:
                        self._cond.notify()  # another waiter takes over the polling
            finally:
                self._queue.remove(key)
                self._tickets = min(self._tickets, len(self._queue))
                self._note_empty()
                if not self._queue and self.board is not None:
                    self._publish()  # the last waiter takes the process off the board

    def queued(self) -> list[str]:
        """The admission keys of this process's waiters, in the order they will be let through."""
        with self._cond:
            return [key for key, _arrival in self._queue]

    def _waiting(self) -> list[str]:
        """Every key this process has in hand, sorted: its waiters and what it received but has not decided yet."""
        with self._cond:  # reentrant: also called with the condition held
            return sorted({key for key, _arrival in self._queue} | set(self._held))

    def _publish(self) -> None:
        assert self.board is not None
        with contextlib.suppress(Exception):  # the board only orders admission; the transaction decides
            self.board.publish(self._waiting())

    def leads(self) -> bool:
        """Whether this process's first waiter ranks among the first `LEAD_RANKS` keys of every live waiter, by the
        latest view of the board (no read; a view older than two slow polls tells nothing). Only with a board read
        at each poll (`in_flight_and_board`): without it the view may be too old to tell, and every process keeps
        the slow pace."""
        if self.board is None or self._in_flight_and_board is None:
            return False
        mine, others = self.queued(), self.board.cached(2 * BOARD_READ_S)
        return bool(mine) and others is not None and bisect.bisect_left(others, mine[0]) < LEAD_RANKS

    def _pace(self) -> tuple[float, bool]:
        """The pause before the next poll, and whether it is the lead pace: `LEAD_POLL_S` while this process leads
        the board, else 0.2-1 s."""
        if self.leads():
            return random.uniform(*LEAD_POLL_S), True
        return jitter_poll_s(), False

    def _read(self) -> tuple[int, float]:
        """Sessions in flight, and how old a board view the decision may use (the board read with it: fresh)."""
        if self._in_flight_and_board is None:
            return self._in_flight(), 0.0
        assert self.board is not None
        in_flight, board = self._in_flight_and_board()
        self.board.absorb(board)
        return in_flight, BOARD_READ_S

    def _poll(self, wait_until: float) -> int:
        """Poll until some slots look free for this process's waiters (their number) or `wait_until` passes."""
        pause, lead = self._pace()
        if self.room is not None:  # the rate may be what binds: look as soon as the budgets have room
            pause = self._room_pause(pause)
        pause = max(pause, self.settle_s())  # a burst's first decision waits for the others' rollouts
        if self.board is not None:
            self._publish()  # waiters let through by the last poll leave the board now, not a poll later
        while True:
            if self._monotonic() + pause > wait_until or self._closed:
                return 0
            self._sleep(pause)
            self.polls += 1
            self.lead_polls += lead
            if self.board is not None:
                self._publish()  # this process's waiters as they are now (changed, or the heartbeat)
            in_flight, board_age_s = self._read()
            pause, lead = self._pace()
            free = self.max_sessions - in_flight
            if free > 0 and self.room is not None:
                free = min(free, self.room.read())
                if free <= 0:
                    pause = self._room_pause(pause)
            if free <= 0:
                continue
            if self.board is None:
                return free
            mine = self.queued()
            try:
                others = self.board.others(board_age_s)
            except Exception:  # no board view: fall back to this process's own order
                return free
            ranked = heapq.nsmallest(free, [(k, 0) for k in mine] + [(k, 1) for k in others])
            ours = sum(1 for _key, theirs in ranked if not theirs)
            if ours:
                return ours
            pause, lead = min(pause, random.uniform(0.1, 0.25)), False  # room others go first for: look again soon

    def _room_pause(self, pause: float) -> float:
        """Poll again when the session budgets will have room (at most `pause`, at least 0.1 s, jittered)."""
        assert self.room is not None
        return min(pause, max(0.1, self.room.next_room_s()) + random.uniform(0.0, 0.05))


class Held:
    """One received rollout's place on the board until it is past the gate; `release` is idempotent."""

    def __init__(self, gate: SlotGate, key: str) -> None:
        self.gate = gate
        self.key = key
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.gate._release(self.key)


def jitter_poll_s() -> float:
    """Pause between two polls of the session counter: 0.2-1 s, jittered so waiters do not move in lockstep."""
    return random.uniform(0.2, 1.0)
