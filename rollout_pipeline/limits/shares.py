"""The account pool's arithmetic (pure): fair shares that follow demand, leases that never over-commit a budget,
and the backoff that makes room when AgentCore throttles anyway.

Every experiment of an account and region is a `Member` of ONE pool (`ledger.pool.PoolState`, one item of the
account's pool table). For each budget (`quotas.BUDGETS`: new sessions/s, data-plane calls/s, active sessions) a
member holds a `Lease`: a rate (for active sessions, a number) granted until a time. A member renews its lease about
every second (`limits.pool.CapacityLease`); `grant` computes what it gets:

- its **fair share**: weighted max-min fair shares (`water_fill`) of the budget times the backoff factor, over the
  members whose lease is live, each asking `min(demand, cap)`; a member with a backlog asks for everything
  (`math.inf`), one without for what it uses plus headroom, so what one does not use goes to the others
  (work-conserving) and comes back at its next renewal once it has work again;
- **never more than is free**: the budget (quota less the reserve, before the backoff) minus what every other
  member may still be using (`counted`: its grant while live, each earlier grant until the last start booked under
  it, and for active sessions those in flight). So at every instant the grants in use sum to at most the budget,
  whatever order members renew in: one that must shrink does so at its own renewal, and the one that grows gets the
  room only once it is free.

The backoff: when AgentCore throttles the pipeline anyway (something outside it uses the account), a member that
sees it multiplies the pool's factor by `DECREASE` (at most once per `DECREASE_HOLD_S`: one overshoot, one decrease),
holds it there for `PROBE_AFTER_S`, then climbs back by `INCREASE_PER_S` per second without throttles (additive
increase, multiplicative decrease, with a pause before probing). Fair shares scale with it at every member's next
renewal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from rollout_pipeline.ledger.pool import Backoff, Lease, Member, PoolState
from rollout_pipeline.limits.pacing import LATE_START_S, LATENESS_S
from rollout_pipeline.quotas import BUDGETS, Budget

#: A member's grant lasts this long; it renews when less than `RENEW_AHEAD_S` is left (about once a second), so its
#: lease always reaches past the admission gate's horizon (`admission.ADMIT_AHEAD_S`, 2 s) and a start admitted in
#: order is never refused for want of a lease. A member that stops renewing (no work, or dead) holds nothing after
#: its lease ends.
LEASE_S: Final = 4.0
RENEW_AHEAD_S: Final = 3.0
#: A member's in-flight sessions count against the active-session budget while its last heartbeat is this recent
#: (the sweeper of every experiment heartbeats every minute, even when nothing else runs).
ACTIVE_STALE_S: Final = 150.0
#: Backoff: after a throttle the factor is this share of what it was ...
DECREASE: Final = 0.75
#: ... at most once per this long (the throttles of one overshoot decrease it once) ...
DECREASE_HOLD_S: Final = 2.0
#: ... never below this ...
MIN_FACTOR: Final = 0.2
#: ... and it stays there this long before it climbs: whoever else uses the account (a production agent serving
#: users) likely goes on for a while, and every probe above the room it leaves throttles its calls too. Climbing at
#: once reached that room about 5 s after each decrease (bench_capacity --outside: one probe, and throttles of the
#: outside consumer's calls, every 5-10 s while it ran). The cost of the pause: up to 20 s at 75% of the rate
#: after a short burst from outside.
PROBE_AFTER_S: Final = 20.0
#: ... then it climbs back by this much per second without throttles.
INCREASE_PER_S: Final = 0.02
#: The budgets the backoff applies to (the rates AgentCore throttles).
RATE_BUDGETS: Final[tuple[Budget, ...]] = ("sessions", "calls")
#: Of a member's rate r, at most ceil(WINDOW_SHARE x r) starts fall in any one second: its starts are spaced
#: (1 + LATENESS_S) / r apart and each is at most `LATE_START_S` late (`pacing.Pacer.sleep_until`).
WINDOW_SHARE: Final = (1.0 + LATE_START_S) / (1.0 + LATENESS_S)
#: Starts booked under the old grant may still be made this long after the renewal read when they were (the writes
#: of a renewal take a few ms; `ledger.limits.LimitLedger.set_pace_lease` refuses a schedule booked further).
BOOKING_SLACK_S: Final = 0.75


def live(lease: Lease, now: float) -> bool:
    return lease.until > now


def lease_counted(lease: Lease, now: float) -> float:
    """What a lease may still be in use for at `now`: its grant while live, and each earlier grant until the last
    start booked under it."""
    current = lease.rate if lease.until > now else 0.0
    return max([current, *(rate for rate, until in lease.held if until > now)])


def counted(member: Member, budget: Budget, now: float) -> float:
    """What `member` may be using of `budget` at `now` (active sessions: also those in flight while it is alive)."""
    held = lease_counted(member.lease(budget), now)
    if budget == "active" and now - member.heartbeat <= ACTIVE_STALE_S:
        held = max(held, float(member.in_flight))
    return held


def want(member: Member, budget: Budget) -> float:
    """What `member` asked for of `budget` at its last renewal, up to its cap."""
    cap = member.caps.get(budget)
    demand = member.lease(budget).demand
    return demand if cap is None else min(demand, cap)


def factor(backoff: Backoff | None, now: float) -> float:
    """The backoff factor at `now`: its base for `PROBE_AFTER_S`, then climbing back by `INCREASE_PER_S` per
    second."""
    if backoff is None:
        return 1.0
    return min(1.0, backoff.base + INCREASE_PER_S * max(0.0, now - backoff.at - PROBE_AFTER_S))


def decreased(backoff: Backoff | None, now: float) -> Backoff | None:
    """The backoff after a throttle at `now`; None while the last decrease is under `DECREASE_HOLD_S` old."""
    if backoff is not None and now - backoff.at < DECREASE_HOLD_S:
        return None
    return Backoff(base=max(MIN_FACTOR, factor(backoff, now) * DECREASE), at=now)


def pool_factor(state: PoolState, budget: Budget, now: float) -> float:
    return factor(state.backoff.get(budget), now) if budget in RATE_BUDGETS else 1.0


def fair_budget(state: PoolState, budget: Budget, now: float) -> float:
    """What fair shares split of `budget` now: the budget less the reserve, times the backoff."""
    return state.settings.budget(budget) * pool_factor(state, budget, now)


def usable(state: PoolState, budget: Budget, now: float, *, besides: str) -> float:
    """What the members' grants may sum to: the budget (quota less the reserve), and for a rate no more than keeps
    every sliding second within the QUOTA. Each member paces its own starts evenly (`pacing.Pacer`), so in a
    second it starts at most ceil(`WINDOW_SHARE` x its rate): with n members the union holds at most
    ceil(WINDOW_SHARE x sum) + n - 1, which the quota bounds when the sum is at most
    (floor(quota) - n + 1) / `WINDOW_SHARE`. With AgentCore's 25/s and a 10% reserve that binds from a fourth
    member on (22.2/s instead of 22.5); with a small quota it binds sooner (4/s, two members: 3.03/s)."""
    budget_s = state.settings.budget(budget)
    if budget not in RATE_BUDGETS:
        return budget_s
    quota = state.settings.quotas.new_sessions_per_s if budget == "sessions" else state.settings.quotas.data_plane_per_s
    members = 1 + sum(1 for name, m in state.members.items() if name != besides and counted(m, budget, now) > 0)
    # More members than the quota starts in a second cannot all be kept within it by pacing each on its own (each
    # may start one in any second): then a second may exceed the quota by the members beyond it.
    return min(budget_s, max(1.0, math.floor(quota) - members + 1) / WINDOW_SHARE)


def in_use(state: PoolState, budget: Budget, now: float, *, besides: str | None = None) -> float:
    """What every member (but `besides`) may be using of `budget` at `now`."""
    return sum(counted(m, budget, now) for name, m in state.members.items() if name != besides)


@dataclass(frozen=True)
class Ask:
    """What a renewing member asks of one budget: `demand` (`math.inf`: all it can get) up to `cap`, and until when
    starts were already booked under its current grant (epoch s; None: its whole current lease)."""

    demand: float
    cap: float | None = None
    booked_until: float | None = None

    @property
    def want(self) -> float:
        return self.demand if self.cap is None else min(self.demand, self.cap)


def water_fill(budget: float, wants: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Weighted max-min fair shares of `budget` for `wants` (name -> (weight, want)): each gets min(want, its weight's
    part of what the smaller wants left), so a share nobody wants goes to those who want more (work-conserving),
    and a budget nobody fills stays partly unallocated. Weights must be > 0."""
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


