"""Admission: which waiting rollouts take the next free session slots (or session starts), in group order across
every dispatcher process (docs/lifecycle.md, "Limits")."""

from __future__ import annotations

import bisect
import contextlib
import heapq
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.limits.pacing import Pacer

#: One process's entry on the admission board: (process, heartbeat in epoch microseconds, its waiting keys).
BoardEntry = tuple[str, int, list[str]]

#: A rollout is admitted only while the session budget has room within this horizon (else it waits in `SlotGate`).
ADMIT_AHEAD_S: Final = 2.0
#: While the room binds, the gate lets waiters through this many seconds of starts at a time (`SlotGate._room_batch`).
ROOM_BATCH_S: Final = 0.5
#: A process's entry on the admission board older than this is ignored (its process crashed or stalled).
BOARD_STALE_S: Final = 5.0
#: A process re-publishes its waiters (its heartbeat) at least, and reads the board for a rollout at most, this often.
BOARD_READ_S: Final = 1.0
#: At most this many waiting keys per process are published (a Lambda holds 10 messages at a time).
BOARD_MAX_KEYS: Final = 32
#: A poller whose first waiter ranks among this many first keys of all live waiters leads (the next slots are theirs)...
LEAD_RANKS: Final = 2
#: ... and polls every this many seconds (jittered); the others every 0.2-1 s.
LEAD_POLL_S: Final = (0.05, 0.25)
#: A burst's first decision waits this long for every dispatcher's part of it: the dispatch function's batching window.
BOARD_SETTLE_S: Final = 1.0


