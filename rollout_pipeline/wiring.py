"""The composition root: the one place that turns settings and a client factory into the stages' ports.

Lambdas (`lambdas/glue.py`, once per container), the SDK (`Experiment.wiring`) and local mode (one per run,
handed to the handlers explicitly) all build their ingestion and lifecycle collaborators here, from one
`adapters.clients.ClientFactory`. Clients are lazy (`ClientFactory.lazy`): wiring costs no boto3 import, a
Lambda pays for a client when its first call needs it. The agent runtime is ACR (the factory's `acr()` client:
explicit timeouts, no botocore retries) unless one is given (local mode's agent processes, the fake in tests).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollout_pipeline.adapters.clients import ACR_SERVICE, ClientFactory
from rollout_pipeline.config import HandlerSettings
from rollout_pipeline.ports import BusSubscriptions, Clock, SystemClock

if TYPE_CHECKING:
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.ingest.core import Ingestion
    from rollout_pipeline.ingest.mtrl import MtrlForwarder
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.ledger.pool import PoolLedger
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.lifecycle.mtrl_report import MtrlReporter
    from rollout_pipeline.limits.facade import Limits
    from rollout_pipeline.metric_names import MetricsRecorder
    from rollout_pipeline.ports import AgentRuntime


@dataclass
class Wiring:
    """One experiment's stages over one client factory. Build it once and reuse it (thread-safe)."""

    settings: HandlerSettings
    clients: ClientFactory = field(default_factory=ClientFactory)
    #: The agent runtime; None: ACR through `clients`.
    runtime: AgentRuntime | None = None
    #: The attempt-token key (`contracts.attempts`); None: tokens are neither issued nor checked.
    attempt_key: Callable[[], bytes] | None = None
    #: The one clock of the ledger and the lifecycle (the ledger stamps times and TTLs with it).
    clock: Clock = field(default_factory=SystemClock)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _ingestion: Ingestion | None = field(default=None, init=False, repr=False)
    _feed: Feed | None = field(default=None, init=False, repr=False)
    _lifecycle: LifecycleDeps | None = field(default=None, init=False, repr=False)
    _limits: Limits | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **kwargs: Any) -> Wiring:
        """A Lambda's wiring: settings from its environment (`config.FunctionEnvironment`), boto3's clients, and
        the attempt-token key from the secret `topology.ATTEMPT_KEY_ENV` names (when the function is given one)."""
        from rollout_pipeline.topology import ATTEMPT_KEY_ENV

        environ = os.environ if environ is None else environ
        wiring = cls(HandlerSettings.from_environ(environ), **kwargs)
        secret = environ.get(ATTEMPT_KEY_ENV)
        if secret and wiring.attempt_key is None:
            from rollout_pipeline.adapters.attempt_key import SecretAttemptKey

            wiring.attempt_key = SecretAttemptKey(secret, wiring.clients.lazy("secretsmanager"))
        return wiring

    # ------------------------------------------------------------------------------------------------ ports

    def store(self) -> S3ObjectStore:
        from rollout_pipeline.adapters.s3 import S3ObjectStore

        return S3ObjectStore(self.clients.lazy("s3"))

    def queue(self) -> SqsQueue:
        from rollout_pipeline.adapters.sqs import SqsQueue

        return SqsQueue(self.clients.lazy("sqs"))

    def publisher(self) -> EventBridgePublisher:
        from rollout_pipeline.adapters.eventbridge import EventBridgePublisher

        return EventBridgePublisher(self.settings.bus_name, self.clients.lazy("events"))

    def ledger(self, clock: Clock | None = None) -> Ledger:
        """The experiment's ledger (`ledger.ledger.Ledger`: batches, rollouts, limits over one table), on the
        wiring's clock unless another is given."""
        from rollout_pipeline.ledger.ledger import Ledger

        ttl_days = self.settings.experiment.ledger_ttl_days
        client = self.clients.lazy("dynamodb")
        return Ledger.open(self.settings.table_name, client, ttl_days=ttl_days, clock=clock or self.clock)

    def pool(self) -> PoolLedger | None:
        """The account pool's table (`ledger.pool`), None when the settings name none (no account pool)."""
        if not self.settings.pool_table_name:
            return None
        from rollout_pipeline.ledger.pool import PoolLedger

        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return PoolLedger.open(
            self.settings.pool_table_name, self.clients.lazy("dynamodb"), clock=self.clock, region=region
        )

    def bus_subscriptions(self) -> BusSubscriptions:
        """The private subscriptions on the experiment's bus (`bus_subscriptions`), over lazy clients."""
        from rollout_pipeline import bus_subscriptions
        from rollout_pipeline.adapters.subscriptions import EventBridgeSubscriptions

        bus = self.settings.bus_name
        return EventBridgeSubscriptions(
            self.clients.lazy("events"),
            self.clients.lazy("sqs"),
            bus,
            prefixes=[f"{bus}-{kind}-" for kind in bus_subscriptions.BUS_KINDS],
            seen_tag=bus_subscriptions.TAG_SEEN,
            target_id=bus_subscriptions.TARGET_ID,
        )

    def agent_runtime(self) -> AgentRuntime:
        """The runtime given, else a local pipeline's at the factory's endpoint (`adapters.runtime`), else the ACR
        adapter of the experiment's runtime (its client made on first use)."""
        if self.runtime is not None:
            return self.runtime
        from rollout_pipeline.adapters.runtime import local_runtime

        found = local_runtime(self.clients.endpoint_url)
        if found is not None:
            return found
        from rollout_pipeline.adapters.acr import AcrAgentRuntime

        return AcrAgentRuntime(
            self.settings.runtime_arn, self.clients.lazy(ACR_SERVICE), endpoints=self.settings.experiment.endpoints
        )

    # ----------------------------------------------------------------------------------------------- stages

    def feed(self) -> Feed:
        """Work into the rollout queue (built once: ingestion and the lifecycle share it, and with it its memory
        of the release window's cursors)."""
        with self._lock:
            if self._feed is None:
                from rollout_pipeline.feed.feed import Feed

                self._feed = Feed(self.ledger(), self.queue(), self.settings)
            return self._feed

    def ingestion(self) -> Ingestion:
        """The ingestion stage (built once)."""
        with self._lock:
            if self._ingestion is None:
                from rollout_pipeline.ingest.core import Ingestion, IngestPorts

                self._ingestion = Ingestion(
                    IngestPorts(
                        store=self.store(),
                        queue=self.queue(),
                        publisher=self.publisher(),
                        ledger=self.ledger(),
                        settings=self.settings,
                        feed=self.feed(),
                    )
                )
            return self._ingestion

    def limits(
        self,
        *,
        clock: Clock | None = None,
        runtime: AgentRuntime | None = None,
        metrics: MetricsRecorder | None = None,
        group_admission: bool = True,
    ) -> Limits:
        """The experiment's limits (`limits.Limits`): through the account pool when the settings name one, else on
        its own settings. Built once on the wiring's clock and runtime; others given build a new one (a test's
        clock, a bench's runtime). `group_admission` False orders waiters only within one process."""
        from rollout_pipeline.limits.facade import Limits
        from rollout_pipeline.limits.pacing import Clocks

        default = clock is None and runtime is None and metrics is None and group_admission
        with self._lock:
            if default and self._limits is not None:
                return self._limits
            clock = clock or self.clock
            wall_clock = clock
            clocks = Clocks(wall=lambda: wall_clock.now().timestamp(), monotonic=clock.monotonic, sleep=clock.sleep)
            built = Limits(
                self.ledger(clock).limits,
                self.settings.experiment,
                runtime or self.agent_runtime(),
                pool=self.pool(),
                clocks=clocks,
                metrics=metrics,
                group_admission=group_admission,
            )
            if default:
                self._limits = built
            return built

    def mtrl_forwarder(self) -> MtrlForwarder:
        """MTRL environment mode's forwarder: ingestion with the forwarder's own submission lease."""
        from rollout_pipeline.ingest.core import Ingestion, IngestTuning
        from rollout_pipeline.ingest.mtrl import LEASE_S, MtrlForwarder

        return MtrlForwarder(Ingestion(self.ingestion().ports, IngestTuning(lease_seconds=LEASE_S)))

    def mtrl_reporter(self, runtime_url: str | None = None) -> MtrlReporter:
        """MTRL environment mode's reporter, reporting to the job runtime at `runtime_url` (default: the variable
        `config.MTRL_RUNTIME_ENV`, else the region's, `config.job_runtime_url`); its client made on first use."""
        from rollout_pipeline.adapters.clients import ClientFactory
        from rollout_pipeline.adapters.job_runtime import JOB_RUNTIME_SERVICE, BotoJobRuntime
        from rollout_pipeline.config import MTRL_RUNTIME_ENV, job_runtime_url
        from rollout_pipeline.lifecycle.mtrl_report import MtrlReporter

        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        url = runtime_url or os.environ.get(MTRL_RUNTIME_ENV) or job_runtime_url(region)
        clients = ClientFactory(region=region, endpoint_url=url)  # no boto3 import until the first report
        runtime = BotoJobRuntime(clients.lazy(JOB_RUNTIME_SERVICE))
        return MtrlReporter(self.ledger(), runtime, self.settings.experiment.name)

    def lifecycle(self) -> LifecycleDeps:
        """The lifecycle stage's collaborators (built once)."""
        with self._lock:
            if self._lifecycle is None:
                self._lifecycle = self.new_lifecycle()
            return self._lifecycle

    def new_lifecycle(self, **overrides: Any) -> LifecycleDeps:
        """Fresh lifecycle collaborators, with `overrides` of `LifecycleDeps` fields (clock, tuning) if given; the
        ledger keeps the lifecycle's clock."""
        from rollout_pipeline.feed.feed import Feed
        from rollout_pipeline.lifecycle.deps import LifecycleDeps
        from rollout_pipeline.metric_names import MetricsRecorder

        clock = overrides.pop("clock", self.clock)
        ledger = self.ledger(clock)
        queue = self.queue()
        if "feed" not in overrides:
            overrides["feed"] = self.feed() if clock is self.clock else Feed(ledger, queue, self.settings)
        runtime = overrides.pop("runtime", None) or self.agent_runtime()
        metrics = overrides.pop("metrics", None) or MetricsRecorder()
        if "limits" not in overrides:
            group_admission = overrides.pop("group_admission", True)
            overrides["limits"] = self.limits(
                clock=clock, runtime=runtime, metrics=metrics, group_admission=group_admission
            )
        return LifecycleDeps(
            settings=self.settings,
            ledger=ledger,
            clock=clock,
            runtime=runtime,
            metrics=metrics,
            store=self.store(),
            queue=queue,
            publisher=self.publisher(),
            **{
                "attempt_key": self.attempt_key,
                "subscriptions": self.bus_subscriptions(),
                **overrides,
            },
        )
