"""The collaborators every lifecycle function takes: settings, ledger, ports, clock, metrics and limits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from rollout_pipeline import ids
from rollout_pipeline.config import DISPATCH_BATCH, ExperimentConfig, HandlerSettings, invoke_rate_cap
from rollout_pipeline.contracts.attempts import attempt_token
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.feed.feed import Feed
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.pool import PoolLedger
from rollout_pipeline.lifecycle.limits.admission import AdmissionBoard, SessionRoom, SlotGate
from rollout_pipeline.lifecycle.limits.pacing import STOP_PACE, LimitedRuntime, Pacer, own_runtime
from rollout_pipeline.lifecycle.limits.pool import CALLS_PACE, SESSION_PACE, CapacityLease
from rollout_pipeline.lifecycle.limits.slots import SlotShards
from rollout_pipeline.lifecycle.metrics import MetricsRecorder
from rollout_pipeline.lifecycle.warm import WarmTaker
from rollout_pipeline.ports import (
    AgentRuntime,
    BusSubscriptions,
    Clock,
    EventPublisher,
    MessageQueue,
    ObjectStore,
    SystemClock,
)
from rollout_pipeline.quotas import AccountQuotas, PoolSettings


@dataclass
class LifecycleDeps:
    """Everything the lifecycle logic needs. Build it once (`wiring.Wiring.lifecycle`) and reuse it."""

    settings: HandlerSettings
    ledger: Ledger
    runtime: AgentRuntime
    store: ObjectStore
    queue: MessageQueue
    publisher: EventPublisher
    #: Work into the rollout queue (`wiring.Wiring.feed`: one per process, shared with ingestion).
    feed: Feed
    clock: Clock = field(default_factory=SystemClock)
    metrics: MetricsRecorder = field(default_factory=MetricsRecorder)
    #: A redelivered message finding its attempt dispatched but not invoked re-invokes only after this long
    #: (the first delivery may still be working on it); SQS redelivery comes after the visibility timeout anyway.
    reinvoke_grace_s: float = 60.0
    #: The sweeper drains outbox entries older than this (younger ones are still being handled by their owner).
    outbox_age_s: float = 30.0
    #: Throttled invokes are retried this many times (each with a new TPS token) before the slot is freed.
    invoke_retries: int = 3
    #: Dispatcher threads per SQS batch, one per rollout a dispatcher holds (also completion threads).
    dispatch_threads: int = DISPATCH_BATCH
    #: A cold-start RuntimeClientError (424) is retried on the same session this many times, this far apart: 6 s
    #: in all, in steps short enough that a session is used at most 0.5 s after it is up (a retry is one `tps` call).
    cold_start_retries: int = 12
    cold_start_wait_s: float = 0.5
    #: Waiters for a session slot are ordered across every dispatcher process (`limits.AdmissionBoard`); off, only
    #: among one process's waiters (the benchmark compares both).
    group_admission: bool = True
    #: The longest one InvokeAgentRuntime can take: an invoke is started only if it can end before the caller's
    #: `wait_until`. None: the runtime's `max_invoke_s` if it declares one (the ACR adapter: its connect + read
    #: timeouts), else 0 (in-process runtimes answer at once).
    invoke_time_s: float | None = None
    #: The key of attempt tokens (`contracts.attempts`): the dispatcher puts the attempt's token into every request
    #: and completion accepts only results that carry it. None: neither (tests of other things, old deployments).
    attempt_key: Callable[[], bytes] | None = None
    #: How long the sweeper keeps ticking the warm pool after its sweep, while the pool has work
    #: (`lifecycle.warm_pool.run_pool`); 0: one tick (local mode ticks it on its own schedule).
    warm_loop_s: float = 50.0
    #: The account pool (`ledger.pool`): every experiment of the account leases its share of AgentCore's quotas
    #: there (`limits.pool.CapacityLease`). None: no pool, the experiment keeps its own limits (`standalone_limits`).
    pool: PoolLedger | None = None
    #: The prices rollouts are costed with (`costs.PriceBook`); None: the experiment's, in the runtime's region
    #: (local mode's runtime: labelled as a local run).
    price_book: PriceBook | None = None
    #: Rollouts held on a spent budget are re-sent to come back after this long (SQS DelaySeconds, at most 900).
    budget_recheck_s: int = 60
    #: The private subscriptions on the experiment's bus: the sweeper removes those whose owner is gone
    #: (`lifecycle.subscriptions`). None: not looked at.
    subscriptions: BusSubscriptions | None = None
    prices: PriceBook = field(init=False)
    limited: LimitedRuntime = field(init=False)
    slots: SlotGate = field(init=False)
    slot_shards: SlotShards = field(init=False)
    lease: CapacityLease | None = field(init=False, default=None)
    #: This process's view of the warm pool's idle sessions (`lifecycle.warm`): dispatch takes one first.
    warm: WarmTaker = field(init=False)

    def __post_init__(self) -> None:
        if self.invoke_time_s is None:
            self.invoke_time_s = float(getattr(self.runtime, "max_invoke_s", 0.0))
        config = self.settings.experiment
        arn = self.settings.runtime_arn
        self.prices = self.price_book or PriceBook.of(config, ids.runtime_region(arn), local=ids.is_local_runtime(arn))
        limits = self.ledger.limits
        max_sessions: int | Callable[[], int] = config.max_sessions
        if self.pool is not None:
            lease = CapacityLease(
                self.pool, limits, config, in_flight=lambda: self.slot_shards.last_in_flight, sleep=self.clock.sleep
            )
            self.lease = lease
            endpoints = [Pacer(limits, f"session#{i}", 1.0, guess_busy=True) for i in range(config.endpoints)]
            self.limited = LimitedRuntime(
                self.runtime,
                Pacer(limits, CALLS_PACE, 1.0, lease=lease),
                endpoints,
                self.metrics,
                sessions_apart=True,
                session=Pacer(limits, SESSION_PACE, 1.0, guess_busy=True, lease=lease),
                lease=lease,
                stops=Pacer(limits, STOP_PACE, 1.0, lease=lease),  # used while the grant opens it
            )
            room: SessionRoom | None = SessionRoom(self.limited.room_pacer)
            max_sessions = lease.max_sessions
        else:
            data_plane, session_rate_limit = standalone_limits(config)
            self.limited = own_runtime(
                self.runtime,
                limits,
                data_plane=data_plane,
                invoke_rate=invoke_rate_cap(config.invoke_rate_limit, data_plane),
                session_rate_limit=session_rate_limit,
                endpoints=config.endpoints,
                metrics=self.metrics,
            )
            sessions = self.limited.sessions
            # One endpoint only: a session's endpoint is its id's hash, so room summed over endpoints let rollouts
            # book the endpoint without room (measured: 14% fewer sessions/s with 2). Ordering per endpoint needs
            # each waiter's endpoint on the board (docs/lifecycle.md, "Limits").
            room = SessionRoom(sessions[0]) if len(sessions) == 1 else None
        self.slot_shards = SlotShards(limits, max_sessions)
        self.slots = SlotGate(
            self.slot_shards.in_flight,
            self.slot_shards.max_sessions,
            board=AdmissionBoard(limits, wall=lambda: self.clock.now().timestamp()) if self.group_admission else None,
            room=room,
            in_flight_and_board=self.slot_shards.in_flight_and_board,
            monotonic=self.clock.monotonic,
            sleep=self.clock.sleep,
        )
        self.warm = WarmTaker(
            self.ledger.warm, config, wall=lambda: self.clock.now().timestamp(), monotonic=self.clock.monotonic
        )

    def max_sessions(self) -> int:
        """Sessions this experiment may hold now: `max_sessions`, or its share of the account's active sessions."""
        return self.slot_shards.max_sessions()

    def invoke_start_by(self, wait_until: float) -> float:
        """The latest moment (monotonic) an invoke may start so that it ends by `wait_until`."""
        return wait_until - (self.invoke_time_s or 0.0)

    def attempt_token(self, exp_id: str, session_id: str) -> str | None:
        """The token of the attempt of `session_id` (None without a key)."""
        if self.attempt_key is None:
            return None
        return attempt_token(self.attempt_key(), exp_id, session_id)

    @property
    def config(self) -> ExperimentConfig:
        return self.settings.experiment

    def now(self) -> datetime:
        return self.clock.now()


def standalone_limits(config: ExperimentConfig) -> tuple[float, float]:
    """(data-plane calls/s: `tps_limit`, `session_rate_limit` per endpoint) of an experiment without an account
    pool: its own settings, else the documented quotas less the reserve (the session rate split over its
    endpoints), as if it owned the account: how every experiment kept its limits before the pool. Its invokes are
    within `config.invoke_rate_cap` besides."""
    settings = PoolSettings(AccountQuotas())
    tps = float(config.tps_limit) if config.tps_limit is not None else settings.budget("calls")
    sessions = config.session_rate_limit or settings.budget("sessions") / config.endpoints
    return tps, sessions
