"""Private subscriptions to an experiment's event bus: an SQS queue plus a rule, made and removed by the SDK.
`tap` (what `rollouts watch` reads), the SDK's streams of some batches (`SubscribedStream`: `Experiment.events(
batch_id=...)`, `groups`, a `RolloutClient`) and the ART backend's per-process queues are built on them.

Each rule and queue is tagged at creation with its kind (`tap`, `art`, ...), its owner (user, host and process), its
creation time and its experiment (the cost-allocation tag); while it is open, one thread of the owner process
refreshes the queue's `rollouts:seen-at` every `bus_subscriptions.HEARTBEAT_S` (`_Heartbeat`), whether or not the
owner reads it. A process that is killed leaves both behind (they count toward the bus's 300 rules and block `cdk
destroy`: a bus with rules cannot be deleted) until the next subscription opened on the same host removes those of
owners gone there (`prune_gone_owners`), or the sweeper those not seen for `bus_subscriptions.STALE_S`
(`lifecycle.subscriptions`). Listing and pruning by age is operator code (`rollout_pipeline.ops.subscriptions`),
which `exp.subscriptions.list` / `prune` reach; what they return (`Subscription`,
`PruneResult`) is defined here.
"""

from __future__ import annotations

import atexit
import getpass
import json
import logging
import math
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline import bus_subscriptions, topology
from rollout_pipeline.bus_subscriptions import TAG_CREATED, TAG_KIND, TAG_OWNER, TAG_SEEN
from rollout_pipeline.contracts import EVENT_SOURCE, DetailType
from rollout_pipeline.sdk._aws import AwsClients, aws_errors, error_code
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.replay import CatchUpStream, Replay
from rollout_pipeline.sdk.transport import QueueReader

logger = logging.getLogger(__name__)

__all__ = ["TAG_CREATED", "TAG_KIND", "TAG_OWNER", "TAG_SEEN"]  # the tags, for `ops.subscriptions`
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
    alone: events it does not want are deleted, never left to wear out (`consume_others`). Its `seen-at` tag is
    refreshed while it is open (`_Heartbeat`).
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


#: EventBridge's default quota on an event pattern's size, in characters ("Event pattern size", adjustable: the API
#: takes at most 4,096): a stream of many batches matches them by prefixes to stay within it (docs/aws-facts.md).
MAX_PATTERN_CHARS: Final = 2048


def stream_pattern(
    batch_ids: Iterable[str] | None, detail_types: Iterable[DetailType | str] | None = None
) -> dict[str, Any]:
    """The event pattern of a stream of `batch_ids` (all batches: None; the experiment-wide events, `batch_id` "",
    with any) and `detail_types` (all: None). When the ids would not fit in `MAX_PATTERN_CHARS`, they are matched by
    the longest prefixes that do (at worst every batch): the rule may then match other batches' events too, which
    the stream's own filter drops (it reads a queue of its own: `SubscribedStream`)."""
    pattern: dict[str, Any] = {"source": [EVENT_SOURCE]}
    if detail_types is not None:
        pattern["detail-type"] = sorted({DetailType(t).value for t in detail_types})
    if batch_ids is None:
        return pattern
    for matcher in _batch_matchers(sorted(set(batch_ids))):
        pattern["detail"] = {"batch_id": matcher}
        if len(json.dumps(pattern)) <= MAX_PATTERN_CHARS:
            return pattern
    del pattern["detail"]
    return pattern


def _batch_matchers(batch_ids: Sequence[str]) -> Iterator[list[Any]]:
    """The batch ids as they are, then by ever shorter prefixes (fewer, wider matchers), with the experiment-wide
    events always."""
    yield sorted({*batch_ids, EXPERIMENT_WIDE})
    for length in range(max((len(b) for b in batch_ids), default=0) - 1, 0, -1):
        yield [*({"prefix": prefix} for prefix in sorted({b[:length] for b in batch_ids})), EXPERIMENT_WIDE]


