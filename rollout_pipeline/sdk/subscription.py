"""Private subscriptions to an experiment's event bus: an SQS queue plus a rule, made and removed by the SDK.
`tap` (what `rollouts watch` reads), the SDK's streams of some batches (`SubscribedStream`: `Experiment.events(
batch_id=...)`, `groups`, a `RolloutClient`) and the ART backend's per-process queues are built on them.

Each rule and queue is tagged at creation with its kind (`tap`, `art`, ...), its owner (user, host and process) and
its creation time; the owner refreshes the queue's `rollouts:seen-at` while it works (`touch_subscription`). A process
that is killed leaves both behind: they count toward the bus's 300 rules and block `cdk destroy` (a bus with rules
cannot be deleted). Finding and pruning them is operator code (`rollout_pipeline.ops.subscriptions`), which
`Experiment.list_subscriptions` / `prune_subscriptions` reach; what they return (`Subscription`, `PruneResult`) is
defined here.
"""

from __future__ import annotations

import atexit
import getpass
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from rollout_pipeline.contracts import EVENT_SOURCE, DetailType
from rollout_pipeline.sdk._aws import AwsClients, aws_errors, error_code
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.replay import CatchUpStream, Replay
from rollout_pipeline.sdk.transport import QueueReader

logger = logging.getLogger(__name__)

#: Tags every subscription's rule and queue carry (the queue's `seen-at` is refreshed by its owner).
TAG_KIND: Final = "rollouts:subscription"
TAG_OWNER: Final = "rollouts:owner"
TAG_CREATED: Final = "rollouts:created-at"
TAG_SEEN: Final = "rollouts:seen-at"
#: The owner refreshes `seen-at` at most this often.
TOUCH_INTERVAL_S: Final = 3600.0
#: The kind (and name prefix, `{bus}-sdk-{8 hex}`) of the SDK's own streams (`SubscribedStream`).
SDK_KIND: Final = "sdk"
#: A stream's queue keeps undelivered events as long as SQS allows (14 days; it has no dead-letter queue, so unlike
#: the trainer queue it need not leave room for one): a trainer may stop reading for a long training step.
STREAM_RETENTION_S: Final = 14 * 86_400
#: Seconds after a stream's subscription is made at which the ledger is read again for events its rule may have
#: missed: EventBridge says "incoming events might not immediately start matching to new or updated rules" (PutRule,
#: API reference) and gives no bound; the events due by then are in the ledger (docs/aws-facts.md).
RECONCILE_AFTER_S: Final = (10.0, 60.0, 300.0)
#: Characters EventBridge and SQS accept in tag values (others become `_`).
_TAG_VALUE_UNSAFE: Final = re.compile(r"[^A-Za-z0-9 _.:/=+@-]")
ACCESS_DENIED: Final = frozenset({"AccessDenied", "AccessDeniedException"})
#: The `batch_id` of experiment-wide events (the experiment's `Budget Warning` / `Budget Exhausted`): every stream of
#: some batches gets them too.
EXPERIMENT_WIDE: Final = ""


@contextmanager
def tap(
    aws: AwsClients,
    bus_name: str,
    batch_id: str | None,
    detail_types: Iterable[DetailType | str] | None,
    timeout: float | None,
    *,
    poll_wait_s: float,
) -> Iterator[EventStream]:
    """An `EventStream` over a private subscription matching `batch_id` (all batches: None), removed on exit."""
    pattern: dict[str, Any] = {"source": [EVENT_SOURCE]}
    if batch_id is not None:  # and the experiment-wide events (batch_id "": the experiment's budget)
        pattern["detail"] = {"batch_id": [batch_id, EXPERIMENT_WIDE]}
    name, queue_url = open_subscription(aws, bus_name, pattern, suffix=f"tap-{uuid.uuid4().hex[:8]}", kind="tap")
    try:
        stream = EventStream(
            QueueReader(aws, queue_url),
            SeenIds(),
            event_filter=EventFilter(batch_id, detail_types),
            timeout=timeout,
            consume_others=True,  # the queue is ours alone
            poll_wait_s=poll_wait_s,
        )
        with stream:
            yield stream
    finally:
        close_subscription(aws, bus_name, name, queue_url)


