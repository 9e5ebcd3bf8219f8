"""Fair shares of the account, advisory: each experiment spaces its own new sessions at its weighted max-min share,
renewed about once a second by one of its processes (docs/lifecycle.md, "Limits"). The account's schedule alone
bounds every sliding second, so a stale share skews the split for a second and never exceeds the quota."""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from rollout_pipeline.config import ExperimentConfig, new_sessions_cap
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.pace import PaceView
from rollout_pipeline.ledger.pool import AccountView, MemberEntry, PoolLedger
from rollout_pipeline.limits.account import RENEW_S, AccountSchedule, active_cap, start_rate
from rollout_pipeline.limits.pacing import LATENESS_S, Clocks
from rollout_pipeline.limits.slots import SlotShards

log = logging.getLogger(__name__)

#: An entry renewed longer ago than this holds no share of the rate (its experiment has no work, or is gone) ...
LIVE_S: Final = 3.0
#: ... and its sessions in flight count against the account's active sessions this long (the sweeper's minute).
ACTIVE_LIVE_S: Final = 150.0
#: A schedule booked further ahead than this is saturated: its experiment asks for all it can get ...
BACKLOG_AHEAD_S: Final = 0.25
#: ... as it does this long after a rollout of it found no room.
BACKLOG_HOLD_S: Final = 2.0
#: Without a backlog an experiment asks for what it started since its last renewal times this.
HEADROOM: Final = 1.5
#: A share is never spaced wider than this rate's spacing (a share of nearly nothing still starts now and then).
MIN_SHARE_PER_S: Final = 0.5


