"""One experiment's limits, built once by `wiring.Wiring.limits` and handed to the lifecycle and the warm pool.

`Limits` holds what a process admits new sessions and paces its calls with (docs/lifecycle.md, "Limits"):
`runtime` (the agent runtime behind its call budgets), `gate` (the admission gate: session slots and the session
budget's room, in group order across processes), `shards` (which session-slot counter a dispatch takes). Two
constructors: `pooled` (every new session books its start on the account's one schedule, `limits.account`, after the
experiment's advisory share, `limits.shares`) and `standalone` (the experiment keeps its own limits, as if it owned
the account: tests, benches).
"""

from __future__ import annotations

from collections.abc import Callable

from rollout_pipeline.config import ExperimentConfig, invoke_rate_cap, new_sessions_cap
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.pool import PoolLedger
from rollout_pipeline.limits.account import AccountSchedule
from rollout_pipeline.limits.admission import AdmissionBoard, SessionRoom, SlotGate
from rollout_pipeline.limits.pacing import SESSION_PACE, Clocks, LimitedRuntime, Pacer, call_budgets
from rollout_pipeline.limits.shares import MIN_SHARE_PER_S, Membership, account_sessions_percent
from rollout_pipeline.limits.slots import SlotShards
from rollout_pipeline.metric_names import MetricsRecorder
from rollout_pipeline.ports import AgentRuntime
from rollout_pipeline.quotas import AccountQuotas, PoolSettings