class AdmissionBoard:
    """The waiting rollouts of EVERY dispatcher process (`LIMIT/WAIT#{process}`: sorted admission keys, heartbeat)."""

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
        if keys == self._published and (not keys or now - self._published_at < BOARD_READ_S):
            return
        if keys:
            self.ledger.put_waiting(self.process, keys, now_us=int(now * 1e6))
        else:
            self.ledger.clear_waiting(self.process)
        self._published, self._published_at = keys, now

    def others(self, max_age_s: float = 0.0) -> list[str]:
        """The live waiting keys of the OTHER processes, sorted; read when the cached view is older than `max_age_s`."""
        with self._lock:
            now = self._wall()
            if now - self._read_at >= max_age_s:
                self._absorb(self.ledger.waiting_board(), now)
            return self._others

    def absorb(self, board: Sequence[BoardEntry]) -> None:
        """Take `board`, read just now with the slot counters, as the cached view."""
        with self._lock:
            self._absorb(board, self._wall())

    def cached(self, max_age_s: float) -> list[str] | None:
        """The other processes' live waiting keys by the latest view (no read); None when older than `max_age_s`."""
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
    """Dispatcher threads of one process waiting for a session slot: ONE polls, and lets the waiters first in group
    order (`priority`) try the dispatch transaction, as many as the `session` budget has room for within
    `ADMIT_AHEAD_S`; with a `board`, in order across processes. Each poll is one `read`: the sessions in flight, the
    board and the schedules."""

    def __init__(
        self,
        read: Callable[[], tuple[int, list[BoardEntry], Mapping[str, Mapping[str, Any]]]],
        max_sessions: Callable[[], int],
        session: Pacer,
        *,
        board: AdmissionBoard | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._read_all = read
        self.max_sessions = max_sessions
        self.session = session
        self.board = board
        self._monotonic = monotonic
        self._sleep = sleep
        self._cond = threading.Condition()
        self._tickets = 0
        self._queue: list[tuple[str, int]] = []  # (admission key, arrival), sorted
        self._seq = 0
        self._polling = False
        self.polls = 0
        self.lead_polls = 0
        #: Keys of rollouts received and not yet past the gate (`hold`).
        self._held: Counter[str] = Counter()
        #: When the current burst began (monotonic; None: nothing held yet) and when the last one ended.
        self._burst_since: float | None = None
        self._empty_since: float | None = None
        self._closed = False
        #: Called when this process's last rollout in hand leaves (its start booked, or sent back).
        self.on_clear: Callable[[], None] = lambda: None

    def close(self) -> None:
        """End every wait now and later at once, as if its `wait_until` had passed (a process shutting down)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def hold(self, keys: Sequence[str]) -> list[Held]:
        """Rollouts just received go on the board at once (one write), each until its `Held` leaves."""
        if not keys:
            return []
        with self._cond:
            now = self._monotonic()
            if not self.in_hand() and (self._empty_since is None or now - self._empty_since > BOARD_STALE_S):
                self._burst_since = now
            self._held.update(keys)
        self._publish()
        return [Held(self, key) for key in keys]

    def _leave(self, key: str) -> None:
        with self._cond:
            self._held[key] -= 1
            if self._held[key] <= 0:
                del self._held[key]
            self._note_empty()
            cleared = not self.in_hand()
        if cleared:
            self._publish()  # the last rollout in hand takes the process off the board
            self.on_clear()

    def in_hand(self) -> bool:
        return bool(self._queue or self._held)

    def _note_empty(self) -> None:
        if not self.in_hand():
            self._empty_since = self._monotonic()

    def settle_s(self) -> float:
        """Seconds left of the current burst's settling time (0 without a board)."""
        if self.board is None or self._burst_since is None:
            return 0.0
        return max(0.0, self._burst_since + BOARD_SETTLE_S - self._monotonic())

    def must_queue(self, priority: str) -> bool:
        """Whether a new rollout must wait: a waiter anywhere comes first, a burst settles, or the budget is busy."""
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
            return not self.session.claim()
        except Exception:  # no view of the budgets: the pacer still holds the rate
            return False

    def wait(self, wait_until: float, priority: str = "") -> bool:
        """Block until a slot looks free for this waiter (True) or `wait_until` passes (False)."""
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
                        self.session.promise(granted - min(self._tickets, granted))
                        self._tickets = granted
                        self._cond.notify_all()
                    else:
                        self._cond.notify()  # another waiter takes over the polling
            finally:
                self._queue.remove(key)
                self._tickets = min(self._tickets, len(self._queue))
                self._note_empty()
                if not self._queue:
                    self._publish()  # the last waiter takes the process off the board

    def queued(self) -> list[str]:
        """The admission keys of this process's waiters, in the order they will be let through."""
        with self._cond:
            return [key for key, _arrival in self._queue]

    def _waiting(self) -> list[str]:
        with self._cond:  # reentrant: also called with the condition held
            return sorted({key for key, _arrival in self._queue} | set(self._held))

    def _publish(self) -> None:
        if self.board is None:
            return
        with contextlib.suppress(Exception):  # the board only orders admission; the transaction decides
            self.board.publish(self._waiting())

    def leads(self) -> bool:
        """Whether this process's first waiter ranks among the first `LEAD_RANKS` keys of every live waiter."""
        if self.board is None:
            return False
        mine, others = self.queued(), self.board.cached(2 * BOARD_READ_S)
        return bool(mine) and others is not None and bisect.bisect_left(others, mine[0]) < LEAD_RANKS

    def _pace(self) -> tuple[float, bool]:
        if self.leads():
            return random.uniform(*LEAD_POLL_S), True
        return jitter_poll_s(), False

    def _read(self) -> tuple[int, Mapping[str, Mapping[str, Any]]]:
        in_flight, board, paces = self._read_all()
        if self.board is not None:
            self.board.absorb(board)
        return in_flight, paces

    def _poll(self, wait_until: float) -> int:
        """Poll until some slots look free for this process's waiters (their number) or `wait_until` passes."""
        pause, lead = self._pace()
        if self._may_chase():  # the rate may be what binds: look as soon as it has room
            pause = self._room_pause(pause, self._room_batch())
        pause = max(pause, self.settle_s())  # a burst's first decision waits for the others' rollouts
        self._publish()  # waiters let through by the last poll leave the board now, not a poll later
        while True:
            if self._monotonic() + pause > wait_until or self._closed:
                return 0
            self._sleep(pause)
            self.polls += 1
            self.lead_polls += lead
            self._publish()  # this process's waiters as they are now (changed, or the heartbeat)
            in_flight, paces = self._read()
            pause, lead = self._pace()
            free = self.max_sessions() - in_flight
            if free > 0:
                batch = min(free, self._room_batch())
                schedule = paces.get(self.session.budget, {})
                room = self.session.read_room(ADMIT_AHEAD_S, schedule, wanted=batch)
                free = min(free, room) if room >= batch else 0  # the rate binds: wait for a batch's room
                if free <= 0 and self._may_chase():
                    pause = self._room_pause(pause, batch)
            if free <= 0:
                continue
            if self.board is None:
                return free
            mine = self.queued()
            try:
                others = self.board.others(BOARD_READ_S)
            except Exception:  # no board view: fall back to this process's own order
                return free
            ranked = heapq.nsmallest(free, [(k, 0) for k in mine] + [(k, 1) for k in others])
            ours = sum(1 for _key, theirs in ranked if not theirs)
            if ours:
                return ours
            if self._may_chase():  # room others go first for: look again soon (the next in line only)
                pause, lead = min(pause, random.uniform(0.1, 0.25)), False

    def _may_chase(self) -> bool:
        return self.board is None or self.leads()

    def _room_batch(self) -> int:
        """Starts let through at a time while the room binds: `ROOM_BATCH_S` worth (at most half the horizon's), at
        most one a waiter."""
        with self._cond:  # reentrant: also called with the condition held
            waiters = len(self._queue)
        per_start = self.session.interval_s
        batch = min(int(ROOM_BATCH_S / per_start + 1e-9), int(ADMIT_AHEAD_S / 2 / per_start + 1e-9))
        return max(1, min(waiters, batch))

    def _room_pause(self, pause: float, sessions: int = 1) -> float:
        ready = max(0.1, self.session.next_room_s(ADMIT_AHEAD_S, sessions)) + random.uniform(0.0, 0.05)
        return min(pause, ready) if sessions <= 1 else min(ready, 1.0)


class Held:
    """One received rollout's place on the board until it is past the gate; `leave` is idempotent."""

    def __init__(self, gate: SlotGate, key: str) -> None:
        self.gate = gate
        self.key = key
        self._left = False

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self.gate._leave(self.key)


def jitter_poll_s() -> float:
    """Pause between two polls of the session counters: 0.2-1 s, jittered."""
    return random.uniform(0.2, 1.0)
