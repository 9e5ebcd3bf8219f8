"""The dispatch side of the warm pool: which warm session a rollout takes, and what happens when it is dead.

A dispatcher process keeps a view of the pool's idle warm sessions (`WarmTaker`: one Query of the pool's partition,
in session-id order) and hands them out walking it from a random point, one after the other, and from another random
point after a session it offered was taken by another process: so each dispatcher of a burst takes a run of the pool
of its own, and two ask for the same session only where one's run reaches the other's (random picks, before,
collided with every session other processes took since the view was read: 208 collisions for 1,024 takes by five
processes, against 27-42 walking; `tests/unit/test_warm_taker.py`). The view is read again when it is older than
`VIEW_MAX_AGE_S`, when it proves stale (`STALE_AFTER` sessions in a row were taken by others: a burst that takes the
whole pool), and when it runs out while its last read still showed sessions; while the pool shows none, at most
every `EMPTY_RECHECK_S`. A read resets both (the process's threads share the view), so reads stay fewer than half
the tries that collided. A dispatch tries up to `MAX_TRIES` sessions before it takes a new one. The dispatch
transaction takes the session (`RolloutLedger.begin_dispatch(warmed_at=...)`: only if still idle; its slot becomes
the rollout's), and the rollout is invoked in it exactly as in a new session: same payload (its
`_rollout.session_id` the warm session's), same result key form, same token rules.

A warm session that turns out dead (its invoke answers NotFound or is rejected, throttled past the retries, or 424:
AgentCore lost it, it idled out, its keep-alive failed) is dropped (`drop_dead`): the rollout goes back to queued
for the SAME attempt (no attempt is lost), the warm session's stop is filed in the rollout's outbox (its slot held
until the stop is confirmed), and the dispatch goes on with a new session as if no warm one had been there.

When a rollout takes a new session while the pool is on, the process notes the demand (`note_cold`, at most once
per `DEMAND_NOTE_S`): the pool fills only while nothing wants the new-session budget. When it takes a warm one, the
process notes the take (`took`, as often): a warm-up is an invocation too, so while a burst of takes runs at the
invoke rate the fill, which would spend some of that rate, waits (it refills for the next step once the burst is in).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger.items import RolloutRecord
from rollout_pipeline.ledger.warm import WarmLedger
from rollout_pipeline.ledger.warm_items import WarmSession

log = logging.getLogger(__name__)

#: While the pool showed no idle session, a process reads it again at most this often.
EMPTY_RECHECK_S: Final = 2.0
#: A view older than this is read again before it is used.
VIEW_MAX_AGE_S: Final = 30.0
#: A warm session is offered only while its last warm-up is younger than the idle timeout minus this margin (it may
#: have idled out after that: the pool keeps it alive or stops it).
STALE_MARGIN_S: Final = 60.0
#: A process notes that rollouts want new sessions, or took warm ones, at most this often (each kind).
DEMAND_NOTE_S: Final = 1.0
#: Warm sessions one dispatch tries before it takes a new session (each failed try a cancelled transaction).
MAX_TRIES: Final = 6
#: Tries in a row that found their session taken by another process before the view is read again.
STALE_AFTER: Final = 2


def offerable(session: WarmSession, now: float, idle_timeout_s: float) -> bool:
    """Whether a dispatch may take `session`: idle, and kept alive recently enough not to have idled out."""
    return session.kept_at > now - max(1.0, idle_timeout_s - STALE_MARGIN_S)


class WarmTaker:
    """One dispatcher process's view of the idle warm sessions (see the module doc). Thread-safe."""

    def __init__(
        self,
        ledger: WarmLedger,
        config: ExperimentConfig,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.ledger = ledger
        self.enabled = config.warm_pool_on
        self.idle_timeout_s = float(config.idle_timeout_s)
        self._wall = wall
        self._monotonic = monotonic
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._view: list[WarmSession] = []
        #: Where the walk through the view is (see the module doc).
        self._cursor = 0
        self._read_at: float | None = None
        #: Sessions the last read showed, and tries in a row since that found theirs taken by another process.
        self._last_read = 0
        self._stale = 0
        self._demand_noted = _AtMostEvery(DEMAND_NOTE_S)
        self._take_noted = _AtMostEvery(DEMAND_NOTE_S)
        #: Reads of the pool's partition, warm sessions taken, and tries that found one taken by another.
        self.reads = 0
        self.taken = 0
        self.collisions = 0

    def next(self) -> WarmSession | None:
        """The next warm session to try (taken out of the view), or None when the pool has none idle."""
        if not self.enabled:
            return None
        with self._lock:
            now_m = self._monotonic()
            if self._due(now_m):
                self._read(now_m)
            now = self._wall()
            while self._view:
                self._cursor %= len(self._view)
                session = self._view.pop(self._cursor)  # the next one moves into its place: the walk goes on
                if offerable(session, now, self.idle_timeout_s):
                    return session
            return None

    def covers(self, rollouts: int) -> bool:
        """Whether the view (read first when due, as `next` would) shows at least `rollouts` idle sessions: a batch
        of that many will most likely start warm."""
        if not self.enabled or rollouts <= 0:
            return False
        with self._lock:
            now_m = self._monotonic()
            if self._due(now_m):
                self._read(now_m)
            now = self._wall()
            return sum(1 for s in self._view if offerable(s, now, self.idle_timeout_s)) >= rollouts

    def _due(self, now_m: float) -> bool:
        """Whether the view is to be read again now (see the module doc)."""
        if self._read_at is None:
            return True
        age = now_m - self._read_at
        if age > VIEW_MAX_AGE_S:
            return True
        if self._stale >= STALE_AFTER or (not self._view and self._last_read > 0):
            return True
        return not self._view and age >= EMPTY_RECHECK_S

    def _read(self, now_m: float) -> None:
        self.reads += 1
        try:
            sessions = sorted(self.ledger.sessions(idle_only=True), key=lambda s: s.session_id)
        except Exception:  # no view of the pool: new sessions, as without one
            log.warning("the warm pool could not be read; dispatching new sessions", exc_info=True)
            sessions = []
        self._view = sessions
        self._cursor = self._rng.randrange(len(sessions)) if sessions else 0
        self._last_read = len(sessions)
        self._stale = 0
        self._read_at = now_m

    def took(self) -> None:
        """This process's dispatch took a warm session: counted, and told to the pool (rate-limited)."""
        with self._lock:
            self.taken += 1
            self._stale = 0
            due = self._take_noted.due(self._monotonic())
        if due:
            self._tell_pool(self.ledger.note_take, "the take of a warm session")

    def collided(self) -> None:
        """A try found its session taken by another process: the view may be stale."""
        with self._lock:
            self.collisions += 1
            self._stale += 1
            if self._view:  # this run reached another process's: walk on from elsewhere
                self._cursor = self._rng.randrange(len(self._view))

    def note_cold(self) -> None:
        """A rollout of this process takes a new session while the pool is on: tell the pool (rate-limited)."""
        if not self.enabled:
            return
        with self._lock:
            due = self._demand_noted.due(self._monotonic())
        if due:
            self._tell_pool(self.ledger.note_demand, "the demand for new sessions")

    def _tell_pool(self, note: Callable[[float], None], what: str) -> None:
        """Write a note on the pool item (now, wall clock). A lost note only moves when the pool fills next (a
        little sooner or later); the dispatch goes on."""
        try:
            note(self._wall())
        except Exception:
            log.warning("could not note %s", what, exc_info=True)


class _AtMostEvery:
    """Says yes at most once per `interval_s` (monotonic seconds); its caller holds the lock."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: float | None = None

    def due(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True


def is_warm_dispatch(rec: RolloutRecord | None) -> bool:
    """Whether this attempt was dispatched into a warm session."""
    return rec is not None and rec.session_warmed_at is not None
