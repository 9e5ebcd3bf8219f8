"""Session slots: which of the `keys.SESSION_SHARDS` counters a dispatch takes its slot on.

Counters `LIMIT/SESSIONS#{i}` whose caps sum to `max_sessions` (`SlotShards`); a slot is taken on a counter with
room in the dispatch transaction and given back (on any counter: the sum stays exact) only once the attempt's
session is confirmed stopped or reaped by AgentCore (see `ledger.rollouts` and `lifecycle.stops`). Each counter
sees 1/32 of the slot transactions, so none is a hot item.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.limits import LimitLedger, shard_cap
from rollout_pipeline.limits.admission import BoardEntry


class SlotShards:
    """Which session-slot counter a dispatch takes its slot on: a process's view of every counter's room (cap minus
    count: `LimitLedger.slot_counts`, refreshed by each read of the sessions in flight, with this process's own
    takes and failures since), and the next counter with room in a rotation that starts at random in each process,
    so the dispatches a process starts at once (an SQS batch's) take distinct counters (chosen at random, 10
    dispatches over 16 counters met on one ~3 times per batch). The transaction stays the arbiter: a counter found
    full is marked so and another is chosen."""

    def __init__(
        self,
        ledger: LimitLedger,
        max_sessions: int | Callable[[], int],
        *,
        rng: random.Random | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        #: `max_sessions`, or a function giving it now (the account pool's grant of active sessions can change).
        self._max_sessions = max_sessions
        self._sized = self.max_sessions()
        self._caps = caps(self._sized)
        self._room = list(self._caps)  # until the first read: every counter empty
        self._cursor = (rng or random).randrange(keys.SESSION_SHARDS)
        self._lock = threading.Lock()
        self._wall = wall
        self._monotonic = monotonic
        #: The experiment's policy version as the latest read of the `LIMIT` partition showed it, and when that read
        #: began (monotonic s): the dispatches that began before it may stamp it (`lifecycle.dispatch.BatchReads`).
        self.policy: tuple[float, str | None] | None = None
        #: The sessions in flight by the latest read, and when (wall s; the account pool's entry reports them).
        self.last_in_flight = 0
        self.read_at = -1e18

    def follow(self, max_sessions: Callable[[], int]) -> None:
        """Take the sessions the experiment may hold from `max_sessions` from now on (its share, as it changes)."""
        self._max_sessions = max_sessions

    def max_sessions(self) -> int:
        """Sessions the experiment may hold now: the caps sum to it."""
        value = self._max_sessions
        return value if isinstance(value, int) else value()

    def _resize(self) -> None:
        """New caps when `max_sessions()` changed (under the lock): the rooms follow them."""
        sized = self.max_sessions()
        if sized != self._sized:
            new = caps(sized)
            self._room = [room + new_cap - cap for room, new_cap, cap in zip(self._room, new, self._caps, strict=True)]
            self._caps, self._sized = new, sized

    def in_flight(self) -> int:
        """Read every counter (one Query): the sessions in flight; refreshes the view."""
        return self._absorb(self.ledger.slot_counts())

    def in_flight_and_board(self) -> tuple[int, list[BoardEntry], dict[str, dict[str, Any]]]:
        """The sessions in flight, the admission board and the call budgets' schedule items, in one Query
        (`LimitLedger.limits_view`); refreshes the view."""
        began = self._monotonic()
        view = self.ledger.limits_view()
        self.saw_policy(began, view.policy_version)
        return self._absorb(view.counts), view.board, view.paces

    def saw_policy(self, began: float, version: str | None) -> None:
        """A read that began at `began` (monotonic s) showed the experiment's policy version `version`."""
        with self._lock:
            if self.policy is None or began >= self.policy[0]:
                self.policy = (began, version)

    def last_read(self) -> tuple[int, float]:
        """The sessions in flight by the latest read, and when it was made (wall s)."""
        with self._lock:
            return self.last_in_flight, self.read_at

    def _absorb(self, counts: Sequence[int]) -> int:
        with self._lock:
            self._resize()
            self._room = [cap - count for cap, count in zip(self._caps, counts, strict=True)]
            self.last_in_flight = sum(counts)
            self.read_at = self._wall()
        return sum(counts)

    def choose(self) -> int:
        """The next counter with room by the view in this process's rotation; the next with a cap when none has."""
        with self._lock:
            self._resize()
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


def caps(max_sessions: int) -> list[int]:
    """Every counter's cap for `max_sessions` (`ledger.limits.shard_cap`: they sum to it)."""
    return [shard_cap(max_sessions, i) for i in range(keys.SESSION_SHARDS)]
