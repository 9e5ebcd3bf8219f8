"""The account's new-session schedule: ONE item per account and region that every experiment's new sessions book their
starts on, and the caps AgentCore's answers teach it.

`POOL/STATE` of the pool table (`ledger.pool`) is a GCRA schedule whose spacing is the item's own
(`quotas.PoolSettings.start_interval_us`: at most floor(quota less the reserve, times the backoff) starts in any
sliding second). Every new session, of every experiment, books its start there with one conditional write (a batch
let through together: one write for the batch), so that one item alone bounds every sliding second of the account,
whatever the experiments' shares say (`limits.shares`: they only space each experiment's own requests).

What AgentCore answers anyway moves the item, so every experiment sees it at its next start:
- a new session's `ThrottlingException` (someone outside the pipeline uses the account's rate) multiplies the spacing's
  rate by `pacing.BACKOFF` (once per overshoot: a conditional write on the backoff the caller saw), holds it
  `pacing.PROBE_AFTER_S`, then climbs back (each process that sees a step due writes it, at most once a second);
- `ServiceQuotaExceededException` ("maxVms": the account holds fewer active sessions than its quota says) sets the
  learned active-session cap to `pacing.BACKOFF` x the sessions every experiment holds, which climbs back
  `ACTIVE_CLIMB_PER_S` after the same pause (additive increase, multiplicative decrease), but only to
  `CEILING_MARGIN` x the level that was refused (the ceiling, kept `CEILING_KEEP_S`): the cap settles under it
  instead of being refused again each time it climbs back; the experiments' shares of active sessions follow at
  their next renewal.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from rollout_pipeline.ledger.pool import AccountView, PoolLedger
from rollout_pipeline.limits.pacing import BACKOFF, BACKOFF_HOLD_S, PROBE_AFTER_S, Pacer, backoff_factor, decreased

log = logging.getLogger(__name__)

#: The learned active-session cap climbs back this many sessions a second after its pause.
ACTIVE_CLIMB_PER_S: Final = 1.0
#: The learned cap climbs back to at most this much of the sessions held when AgentCore refused one (or of the cap
#: then, if lower), for `CEILING_KEEP_S`; then to the quota again (a probe an hour, should the account's cap be raised).
CEILING_MARGIN: Final = 0.95
CEILING_KEEP_S: Final = 3600.0
#: A process looks at most this often whether the backoff's climb changes the schedule's spacing.
CLIMB_CHECK_S: Final = 1.0
#: The account's budget name (in logs and blocks).
ACCOUNT: Final = "account"


def active_cap(view: AccountView, now: float) -> int:
    """Active sessions the account may hold now: its quota, or the cap learned from AgentCore's answers, climbing
    back `ACTIVE_CLIMB_PER_S` after `pacing.PROBE_AFTER_S` to its ceiling (while it is kept)."""
    quota = view.settings.quotas.active_sessions
    if view.active_cap_at <= 0:
        return quota
    climbed = int(max(0.0, now - view.active_cap_at - PROBE_AFTER_S) * ACTIVE_CLIMB_PER_S)
    kept = view.active_ceiling > 0 and now - view.active_cap_at < CEILING_KEEP_S
    return min(view.active_ceiling if kept else quota, quota, view.active_cap + climbed)


def start_rate(view: AccountView, now: float) -> float:
    """New sessions per second the account's schedule starts at most now (after the backoff)."""
    return 1e6 / view.settings.start_interval_us(backoff_factor(view.factor, view.factor_at, now))


