"""`ExperimentHandle`: one experiment's resources (from its stack outputs) and what every topic of `Experiment`
reads them through: the clients, the ledger, the pipeline's stages, the prices, result objects, the event ids
already handed over and the streams left open.

`Experiment` is this plus its topics (`sdk/experiment.py`); the topics (`sdk/batches.py`, `sdk/events.py`, ...) and
the ART-style client take an `ExperimentHandle`, so none of them imports the facade.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollout_pipeline import ids, topology
from rollout_pipeline.config import ExperimentConfig, HandlerSettings
from rollout_pipeline.contracts import read_result
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.sdk._aws import AwsClients, aws_errors
from rollout_pipeline.sdk.delivery import DEFAULT_SEEN_IDS, SeenIds
from rollout_pipeline.sdk.errors import AwsError, SdkError

if TYPE_CHECKING:
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.ports import AgentRuntime
    from rollout_pipeline.sdk.subscription import SubscribedStream
    from rollout_pipeline.wiring import Wiring


class ExperimentHandle:
    """A handle on one experiment's resources (buckets, queues, bus, ledger), from its stack outputs.

    Region and credentials come from the usual boto3 chain unless a `session` / `region` is given; `endpoint_url`:
    local mode (every client talks to it). Thread-safe: the dispatcher thread of a `RolloutClient` shares it with
    the caller.
    """

    def __init__(
        self,
        outputs: Mapping[str, str],
        *,
        session: Any | None = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        seen_ids: int = DEFAULT_SEEN_IDS,
    ) -> None:
        missing = topology.StackOutputs.missing(outputs)
        if missing:
            raise SdkError(f"stack outputs are missing {', '.join(missing)} (is the stack up to date?)")
        self.outputs: dict[str, str] = dict(outputs)
        self.stack_outputs = topology.StackOutputs.from_outputs(outputs)
        try:
            self.config = ExperimentConfig.from_env(self.outputs["ExperimentConfig"])
        except ValueError as exc:
            raise SdkError(f"the ExperimentConfig output is not a valid experiment configuration: {exc}") from None
        self.aws = AwsClients(session=session, region=region, endpoint_url=endpoint_url)
        #: Event ids already handed to user code in this process (shared by every stream and the dispatcher).
        self.seen = SeenIds(seen_ids)
        self._settings = self.stack_outputs.handler_settings(self.config)
        self._wiring: Wiring | None = None
        #: The streams of their own (a private subscription each) opened and not yet collected.
        self._own_streams: weakref.WeakSet[SubscribedStream] = weakref.WeakSet()

    @property
    def name(self) -> str:
        return self.stack_outputs.experiment_name

    @property
    def input_bucket(self) -> str:
        return self.stack_outputs.input_bucket

    @property
    def results_bucket(self) -> str:
        return self.stack_outputs.results_bucket

    @property
    def rollout_queue_url(self) -> str:
        return self.stack_outputs.rollout_queue_url

    @property
    def trainer_queue_url(self) -> str:
        return self.stack_outputs.trainer_queue_url

    @property
    def bus_name(self) -> str:
        return self.stack_outputs.bus_name

    @property
    def table_name(self) -> str:
        return self.stack_outputs.table_name

    @property
    def runtime_arn(self) -> str:
        return self.stack_outputs.runtime_arn

    def client(self, service: str) -> Any:
        """The boto3 client of `service` this experiment uses (same session, region and endpoint)."""
        return self.aws.client(service)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, region={self.aws.region!r})"

    def settings(self) -> HandlerSettings:
        """The handler settings of this experiment (what the pipeline's own stages are configured with)."""
        return self._settings

    def wiring(self, runtime: AgentRuntime | None = None) -> Wiring:
        """The pipeline's stages over this experiment's clients (the composition root, `rollout_pipeline.wiring`);
        `runtime` for cancels (default: ACR, or the local pipeline's at this experiment's local endpoint)."""
        from rollout_pipeline.wiring import Wiring

        if runtime is not None:
            return Wiring(self._settings, self.aws, runtime=runtime)
        if self._wiring is None:  # built once: its stages are reused by every call (a race builds an equal one)
            self._wiring = Wiring(self._settings, self.aws)
        return self._wiring

    def ledger(self) -> Ledger:
        """The experiment's ledger (its DynamoDB table), as the SDK reads and writes it."""
        return self.wiring().ledger()

    def price_book(self) -> PriceBook:
        """The prices and session size this experiment's rollouts are costed with (`rollout_pipeline.costs`)."""
        arn = self.runtime_arn
        region = ids.runtime_region(arn) or self.aws.region
        return PriceBook.of(self.config, region, local=ids.is_local_runtime(arn))

    def fetch_result(self, result_uri: str, max_bytes: int | None = None) -> dict[str, Any]:
        """Read a result object (`s3://bucket/key`) and return it parsed (`contracts.read_result`, as completion
        reads it). `SdkError` when it is missing, larger than `max_bytes` or not a JSON object."""
        from rollout_pipeline.adapters.s3 import S3ObjectStore
        from rollout_pipeline.ports import ObjectNotFound

        try:
            bucket, key = ids.parse_s3_uri(result_uri)
        except ids.InvalidId as exc:
            raise SdkError(str(exc)) from None
        limit = max_bytes or self.config.result_max_bytes
        try:
            with aws_errors(f"read {result_uri}"):
                read = read_result(S3ObjectStore(self.client("s3")), bucket, key, max_bytes=limit)
        except ObjectNotFound as exc:
            raise AwsError(f"read {result_uri}: {exc}") from None
        if read.too_large:
            raise SdkError(f"{result_uri} is larger than {limit} bytes")
        if read.outcome.body is None:
            raise SdkError(f"{result_uri} does not hold a JSON object ({read.outcome.error})")
        return dict(read.outcome.body)

    def keep_stream(self, stream: SubscribedStream) -> None:
        """Remember a stream of its own for `close_streams` (until it is collected)."""
        self._own_streams.add(stream)

    def close_streams(self) -> None:
        """Close every event stream of its own opened on this experiment and left open (a loop that `break`s out of
        `events(batch_id=...)` leaves one until it is collected): each removes its private subscription now."""
        for stream in list(self._own_streams):
            stream.close()
