"""`Experiment`: one deployed (or local) experiment, attached by name, and everything a trainer does with it."""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rollout_pipeline import ids, topology
from rollout_pipeline.config import ExperimentConfig, HandlerSettings, SamplingParams
from rollout_pipeline.contracts import (
    DatasetRow,
    DetailType,
    FileOptions,
    read_result,
    utcnow,
)
from rollout_pipeline.sdk import route, submission, subscription
from rollout_pipeline.sdk._aws import AwsClients, aws_errors
from rollout_pipeline.sdk.aio import AsyncStream
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, DEFAULT_SEEN_IDS, EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.errors import AwsError, BatchNotFound, DatasetInvalid, ExperimentNotDeployed, SdkError
from rollout_pipeline.sdk.groups import DEFAULT_GROUP_GRACE_S, GROUP_DETAIL_TYPES, Group, GroupStream
from rollout_pipeline.sdk.stats import DEFAULT_PASS_THRESHOLD, BatchStats, FailurePolicy
from rollout_pipeline.sdk.status import BatchStatus, batch_status
from rollout_pipeline.sdk.transport import Event, QueueReader

if TYPE_CHECKING:
    from rollout_pipeline.costs import PriceBook
    from rollout_pipeline.ledger.items import RolloutSummary
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.lifecycle.cancel import CancelResult
    from rollout_pipeline.ports import AgentRuntime
    from rollout_pipeline.sdk.capacity import CapacityView
    from rollout_pipeline.sdk.client import RolloutClient
    from rollout_pipeline.sdk.cost import ExperimentCost
    from rollout_pipeline.sdk.dataset import DatasetExport, RowFilter
    from rollout_pipeline.sdk.rescore import RewardFunction
    from rollout_pipeline.sdk.warm import WarmPoolStatus
    from rollout_pipeline.wiring import Wiring

logger = logging.getLogger(__name__)

#: The experiment's CloudFormation stack and its outputs: `rollout_pipeline.topology`.
stack_name = topology.stack_name
#: Stack outputs from a JSON file (`cdk deploy --outputs-file`, `rollouts local up --write-outputs`).
read_outputs_file = route.read_outputs_file


