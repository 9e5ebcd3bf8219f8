"""One experiment's limits, built once by `wiring.Wiring.limits` and handed to the lifecycle and the warm pool
(docs/lifecycle.md, "Limits"): pooled (with an account pool, every new session books its start on the account's one
schedule after the experiment's advisory share) or standalone (the experiment keeps its own limits, as if it owned the
account)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

from rollout_pipeline.config import ExperimentConfig, invoke_rate_cap, new_sessions_cap
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.pool import PoolLedger
from rollout_pipeline.limits.account import AccountSchedule
from rollout_pipeline.limits.admission import AdmissionBoard, SlotGate
from rollout_pipeline.limits.pacing import SESSION_PACE, Clocks, LimitedRuntime, Pacer, call_budgets
from rollout_pipeline.limits.shares import MIN_SHARE_PER_S, Membership, account_sessions_percent
from rollout_pipeline.limits.slots import SlotShards
from rollout_pipeline.metric_names import MetricsRecorder
from rollout_pipeline.ports import AgentRuntime
from rollout_pipeline.quotas import AccountQuotas, PoolSettings


class Limits:
    """An experiment's admission (`gate`, `shards`) and call budgets (`runtime`), as one process holds them: through
    the account `pool` when given (`account`, `membership`), else on its own settings (`own_limits`). `clocks`: the
    admission gate's; `pacing`: the schedules' (the system's by default: their times are shared with every other
    process through the items)."""

    def __init__(
        self,
        ledger: LimitLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        pool: PoolLedger | None = None,
        clocks: Clocks | None = None,
        pacing: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> None:
        clocks, pacing = clocks or Clocks(), pacing or Clocks()
        self._wall = pacing.wall
        again = partial(Limits, ledger, config, runtime, pool=pool, clocks=clocks, pacing=pacing, metrics=metrics)
        self._again: Callable[[], Limits] = partial(again, group_admission=group_admission)
        data_plane, self._session_rate = own_limits(config)
        self.account: AccountSchedule | None = None
        self.membership: Membership | None = None
        self.shards = SlotShards(ledger, config.max_sessions, wall=pacing.wall, monotonic=clocks.monotonic)
        if pool is None:
            session = Pacer(
                ledger.schedule(SESSION_PACE), SESSION_PACE, self._session_rate, guess_busy=True, clocks=clocks
            )
        else:
            self.account = AccountSchedule(pool, clocks=pacing)
            self.membership = membership = Membership(
                pool,
                ledger,
                self.account,
                config,
                shards=self.shards,
                waiting=lambda: self.gate.in_hand(),  # noqa: PLW0108 - the gate is built below
                clocks=pacing,
            )
            self.shards.follow(membership.max_sessions)
            self.account.on_view = membership.account_seen
            session = Pacer(
                ledger.schedule(SESSION_PACE, item_spacing=True),
                SESSION_PACE,
                MIN_SHARE_PER_S,  # until its first renewal: one start a horizon
                guess_busy=True,
                on_item=membership.seen,
                on_unspaced=lambda: membership.renew(force=True, demand=math.inf),  # a first start: asks for all
                on_backlog=membership.note_backlog,
                clocks=pacing,
            )
        tps, stops = call_budgets(
            ledger.schedule,
            data_plane=data_plane,
            invoke_rate=invoke_rate_cap(config.invoke_rate_limit, data_plane),
            session_rate=self._session_rate,
            clocks=pacing,
        )
        self.runtime = LimitedRuntime(runtime, tps, session, metrics, account=self.account, stops=stops)
        board = AdmissionBoard(ledger, wall=clocks.wall) if group_admission else None
        self.gate = SlotGate(
            self.shards.in_flight_and_board,
            self.shards.max_sessions,
            session,
            board=board,
            monotonic=clocks.monotonic,
            sleep=clocks.sleep,
        )
        if (member := self.membership) is not None and board is not None:
            self.gate.on_clear = lambda: member.idle(lambda: bool(self.gate.queued() or board.others()))

    def for_another_process(self) -> Limits:
        """The same limits as another process holds them (benches and tests model each Lambda as a process)."""
        return self._again()

    def max_sessions(self) -> int:
        """Sessions this experiment may hold now: `max_sessions`, or its share of the account's active sessions."""
        return self.shards.max_sessions()

    def sessions_to_hold(self) -> int:
        """`max_sessions()` once this process knows its share (renewed first when it has none yet)."""
        if self.membership is not None and not self.membership.session.renewed_us:
            self.membership.renew(force=True)
        return self.max_sessions()

    def new_session_rate(self) -> float:
        """New sessions/s this experiment may start now: its share of the account's rate, or its own limit."""
        if self.membership is None:
            return self._session_rate
        self.membership.note_backlog()  # the caller wants to start sessions: its share is asked for all it can get
        self.sessions_to_hold()  # renewed first when it has no share yet
        return self.membership.share()

    def heartbeat(self) -> float | None:
        """Renew the experiment's pool entry (the sweeper); the account's sessions in percent of its quota, or None."""
        if self.membership is None or self.account is None:
            return None
        self.membership.renew(force=True)
        quota = self.account.current().settings.quotas.active_sessions
        return account_sessions_percent(self.membership.members, quota, self._wall())


def own_limits(config: ExperimentConfig) -> tuple[float, float]:
    """(data-plane calls/s, new sessions/s) an experiment keeps for itself: `tps_limit` and `session_rate_limit`,
    else the documented quotas less the reserve (as if it owned the account; through the pool, its share spaces it)."""
    settings = PoolSettings(AccountQuotas())
    tps = float(config.tps_limit) if config.tps_limit is not None else settings.budget("calls")
    budget = config.session_rate_limit or settings.budget("sessions")
    sessions = new_sessions_cap(budget, config.tps_limit, config.invoke_rate_limit) or budget
    return tps, sessions
