"""Pipeline events: the SDK's event classes (their stable import path) and `exp.events`, the experiment's events
topic (streams of pushed events, GRPO groups, taps, what the ledger rebuilds), with `exp.subscriptions` (the private
subscriptions on the experiment bus).

The code of the classes lives in one module per concern: `transport` (envelopes; SQS receive, delete, redeliver),
`delivery` (the delivery rules: `EventStream`, `EventFilter`, `SeenIds`), `groups` (GRPO groups and advantages),
`aio` (asyncio views), `subscription` (private subscriptions) and `replay` (events rebuilt from the ledger).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.sdk import subscription
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.aio import AsyncStream
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, DEFAULT_SEEN_IDS, EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.errors import BatchNotFound, SdkError
from rollout_pipeline.sdk.groups import (
    DEFAULT_GROUP_GRACE_S,
    DEFAULT_MAX_BUFFERED_ROLLOUTS,
    GROUP_DETAIL_TYPES,
    Group,
    GroupStream,
)
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.transport import AnyDetail, Delivery, Event, QueueReader, RolloutDetail, parse_envelope

__all__ = [
    "DEFAULT_GROUP_GRACE_S",
    "DEFAULT_MAX_BUFFERED_ROLLOUTS",
    "DEFAULT_POLL_WAIT_S",
    "DEFAULT_SEEN_IDS",
    "GROUP_DETAIL_TYPES",
    "AnyDetail",
    "AsyncStream",
    "Delivery",
    "Event",
    "EventFilter",
    "EventStream",
    "Events",
    "Group",
    "GroupStream",
    "QueueReader",
    "RolloutDetail",
    "SeenIds",
    "Subscriptions",
    "parse_envelope",
]


class Events:
    """The events of one experiment (`exp.events`). Calling it opens a stream: `exp.events(batch_id, ...)`."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def __call__(
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
        exp = self._exp
        if own_stream:
            batches = sorted(event_filter.batch_ids or ())
            stream = subscription.SubscribedStream(
                exp.aws,
                exp.bus_name,
                subscription.stream_pattern(batches, event_filter.detail_types),
                SeenIds() if from_start else exp.seen,
                replay=lambda skip: self.replay(batches, event_filter.detail_types, skip=skip),
                event_filter=event_filter,
                timeout=timeout,
                max_events=max_events,
                poll_wait_s=poll_wait_s,
            )
            exp.keep_stream(stream)
            return stream
        return EventStream(
            QueueReader(exp.aws, exp.trainer_queue_url, visibility_s=visibility_s),
            exp.seen,
            event_filter=event_filter,
            timeout=timeout,
            max_events=max_events,
            consume_others=consume_others,
            poll_wait_s=poll_wait_s,
        )

    def aio(
        self,
        /,
        batch_id: str | Iterable[str] | None = None,
        detail_types: Iterable[DetailType | str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> AsyncStream:
        """The stream for asyncio: `async for event in exp.events.aio(...)` (receives run in a thread)."""
        return AsyncStream(self(batch_id, detail_types, timeout, **kwargs))

    def subscribe(
        self,
        /,
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
        stream = self(batch_id, detail_types, timeout, **kwargs)
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
        private subscription of the batch (see `exp.events(...)`), the groups completed before it first.

        Ends when `Batch Completed` for the batch arrives (unless `stop_on_batch_completed=False`) or after
        `timeout` seconds. `from_start=True`: every group of the batch, also those another stream of this process
        handed over.
        """
        stream = self(
            batch_id,
            GROUP_DETAIL_TYPES,
            timeout,
            consume_others=consume_others,
            poll_wait_s=poll_wait_s,
            from_trainer_queue=from_trainer_queue,
            from_start=from_start,
        )
        return GroupStream(stream, grace_s=grace_s, stop_on_batch_completed=stop_on_batch_completed)

    def agroups(self, /, batch_id: str, timeout: float | None = None, **kwargs: Any) -> AsyncStream:
        """`groups()` for asyncio: `async for group in exp.events.agroups(batch_id)`."""
        return AsyncStream(self.groups(batch_id, timeout, **kwargs))

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
        that also has the earlier ones: `exp.events(batch_id)`). Needs
        `sqs:CreateQueue`/`DeleteQueue`/`SetQueueAttributes` and `events:PutRule`/`PutTargets`/`RemoveTargets`/
        `DeleteRule`. `rollouts watch` uses it so that watching never steals the trainer's events.
        """
        exp = self._exp
        return subscription.tap(exp.aws, exp.bus_name, batch_id, detail_types, timeout, poll_wait_s=poll_wait_s)

    def replay(
        self,
        batch_ids: Iterable[str],
        detail_types: Iterable[DetailType | str] | None = None,
        *,
        skip: Callable[[str], bool] | None = None,
    ) -> Iterator[Event]:
        """The events `batch_ids` have published so far, rebuilt from the ledger (`sdk.replay.batch_events`: same
        `event_id`s, `timings.notified_at` None, small results inlined), after the experiment-wide ones still in
        force (`sdk.replay.experiment_events`), batch by batch and group by group as they are read; those whose id
        `skip` accepts are left out (and their results not read). What a stream of those batches made after them
        is given first."""
        from rollout_pipeline.sdk.export import quiet_fetch
        from rollout_pipeline.sdk.replay import batch_events, experiment_events

        types = None if detail_types is None else {DetailType(t) for t in detail_types}
        ledger = self._exp.ledger()
        fetch = quiet_fetch(self._exp)
        prices = self._exp.price_book()
        with aws_errors("read the batch's events from the ledger"):
            yield from experiment_events(ledger, detail_types=types, skip=skip)
            for batch in batch_ids:
                yield from batch_events(ledger, batch, detail_types=types, skip=skip, fetch_result=fetch, prices=prices)

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
        prices = self._exp.price_book()
        with aws_errors(f"read the completed groups of batch {batch_id}"):
            ledger = self._exp.ledger()
            batch = ledger.batches.read_batch(batch_id)
            if batch is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self._exp.name!r}")
            options = batch.options
            for group_item in ledger.groups.batch_groups(batch_id):
                if group_item.input_id in skipped or not group_item.complete:
                    continue
                rollouts, completed = group_events(
                    group_item,
                    ledger.rollouts.iter_rollouts(batch_id, group_item.input_id),
                    policy_version=options.policy_version if options else None,
                    fetch_result=self._exp.fetch_result if include_results else None,
                    inline_limit=None,
                    prices=prices,
                )
                if completed is None:
                    continue
                groups.append(Group(completed=completed, rollouts={r.index: r for r in rollouts}))
        return groups


class Subscriptions:
    """The private subscriptions on the experiment bus (`exp.subscriptions`): a rule and an SQS queue each, what a
    tap, a stream of some batches and the ART backend read."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def open(
        self, pattern: Mapping[str, Any], *, suffix: str, retention_s: int = 3600, kind: str | None = None
    ) -> tuple[str, str]:
        """A private SQS queue subscribed to the experiment bus by a rule with `pattern`; returns (name, queue URL).

        Rule and queue are tagged with `kind` (default: the suffix's first word), this process as owner and the
        creation time (`prune` finds them by these). Remove it with `close(name, queue_url)`. Needs
        `sqs:CreateQueue`/`TagQueue`/`DeleteQueue`/`SetQueueAttributes` and `events:PutRule`/`TagResource`/
        `PutTargets`/`RemoveTargets`/`DeleteRule`.
        """
        exp = self._exp
        return subscription.open_subscription(
            exp.aws, exp.bus_name, pattern, suffix=suffix, retention_s=retention_s, kind=kind
        )

    def close(self, name: str, queue_url: str) -> None:
        """Remove a subscription made by `open` (best effort: failures are logged)."""
        subscription.close_subscription(self._exp.aws, self._exp.bus_name, name, queue_url)

    def touch(self, queue_url: str) -> None:
        """Mark a subscription of this process as alive (its queue's `rollouts:seen-at` tag), so that a prune with
        `older_than_s` shorter than its life does not remove it."""
        subscription.touch_subscription(self._exp.aws, queue_url)

    def list(self) -> list[subscription.Subscription]:
        """The private subscriptions (tap, ART, smoke) on the experiment bus, with owner and last-seen time."""
        from rollout_pipeline.sdk.operations import operations

        return operations().list_subscriptions(self._exp)

    def prune(
        self,
        older_than_s: float,
        *,
        dry_run: bool = False,
        kinds: Iterable[str] | None = None,
        skip_recent: bool = False,
    ) -> builtins.list[subscription.PruneResult]:
        """Remove the private subscriptions not seen for `older_than_s` seconds (left by killed trainers and
        watchers: they count toward the bus's 300 rules and block `cdk destroy`), rule targets first, then the rule,
        then the queue. `dry_run`: only report. `kinds`: only these kinds (`tap`, `art`, `smoke`). `skip_recent`:
        do not even look at rules created less than `older_than_s` ago (one ListRules call for them)."""
        from rollout_pipeline.sdk.operations import operations

        return operations().prune_subscriptions(
            self._exp, older_than_s, dry_run=dry_run, kinds=kinds, skip_recent=skip_recent
        )