def _tag_value(text: str) -> str:
    return _TAG_VALUE_UNSAFE.sub("_", text)[:256]


def iso_now(now: float | None = None) -> str:
    """A UTC time as tags carry it: `2026-11-24T01:20:00Z`."""
    return bus_subscriptions.iso(time.time() if now is None else now)


def default_owner() -> str:
    """Who made a subscription: `user@host:pid`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name in a container
        user = "unknown"
    return bus_subscriptions.this_owner(user)


def subscription_tags(
    kind: str, owner: str | None = None, now: float | None = None, *, experiment: str | None = None
) -> dict[str, str]:
    """The tags of a new subscription's rule and queue (with `experiment`, the cost-allocation tag)."""
    created = iso_now(now)
    tags = {
        TAG_KIND: _tag_value(kind),
        TAG_OWNER: _tag_value(owner or default_owner()),
        TAG_CREATED: created,
        TAG_SEEN: created,
    }
    if experiment:
        tags[topology.COST_TAG] = _tag_value(experiment)
    return tags


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
    experiment: str | None = None,
) -> tuple[str, str]:
    """A private SQS queue subscribed to the event bus `bus_name` by a rule with `pattern`; returns (name, queue URL).

    Both are tagged with `kind` (default: the suffix's first word), `owner` (default: `user@host:pid`), the creation
    time and the experiment (the cost-allocation tag), so a subscription left behind by a killed process can be
    found and pruned; while it is open this process refreshes its queue's `seen-at` (`_Heartbeat`). First, the
    subscriptions on the bus whose owner ran on this host and is gone are removed (`prune_gone_owners`). `name`
    (rule and queue) defaults to `{bus_name}-{suffix}`; `experiment` (its cost-allocation tag) to the bus's. Close
    it with `close_subscription`. Needs `sqs:CreateQueue`/`TagQueue`/`DeleteQueue`/`SetQueueAttributes`/
    `GetQueueUrl` and `events:PutRule`/`TagResource`/`PutTargets`/`RemoveTargets`/`DeleteRule`/`ListRules`.
    """
    name = (name or f"{bus_name}-{suffix}")[:64]
    tags = subscription_tags(
        kind or suffix.split("-", maxsplit=1)[0], owner, experiment=experiment or topology.bus_experiment(bus_name)
    )
    _prune_gone_owners_now_and_then(aws, bus_name)
    sqs, events = aws.client("sqs"), aws.client("events")
    queue_url: str | None = None
    rule_made = False
    heartbeat: int | None = None
    try:
        with aws_errors("create a subscription queue on the event bus"):
            attributes = {"MessageRetentionPeriod": str(retention_s), "SqsManagedSseEnabled": "true"}
            created, tagged = _tagged(
                "sqs:TagQueue",
                lambda: sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags),
                lambda: sqs.create_queue(QueueName=name, Attributes=attributes),
            )
            queue_url = str(created["QueueUrl"])
            queue_arn = _queue_arn(sqs, queue_url)
            heartbeat = int(bus_subscriptions.HEARTBEAT_S) if tagged else None
            rule = {
                "Name": name,
                "EventBusName": bus_name,
                "EventPattern": json.dumps(pattern),
                "State": "ENABLED",
                "Description": bus_subscriptions.description(
                    tags[TAG_KIND], tags[TAG_OWNER], tags[TAG_CREATED], heartbeat, bus_subscriptions.pid_namespace()
                ),
            }
            rule_tags = [{"Key": key, "Value": value} for key, value in tags.items() if key != TAG_SEEN]
            rule_arn = _put_rule(events, bus_name, rule, rule_tags)["RuleArn"]
            rule_made = True
            policy = delivery_policy(queue_arn, "events.amazonaws.com", rule_arn)
            sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
            events.put_targets(
                Rule=name, EventBusName=bus_name, Targets=[{"Id": bus_subscriptions.TARGET_ID, "Arn": queue_arn}]
            )
    except BaseException:
        _remove(aws, bus_name, name, queue_url, rule_made)
        raise
    if heartbeat is not None:
        _HEARTBEAT.add(aws, queue_url)
    return name, queue_url


