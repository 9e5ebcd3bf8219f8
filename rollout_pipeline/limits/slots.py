"""Which session-slot counter (`keys.SESSION_SHARDS`) a dispatch takes its slot on (docs/lifecycle.md, "Limits")."""

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
    """A process's view of every counter's room (cap minus count, refreshed by each read, with its own takes since)
    and the next counter with room in a rotation that starts at random in each process, so the dispatches of an SQS
    batch take distinct counters. The transaction stays the arbiter."""

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
        self._max_sessions = max_sessions
        self._sized = self.max_sessions()
        self._caps = caps(self._sized)
        self._room = list(self._caps)  # until the first read: every counter empty
        self._cursor = (rng or random).randrange(keys.SESSION_SHARDS)
        self._lock = threading.Lock()
        self._wall, self._monotonic = wall, monotonic
        #: The policy version by the latest read, and when that read began (monotonic s).
        self.policy: tuple[float, str | None] | None = None
        #: The sessions in flight by the latest read, and when (wall s).
        self.last_in_flight = 0
        self.read_at = -1e18

    def follow(self, max_sessions: Callable[[], int]) -> None:
        """Take the sessions the experiment may hold from `max_sessions` from now on (its share)."""
        self._max_sessions = max_sessions

    def max_sessions(self) -> int:
        """Sessions the experiment may hold now: the caps sum to it."""
        value = self._max_sessions
        return value if isinstance(value, int) else value()

    def _resize(self) -> None:
        sized = self.max_sessions()
        if sized != self._sized:
            new = caps(sized)
            self._room = [room + new_cap - cap for room, new_cap, cap in zip(self._room, new, self._caps, strict=True)]
            self._caps, self._sized = new, sized

    def in_flight(self) -> int:
        """Read every counter (one Query): the sessions in flight; refreshes the view."""
        return self._absorb(self.ledger.slot_counts())

    def in_flight_and_board(self) -> tuple[int, list[BoardEntry], dict[str, dict[str, Any]]]:
        """The sessions in flight, the admission board and the schedules, in one Query; refreshes the view."""
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
    """Every counter's cap for `max_sessions` (they sum to it)."""
    return [shard_cap(max_sessions, i) for i in range(keys.SESSION_SHARDS)]
