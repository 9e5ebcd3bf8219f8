"""`exp.capacity`: the sessions an experiment may hold. Calling it reads the account pool as a user reads it
(`rollouts capacity`): AgentCore's quotas of the account and region, the reserve, what AgentCore's answers taught
(the new-session backoff, the active-session cap), and every experiment's weight, share, demand, sessions in flight
and throttles; `exp.capacity.warm_pool()` the experiment's warm sessions."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout_pipeline.contracts import utcnow
from rollout_pipeline.ledger.pool import AccountView, MemberEntry, PoolLedger
from rollout_pipeline.limits import account, pacing, shares
from rollout_pipeline.quotas import PoolSettings
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.topology import POOL_TABLE_NAME

if TYPE_CHECKING:
    from rollout_pipeline.ports import AgentRuntime
    from rollout_pipeline.sdk.warm import WarmPoolStatus


@dataclass(frozen=True)
class MemberView:
    """One experiment in the pool, as its last renewal wrote it."""

    name: str
    weight: float
    #: Whether it renewed within `limits.shares.LIVE_S`: only then does it hold a share of the rate.
    live: bool
    #: New sessions/s it asked for (None: all it can get) and its share then; sessions in flight, its share of the
    #: active sessions, throttles in all, seconds since it renewed.
    demand: float | None
    share: float
    in_flight: int
    active_share: int
    throttles: int
    age_s: float


@dataclass(frozen=True)
class CapacityView:
    """The account pool as of one read (`exp.capacity()`)."""

    settings: PoolSettings
    #: New sessions per second the account's schedule starts at most now, and its backoff factor (1: none).
    rate: float
    factor: float
    #: Active sessions the account may hold now (the quota, or what AgentCore's answers taught), and whether learned.
    active_cap: int
    active_learned: bool
    #: What the learned cap climbs back to at most (0: the quota).
    active_ceiling: int
    members: list[MemberView]
    configured: bool

    def lines(self) -> list[str]:
        """What `rollouts capacity` prints."""
        q = self.settings.quotas
        back_to = self.active_ceiling or q.active_sessions
        learned = (
            f" (learned from AgentCore's ServiceQuotaExceededException; back to {back_to} at most)"
            if self.active_learned
            else ""
        )
        out = [
            f"account quotas ({q.source}{'' if self.configured else ', pool settings not written yet'}): "
            f"new sessions {q.new_sessions_per_s:g}/s, data plane {q.data_plane_per_s:g}/s, active sessions "
            f"{q.active_sessions}; reserve {self.settings.reserve:.0%}",
            f"new sessions now: at most {self.rate:.2f}/s in any second (backoff x{self.factor:.2f}; 1.00: no "
            f"throttles from AgentCore lately); active sessions at most {self.active_cap}{learned}",
            f"{'experiment':<24} {'weight':>6} {'live':>4}  {'new sessions/s: asked / share':<30} "
            f"{'in flight / share':>18} {'throttles':>9}",
        ]
        for m in self.members:
            asked = "all" if m.demand is None else f"{m.demand:.2f}"
            out.append(
                f"{m.name:<24} {m.weight:>6g} {'yes' if m.live else 'no':>4}  {asked:>13} / {m.share:>6.2f}"
                f"{'':<7} {m.in_flight:>9} / {m.active_share:<6} {m.throttles:>9}"
            )
        if not self.members:
            out.append("(no experiment has used the pool yet)")
        return out


def capacity_view(view: AccountView, members: list[MemberEntry], now: float | None = None) -> CapacityView:
    """The pool's items, as people read them."""
    now = time.time() if now is None else now
    return CapacityView(
        settings=view.settings,
        rate=account.start_rate(view, now),
        factor=pacing.backoff_factor(view.factor, view.factor_at, now),
        active_cap=account.active_cap(view, now),
        active_learned=view.active_cap_at > 0,
        active_ceiling=view.active_ceiling,
        members=[
            MemberView(
                name=m.name,
                weight=m.weight,
                live=now - m.renewed_at <= shares.LIVE_S,
                demand=None if math.isinf(m.demand) else m.demand,
                share=m.share,
                in_flight=m.in_flight,
                active_share=m.active_share,
                throttles=m.throttles,
                age_s=max(0.0, now - m.renewed_at),
            )
            for m in sorted(members, key=lambda m: m.name)
        ],
        configured=view.configured,
    )


def read_capacity(pool_table: str, client: Any, region: str | None) -> CapacityView:
    """Read the account pool (one Query)."""
    return capacity_view(*PoolLedger.open(pool_table, client, region=region).snapshot())


class Capacity:
    """The sessions one experiment may hold (`exp.capacity`): the account pool it shares AgentCore's quotas
    through (`exp.capacity()`), and its warm pool."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def __call__(self) -> CapacityView:
        """The account pool this experiment shares AgentCore's quotas through (one read): the account's quotas,
        the reserve, the backoff, and every experiment's weight, fair share, grant, recent use and throttles
        (`rollouts capacity`; `CapacityView.lines()` prints it)."""
        table = self._exp.stack_outputs.pool_table_name or POOL_TABLE_NAME
        with aws_errors("read the account pool"):
            return read_capacity(table, self._exp.client("dynamodb"), self._exp.aws.region)

    def warm_pool(self) -> WarmPoolStatus:
        """The warm pool now (`warm_sessions`): what it holds, whether it is halted, what it has spent and what its
        idle memory costs."""
        from rollout_pipeline.sdk.warm import WarmPoolStatus

        with aws_errors("read the warm pool"):
            ledger = self._exp.ledger()
            state, sessions = ledger.warm.pool(), ledger.warm.sessions()
        return WarmPoolStatus.of(self._exp.config, state, sessions, utcnow().timestamp(), self._exp.price_book())

    def stop_warm_pool(self, runtime: AgentRuntime | None = None, *, reason: str = "stopped") -> int:
        """Stop every warm session now and keep none (through `runtime`, by default ACR): until the next batch
        (`reason` "stopped", "cancelled"), or for good ("destroyed": `destroy` does it before the stack goes).
        Returns how many were stopped."""
        from rollout_pipeline.lifecycle.warm_pool import WarmPool

        with aws_errors("stop the warm pool"):
            return WarmPool(self._exp.wiring(runtime).lifecycle()).halt(reason)