#: SQS: "After you create a queue, you must wait at least one second after the queue is created to be able to use
#: the queue" (CreateQueue, API reference): a read of its attributes right after is retried this many times, 0.25 s
#: doubling (about 8 s in all).
QUEUE_READY_TRIES: Final = 6
_QUEUE_GONE: Final = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"})


def _queue_arn(sqs: Any, queue_url: str, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """The ARN of a queue just created, waiting for it to be usable (`QUEUE_READY_TRIES`)."""
    from botocore.exceptions import ClientError

    pause = 0.25
    for attempt in range(QUEUE_READY_TRIES):
        try:
            answer = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
            return str(answer["Attributes"]["QueueArn"])
        except ClientError as exc:
            if error_code(exc) not in _QUEUE_GONE or attempt == QUEUE_READY_TRIES - 1:
                raise
        sleep(pause)
        pause *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def _put_rule(events: Any, bus_name: str, rule: Mapping[str, Any], rule_tags: list[dict[str, str]]) -> Any:
    """PutRule (tagged when allowed); a bus at EventBridge's rule quota is one line naming the way out."""
    from botocore.exceptions import ClientError

    try:
        answer, _tags = _tagged(
            "events:TagResource", lambda: events.put_rule(**rule, Tags=rule_tags), lambda: events.put_rule(**rule)
        )
        return answer
    except ClientError as exc:
        if error_code(exc) != "LimitExceededException":
            raise
        experiment = topology.bus_experiment(bus_name)
        raise SdkError(
            f"event bus {bus_name} has as many rules as EventBridge allows (300 per bus): subscriptions left by "
            f"killed processes count; remove them with `rollouts subscriptions prune -e {experiment} --older-than 1h`"
        ) from None


def prune_gone_owners(aws: AwsClients, bus_name: str) -> list[str]:
    """Remove the subscriptions on the bus whose owner ran on this host and is gone (`bus_subscriptions.owner_gone`:
    its process no longer exists; a killed process ran no cleanup), found by their rules' descriptions with ListRules
    alone. Best effort: a failure is logged. Returns the names removed."""
    removed: list[str] = []
    try:
        events = aws.client("events")
        prefixes = [f"{bus_name}-{kind}-" for kind in bus_subscriptions.BUS_KINDS]
        for prefix in prefixes:
            for page in events.get_paginator("list_rules").paginate(EventBusName=bus_name, NamePrefix=prefix):
                for rule in page.get("Rules", []):
                    facts = bus_subscriptions.parse_description(str(rule.get("Description") or ""))
                    if facts is not None and bus_subscriptions.owner_gone(facts.owner, facts.pid_namespace):
                        name = str(rule["Name"])
                        _remove(aws, bus_name, name, _queue_url(aws, name), rule_made=True)
                        removed.append(name)
    except Exception as exc:  # never in the way of opening a subscription
        logger.warning("could not look for subscriptions of gone processes on %s: %s", bus_name, exc)
    if removed:
        logger.info("removed %d subscription(s) of processes gone from this host: %s", len(removed), removed)
    return removed


_pruned_at: dict[tuple[str | None, str | None, str], float] = {}
_pruned_lock = threading.Lock()


def _prune_gone_owners_now_and_then(aws: AwsClients, bus_name: str) -> None:
    """`prune_gone_owners`, at most once per `HEARTBEAT_S` per account endpoint, bus and process (a trainer opening
    a stream per step pays one ListRules a minute, not one per stream)."""
    now = time.monotonic()
    where = (aws.endpoint_url, aws.region, bus_name)
    with _pruned_lock:
        if now - _pruned_at.get(where, -math.inf) < bus_subscriptions.HEARTBEAT_S:
            return
        _pruned_at[where] = now
    prune_gone_owners(aws, bus_name)


def _queue_url(aws: AwsClients, name: str) -> str | None:
    from botocore.exceptions import ClientError

    try:
        return str(aws.client("sqs").get_queue_url(QueueName=name)["QueueUrl"])
    except ClientError as exc:
        if error_code(exc) in _QUEUE_GONE:
            return None
        raise


class _Heartbeat:
    """Refreshes the `seen-at` tag of every subscription this process has open, every `HEARTBEAT_S`, from one daemon
    thread (started with the first, ended with the last): whether or not its owner reads it (a trainer may not read
    for a long training step). A forked child keeps none of its parent's."""

    def __init__(
        self,
        touch: Callable[[AwsClients, str], bool] | None = None,
        interval_s: Callable[[], float] = lambda: bus_subscriptions.HEARTBEAT_S,
    ) -> None:
        self._touch = touch
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._open: dict[str, AwsClients] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, aws: AwsClients, queue_url: str) -> None:
        with self._lock:
            self._open[queue_url] = aws
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rollouts-subscription-heartbeat", daemon=True)
                self._thread.start()

    def discard(self, queue_url: str) -> None:
        with self._lock:
            self._open.pop(queue_url, None)
            if not self._open:
                self._wake.set()  # the thread ends now, not a beat later

    def open_urls(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def forget(self) -> None:
        """In a forked child: its parent's subscriptions are not its own, and the thread did not come along."""
        self._lock = threading.Lock()
        self._open = {}
        self._thread = None
        self._wake = threading.Event()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s())
            with self._lock:
                self._wake.clear()
                beating = list(self._open.items())
                if not beating:
                    self._thread = None
                    return
            for queue_url, aws in beating:
                if not (self._touch or _beat)(aws, queue_url):
                    self.discard(queue_url)  # removed by other means (a prune, the sweeper)