class SubscribedStream(CatchUpStream):
    """A `CatchUpStream` over a private subscription of its own (a rule matching `pattern` on the bus, and a queue),
    made at construction and removed at `close()` (or when the stream is garbage-collected, or at exit).

    Events published before the rule matched are not in its queue: `replay(skip)` supplies them from the ledger
    (`sdk.replay.batch_events`, same `event_id`s), at the first read, again at `RECONCILE_AFTER_S` after the
    subscription was made, and when a `Batch Completed` arrives (the ledger then holds everything of that batch).
    Each `event_id` is handed over once, whichever copy comes first (`CatchUpStream`). The queue is this stream's
    alone: events it does not want are deleted, never left to wear out (`consume_others`). The owner's `seen-at`
    tag is refreshed while it reads.
    """

    def __init__(
        self,
        aws: AwsClients,
        bus_name: str,
        pattern: Mapping[str, Any],
        seen: SeenIds,
        *,
        replay: Replay | None = None,
        event_filter: EventFilter | None = None,
        timeout: float | None = None,
        max_events: int | None = None,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
        reconcile_after_s: Sequence[float] = RECONCILE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        name, queue_url = open_subscription(
            aws, bus_name, pattern, suffix=f"{SDK_KIND}-{uuid.uuid4().hex[:8]}", retention_s=STREAM_RETENTION_S
        )
        self.subscription = (name, queue_url)
        self._remove = weakref.finalize(self, _remove_collected, aws, bus_name, name, queue_url)
        self._remove.atexit = False  # `_close_open_streams` closes what is still open, in order
        _open_streams.add(self)
        super().__init__(
            QueueReader(aws, queue_url),
            seen,
            replay=replay,
            reconcile_after_s=reconcile_after_s,
            event_filter=event_filter,
            timeout=timeout,
            max_events=max_events,
            consume_others=True,
            poll_wait_s=poll_wait_s,
            clock=clock,
            sleep=sleep,
        )
        self._aws = aws
        self._touched = self._clock()

    def _refill(self) -> bool:
        now = self._clock()
        if now - self._touched >= TOUCH_INTERVAL_S:
            self._touched = now
            touch_subscription(self._aws, self.subscription[1])
        return super()._refill()

    def close(self, *, ack_current: bool = False) -> None:
        """Stop (as `EventStream.close`), then remove the subscription (rule targets, rule, queue)."""
        try:
            super().close(ack_current=ack_current)
        finally:
            _open_streams.discard(self)
            alive = self._remove.detach()
            if alive is not None:
                _, _, args, _ = alive
                close_subscription(*args)


def stream_pattern(
    batch_ids: Iterable[str] | None, detail_types: Iterable[DetailType | str] | None = None
) -> dict[str, Any]:
    """The event pattern of a stream of `batch_ids` (all batches: None; the experiment-wide events, `batch_id` "",
    with any) and `detail_types` (all: None)."""
    pattern: dict[str, Any] = {"source": [EVENT_SOURCE]}
    if batch_ids is not None:
        pattern["detail"] = {"batch_id": sorted({*batch_ids, EXPERIMENT_WIDE})}
    if detail_types is not None:
        pattern["detail-type"] = sorted({DetailType(t).value for t in detail_types})
    return pattern


def _tag_value(text: str) -> str:
    return _TAG_VALUE_UNSAFE.sub("_", text)[:256]


def iso_now(now: float | None = None) -> str:
    """A UTC time as tags carry it: `2026-11-24T01:20:00Z`."""
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def default_owner() -> str:
    """Who made a subscription: `user@host:pid`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in a container
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def subscription_tags(kind: str, owner: str | None = None, now: float | None = None) -> dict[str, str]:
    """The tags of a new subscription's rule and queue."""
    created = iso_now(now)
    return {
        TAG_KIND: _tag_value(kind),
        TAG_OWNER: _tag_value(owner or default_owner()),
        TAG_CREATED: created,
        TAG_SEEN: created,
    }


def open_subscription(
    aws: AwsClients,
    bus_name: str,
    pattern: Mapping[str, Any],
    *,
    suffix: str,
    retention_s: int = 3600,
    kind: str | None = None,
    owner: str | None = None,
    name: str | None = None,
) -> tuple[str, str]:
    """A private SQS queue subscribed to the event bus `bus_name` by a rule with `pattern`; returns (name, queue URL).

    Both are tagged with `kind` (default: the suffix's first word), `owner` (default: `user@host:pid`) and the
    creation time, so a subscription left behind by a killed process can be found and pruned. `name` (rule and
    queue) defaults to `{bus_name}-{suffix}`. Close it with `close_subscription`. Needs `sqs:CreateQueue`/
    `TagQueue`/`DeleteQueue`/`SetQueueAttributes` and `events:PutRule`/`TagResource`/`PutTargets`/`RemoveTargets`/
    `DeleteRule`.
    """
    name = (name or f"{bus_name}-{suffix}")[:64]
    tags = subscription_tags(kind or suffix.split("-", maxsplit=1)[0], owner)
    sqs, events = aws.client("sqs"), aws.client("events")
    queue_url: str | None = None
    rule_made = False
    try:
        with aws_errors("create a subscription queue on the event bus"):
            attributes = {"MessageRetentionPeriod": str(retention_s), "SqsManagedSseEnabled": "true"}
            queue_url = str(
                _tagged(
                    "sqs:TagQueue",
                    lambda: sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags),
                    lambda: sqs.create_queue(QueueName=name, Attributes=attributes),
                )["QueueUrl"]
            )
            queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            rule = {
                "Name": name,
                "EventBusName": bus_name,
                "EventPattern": json.dumps(pattern),
                "State": "ENABLED",
                "Description": f"rollouts {tags[TAG_KIND]} subscription of {tags[TAG_OWNER]}, created "
                f"{tags[TAG_CREATED]}",
            }
            rule_tags = [{"Key": key, "Value": value} for key, value in tags.items() if key != TAG_SEEN]
            rule_arn = _tagged(
                "events:TagResource",
                lambda: events.put_rule(**rule, Tags=rule_tags),
                lambda: events.put_rule(**rule),
            )["RuleArn"]
            rule_made = True
            policy = delivery_policy(queue_arn, "events.amazonaws.com", rule_arn)
            sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
            events.put_targets(Rule=name, EventBusName=bus_name, Targets=[{"Id": "tap", "Arn": queue_arn}])
    except BaseException:
        _remove(aws, bus_name, name, queue_url, rule_made)
        raise
    return name, queue_url