class Limits:
    """An experiment's admission and call budgets, as one process holds them (see the module doc)."""

    def __init__(
        self,
        runtime: LimitedRuntime,
        shards: SlotShards,
        gate: SlotGate,
        *,
        account: AccountSchedule | None = None,
        membership: Membership | None = None,
        session_rate: float = 0.0,
    ) -> None:
        self.runtime = runtime
        self.shards = shards
        self.gate = gate
        #: Through the account pool: the account's schedule and this experiment's entry there.
        self.account = account
        self.membership = membership
        self._session_rate = session_rate
        #: Builds the same limits anew (`for_another_process`).
        self._again: Callable[[], Limits] | None = None

    @classmethod
    def pooled(
        cls,
        ledger: LimitLedger,
        pool: PoolLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        clocks: Clocks | None = None,
        pacing: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """Limits that share the account's quotas with every experiment of the account through its pool. `clocks`:
        the admission gate's; `pacing`: the schedules' (the system's by default: their times are shared with every
        other process through the items)."""
        clocks, pacing = clocks or Clocks(), pacing or Clocks()
        account = AccountSchedule(pool, wall=pacing.wall, monotonic=pacing.monotonic, sleep=pacing.sleep)
        shards = SlotShards(ledger, config.max_sessions, wall=pacing.wall, monotonic=clocks.monotonic)
        membership = Membership(
            pool,
            ledger,
            account,
            config,
            in_flight=shards.last_read,
            read_in_flight=shards.in_flight,
            waiting=lambda: bool(gate.queued()),
            wall=pacing.wall,
        )
        shards.follow(membership.max_sessions)
        account.on_throttled = membership.throttled
        session = Pacer(
            ledger.schedule(SESSION_PACE, item_spacing=True),
            SESSION_PACE,
            MIN_SHARE_PER_S,  # until its first renewal: one start a horizon
            guess_busy=True,
            on_item=membership.seen,
            on_unspaced=membership.first_share,
            on_backlog=membership.note_backlog,
            wall=pacing.wall,
            monotonic=pacing.monotonic,
            sleep=pacing.sleep,
        )
        data_plane, session_rate = own_limits(config)
        tps, stops = call_budgets(
            ledger.schedule,
            data_plane=data_plane,
            invoke_rate=invoke_rate_cap(config.invoke_rate_limit, data_plane),
            session_rate=session_rate,
            clocks=pacing,
        )
        limited = LimitedRuntime(runtime, tps, session, metrics, account=account, stops=stops)
        gate = _gate(ledger, shards, SessionRoom(session), clocks, group_admission)
        return cls(limited, shards, gate, account=account, membership=membership)

    @classmethod
    def standalone(
        cls,
        ledger: LimitLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        clocks: Clocks | None = None,
        pacing: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """Limits of an experiment on its own settings, as if it owned the account (`own_limits`)."""
        clocks, pacing = clocks or Clocks(), pacing or Clocks()
        data_plane, session_rate = own_limits(config)
        schedule = ledger.schedule(SESSION_PACE)
        session = Pacer(
            schedule,
            SESSION_PACE,
            session_rate,
            guess_busy=True,
            wall=clocks.wall,
            monotonic=clocks.monotonic,
            sleep=clocks.sleep,
        )
        tps, stops = call_budgets(
            ledger.schedule,
            data_plane=data_plane,
            invoke_rate=invoke_rate_cap(config.invoke_rate_limit, data_plane),
            session_rate=session_rate,
            clocks=pacing,
        )
        limited = LimitedRuntime(runtime, tps, session, metrics, stops=stops)
        shards = SlotShards(ledger, config.max_sessions, wall=pacing.wall, monotonic=clocks.monotonic)
        gate = _gate(ledger, shards, SessionRoom(session), clocks, group_admission)
        return cls(limited, shards, gate, session_rate=session_rate)

    @classmethod
    def build(
        cls,
        ledger: LimitLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        pool: PoolLedger | None,
        clocks: Clocks | None = None,
        pacing: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """`pooled` with an account pool, else `standalone`."""
        options = {"clocks": clocks, "pacing": pacing, "metrics": metrics, "group_admission": group_admission}

        def again() -> Limits:
            if pool is not None:
                return cls.pooled(ledger, pool, config, runtime, **options)  # type: ignore[arg-type]
            return cls.standalone(ledger, config, runtime, **options)  # type: ignore[arg-type]

        built = again()
        built._again = again
        return built

    def for_another_process(self) -> Limits:
        """The same limits as another process holds them: its own gate, views and budgets' local state over the same
        items (benches and tests model each Lambda as a process). Only for limits made by `build`."""
        assert self._again is not None, "only limits made by Limits.build can be copied"
        copy = self._again()
        copy._again = self._again
        return copy

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
        if not self.membership.session.renewed_us:
            self.membership.renew(force=True)
        return self.membership.share()

    def heartbeat(self) -> float | None:
        """Renew this experiment's entry in the account pool with its sessions in flight (the sweeper, every run):
        they keep counting against the account's active sessions while nothing else of the experiment runs. Returns
        the sessions every experiment of the account holds, in percent of its quota (None without a pool)."""
        if self.membership is None or self.account is None:
            return None
        self.membership.renew(force=True)
        quota = self.account.current().settings.quotas.active_sessions
        return account_sessions_percent(self.membership.members, quota, self.membership.now())


def _gate(
    ledger: LimitLedger, shards: SlotShards, room: SessionRoom | None, clocks: Clocks, group_admission: bool
) -> SlotGate:
    return SlotGate(
        shards.in_flight,
        shards.max_sessions,
        board=AdmissionBoard(ledger, wall=clocks.wall) if group_admission else None,
        room=room,
        in_flight_and_board=shards.in_flight_and_board,
        monotonic=clocks.monotonic,
        sleep=clocks.sleep,
    )


def own_limits(config: ExperimentConfig) -> tuple[float, float]:
    """(data-plane calls/s, new sessions/s) an experiment keeps for itself: `tps_limit` (else the documented
    data-plane quota less the reserve: the account's data-plane rate is not pooled, it never binds) and
    `session_rate_limit` (else the documented new-session quota less the reserve, as if it owned the account; through
    the pool, its share is what spaces it). Its invokes are within `config.invoke_rate_cap` besides."""
    settings = PoolSettings(AccountQuotas())
    tps = float(config.tps_limit) if config.tps_limit is not None else settings.budget("calls")
    budget = config.session_rate_limit or settings.budget("sessions")
    sessions = new_sessions_cap(budget, config.tps_limit, config.invoke_rate_limit) or budget
    return tps, sessions
