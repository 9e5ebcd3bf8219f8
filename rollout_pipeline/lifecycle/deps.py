"""The collaborators every lifecycle function takes: settings, ledger, ports, clock, metrics and limits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from rollout_pipeline import ids
from rollout_pipeline.config import DISPATCH_BATCH, ExperimentConfig, HandlerSettings
from rollout_pipeline.contracts.attempts import attempt_token
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.feed.feed import Feed
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.lifecycle.warm import WarmTaker
from rollout_pipeline.limits.facade import Limits
from rollout_pipeline.metric_names import MetricsRecorder
from rollout_pipeline.ports import (
    AgentRuntime,
    BusSubscriptions,
    Clock,
    EventPublisher,
    MessageQueue,
    ObjectStore,
    SystemClock,
)


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
    #: Admission and call budgets (`wiring.Wiring.limits`): the runtime every call goes through, the gate, the slots.
    limits: Limits
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
    #: The prices rollouts are costed with (`costs.PriceBook`); None: the experiment's, in the runtime's region
    #: (local mode's runtime: labelled as a local run).
    price_book: PriceBook | None = None
    #: Rollouts held on a spent budget are re-sent to come back after this long (SQS DelaySeconds, at most 900).
    budget_recheck_s: int = 60
    #: The private subscriptions on the experiment's bus: the sweeper removes those whose owner is gone
    #: (`lifecycle.subscriptions`). None: not looked at.
    subscriptions: BusSubscriptions | None = None
    prices: PriceBook = field(init=False)
    #: This process's access to the warm pool's offers (`lifecycle.warm`): dispatch takes one first.
    warm: WarmTaker = field(init=False)

    def __post_init__(self) -> None:
        if self.invoke_time_s is None:
            self.invoke_time_s = float(getattr(self.runtime, "max_invoke_s", 0.0))
        config = self.settings.experiment
        arn = self.settings.runtime_arn
        self.prices = self.price_book or PriceBook.of(config, ids.runtime_region(arn), local=ids.is_local_runtime(arn))
        self.warm = WarmTaker(
            self.queue,
            self.settings.warm_queue_url,
            self.ledger.warm,
            config,
            wall=lambda: self.clock.now().timestamp(),
            monotonic=self.clock.monotonic,
        )

    def for_another_process(self) -> LifecycleDeps:
        """These deps as another process of the experiment holds them: the same ledger and ports, its own limits'
        state and warm-queue access (benches and tests model each Lambda as a process)."""
        return dataclasses.replace(self, limits=self.limits.for_another_process())

    def max_sessions(self) -> int:
        """Sessions this experiment may hold now: `max_sessions`, or its share of the account's active sessions."""
        return self.limits.max_sessions()

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