def delivery_policy(queue_arn: str, service: str, source_arn: str) -> dict[str, Any]:
    """The policy of a private queue that `service` (EventBridge, SNS) delivers to for `source_arn` (a rule, a
    topic) only, over TLS only."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": source_arn}},
            },
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": queue_arn,
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ],
    }


def _tagged(permission: str, with_tags: Callable[[], Any], without: Callable[[], Any]) -> Any:
    """Create with tags; without them when the caller may not tag (the subscription then ages by its queue's
    creation time and is found by its name's form)."""
    from botocore.exceptions import ClientError

    try:
        return with_tags()
    except ClientError as exc:
        if error_code(exc) not in ACCESS_DENIED:
            raise
        logger.warning("no %s permission: the subscription is made untagged (%s)", permission, exc)
        return without()


#: The `SubscribedStream`s whose subscription is still up (closed at interpreter exit, in the main thread).
_open_streams: weakref.WeakSet[SubscribedStream] = weakref.WeakSet()


def _remove_collected(aws: AwsClients, bus_name: str, name: str, queue_url: str) -> None:
    """Remove the subscription of a stream that was garbage-collected open, never in the collecting thread: the
    collector runs in whichever thread allocates, maybe one that holds a lock the removal's own requests wait for
    (a local endpoint's request thread did, and its server deadlocked)."""
    try:
        threading.Thread(
            target=close_subscription, args=(aws, bus_name, name, queue_url), name=f"remove-{name}", daemon=True
        ).start()
    except RuntimeError:  # the interpreter is shutting down: no new threads
        close_subscription(aws, bus_name, name, queue_url)


@atexit.register
def _close_open_streams() -> None:
    for stream in list(_open_streams):
        stream.close()


def close_subscription(aws: AwsClients, bus_name: str, name: str, queue_url: str) -> None:
    """Remove a subscription made by `open_subscription` (best effort: failures are logged)."""
    _remove(aws, bus_name, name, queue_url, rule_made=True)


def _remove(aws: AwsClients, bus_name: str, name: str, queue_url: str | None, rule_made: bool) -> None:
    events, sqs = aws.client("events"), aws.client("sqs")
    steps: list[tuple[str, Callable[[], Any]]] = []
    if rule_made:
        steps.append(
            ("remove tap target", lambda: events.remove_targets(Rule=name, EventBusName=bus_name, Ids=["tap"]))
        )
        steps.append(("delete tap rule", lambda: events.delete_rule(Name=name, EventBusName=bus_name)))
    if queue_url is not None:
        steps.append(("delete tap queue", lambda: sqs.delete_queue(QueueUrl=queue_url)))
    for what, step in steps:
        try:
            with aws_errors(what):
                step()
        except SdkError as exc:
            logger.warning("%s %s failed (delete it by hand): %s", what, name, exc)


def touch_subscription(aws: AwsClients, queue_url: str, now: float | None = None) -> None:
    """Refresh the queue's `rollouts:seen-at` tag: its owner is alive (best effort; failures are logged)."""
    try:
        with aws_errors("refresh the subscription's seen-at tag"):
            aws.client("sqs").tag_queue(QueueUrl=queue_url, Tags={TAG_SEEN: iso_now(now)})
    except SdkError as exc:
        logger.warning("could not tag %s: %s", queue_url, exc)


@dataclass(frozen=True)
class Subscription:
    """One private subscription on an experiment's bus, as `list_subscriptions` found it.

    `queue_url` is None when the rule's queue is gone; `rule_arn` is None for a queue whose rule is gone.
    `last_seen` is the newest of the queue's `seen-at` / `created-at` tags and the rule's `created-at` tag, else
    (untagged) the queue's creation time (epoch seconds; None when nothing tells)."""

    name: str
    kind: str
    owner: str
    rule_arn: str | None
    queue_url: str | None
    last_seen: float | None
    target_ids: tuple[str, ...] = ()
    #: The bus of the rule, when not the experiment's (the smoke run's S3-event rule is on the default bus).
    rule_bus: str | None = None

    def age_s(self, now: float) -> float | None:
        return None if self.last_seen is None else max(0.0, now - self.last_seen)

    def stale(self, older_than_s: float, now: float) -> bool:
        """Not seen for `older_than_s` (or of unknown age). A half-removed one (a queue whose rule is gone) ages
        like any other: a run in progress may be between creating its queue and its rule, or own a queue alone."""
        age = self.age_s(now)
        return age is None or age >= older_than_s


@dataclass(frozen=True)
class PruneResult:
    """What `prune_subscriptions` did with one subscription: `removed`, `would remove` (dry run), `kept` (fresh) or
    `failed: ...` (left for a later prune)."""

    subscription: Subscription
    action: str