def _beat(aws: AwsClients, queue_url: str) -> bool:
    """One heartbeat of a subscription: its `seen-at` refreshed. False when its queue is gone (nothing left to
    keep alive); other failures are logged and the next beat tries again."""
    from botocore.exceptions import ClientError

    try:
        aws.client("sqs").tag_queue(QueueUrl=queue_url, Tags={TAG_SEEN: iso_now()})
    except ClientError as exc:
        if error_code(exc) in _QUEUE_GONE:
            return False
        logger.warning("could not refresh the subscription %s: %s", queue_url, exc)
    except Exception as exc:
        logger.warning("could not refresh the subscription %s: %s", queue_url, exc)
    return True


_HEARTBEAT: Final = _Heartbeat()
os.register_at_fork(after_in_child=_HEARTBEAT.forget)


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


def _tagged(permission: str, with_tags: Callable[[], Any], without: Callable[[], Any]) -> tuple[Any, bool]:
    """Create with tags; without them when the caller may not tag (the subscription then ages by its queue's
    creation time, is found by its name's form and has no heartbeat). Returns the answer and whether it is tagged."""
    from botocore.exceptions import ClientError

    try:
        return with_tags(), True
    except ClientError as exc:
        if error_code(exc) not in ACCESS_DENIED:
            raise
        logger.warning("no %s permission: the subscription is made untagged (%s)", permission, exc)
        return without(), False


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
    _HEARTBEAT.discard(queue_url)
    _remove(aws, bus_name, name, queue_url, rule_made=True)


def _remove(aws: AwsClients, bus_name: str, name: str, queue_url: str | None, rule_made: bool) -> None:
    events, sqs = aws.client("events"), aws.client("sqs")
    steps: list[tuple[str, Callable[[], Any]]] = []
    if rule_made:
        steps.append(
            (
                "remove tap target",
                lambda: events.remove_targets(Rule=name, EventBusName=bus_name, Ids=[bus_subscriptions.TARGET_ID]),
            )
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