class AccountSchedule:
    """The account's new-session schedule as one process holds it: its `pacer` on the item, the latest view of the
    item (every answer updates it), and the backoffs AgentCore's answers set (see the module doc)."""

    def __init__(
        self,
        pool: PoolLedger,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        members_in_flight: Callable[[], int] | None = None,
    ) -> None:
        self.pool = pool
        self._wall = wall
        #: Sessions every experiment holds, as their entries say (one Query): what a quota exceeded is measured on.
        self._members_in_flight = members_in_flight or (lambda: sum(m.in_flight for m in pool.members()))
        self.view: AccountView | None = None
        self._climb_checked = -math.inf
        self.pacer = Pacer(
            pool.schedule(),
            ACCOUNT,
            wall=wall,
            monotonic=monotonic,
            sleep=sleep,
            guess_busy=True,
            on_item=self._seen,
            on_unspaced=self._space,
        )
        #: Told of each throttle of a new session (the experiment counts them in its entry).
        self.on_throttled: Callable[[], None] = lambda: None
        #: What this process's answers did: decreases written, climbs written, caps learned.
        self.decreases = self.climbs = self.caps_learned = 0

    def current(self) -> AccountView:
        """The latest view of the item (read when this process has none yet)."""
        return self.view or self._read()

    def _read(self) -> AccountView:
        self.view = self.pool.account()
        return self.view

    def _seen(self, item: Mapping[str, Any]) -> None:
        """An answer of the item: the latest view; a climb step written when due."""
        self.view = view = self.pool.account(item)
        now = self._wall()
        if view.factor_at <= 0 or now - self._climb_checked < CLIMB_CHECK_S:
            return
        self._climb_checked = now
        wanted = view.settings.start_interval_us(backoff_factor(view.factor, view.factor_at, now))
        if wanted != view.pace.interval_us:
            written = self.pool.set_spacing(
                wanted, factor=view.factor, factor_at=view.factor_at, after_at=view.factor_at
            )
            self.climbs += written is not None

    def _space(self) -> None:
        """The item has no spacing (no settings written yet, or a pool from before): its settings' at the backoff."""
        view = self._read()
        now = self._wall()
        interval = view.settings.start_interval_us(backoff_factor(view.factor, view.factor_at, now))
        self.pool.set_spacing(interval, factor=view.factor, factor_at=view.factor_at, after_at=view.factor_at)

    def rate(self) -> float:
        """New sessions per second the account starts at most now."""
        return start_rate(self.current(), self._wall())

    def active_cap(self) -> int:
        """Active sessions the account may hold now (its quota, or what AgentCore's answers taught)."""
        return active_cap(self.current(), self._wall())

    def throttled(self) -> None:
        """AgentCore answered a new session "rate exceeded": the schedule's rate x `BACKOFF`, unless this overshoot
        already decreased it (a conditional write on the backoff this process saw; lost: the item is read)."""
        self.on_throttled()
        view = self.current()
        now = self._wall()
        lower = decreased(view.factor, view.factor_at, now)
        if lower is None:
            return
        try:
            written = self.pool.set_spacing(
                view.settings.start_interval_us(lower), factor=lower, factor_at=now, after_at=view.factor_at
            )
        except Exception:  # the backoff is best effort: the throttled call is retried through the budgets anyway
            log.warning("could not back the account's schedule off", exc_info=True)
            return
        if written is None:
            self._read()  # another process decreased it for this overshoot
            return
        self.view = written
        self.decreases += 1
        log.warning("AgentCore throttled a new session: the account's schedule backs off to %.2f/s", self.rate())

    def quota_exceeded(self) -> None:
        """AgentCore answered a new session `ServiceQuotaExceededException`: the account holds fewer active sessions
        than thought, about as many as the experiments hold now. The cap learned: `BACKOFF` x those, climbing back to
        `CEILING_MARGIN` x the lower of those and the cap now (at most once per `BACKOFF_HOLD_S`, conditional on the
        cap this process saw; never raised by a refusal, so the refusals of the sessions above it while they drain do
        not lower it again)."""
        view = self.current()
        now = self._wall()
        if view.active_cap_at > 0 and now - view.active_cap_at < BACKOFF_HOLD_S:
            return
        try:
            held = self._members_in_flight()
            cap, current = max(1, math.floor(BACKOFF * max(1, held))), active_cap(view, now)
            if cap >= current:
                return  # already under what the account showed it holds: sessions above the cap are draining
            ceiling = max(cap, math.floor(CEILING_MARGIN * min(held, current)))
            learned = self.pool.learn_active_cap(cap, ceiling, at=now, after_at=view.active_cap_at)
        except Exception:  # best effort: the refused invoke is retried through the gate anyway
            log.warning("could not record the account's active-session cap", exc_info=True)
            return
        self._read()
        if learned:
            self.caps_learned += 1
            log.warning(
                "AgentCore refused a new session (active sessions): the account's cap is now %d (back to %d at most)",
                cap,
                ceiling,
            )
