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
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.ledger.pool import PoolLedger
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
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

        clock = overrides.pop("clock", self.clock)
        ledger = self.ledger(clock)
        queue = self.queue()
        if "feed" not in overrides:
            overrides["feed"] = self.feed() if clock is self.clock else Feed(ledger, queue, self.settings)
        return LifecycleDeps(
            settings=self.settings,
            ledger=ledger,
            clock=clock,
            runtime=self.agent_runtime(),
            store=self.store(),
            queue=queue,
            publisher=self.publisher(),
            **{
                "attempt_key": self.attempt_key,
                "pool": self.pool(),
                "subscriptions": self.bus_subscriptions(),
                **overrides,
            },
        )
