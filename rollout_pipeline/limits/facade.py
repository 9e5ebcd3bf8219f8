"""One experiment's limits, built once by `wiring.Wiring.limits` and handed to the lifecycle and the warm pool.

`Limits` holds what a process admits new sessions and paces its calls with (docs/lifecycle.md, "Limits"):
`runtime` (the agent runtime behind its call budgets), `gate` (the admission gate: session slots and the session
budget's room, in group order across processes), `shards` (which session-slot counter a dispatch takes). Two
constructors: `pooled` (the account pool shares AgentCore's quotas with every experiment of the account) and
`standalone` (the experiment keeps its own limits, as if it owned the account: tests, benches).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rollout_pipeline.config import ExperimentConfig, invoke_rate_cap
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.pool import PoolLedger
from rollout_pipeline.limits.admission import AdmissionBoard, SessionRoom, SlotGate
from rollout_pipeline.limits.pacing import STOP_PACE, LimitedRuntime, Pacer, own_runtime
from rollout_pipeline.limits.pool import CALLS_PACE, SESSION_PACE, CapacityLease
from rollout_pipeline.limits.slots import SlotShards
from rollout_pipeline.metric_names import MetricsRecorder
from rollout_pipeline.ports import AgentRuntime
from rollout_pipeline.quotas import AccountQuotas, PoolSettings


@dataclass(frozen=True)
class Clocks:
    """The clocks limits wait on: wall clock (epoch s), monotonic and sleep (a test's or a bench's, or the system's)."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class Limits:
    """An experiment's admission and call budgets, as one process holds them (see the module doc)."""

    def __init__(
        self,
        runtime: LimitedRuntime,
        shards: SlotShards,
        gate: SlotGate,
        *,
        lease: CapacityLease | None = None,
        new_session_rate: Callable[[], float],
    ) -> None:
        self.runtime = runtime
        self.shards = shards
        self.gate = gate
        self.lease = lease
        self._new_session_rate = new_session_rate
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
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """Limits that lease the experiment's share of the account's quotas from the account pool."""
        clocks = clocks or Clocks()
        holder: list[SlotShards] = []
        lease = CapacityLease(pool, ledger, config, in_flight=lambda: holder[0].last_in_flight, sleep=clocks.sleep)
        endpoints = [Pacer(ledger, f"session#{i}", 1.0, guess_busy=True) for i in range(config.endpoints)]
        limited = LimitedRuntime(
            runtime,
            Pacer(ledger, CALLS_PACE, 1.0, lease=lease),
            endpoints,
            metrics,
            sessions_apart=True,
            session=Pacer(ledger, SESSION_PACE, 1.0, guess_busy=True, lease=lease),
            lease=lease,
            stops=Pacer(ledger, STOP_PACE, 1.0, lease=lease),  # used while the grant opens it
        )
        shards = SlotShards(ledger, lease.max_sessions)
        holder.append(shards)
        gate = _gate(ledger, shards, SessionRoom(limited.room_pacer), clocks, group_admission)
        return cls(limited, shards, gate, lease=lease, new_session_rate=lambda: lease.ensure().sessions_per_s)

    @classmethod
    def standalone(
        cls,
        ledger: LimitLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        clocks: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """Limits of an experiment on its own settings, as if it owned the account (`standalone_limits`)."""
        clocks = clocks or Clocks()
        data_plane, session_rate_limit = standalone_limits(config)
        limited = own_runtime(
            runtime,
            ledger,
            data_plane=data_plane,
            invoke_rate=invoke_rate_cap(config.invoke_rate_limit, data_plane),
            session_rate_limit=session_rate_limit,
            endpoints=config.endpoints,
            metrics=metrics,
        )
        sessions = limited.sessions
        # One endpoint only: a session's endpoint is its id's hash, so room summed over endpoints let rollouts book
        # the endpoint without room (measured: 14% fewer sessions/s with 2).
        room = SessionRoom(sessions[0]) if len(sessions) == 1 else None
        shards = SlotShards(ledger, config.max_sessions)
        gate = _gate(ledger, shards, room, clocks, group_admission)
        return cls(limited, shards, gate, new_session_rate=lambda: session_rate_limit * config.endpoints)

    @classmethod
    def build(
        cls,
        ledger: LimitLedger,
        config: ExperimentConfig,
        runtime: AgentRuntime,
        *,
        pool: PoolLedger | None,
        clocks: Clocks | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """`pooled` with an account pool, else `standalone`."""
        options = {"clocks": clocks, "metrics": metrics, "group_admission": group_admission}

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
        """`max_sessions()` after this process has its share (before its first grant a lease would say
        `max_sessions`)."""
        if self.lease is not None:
            self.lease.ensure()
        return self.max_sessions()

    def new_session_rate(self) -> float:
        """New sessions/s this experiment may start now (its share of the account's rate, or its own limit)."""
        return self._new_session_rate()

    def heartbeat(self) -> None:
        """Tell the account pool this experiment is alive, with its sessions in flight (the sweeper, every run)."""
        if self.lease is not None:
            self.lease.heartbeat()


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


def standalone_limits(config: ExperimentConfig) -> tuple[float, float]:
    """(data-plane calls/s: `tps_limit`, `session_rate_limit` per endpoint) of an experiment without an account
    pool: its own settings, else the documented quotas less the reserve (the session rate split over its
    endpoints), as if it owned the account. Its invokes are within `config.invoke_rate_cap` besides."""
    settings = PoolSettings(AccountQuotas())
    tps = float(config.tps_limit) if config.tps_limit is not None else settings.budget("calls")
    sessions = config.session_rate_limit or settings.budget("sessions") / config.endpoints
    return tps, sessions