def water_fill(budget: float, wants: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Weighted max-min fair shares of `budget` for `wants` (name -> (weight > 0, want))."""
    shares = dict.fromkeys(wants, 0.0)
    left = max(0.0, budget)
    weight = sum(w for w, _want in wants.values())
    for name, (w, wanted) in sorted(wants.items(), key=lambda kv: (kv[1][1] / kv[1][0], kv[0])):
        part = left * w / weight if weight > 0 else 0.0
        got = min(wanted, part)
        shares[name] = got
        left -= got
        weight -= w
    return shares


def fair_shares(
    name: str, members: Iterable[MemberEntry], rate: float, active_budget: float, now: float
) -> tuple[float, int]:
    """Experiment `name`'s fair shares of the account's new-session `rate` and of `active_budget` active sessions."""
    entries = [m for m in members if m.weight > 0]
    live = {m.name: m for m in entries if now - m.renewed_at <= LIVE_S}
    wants = {n: (m.weight, min(m.demand, m.sessions_cap or math.inf)) for n, m in live.items()}
    holding = {m.name: m for m in entries if now - m.renewed_at <= ACTIVE_LIVE_S}
    active_wants = {n: (m.weight, float(m.max_sessions if n in live else m.in_flight)) for n, m in holding.items()}
    share = water_fill(rate, wants).get(name, 0.0)
    return share, int(water_fill(active_budget, active_wants).get(name, 0.0) + 1e-9)


class Membership:
    """This experiment's entry in the account pool and its renewals, as one process holds them (thread-safe)."""

    def __init__(
        self,
        pool: PoolLedger,
        limits: LimitLedger,
        account: AccountSchedule,
        config: ExperimentConfig,
        *,
        shards: SlotShards,
        waiting: Callable[[], bool],
        clocks: Clocks | None = None,
    ) -> None:
        self.pool = pool
        self.limits = limits
        self.account = account
        self.config = config
        self.shards = shards
        self._waiting = waiting
        self._wall, _monotonic, self._sleep = clocks or Clocks()
        self._lock = threading.Lock()
        self._behind: threading.Thread | None = None
        self._due_after = RENEW_S * random.uniform(1.0, 1.3)  # seldom two processes at once
        self._backlog_until = 0.0
        self.session = PaceView()
        self.entry: MemberEntry | None = None
        self.members: list[MemberEntry] = []
        self._throttles_counted = 0
        self.renewals = self.lost = 0

    def seen(self, item: Mapping[str, Any]) -> None:
        self.session = PaceView.of(item)
        if self._wall() - self.session.renewed_us / 1e6 > self._due_after:
            self.renew_behind()

    def note_backlog(self) -> None:
        """Rollouts wait for the rate: the experiment asks for all it can get (now, if it asked for less)."""
        now = self._wall()
        surge = self._backlog_until <= now and self.entry is not None and not math.isinf(self.entry.demand)
        self._backlog_until = now + BACKLOG_HOLD_S
        if surge:
            self.renew_behind(force=True)

    def max_sessions(self) -> int:
        """Sessions this experiment may hold: `max_sessions`, or its share of the account's active sessions."""
        active = self.session.active if self.session.renewed_us else self.config.max_sessions
        return min(self.config.max_sessions, active)

    def share(self) -> float:
        """New sessions per second of its share, by the latest view (0 before its first renewal)."""
        return (1.0 + LATENESS_S) * 1e6 / self.session.interval_us if self.session.interval_us else 0.0

    def idle(self, waiting: Callable[[], bool]) -> None:
        """This process's last rollout in hand booked its start: once the starts booked run out, unless any wait again
        (`waiting()`), the experiment asks for nothing and the others take its share at once, not after `LIVE_S`."""
        self._backlog_until = 0.0
        threading.Thread(target=self._renew_quietly, args=(True, waiting), name="pool-idle", daemon=True).start()

    def account_seen(self, view: AccountView) -> None:
        """Another experiment started or stopped asking since this process's view of the last renewal: renew now."""
        if view.moved_by != self.config.name and view.moved_us > self.session.renewed_us > 0:
            self.renew_behind(force=True)

    def renew_behind(self, *, force: bool = False) -> None:
        if self._behind is not None and self._behind.is_alive():
            return
        self._behind = threading.Thread(target=self._renew_quietly, args=(force,), name="pool-share", daemon=True)
        self._behind.start()

    def _renew_quietly(self, force: bool, idle_unless: Callable[[], bool] | None = None) -> None:
        try:
            if idle_unless is not None:
                self._sleep(max(0.0, self.session.tat_us / 1e6 - RENEW_S * 0.5 - self._wall()))
            if idle_unless is None or not idle_unless():
                self.renew(force=force, demand=None if idle_unless is None else 0.0)
        except Exception:  # the next view starts another; shares are advisory meanwhile
            log.warning("renewal of the experiment's share in the account pool failed", exc_info=True)

    def renew(self, *, force: bool = False, demand: float | None = None) -> bool:
        """Renew the entry and share (`demand`: as asked, else `_demand`); False when another process renewed first."""
        with self._lock:
            now = self._wall()
            if not force and now - self.session.renewed_us / 1e6 <= self._due_after:
                return False
            self.account.view, self.members = self.pool.snapshot()
            members = {m.name: m for m in self.members}
            last = members.get(self.config.name)
            me = self._entry(last, now, self._demand(last, now) if demand is None else demand)
            view, mine = self.account.current(), {**members, me.name: me}.values()
            active_budget = active_cap(view, now) * (1.0 - view.settings.reserve)
            rate, active = fair_shares(self.config.name, mine, start_rate(view, now), active_budget, now)
            me = replace(me, share=rate, active_share=active)
            self.pool.put_member(me, now=now)
            self.entry = me
            if (me.demand > 0) != (last is not None and last.demand > 0 and now - last.renewed_at <= LIVE_S):
                self.pool.shares_moved(self.config.name, int(now * 1e6))  # it starts or stops asking
            idle = demand == 0.0 and self.session.interval_us > 0  # keeps the spacing, due again at once
            share_us = math.ceil((1.0 + LATENESS_S) / max(rate, MIN_SHARE_PER_S) * 1e6)  # as an own budget's
            spacing = self.session.interval_us if idle else share_us
            stamp_us = int((now - (2 * RENEW_S if idle else 0.0)) * 1e6)
            after_us = int((now - (0.0 if force else RENEW_S * 0.5)) * 1e6)
            won = self.limits.set_share("session", spacing, active=active, renewed_us=stamp_us, after_us=after_us)
            self.renewals += won
            self.lost += not won
            self._due_after = RENEW_S * random.uniform(1.0, 1.3)
            if won:
                self.session = replace(self.session, interval_us=spacing, active=active, renewed_us=stamp_us)
            return won

    def _demand(self, last: MemberEntry | None, now: float) -> float:
        """New sessions/s the experiment asks for: all it can get on a first renewal, while rollouts wait here or its
        schedule is booked ahead, else what it started since its last renewal x `HEADROOM` (what that renewal asked
        when under a round ago or this process's view of the schedule is older: nothing once it is not live)."""
        booked_ahead = self.session.tat_us / 1e6 > now + BACKLOG_AHEAD_S
        if last is None or booked_ahead or self._backlog_until > now or self._waiting():
            return math.inf
        since, started = now - last.renewed_at, self.session.booked - last.booked
        if since < RENEW_S or started < 0:
            return last.demand if since <= LIVE_S else 0.0
        return HEADROOM * started / since

    def _entry(self, last: MemberEntry | None, now: float, demand: float) -> MemberEntry:
        config = self.config
        count, read_at = self.shards.last_read()
        if now - read_at > 2 * RENEW_S:  # never a figure this process did not just read
            count = self.shards.in_flight()
        total = self.account.throttles  # read once: a throttle counted meanwhile goes to the next renewal
        throttles, self._throttles_counted = total - self._throttles_counted, total
        return MemberEntry(
            name=config.name,
            weight=config.capacity_weight,
            sessions_cap=new_sessions_cap(config.session_rate_limit, config.tps_limit, config.invoke_rate_limit),
            max_sessions=config.max_sessions,
            demand=demand,
            in_flight=count,
            renewed_at=now,
            booked=self.session.booked,
            throttles=(last.throttles if last is not None else 0) + throttles,
        )


def account_sessions_percent(members: list[MemberEntry], quota: int, now: float) -> float:
    """The sessions every experiment of the account holds, in percent of its quota (`ActiveSessionsNearQuota`)."""
    held = sum(m.in_flight for m in members if now - m.renewed_at <= ACTIVE_LIVE_S)
    return 100.0 * held / max(1, quota)