class Experiment:
    """A handle on one experiment's resources (buckets, queues, bus, ledger), from its stack outputs.

    Create it with `Experiment.attach(name)` (reads the CloudFormation outputs once), `Experiment.from_outputs(...)`
    or `Experiment.local(endpoint_url, name=...)` (local mode: every client talks to that endpoint).
    Region and credentials come from the usual boto3 chain unless a `session` / `region` is given.
    Thread-safe: the dispatcher thread of a `RolloutClient` shares it with the caller.
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
        #: Stops what a launcher started for this experiment (local mode); None for a deployed stack.
        self._teardown: Callable[[], None] | None = None
        #: The streams of their own (a private subscription each) this object opened and not yet collected.
        self._own_streams: weakref.WeakSet[subscription.SubscribedStream] = weakref.WeakSet()

    # ---------------------------------------------------------------------------------------------- attach

    @classmethod
    def attach(
        cls, name: str, region: str | None = None, session: Any | None = None, *, endpoint_url: str | None = None
    ) -> Experiment:
        """Attach to the deployed experiment `name`: one DescribeStacks of stack `Rollouts-{name}`.

        `endpoint_url` (default `$ROLLOUTS_ENDPOINT_URL`): a local pipeline's endpoint, where `rollouts local up`
        registers the same stack. Raises `ExperimentNotDeployed` when the stack does not exist, `NoCredentials`
        without AWS credentials.
        """
        endpoint_url = route.endpoint_from_env(endpoint_url)
        try:
            ids.validate_exp_id(name)
        except ids.InvalidId as exc:
            raise SdkError(f"invalid experiment name: {exc}") from None
        aws = AwsClients(session=session, region=region, endpoint_url=endpoint_url)
        stack = stack_name(name)
        try:
            with aws_errors(f"describe stack {stack}"):
                resp = aws.client("cloudformation").describe_stacks(StackName=stack)
        except AwsError as exc:
            if "does not exist" in str(exc) or "ValidationError" in str(exc):
                if endpoint_url is not None:
                    raise ExperimentNotDeployed(
                        f"no experiment {name!r} at {endpoint_url} (start it with `rollouts local up -e {name}`, "
                        "or check the name and the endpoint `rollouts local up` printed)"
                    ) from None
                where = f" in {aws.region}" if aws.region else ""
                raise ExperimentNotDeployed(
                    f"experiment {name!r} is not deployed{where} (no stack {stack}); "
                    f"deploy it with `rollouts deploy -e {name}` (Experiment.deploy) or check --region"
                ) from None
            raise
        stacks = resp.get("Stacks") or []
        if not stacks:
            raise ExperimentNotDeployed(f"experiment {name!r} is not deployed (no stack {stack})")
        status = str(stacks[0].get("StackStatus", ""))
        if status.endswith("_FAILED") or status.startswith("DELETE") or status == "ROLLBACK_COMPLETE":
            raise ExperimentNotDeployed(f"experiment {name!r}: stack {stack} is in state {status}")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs") or []}
        return cls(outputs, session=aws.session, region=region, endpoint_url=endpoint_url)

    @classmethod
    def from_outputs(
        cls,
        outputs: route.OutputsSource,
        region: str | None = None,
        session: Any | None = None,
        *,
        endpoint_url: str | None = None,
        name: str | None = None,
    ) -> Experiment:
        """An experiment from its stack outputs: a dict (flat, or `cdk deploy --outputs-file`'s `{stack: {...}}`:
        the stack of experiment `name`, or the only one), that file's path, or its JSON text."""
        endpoint = route.endpoint_from_env(endpoint_url)
        return cls(route.stack_outputs(outputs, name), session=session, region=region, endpoint_url=endpoint)

    @classmethod
    def local(
        cls,
        endpoint_url: str | None = None,
        outputs: route.OutputsSource | None = None,
        *,
        name: str | None = None,
        region: str = "us-east-1",
        session: Any | None = None,
    ) -> Experiment:
        """An experiment in local mode: every AWS call goes to `endpoint_url` (a local pipeline's loopback AWS).

        The way `rollouts local up` prints: `Experiment.local(endpoint_url, name=NAME)` attaches by name (local
        mode registers the experiment's stack outputs at its endpoint). `outputs` instead: the outputs themselves,
        in any form `from_outputs` takes (a dict, flat or wrapped; the `--write-outputs` file's path; its JSON
        text). `endpoint_url` and `name` default to `$ROLLOUTS_ENDPOINT_URL` and `$ROLLOUTS_EXPERIMENT`.
        """
        endpoint = route.endpoint_from_env(endpoint_url)
        if endpoint is None:
            raise SdkError(
                "Experiment.local needs the endpoint URL `rollouts local up` printed (or $ROLLOUTS_ENDPOINT_URL)"
            )
        if outputs is not None:
            found = route.stack_outputs(outputs, route.experiment_from_env(name) if name is None else name)
            return cls(found, session=session, region=region, endpoint_url=endpoint)
        experiment = route.experiment_from_env(name)
        if experiment is None:
            raise SdkError(
                "Experiment.local needs the local experiment's name (name=..., or $ROLLOUTS_EXPERIMENT) or its outputs"
            )
        return cls.attach(experiment, region=region, session=session, endpoint_url=endpoint)

    # ---------------------------------------------------------------------------------------------- launch

    @classmethod
    def launch(
        cls,
        name: str,
        mode: str = "deployed",
        *,
        yes: bool = False,
        force: bool = False,
        region: str | None = None,
        session: Any | None = None,
        project_dir: str | os.PathLike[str] | None = None,
        local_options: Mapping[str, Any] | None = None,
        out: IO[str] | None = None,
        **settings: Any,
    ) -> Experiment:
        """Start experiment `name` with `settings` (`ExperimentConfig`'s fields and the stack's own keys, as
        `cdk deploy -c key=value` takes them) and return it attached, in either mode, so the same trainer code
        runs against both:

        - `mode="deployed"`: validate the settings, run the preflight, deploy the project's CDK app through its
          CDK CLI (`node_modules/.bin/cdk`, installed by `make setup`) with live progress. Nothing happens when
          the stack is up to date; changes are shown (`cdk diff`) and confirmed unless `yes=True`. An update
          refuses while rollouts are in flight (drain before upgrading) unless `force=True`; a new ledger layout
          or a new `endpoints` refuses even then (docs/deploy.md, "Upgrades").
        - `mode="local"`: start the local pipeline in this process (moto on loopback, the Lambda handlers as
          consumers, agent processes); it stops at `destroy()`, at the end of a `with` block or at exit.
          `local_options`: local mode's own settings (`LocalSettings` fields: `agent_module`, `work_dir`, ...).

        Raises `SdkError` (one line, what to do) for a bad setting, missing credentials or bootstrap, a stack in
        a failed state, a missing CLI, and `DeployFailed` naming the first resource that failed.
        """
        from rollout_pipeline.sdk.operations import operations

        return operations().launch(
            name,
            mode,
            settings,
            yes=yes,
            force=force,
            region=region,
            session=session,
            project_dir=project_dir,
            local_options=local_options,
            out=out,
        )

    @classmethod
    def deploy(cls, name: str, *, local: bool = False, yes: bool = False, **kwargs: Any) -> Experiment:
        """`Experiment.launch(name, mode="local" if local else "deployed", yes=yes, **kwargs)`."""
        return cls.launch(name, "local" if local else "deployed", yes=yes, **kwargs)

    def destroy(
        self,
        keep_results: bool = True,
        force: bool = False,
        *,
        yes: bool = True,
        project_dir: str | os.PathLike[str] | None = None,
        out: IO[str] | None = None,
    ) -> None:
        """Tear the experiment down. Local mode: stop the local pipeline. Deployed: refuse while rollouts are in
        flight or queued unless `force` (then cancel their batches first), remove the SDK's subscriptions from
        the bus, empty and delete the results bucket unless `keep_results`, then `cdk destroy` the stack. Resources
        the stack retains (`results_retention=retain`: ledger table, buckets) stay. `yes=False` asks first."""
        if self._teardown is not None:
            self._teardown()
            return
        from rollout_pipeline.sdk.operations import operations

        operations().destroy(self, keep_results=keep_results, force=force, yes=yes, project_dir=project_dir, out=out)

    def close(self) -> None:
        """Close the event streams this object opened, then stop what `launch` started for this experiment in this
        process (local mode); a deployed stack stays."""
        self.close_streams()
        if self._teardown is not None:
            self._teardown()

    def close_streams(self) -> None:
        """Close every event stream of its own this object opened and left open (a loop that `break`s out of
        `events(batch_id=...)` leaves one until it is collected): each removes its private subscription now."""
        for stream in list(self._own_streams):
            stream.close()

    def on_destroy(self, teardown: Callable[[], None]) -> None:
        """Run `teardown` on `destroy()` and `close()` instead of destroying a stack (a launcher's mode, e.g. local
        mode stopping its processes)."""
        self._teardown = teardown

    def __enter__(self) -> Experiment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ properties

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
        return f"Experiment({self.name!r}, region={self.aws.region!r})"

    def wiring(self, runtime: AgentRuntime | None = None) -> Wiring:
        """The pipeline's stages over this experiment's clients (the composition root, `rollout_pipeline.wiring`);
        `runtime` for cancels (default: ACR, or the local pipeline's at this experiment's local endpoint)."""
        from rollout_pipeline.wiring import Wiring

        if runtime is not None:
            return Wiring(self._settings, self.aws, runtime=runtime)
        if self._wiring is None:  # built once: its stages are reused by every call (a race builds an equal one)
            self._wiring = Wiring(self._settings, self.aws)
        return self._wiring

    def _ledger(self) -> Ledger:
        return self.wiring().ledger()

    # ---------------------------------------------------------------------------------------------- submit

    def submit_file(
        self,
        path: str | os.PathLike[str],
        *,
        group_size: int | None = None,
        sampling_params: Mapping[str, Any] | SamplingParams | None = None,
        timeout_s: int | None = None,
        max_attempts: int | None = None,
        policy_version: str | None = None,
        key: str | None = None,
        validate: bool = True,
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> str:
        """Upload a dataset file (`.jsonl`, `.jsonl.gz`, `.json` array) to `datasets/` and return its batch id.

        The file is validated locally first (same reader and row rules as ingestion): a bad row, or a key with
        `+`, `%` or a space, raises `DatasetInvalid` naming the file, the line and the reason, before anything is
        uploaded. Options not given
        default to the experiment's; they travel as S3 object metadata. The batch id is the one ingestion derives
        from the upload's version id, so it is known at once. `budget_usd`: the batch's own budget (its rollouts wait
        once its cost reaches it; `set_budget(..., batch=...)` raises it). `oversample`: extra rollouts per group
        (docs/lifecycle.md, "Trainer-ready groups"; default: the experiment's).
        """
        options = self.file_options(
            group_size,
            sampling_params,
            timeout_s,
            max_attempts,
            policy_version,
            budget_usd=budget_usd,
            oversample=oversample,
        )
        try:
            object_key = submission.dataset_key(path, key)
        except ids.InvalidId as exc:
            raise DatasetInvalid(str(path), [("", f"invalid_key: {exc}")]) from None
        rows = 0
        if validate:
            rows = submission.validate_file(path)
        elif not Path(path).is_file():
            raise DatasetInvalid(str(path), [("", "no such file")])
        with aws_errors(f"upload s3://{self.input_bucket}/{object_key}"), Path(path).open("rb") as body:
            resp = self.client("s3").put_object(
                Bucket=self.input_bucket,
                Key=object_key,
                Body=body,
                ContentType=submission.content_type(object_key),
                Metadata=options.to_metadata(),
            )
        # Ingestion derives the batch id from the S3 event's version id and etag: the same values PutObject returns.
        version_id = resp.get("VersionId")
        etag = str(resp.get("ETag", "")).strip('"') or None
        batch_id = ids.batch_id_for_upload(self.input_bucket, object_key, version_id, etag)
        logger.info("uploaded %s as s3://%s/%s (batch %s)", path, self.input_bucket, object_key, batch_id)
        from rollout_pipeline.feed.feed import start_warnings

        for warning in start_warnings(self.config, rows * options.rollouts_per_group):
            logger.warning("batch %s: %s", batch_id, warning)
        return batch_id

    def submit(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        group_size: int | None = None,
        sampling_params: Mapping[str, Any] | SamplingParams | None = None,
        timeout_s: int | None = None,
        max_attempts: int | None = None,
        policy_version: str | None = None,
        name: str = "sdk",
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> str:
        """Submit in-memory payloads (dataset rows: `id` and `_rollout` keys allowed) straight to the rollout queue.

        Goes through the ingestion stage's own code: batch and group items in the ledger, claim checks for big
        payloads, one rollout message per rollout, `Batch Accepted`. Returns the new batch id (`{name}-{12 hex}`).
        Invalid payloads raise `DatasetInvalid` (index and reason) before anything is written. `budget_usd`: the
        batch's own budget, and `oversample`, as for `submit_file`.
        """
        options = self.file_options(
            group_size,
            sampling_params,
            timeout_s,
            max_attempts,
            policy_version,
            budget_usd=budget_usd,
            oversample=oversample,
        )
        return self.submit_rows(submission.validate_payloads(payloads), options, name)

    def submit_rows(self, rows: Sequence[DatasetRow], options: FileOptions, name: str) -> str:
        """Submit rows validated once (`submission.validate_payloads`) as batch `name-...` with `options`
        (`file_options`); ingestion takes them as they are. Returns the batch id."""
        with aws_errors("submit payloads"):
            result = (
                self.wiring()
                .ingestion()
                .submit_rows(rows, name=name, options=options, owner=submission.new_lease_owner())
            )
        if result.batch_id is None:  # pragma: no cover - submit_rows always creates a batch
            raise SdkError("the submission created no batch")
        if result.rows_rejected:  # pragma: no cover - validated above with the same rules
            logger.warning("batch %s: %d payload(s) rejected: %s", result.batch_id, result.rows_rejected, result.errors)
        for warning in result.warnings:
            logger.warning("batch %s: %s", result.batch_id, warning)
        return result.batch_id

    def settings(self) -> HandlerSettings:
        """The handler settings of this experiment (what the pipeline's own stages are configured with)."""
        return self._settings

    def file_options(
        self,
        group_size: int | None,
        sampling_params: Mapping[str, Any] | SamplingParams | None,
        timeout_s: int | None,
        max_attempts: int | None,
        policy_version: str | None,
        *,
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> FileOptions:
        """The options of one batch: those given, the experiment's defaults for the rest (`SdkError` naming a bad
        one)."""
        try:
            return submission.file_options(
                self.config,
                group_size=group_size,
                sampling_params=sampling_params,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
                policy_version=policy_version,
                budget_usd=budget_usd,
                oversample=oversample,
            )
        except ValueError as exc:
            raise SdkError(f"invalid option {exc}") from None

    # ---------------------------------------------------------------------------------------------- events

    def events(
        self,
        batch_id: str | Iterable[str] | None = None,
        detail_types: Iterable[DetailType | str] | None = None,
        timeout: float | None = None,
        *,
        max_events: int | None = None,
        consume_others: bool = False,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
        visibility_s: int | None = None,
        from_trainer_queue: bool = False,
        from_start: bool = False,
    ) -> EventStream:
        """Iterate pipeline events as they are pushed, by long polling.

        Where they come from: the events of `batch_id` (one id or several) come through a private subscription of
        this stream's own (a rule on the experiment bus for those batches and a queue, made now and removed when
        the stream closes), preceded by the events those batches published before it existed, rebuilt from the
        ledger with the same `event_id`s: so any number of consumers of their own batches run side by side, and
        none waits behind, or wears out, another's events. Without `batch_id` (the trainer of every batch), or with
        `from_trainer_queue=True` or `consume_others=True`, events come from the experiment's trainer queue: its
        one consumer. There, events that do not match `batch_id` / `detail_types` are released for another
        consumer, or deleted with `consume_others=True`.

        Each `event_id` is handed to user code once per process; a message is deleted only after the iterator
        advanced past it (or the `with` block ended normally). Stops after `timeout` seconds (None: never) or
        `max_events` events.

        `from_start` (a stream of its own only) sets where the stream starts. False (default): where this process
        is: the batches' events no stream of this process handed over yet (those published before, then the live
        ones), each `event_id` once per process. True: the batches' first event: every event they published, then
        the live ones, each `event_id` once for this stream, also those other streams of this process handed over
        (and what it hands over counts for no other stream): a second consumer in a process sees the whole batch.
        Either way nothing is re-run. Only live events: `tap`.
        """
        event_filter = EventFilter(batch_id, detail_types)
        own_stream = event_filter.batch_ids is not None and not (from_trainer_queue or consume_others)
        if from_start and event_filter.batch_ids is None:
            raise SdkError("from_start needs the batch (or batches) to start from: pass batch_id")
        if from_start and not own_stream:
            raise SdkError(
                "from_start reads a stream of the batch's own: not with from_trainer_queue or consume_others"
            )
        if own_stream:
            batches = sorted(event_filter.batch_ids or ())
            stream = subscription.SubscribedStream(
                self.aws,
                self.bus_name,
                subscription.stream_pattern(batches, event_filter.detail_types),
                SeenIds() if from_start else self.seen,
                replay=lambda skip: self.ledger_events(batches, event_filter.detail_types, skip=skip),
                event_filter=event_filter,
                timeout=timeout,
                max_events=max_events,
                poll_wait_s=poll_wait_s,
            )
            self._own_streams.add(stream)
            return stream
        return EventStream(
            QueueReader(self.aws, self.trainer_queue_url, visibility_s=visibility_s),
            self.seen,
            event_filter=event_filter,
            timeout=timeout,
            max_events=max_events,
            consume_others=consume_others,
            poll_wait_s=poll_wait_s,
        )

    def ledger_events(
        self,
        batch_ids: Iterable[str],
        detail_types: Iterable[DetailType | str] | None = None,
        *,
        skip: Callable[[str], bool] | None = None,
    ) -> Iterator[Event]:
        """The events `batch_ids` have published so far, rebuilt from the ledger (`sdk.replay.batch_events`: same
        `event_id`s, `timings.notified_at` None, small results inlined), batch by batch and group by group as
        they are read; those whose id `skip` accepts are left out (and their results not read). What a stream of
        those batches made after them is given first."""
        from rollout_pipeline.sdk.export import quiet_fetch
        from rollout_pipeline.sdk.replay import batch_events

        types = None if detail_types is None else {DetailType(t) for t in detail_types}
        ledger = self._ledger()
        fetch = quiet_fetch(self)
        prices = self.price_book()
        with aws_errors("read the batch's events from the ledger"):
            for batch in batch_ids:
                yield from batch_events(ledger, batch, detail_types=types, skip=skip, fetch_result=fetch, prices=prices)

    def aevents(
        self,
        batch_id: str | Iterable[str] | None = None,
        detail_types: Iterable[DetailType | str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> AsyncStream:
        """`events()` for asyncio: `async for event in experiment.aevents(...)` (receives run in a thread)."""
        return AsyncStream(self.events(batch_id, detail_types, timeout, **kwargs))

    def tap(
        self,
        batch_id: str | None = None,
        detail_types: Iterable[DetailType | str] | None = None,
        timeout: float | None = None,
        *,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
    ) -> AbstractContextManager[EventStream]:
        """Observe events without taking them from the trainer: a private queue subscribed to the bus.

        Creates an SQS queue and a rule on the experiment bus (matching `batch_id` if given) for the duration of
        the `with` block, and deletes both afterwards. Only events published after it starts are seen (a stream
        that also has the earlier ones: `events(batch_id)`). Needs
        `sqs:CreateQueue`/`DeleteQueue`/`SetQueueAttributes` and `events:PutRule`/`PutTargets`/`RemoveTargets`/
        `DeleteRule`. `rollouts watch` uses it so that watching never steals the trainer's events.
        """
        return subscription.tap(self.aws, self.bus_name, batch_id, detail_types, timeout, poll_wait_s=poll_wait_s)

    def open_subscription(
        self, pattern: Mapping[str, Any], *, suffix: str, retention_s: int = 3600, kind: str | None = None
    ) -> tuple[str, str]:
        """A private SQS queue subscribed to the experiment bus by a rule with `pattern`; returns (name, queue URL).

        Rule and queue are tagged with `kind` (default: the suffix's first word), this process as owner and the
        creation time (`prune_subscriptions` finds them by these). Close it with `close_subscription(name,
        queue_url)`. Needs `sqs:CreateQueue`/`TagQueue`/`DeleteQueue`/`SetQueueAttributes` and `events:PutRule`/
        `TagResource`/`PutTargets`/`RemoveTargets`/`DeleteRule`.
        """
        return subscription.open_subscription(
            self.aws, self.bus_name, pattern, suffix=suffix, retention_s=retention_s, kind=kind
        )

    def close_subscription(self, name: str, queue_url: str) -> None:
        """Remove a subscription made by `open_subscription` (best effort: failures are logged)."""
        subscription.close_subscription(self.aws, self.bus_name, name, queue_url)

    def touch_subscription(self, queue_url: str) -> None:
        """Mark a subscription of this process as alive (its queue's `rollouts:seen-at` tag), so that a prune with
        `older_than_s` shorter than its life does not remove it."""
        subscription.touch_subscription(self.aws, queue_url)

    def list_subscriptions(self) -> list[subscription.Subscription]:
        """The private subscriptions (tap, ART, smoke) on the experiment bus, with owner and last-seen time."""
        from rollout_pipeline.sdk.operations import operations

        return operations().list_subscriptions(self)

    def prune_subscriptions(
        self,
        older_than_s: float,
        *,
        dry_run: bool = False,
        kinds: Iterable[str] | None = None,
        skip_recent: bool = False,
    ) -> list[subscription.PruneResult]:
        """Remove the private subscriptions not seen for `older_than_s` seconds (left by killed trainers and
        watchers: they count toward the bus's 300 rules and block `cdk destroy`), rule targets first, then the rule,
        then the queue. `dry_run`: only report. `kinds`: only these kinds (`tap`, `art`, `smoke`). `skip_recent`:
        do not even look at rules created less than `older_than_s` ago (one ListRules call for them)."""
        from rollout_pipeline.sdk.operations import operations

        return operations().prune_subscriptions(
            self, older_than_s, dry_run=dry_run, kinds=kinds, skip_recent=skip_recent
        )

    def subscribe(
        self,
        handler: Callable[[Event], Any],
        batch_id: str | Iterable[str] | None = None,
        detail_types: Iterable[DetailType | str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> int:
        """Call `handler(event)` for each event; a message is deleted only after the handler returned.

        A handler that raises leaves its message for redelivery and the exception propagates. Returns the number
        of events handled (when `timeout` / `max_events` ended the subscription).
        """
        stream = self.events(batch_id, detail_types, timeout, **kwargs)
        with stream:
            for event in stream:
                handler(event)
        return stream.handed

    def groups(
        self,
        batch_id: str,
        timeout: float | None = None,
        *,
        grace_s: float = DEFAULT_GROUP_GRACE_S,
        stop_on_batch_completed: bool = True,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
        consume_others: bool = False,
        from_trainer_queue: bool = False,
        from_start: bool = False,
    ) -> GroupStream:
        """Complete GRPO groups of a batch as they complete (`Group Completed` + its per-rollout events), from a
        private subscription of the batch (see `events`), the groups completed before it first.

        Ends when `Batch Completed` for the batch arrives (unless `stop_on_batch_completed=False`) or after
        `timeout` seconds. `from_start=True`: every group of the batch, also those another stream of this process
        handed over (`events(from_start=True)`).
        """
        stream = self.events(
            batch_id,
            GROUP_DETAIL_TYPES,
            timeout,
            consume_others=consume_others,
            poll_wait_s=poll_wait_s,
            from_trainer_queue=from_trainer_queue,
            from_start=from_start,
        )
        return GroupStream(stream, grace_s=grace_s, stop_on_batch_completed=stop_on_batch_completed)

    def agroups(self, batch_id: str, timeout: float | None = None, **kwargs: Any) -> AsyncStream:
        """`groups()` for asyncio: `async for group in experiment.agroups(batch_id)`."""
        return AsyncStream(self.groups(batch_id, timeout, **kwargs))

    # ---------------------------------------------------------------------------------------------- status

    def status(self, batch_id: str) -> BatchStatus:
        """Where a batch stands, from the ledger: queued, running, succeeded, failed by reason, reward mean/std."""
        with aws_errors(f"read batch {batch_id}"):
            item = self._ledger().batches.read_batch(batch_id)
            if item is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self.name!r}")
            states = Counter(r.state for r in self.rollout_states(batch_id, states_only=True))
        return batch_status(item, states)

    def rollout_states(self, batch_id: str, *, states_only: bool = False) -> Iterator[RolloutSummary]:
        """Each dispatched rollout of a batch as the ledger holds it: state, ids, reward, failure reason (with
        `states_only`, the state alone: a smaller read). Rollouts not yet dispatched have no entry."""
        with aws_errors(f"read the rollouts of batch {batch_id}"):
            yield from self._ledger().rollouts.rollout_summaries(batch_id, states_only=states_only)

    def cancel(self, batch_id: str, runtime: AgentRuntime | None = None) -> CancelResult:
        """Cancel a batch: queued rollouts are never started, running ones are stopped (through `runtime`, by
        default ACR with this experiment's session) and every rollout ends once as `Rollout Failed` (cancelled).
        Idempotent; returns the lifecycle stage's report (counts)."""
        from rollout_pipeline.lifecycle.cancel import cancel_batch

        with aws_errors(f"cancel batch {batch_id}"):
            item = self._ledger().batches.read_batch(batch_id)
            if item is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self.name!r}")
            report = cancel_batch(batch_id, self.wiring(runtime).lifecycle())
        if not report.found:
            raise SdkError(f"batch {batch_id!r} cannot be cancelled: it was rejected as a whole (see `status`)")
        return report

    def cancel_rollout(self, batch_id: str, input_id: str, index: int = 0, runtime: AgentRuntime | None = None) -> str:
        """Cancel one rollout (stop its session, end it as `Rollout Failed` / cancelled); the rest of its batch goes
        on. Returns "cancelled" or "already_terminal"."""
        from rollout_pipeline.lifecycle.cancel import cancel_rollout

        with aws_errors(f"cancel rollout {input_id}#{index} of batch {batch_id}"):
            deps = self.wiring(runtime).lifecycle()
            return cancel_rollout(exp_id=self.name, batch_id=batch_id, input_id=input_id, index=index, deps=deps)

    # ------------------------------------------------------------------------------------------ warm pool

    def warm_pool(self) -> WarmPoolStatus:
        """The warm pool now (`warm_sessions`): what it holds, whether it is halted, what it has spent and what its
        idle memory costs."""
        from rollout_pipeline.sdk.warm import WarmPoolStatus

        with aws_errors("read the warm pool"):
            ledger = self._ledger()
            state, sessions = ledger.warm.pool(), ledger.warm.sessions()
        return WarmPoolStatus.of(self.config, state, sessions, utcnow().timestamp(), self.price_book())

    def stop_warm_pool(self, runtime: AgentRuntime | None = None, *, reason: str = "stopped") -> int:
        """Stop every warm session now and keep none (through `runtime`, by default ACR): until the next batch
        (`reason` "stopped", "cancelled"), or for good ("destroyed": `destroy` does it before the stack goes).
        Returns how many were stopped."""
        from rollout_pipeline.lifecycle.warm_pool import WarmPool

        with aws_errors("stop the warm pool"):
            return WarmPool(self.wiring(runtime).lifecycle()).halt(reason)

    # ---------------------------------------------------------------------------------------------- results

    def fetch_result(self, result_uri: str, max_bytes: int | None = None) -> dict[str, Any]:
        """Read a result object (`s3://bucket/key`) and return it parsed (`contracts.read_result`, as completion
        reads it). `SdkError` when it is missing, larger than `max_bytes` or not a JSON object."""
        from rollout_pipeline.adapters.s3 import S3ObjectStore
        from rollout_pipeline.ports import ObjectNotFound

        bucket, key = parse_s3_uri(result_uri)
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

    def export(
        self,
        batch_id: str | Iterable[str] | None,
        out: str | os.PathLike[str] | IO[str],
        *,
        include_results: bool = True,
        include_payload: bool = False,
        format: str = "jsonl",
        **dataset_options: Any,
    ) -> int:
        """Export batches from the ledger (+ their result objects); return the rows written.

        `format="jsonl"`: one JSON line per rollout to `out` (a path, `-` for stdout, or a text stream).
        `format="parquet"`: the rollout dataset (docs/datasets.md, "The rollout dataset") in the directory `out`
        (`export_dataset`, whose options `dataset_options` are: `variance_only`, `succeeded_only`, `min_reward`,
        `result_fields`, `overwrite`); needs pyarrow (`pip install 'rollout-pipeline[data]'`). `batch_id`: one id,
        several, or None for every batch of the experiment.
        """
        if format == "parquet":
            if not isinstance(out, str | os.PathLike):
                raise SdkError("format='parquet' writes a directory: give its path")
            return self.export_dataset(batch_id, out, include_results=include_results, **dataset_options).rows
        if format != "jsonl":
            raise SdkError(f"format must be jsonl or parquet (got {format!r})")
        if dataset_options:
            raise SdkError(f"{', '.join(sorted(dataset_options))}: only with format='parquet'")
        from rollout_pipeline.sdk.export import export_rows, quiet_fetch, resolve_batches, write_jsonl

        batches = resolve_batches(self, batch_id)
        ledger = self._ledger()
        prices = self.price_book()

        def rows() -> Iterator[dict[str, Any]]:
            for batch in batches:
                yield from export_rows(
                    groups=ledger.groups.batch_groups(batch),
                    rollouts=ledger.rollouts.batch_rollouts(batch),
                    prices=prices,
                    fetch_result=quiet_fetch(self) if include_results else None,
                    include_payload=include_payload,
                )

        with aws_errors(f"export {len(batches)} batch(es)"):
            if isinstance(out, str | os.PathLike):
                if str(out) == "-":
                    return write_jsonl(rows(), sys.stdout)
                with Path(out).open("w", encoding="utf-8") as handle:
                    return write_jsonl(rows(), handle)
            return write_jsonl(rows(), out)

    def export_dataset(
        self,
        batch_id: str | Iterable[str] | None,
        directory: str | os.PathLike[str],
        *,
        include_results: bool = True,
        variance_only: bool = False,
        succeeded_only: bool = False,
        min_reward: float | None = None,
        result_fields: Sequence[str] = (),
        overwrite: bool = False,
    ) -> DatasetExport:
        """Write the rollout dataset of one batch, several, or every batch (None) to `directory`: one Parquet file
        per batch under `data/` (row groups written as they are read: memory stays bounded) and a dataset card
        `README.md`. One row per rollout, schema `sdk.dataset.COLUMNS` (docs/datasets.md); failures are rows with
        their typed reason and a null reward. Filters: `variance_only` (groups whose rewards differ),
        `succeeded_only`, `min_reward` (reward >= it). `result_fields`: top-level fields of the result object to add
        as columns `result_{field}`. A directory that is not empty is refused unless `overwrite`. Needs pyarrow."""
        from rollout_pipeline.sdk.export import export_dataset

        row_filter = _row_filter(variance_only, succeeded_only, min_reward)
        return export_dataset(
            self,
            batch_id,
            directory,
            include_results=include_results,
            row_filter=row_filter,
            result_fields=result_fields,
            overwrite=overwrite,
        )

    def rescore(
        self,
        batch_id: str | Iterable[str] | None,
        reward: str | RewardFunction,
        directory: str | os.PathLike[str],
        *,
        variance_only: bool = False,
        succeeded_only: bool = False,
        min_reward: float | None = None,
        result_fields: Sequence[str] = (),
        overwrite: bool = False,
    ) -> DatasetExport:
        """Re-score stored rollouts with `reward` (a function `(row, result) -> number | per-turn list`, or its
        `module:function` / `file.py:function` name) and write the dataset as `export_dataset` does, with the new
        rewards, group statistics and advantages, and the agent's beside them (`original_*`). Runs no agent and
        writes nothing to the ledger, the buckets or the bus. A row whose function raised is marked
        (`rescore_error`) and counted (`DatasetExport.failed`, the first ones in `errors`); the run goes on."""
        from rollout_pipeline.sdk.export import export_dataset, quiet_payload
        from rollout_pipeline.sdk.rescore import Rescorer, load_reward_function

        if isinstance(reward, str):
            function, name = load_reward_function(reward)
        else:
            function, name = reward, f"{getattr(reward, '__module__', '?')}:{getattr(reward, '__qualname__', '?')}"
        row_filter = _row_filter(variance_only, succeeded_only, min_reward)
        return export_dataset(
            self,
            batch_id,
            directory,
            row_filter=row_filter,
            result_fields=result_fields,
            overwrite=overwrite,
            rescorer=Rescorer(function, load_payload=quiet_payload(self)),
            rescored_with=name,
        )

    def stats(
        self,
        batch_id: str,
        *,
        pass_k: Sequence[int] = (),
        threshold: float = DEFAULT_PASS_THRESHOLD,
        failures: FailurePolicy = "exclude",
    ) -> BatchStats:
        """A batch's rewards, groups with reward variance and pass@k for each k of `pass_k` (the unbiased estimator
        of Chen et al. 2021, per input, averaged over the inputs with at least k samples; a sample passes when its
        reward >= `threshold`; failed rollouts are not samples unless `failures="fail"`), from the group items."""
        from rollout_pipeline.sdk.stats import batch_stats

        with aws_errors(f"read the groups of batch {batch_id}"):
            ledger = self._ledger()
            if ledger.batches.read_batch(batch_id) is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self.name!r}")
            try:
                return batch_stats(
                    batch_id, ledger.groups.batch_groups(batch_id), ks=pass_k, threshold=threshold, failures=failures
                )
            except ValueError as exc:
                raise SdkError(str(exc)) from None

    def capacity(self) -> CapacityView:
        """The account pool this experiment shares AgentCore's quotas through (one read): the account's quotas,
        the reserve, the backoff, and every experiment's weight, fair share, grant, recent use and throttles
        (`rollouts capacity`; `CapacityView.lines()` prints it)."""
        from rollout_pipeline.sdk.capacity import read_capacity
        from rollout_pipeline.topology import POOL_TABLE_NAME

        table = self.stack_outputs.pool_table_name or POOL_TABLE_NAME
        with aws_errors("read the account pool"):
            return read_capacity(table, self.aws.client("dynamodb"), self.aws.region)

    def set_policy_version(self, version: str | None) -> None:
        """Advance the experiment's current policy version (an async trainer, after each weight sync): rollouts
        dispatched from now on are stamped with it (`policy_version` on their events; the batch's own version, when
        different, as `batch_policy_version`), so stale rollouts can be dropped or corrected. None clears it."""
        from rollout_pipeline.contracts import iso

        if version is not None and not 0 < len(version) <= 128:
            raise SdkError("a policy version is 1-128 characters")
        with aws_errors("set the current policy version"):
            self._ledger().limits.set_current_policy_version(version, iso(utcnow()))

    # ---------------------------------------------------------------------------------------------- cost

    def price_book(self) -> PriceBook:
        """The prices and session size this experiment's rollouts are costed with (`rollout_pipeline.costs`)."""
        from rollout_pipeline.costs import PriceBook

        arn = self.runtime_arn
        region = ids.runtime_region(arn) or self.aws.region
        return PriceBook.of(self.config, region, local=ids.is_local_runtime(arn))

    def recent_batches(self, limit: int = 20) -> list[str]:
        """The ids of the experiment's newest batches, newest first (at most `limit`; an index read: a batch created
        a moment ago may be missing)."""
        with aws_errors("list the experiment's batches"):
            return self._ledger().batches.recent_batch_ids(limit)

    def cost(self, batch: str | None = None, *, limit: int = 20) -> ExperimentCost:
        """What the experiment cost: its spend (every ended session's cost, exact at its confirmed stop: what the
        budget is held to) and budget, and per batch the sum its events carried and its rollouts priced again now
        (`sdk.cost`). `batch`: that batch only; else the `limit` newest batches."""
        from rollout_pipeline.sdk.cost import ExperimentCost, batch_cost

        book = self.price_book()
        with aws_errors("read the experiment's cost"):
            ledger = self._ledger()
            in_flight, spent = ledger.limits.slots_and_spend()
            ids_ = [batch] if batch is not None else ledger.batches.recent_batch_ids(limit)
            batches = []
            now = utcnow()
            for batch_id in ids_:
                view = ledger.batches.read_batch(batch_id)
                if view is None:
                    if batch is not None:
                        raise BatchNotFound(f"no batch {batch_id!r} in experiment {self.name!r}")
                    continue
                batches.append(batch_cost(view, ledger.rollouts.batch_rollouts(batch_id), book, now))
            budget = self.budget()
        return ExperimentCost(
            experiment=self.name,
            priced_as=book.label,
            fallback=book.fallback,
            spent_usd=spent,
            budget_usd=budget,
            sessions_in_flight=in_flight,
            batches=batches,
        )

    def budget(self) -> float | None:
        """The experiment's budget (USD): the one set with `set_budget`, else the deployed `budget_usd`."""
        with aws_errors("read the budget"):
            state = self._ledger().limits.budget()
        return state.budget_usd if state.budget_usd is not None else self.config.budget_usd

    def set_budget(self, budget_usd: float, *, batch: str | None = None) -> None:
        """Set the experiment's budget (USD), or `batch`'s own. Dispatch pauses while the spend is at or above it and
        resumes, where it stopped, once it is raised above the spend (within `budget_recheck_s`, a minute by
        default): held rollouts come back by themselves."""
        from rollout_pipeline.contracts import iso

        if not budget_usd > 0:
            raise SdkError(f"a budget is a positive number of US dollars, got {budget_usd!r}")
        with aws_errors("set the budget"):
            ledger = self._ledger()
            if batch is None:
                ledger.limits.set_budget(float(budget_usd), iso(utcnow()))
            elif not ledger.batches.set_budget(batch, float(budget_usd)):
                raise BatchNotFound(f"no batch {batch!r} in experiment {self.name!r}")

    def completed_groups(
        self,
        batch_id: str,
        *,
        skip: Iterable[str] = (),
        include_results: bool = True,
    ) -> list[Group]:
        """Resume after a trainer crash: every group of the batch whose rollouts are all terminal, in one call,
        rebuilt from the ledger (and the results bucket), never by re-running a rollout.

        Each `Group` holds the `Group Completed` detail (per-member status, failure reason, dispatched policy
        version) and every member's `Rollout Completed` / `Rollout Failed` detail, with the same `event_id`s the
        pipeline published, so a trainer that also re-attaches to the event stream can de-duplicate by id.
        `skip`: input ids the trainer already handled (checkpointed). `include_results`: inline each successful
        rollout's result object (one S3 GET per rollout). Raises `BatchNotFound` for an unknown batch.
        """
        from rollout_pipeline.sdk.replay import group_events

        skipped = set(skip)
        groups: list[Group] = []
        prices = self.price_book()
        with aws_errors(f"read the completed groups of batch {batch_id}"):
            ledger = self._ledger()
            batch = ledger.batches.read_batch(batch_id)
            if batch is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self.name!r}")
            options = batch.options
            for group_item in ledger.groups.batch_groups(batch_id):
                if group_item.input_id in skipped or not group_item.complete:
                    continue
                rollouts, completed = group_events(
                    group_item,
                    ledger.rollouts.iter_rollouts(batch_id, group_item.input_id),
                    policy_version=options.policy_version if options else None,
                    fetch_result=self.fetch_result if include_results else None,
                    inline_limit=None,
                    prices=prices,
                )
                if completed is None:
                    continue
                groups.append(Group(completed=completed, rollouts={r.index: r for r in rollouts}))
        return groups

    # ------------------------------------------------------------------------------------------ ART-style

    def rollout_client(self, **defaults: Any) -> RolloutClient:
        """An ART-style client (`invoke`, `run_batch`, futures) over this experiment; see `RolloutClient`."""
        from rollout_pipeline.sdk.client import RolloutClient

        return RolloutClient(self, **defaults)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key); `SdkError` for anything else."""
    try:
        return ids.parse_s3_uri(uri)
    except ids.InvalidId as exc:
        raise SdkError(str(exc)) from None


def _row_filter(variance_only: bool, succeeded_only: bool, min_reward: float | None) -> RowFilter:
    """The dataset's row filter from `export`/`rescore`'s options; a bad combination is an SdkError."""
    from rollout_pipeline.sdk.dataset import RowFilter

    try:
        return RowFilter(variance_only, succeeded_only, min_reward)
    except ValueError as exc:
        raise SdkError(str(exc)) from None