def fair_shares(state: PoolState, budget: Budget, now: float, **extra: tuple[float, float]) -> dict[str, float]:
    """Every live member's fair share of `budget` now (plus `extra` members: name -> (weight, want))."""
    wants = {
        name: (m.weight, want(m, budget))
        for name, m in state.members.items()
        if live(m.lease(budget), now) and m.weight > 0 and name not in extra
    }
    return water_fill(fair_budget(state, budget, now), {**wants, **extra})


def grant(
    state: PoolState,
    name: str,
    *,
    weight: float,
    asks: Mapping[Budget, Ask],
    now: float,
    lease_s: float = LEASE_S,
) -> dict[Budget, Lease]:
    """The leases member `name` gets now for `asks` (one per budget), each from `now` until `now + lease_s`."""
    me = state.members.get(name) or Member(name)
    out: dict[Budget, Lease] = {}
    for budget in BUDGETS:
        ask = asks.get(budget)
        if ask is None:
            continue
        fair = fair_shares(state, budget, now, **{name: (weight, ask.want)})[name]
        free = usable(state, budget, now, besides=name) - in_use(state, budget, now, besides=name)
        old = me.lease(budget)
        out[budget] = Lease(
            rate=max(0.0, min(fair, free)),
            until=now + lease_s,
            held=still_held(old, booked_until(old, ask), now),
            demand=ask.demand,
        )
    return out


def booked_until(old: Lease, ask: Ask) -> float:
    """Until when starts booked under `old` (and earlier grants) may still be made: the last one booked (with the
    slack of the renewal's own writes), or the lease's end when that is unknown (active sessions)."""
    return old.until if ask.booked_until is None else min(old.until, ask.booked_until + BOOKING_SLACK_S)


def still_held(old: Lease, booked: float, now: float) -> tuple[tuple[float, float], ...]:
    """The grants a renewal must go on counting: the old one and the earlier ones still in use, each until it ends
    or the last start booked (no start was booked after `booked` under any of them); a grant that a later-ending
    one at least as big covers is dropped."""
    segments = [(rate, min(until, booked)) for rate, until in old.held] + [(old.rate, min(old.until, booked))]
    alive = sorted(((rate, until) for rate, until in segments if until > now and rate > 0), key=lambda s: -s[1])
    kept: list[tuple[float, float]] = []
    for rate, until in alive:  # latest end first: keep one only if it is bigger than every later-ending one
        if all(rate > other for other, _end in kept):
            kept.append((rate, until))
    return tuple(kept)


def finite(value: float) -> float | None:
    """`value`, or None for infinity."""
    return None if math.isinf(value) else value
