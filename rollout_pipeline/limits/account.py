"""The account's new-session schedule (`POOL/STATE`, one item per account and region: every experiment's new sessions
book their starts there) and the backoffs AgentCore's answers set on it (docs/lifecycle.md, "Limits")."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from rollout_pipeline.ledger.pool import AccountView, PoolLedger
from rollout_pipeline.limits.pacing import (
    BACKOFF,
    BACKOFF_HOLD_S,
    PROBE_AFTER_S,
    Clocks,
    Pacer,
    backoff_factor,
    decreased,
)

log = logging.getLogger(__name__)

#: The account's round: shares are renewed, the backoff's climb is checked and the learned cap climbs one session.
RENEW_S: Final = 1.0
#: The learned cap climbs back to this much of the sessions held when AgentCore refused one (or of the cap then) ...
CEILING_MARGIN: Final = 0.95
#: ... for this long; then to the quota again (should the account's cap have been raised).
CEILING_KEEP_S: Final = 3600.0
ACCOUNT: Final = "account"
#: A throttle of a new session pauses the account's schedule this long (AgentCore's quota is per sliding second).
THROTTLE_PAUSE_S: Final = 0.5


def active_cap(view: AccountView, now: float) -> int:
    """Active sessions the account may hold now: its quota, or the cap learned from AgentCore's answers."""
    quota = view.settings.quotas.active_sessions
    if view.active_cap_at <= 0:
        return quota
    climbed = int(max(0.0, now - view.active_cap_at - PROBE_AFTER_S) / RENEW_S)  # additive increase: one a round
    kept = view.active_ceiling > 0 and now - view.active_cap_at < CEILING_KEEP_S
    return min(view.active_ceiling if kept else quota, quota, view.active_cap + climbed)


def start_interval_us(view: AccountView, now: float) -> int:
    """The spacing of the account's schedule now (after the backoff, as it climbs back)."""
    return view.settings.start_interval_us(backoff_factor(view.factor, view.factor_at, now))


def start_rate(view: AccountView, now: float) -> float:
    """New sessions per second the account's schedule starts at most now (after the backoff)."""
    return 1e6 / start_interval_us(view, now)


class AccountSchedule:
    """The account's schedule as one process holds it: its `pacer` on the item and the latest view of the item."""

    def __init__(self, pool: PoolLedger, *, clocks: Clocks | None = None) -> None:
        self.pool = pool
        self._wall = (clocks or Clocks()).wall
        self.view: AccountView | None = None
        self._climb_checked = -math.inf
        self.pacer = Pacer(pool.schedule(), ACCOUNT, clocks=clocks, guess_busy=True, on_item=self._seen)
        self.pacer.on_unspaced = lambda: self._respace(self._read(), self._wall())  # an item with no spacing yet
        self.on_view: Callable[[AccountView], None] = lambda _view: None
        self.throttles = self.decreases = self.climbs = self.caps_learned = 0

    def current(self) -> AccountView:
        """The latest view of the item (read when this process has none yet)."""
        return self.view or self._read()

    def _read(self) -> AccountView:  # strongly consistent
        self.view = self.pool.account()
        return self.view

    def _seen(self, item: Mapping[str, Any]) -> None:
        self.view = view = self.pool.account(item)
        self.on_view(view)
        now = self._wall()
        if view.factor_at <= 0 or now - self._climb_checked < RENEW_S:
            return
        self._climb_checked = now
        if start_interval_us(view, now) != view.pace.interval_us:
            self.climbs += self._respace(view, now) is not None

    def _respace(self, view: AccountView, now: float) -> AccountView | None:
        """Space the schedule as its backoff is now (unless another process moved the backoff meanwhile)."""
        interval = start_interval_us(view, now)
        return self.pool.set_spacing(interval, factor=view.factor, factor_at=view.factor_at, after_at=view.factor_at)

    def backed_off_at(self) -> float:
        """When the schedule last backed off (wall clock s; 0: never), by this process's latest view of it."""
        return self.view.factor_at if self.view is not None else 0.0

    def rate(self) -> float:
        """New sessions per second the account starts at most now."""
        return start_rate(self.current(), self._wall())

    def throttled(self) -> None:
        """AgentCore answered a new session "rate exceeded": the schedule's rate x `BACKOFF`, once per overshoot, after
        a pause of `THROTTLE_PAUSE_S` (AgentCore's sliding second drains: whoever else uses the account finds room)."""
        self.throttles += 1
        view = self.current()
        now = self._wall()
        lower = decreased(view.factor, view.factor_at, now)
        if lower is None:
            return
        try:
            interval, pause = view.settings.start_interval_us(lower), int(THROTTLE_PAUSE_S * 1e6)
            written = self.pool.set_spacing(
                interval, factor=lower, factor_at=now, after_at=view.factor_at, pause_us=pause
            )
        except Exception:  # the backoff is best effort: the throttled call is retried through the budgets anyway
            log.warning("could not back the account's schedule off", exc_info=True)
            return
        if written is None:
            self._read()  # another process decreased it
            return
        self.view = written
        self.decreases += 1
        log.warning("AgentCore throttled a new session: the account's schedule backs off to %.2f/s", self.rate())

    def quota_exceeded(self) -> None:
        """AgentCore answered a new session `ServiceQuotaExceededException`: the cap learned is `BACKOFF` x the
        sessions the experiments hold now (never raised by a refusal: the sessions above it drain)."""
        view = self.current()
        now = self._wall()
        if view.active_cap_at > 0 and now - view.active_cap_at < BACKOFF_HOLD_S:
            return
        try:
            held = sum(m.in_flight for m in self.pool.snapshot()[1])
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
