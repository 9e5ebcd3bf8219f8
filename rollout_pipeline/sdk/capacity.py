"""The account pool as a user reads it (`rollouts capacity`, `Experiment.capacity()`), and its one-time set-up
(`rollouts bootstrap`): AgentCore's quotas of the account and region, the reserve, the backoff, and every
experiment's weight, share, grant, recent use and throttles."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rollout_pipeline.ledger.pool import PoolLedger, PoolState
from rollout_pipeline.limits import shares
from rollout_pipeline.quotas import BUDGETS, Budget, PoolSettings


@dataclass(frozen=True)
class MemberView:
    """One experiment in the pool, as of one read."""

    name: str
    weight: float
    live: bool
    #: Per budget: what it asked (None: all it can get), its fair share now, and what it holds (granted).
    demand: dict[str, float | None]
    share: dict[str, float]
    granted: dict[str, float]
    #: New sessions/s it used over its last renewal period, sessions in flight, throttles in all.
    use: float
    in_flight: int
    throttles: int
    heartbeat_age_s: float


@dataclass(frozen=True)
class CapacityView:
    """The account pool as of one read (`Experiment.capacity()`)."""

    settings: PoolSettings
    #: Per rate budget: the backoff factor now (1: none).
    factors: dict[str, float]
    #: Per budget: what every experiment together may use (the quota less the reserve, times the backoff).
    budgets: dict[str, float]
    members: list[MemberView]
    configured: bool

    def lines(self) -> list[str]:
        """What `rollouts capacity` prints."""
        q = self.settings.quotas
        out = [
            f"account quotas ({q.source}{'' if self.configured else ', pool settings not written yet'}): "
            f"new sessions {q.new_sessions_per_s:g}/s per {q.new_session_scope}, data plane "
            f"{q.data_plane_per_s:g}/s, active sessions {q.active_sessions}; reserve {self.settings.reserve:.0%}",
            "backoff: "
            + ", ".join(f"{budget} x{factor:.2f}" for budget, factor in self.factors.items())
            + " (1.00: no throttles from AgentCore lately)",
            f"{'experiment':<24} {'weight':>6} {'live':>4}  {'new sessions/s: share / granted / used':<40} "
            f"{'active':>7} {'throttles':>9}",
        ]
        for m in self.members:
            out.append(
                f"{m.name:<24} {m.weight:>6g} {'yes' if m.live else 'no':>4}  "
                f"{m.share['sessions']:>8.2f} / {m.granted['sessions']:>7.2f} / {m.use:>6.2f}"
                f"{'':<17} {m.in_flight:>7} {m.throttles:>9}"
            )
        if not self.members:
            out.append("(no experiment has used the pool yet)")
        return out


def capacity_view(state: PoolState, now: float | None = None) -> CapacityView:
    """The pool item `state`, as people read it."""
    now = time.time() if now is None else now
    fair = {budget: shares.fair_shares(state, budget, now) for budget in BUDGETS}
    members = []
    for name, member in sorted(state.members.items()):
        members.append(
            MemberView(
                name=name,
                weight=member.weight,
                live=any(shares.live(lease, now) for lease in member.leases.values()),
                demand={b: shares.finite(member.lease(b).demand) for b in member.leases},
                share={b: fair[b].get(name, 0.0) for b in BUDGETS},
                granted={b: shares.lease_counted(member.lease(b), now) for b in BUDGETS},
                use=member.use,
                in_flight=member.in_flight,
                throttles=member.throttles,
                heartbeat_age_s=max(0.0, now - member.heartbeat),
            )
        )
    budget_names: tuple[Budget, ...] = BUDGETS
    return CapacityView(
        settings=state.settings,
        factors={b: shares.pool_factor(state, b, now) for b in shares.RATE_BUDGETS},
        budgets={b: shares.fair_budget(state, b, now) for b in budget_names},
        members=members,
        configured=state.configured,
    )


def read_capacity(pool_table: str, client: Any, region: str | None) -> CapacityView:
    """Read the account pool (one strongly consistent GetItem)."""
    return capacity_view(PoolLedger.open(pool_table, client, region=region).read())
