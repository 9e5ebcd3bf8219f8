"""Private subscriptions to an experiment's event bus: an SQS queue plus a rule, made and removed by the SDK.
`tap` (what `rollouts watch` reads), the SDK's streams of some batches (`SubscribedStream`: `Experiment.events(
batch_id=...)`, `groups`, a `RolloutClient`) and the ART backend's per-process queues are built on them.

Each rule and queue is tagged at creation with its kind (`tap`, `art`, ...), its owner (user, host and process) and
its creation time; the owner refreshes the queue's `rollouts:seen-at` while it works (`touch_subscription`). A process
that is killed leaves both behind: they count toward the bus's 300 rules and block `cdk destroy` (a bus with rules
cannot be deleted). `list_subscriptions` finds them by tag (and, for subscriptions made before tagging, by their
exact name form) and `prune_subscriptions` removes the stale ones: rule targets first, then the rule, then the queue.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import socket
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
#: Subscriptions made before tagging: `{bus}-{tap|art}-{8 hex}`.
_LEGACY_SUFFIX: Final = re.compile(r"^(?P<kind>tap|art)-[0-9a-f]{8}$")
#: Rule names (after `{bus}-`) of the private subscriptions: only these are looked at by `list_subscriptions`.
_SUBSCRIPTION_NAME_KINDS: Final = ("tap-", "art-", "sdk-", "smoke-")
#: The kind (and name prefix, `{bus}-sdk-{8 hex}`) of the SDK's own streams (`SubscribedStream`).
SDK_KIND: Final = "sdk"
#: A stream's queue keeps undelivered events as long as the trainer queue does (SQS's maximum, 14 days): a trainer
#: may stop reading for a long training step.
STREAM_RETENTION_S: Final = 14 * 86_400
#: Seconds after a stream's subscription is made at which the ledger is read again for events its rule may have
#: missed: EventBridge says "incoming events might not immediately start matching to new or updated rules" (PutRule,
#: API reference) and gives no bound; the events due by then are in the ledger (docs/aws-facts.md).
RECONCILE_AFTER_S: Final = (10.0, 60.0, 300.0)
#: Characters EventBridge and SQS accept in tag values (others become `_`).
_TAG_VALUE_UNSAFE: Final = re.compile(r"[^A-Za-z0-9 _.:/=+@-]")
_CREATED_IN_DESCRIPTION: Final = re.compile(r"created (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")
_ACCESS_DENIED: Final = frozenset({"AccessDenied", "AccessDeniedException"})
_GONE: Final = frozenset(
    {"ResourceNotFoundException", "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)


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
    if batch_id is not None:
        pattern["detail"] = {"batch_id": [batch_id]}
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
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        name, queue_url = open_subscription(
            aws, bus_name, pattern, suffix=f"{SDK_KIND}-{uuid.uuid4().hex[:8]}", retention_s=STREAM_RETENTION_S
        )
        self.subscription = (name, queue_url)
        self._remove = weakref.finalize(self, close_subscription, aws, bus_name, name, queue_url)
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
            self._remove()


def stream_pattern(
    batch_ids: Iterable[str] | None, detail_types: Iterable[DetailType | str] | None = None
) -> dict[str, Any]:
    """The event pattern of a stream of `batch_ids` (all batches: None) and `detail_types` (all: None)."""
    pattern: dict[str, Any] = {"source": [EVENT_SOURCE]}
    if batch_ids is not None:
        pattern["detail"] = {"batch_id": sorted(set(batch_ids))}
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
        if error_code(exc) not in _ACCESS_DENIED:
            raise
        logger.warning("no %s permission: the subscription is made untagged (%s)", permission, exc)
        return without()


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


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _legacy_kind(bus_name: str, name: str) -> str | None:
    prefix = f"{bus_name}-"
    if not name.startswith(prefix):
        return None
    found = _LEGACY_SUFFIX.match(name[len(prefix) :])
    return found.group("kind") if found else None


def _queue_facts(sqs: Any, queue_url: str) -> tuple[dict[str, str], float | None] | None:
    """(tags, creation time) of a queue, or None when it no longer exists."""
    from botocore.exceptions import ClientError

    try:
        tags = dict(sqs.list_queue_tags(QueueUrl=queue_url).get("Tags") or {})
        attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["CreatedTimestamp"])["Attributes"]
    except ClientError as exc:
        if error_code(exc) in _GONE:
            return None
        raise
    created = attributes.get("CreatedTimestamp")
    return tags, float(created) if created else None


def _queue_url_of(sqs: Any, queue_arn: str) -> str | None:
    from botocore.exceptions import ClientError

    parts = queue_arn.split(":")
    if len(parts) < 6:
        return None
    try:
        return str(sqs.get_queue_url(QueueName=parts[5], QueueOwnerAWSAccountId=parts[4])["QueueUrl"])
    except ClientError as exc:
        if error_code(exc) in _GONE:
            return None
        raise


def _newest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


def list_subscriptions(
    aws: AwsClients,
    bus_name: str,
    *,
    kinds: Iterable[str] | None = None,
    created_after: float | None = None,
) -> list[Subscription]:
    """Every private subscription on the bus: rules tagged `rollouts:subscription` (or named as untagged ones were),
    with their queues, plus tagged queues whose rule is gone. The stack's own rules and queues are never listed.

    `kinds` lists only those (by name prefix, `{bus_name}-{kind}-`). `created_after` (epoch seconds) leaves out the
    rules whose description says they were created later, with one ListRules call and nothing more for them: they
    cannot be stale for an age up to now - `created_after` (what the ART backend's prune at attach uses, so that
    many worker processes starting together stay cheap).

    Needs `events:ListRules`/`ListTagsForResource`/`ListTargetsByRule` and `sqs:ListQueues`/`ListQueueTags`/
    `GetQueueUrl`/`GetQueueAttributes`."""
    events, sqs = aws.client("events"), aws.client("sqs")
    prefixes = [f"{bus_name}-{kind}-" for kind in sorted(set(kinds))] if kinds is not None else [f"{bus_name}-"]
    found: dict[str, Subscription] = {}
    young: set[str] = set()
    with aws_errors(f"list the subscriptions on bus {bus_name}"):
        for bus, page in _rule_pages(events, bus_name, prefixes):
            for rule in page.get("Rules", []):
                name = str(rule["Name"])
                created = _description_time(str(rule.get("Description") or ""))
                if created_after is not None and created is not None and created > created_after:
                    young.add(name)
                    continue
                subscription = _rule_subscription(events, sqs, bus_name, bus, rule)
                if subscription is not None:
                    found[name] = subscription
        queue_pages = (
            page for prefix in prefixes for page in sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix)
        )
        for page in queue_pages:
            for queue_url in page.get("QueueUrls", []):
                name = str(queue_url).rstrip("/").rsplit("/", 1)[-1]
                if name in found or name in young or not name[len(bus_name) + 1 :].startswith(_SUBSCRIPTION_NAME_KINDS):
                    continue  # listed already, too young, or the stack's own queue (`{bus}-ingest-dlq`...)
                subscription = _queue_subscription(sqs, bus_name, str(queue_url))
                if subscription is not None:
                    found[name] = subscription
    return sorted(found.values(), key=lambda sub: sub.name)


def _rule_subscription(events: Any, sqs: Any, bus_name: str, bus: str, rule: Mapping[str, Any]) -> Subscription | None:
    """The subscription of one listed rule on `bus`, with its queue; None for a rule that is not one of ours (or
    that we may not read)."""
    from botocore.exceptions import ClientError

    name, arn = str(rule["Name"]), str(rule["Arn"])
    if not name[len(bus_name) + 1 :].startswith(_SUBSCRIPTION_NAME_KINDS):
        return None  # the stack's rules (`{bus}-trainer`...) and the user's own: never read, never touched
    try:
        rule_tags = {t["Key"]: t["Value"] for t in events.list_tags_for_resource(ResourceARN=arn)["Tags"]}
    except ClientError as exc:
        if error_code(exc) not in _ACCESS_DENIED:
            raise
        return None  # not ours to read (a trainer's policy covers its experiment bus's subscriptions only)
    kind = rule_tags.get(TAG_KIND) or (_legacy_kind(bus_name, name) if bus == bus_name else None)
    if not kind:
        return None  # the stack's rules and the user's own
    targets = events.list_targets_by_rule(Rule=name, EventBusName=bus).get("Targets", [])
    queue_arns = [str(t["Arn"]) for t in targets if ":sqs:" in str(t["Arn"])]
    queue_url = _queue_url_of(sqs, queue_arns[0]) if queue_arns else None
    facts = _queue_facts(sqs, queue_url) if queue_url else None
    if facts is None:
        queue_url = None
    queue_tags, queue_created = facts if facts else ({}, None)
    return Subscription(
        name=name,
        kind=kind,
        owner=rule_tags.get(TAG_OWNER) or queue_tags.get(TAG_OWNER, "unknown"),
        rule_arn=arn,
        queue_url=queue_url,
        last_seen=_newest(
            _parse_time(queue_tags.get(TAG_SEEN)),
            _parse_time(queue_tags.get(TAG_CREATED)),
            _parse_time(rule_tags.get(TAG_CREATED)),
        )
        or queue_created,
        target_ids=tuple(str(t["Id"]) for t in targets),
        rule_bus=None if bus == bus_name else bus,
    )


def _queue_subscription(sqs: Any, bus_name: str, queue_url: str) -> Subscription | None:
    """A tagged (or subscription-named) queue whose rule is gone; None when it is not one of ours or is gone."""
    facts = _queue_facts(sqs, queue_url)
    if facts is None:
        return None
    queue_tags, queue_created = facts
    name = queue_url.rstrip("/").rsplit("/", 1)[-1]
    kind = queue_tags.get(TAG_KIND) or _legacy_kind(bus_name, name)
    if not kind:
        return None
    return Subscription(
        name=name,
        kind=kind,
        owner=queue_tags.get(TAG_OWNER, "unknown"),
        rule_arn=None,
        queue_url=queue_url,
        last_seen=_newest(_parse_time(queue_tags.get(TAG_SEEN)), _parse_time(queue_tags.get(TAG_CREATED)))
        or queue_created,
    )


def _rule_pages(events: Any, bus_name: str, prefixes: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Pages of the rules named `prefix*` on the experiment bus, then on the default bus (a smoke run's S3 rule)."""
    for bus in (bus_name, "default"):
        for prefix in prefixes:
            for page in events.get_paginator("list_rules").paginate(EventBusName=bus, NamePrefix=prefix):
                yield bus, page


def _description_time(description: str) -> float | None:
    found = _CREATED_IN_DESCRIPTION.search(description)
    return _parse_time(found.group(1)) if found else None


def remove_subscription(aws: AwsClients, bus_name: str, subscription: Subscription) -> None:
    """Remove one subscription: the rule's targets first, then the rule, then the queue. Parts already gone are
    skipped; any other failure raises `SdkError` (what was removed stays removed)."""
    from botocore.exceptions import ClientError

    events, sqs = aws.client("events"), aws.client("sqs")
    bus_name = subscription.rule_bus or bus_name
    steps: list[tuple[str, Callable[[], Any]]] = []
    if subscription.rule_arn is not None:
        if subscription.target_ids:
            steps.append(
                (
                    "remove the rule's targets",
                    lambda: events.remove_targets(
                        Rule=subscription.name, EventBusName=bus_name, Ids=list(subscription.target_ids)
                    ),
                )
            )
        steps.append(("delete the rule", lambda: events.delete_rule(Name=subscription.name, EventBusName=bus_name)))
    if subscription.queue_url is not None:
        queue_url = subscription.queue_url
        steps.append(("delete the queue", lambda: sqs.delete_queue(QueueUrl=queue_url)))
    for what, step in steps:
        with aws_errors(f"{what} of subscription {subscription.name}"):
            try:
                step()
            except ClientError as exc:
                if error_code(exc) not in _GONE:
                    raise


def prune_subscriptions(
    aws: AwsClients,
    bus_name: str,
    older_than_s: float,
    *,
    dry_run: bool = False,
    kinds: Iterable[str] | None = None,
    now: float | None = None,
    skip_recent: bool = False,
) -> list[PruneResult]:
    """Remove the subscriptions on the bus not seen for `older_than_s` seconds; with `dry_run`, only say which.
    `kinds` limits it (e.g. `("art",)`). `skip_recent`: leave out (unlisted, no result) the rules created less than
    `older_than_s` ago, at the cost of one ListRules call. Returns one result per subscription examined."""
    moment = time.time() if now is None else now
    wanted = None if kinds is None else set(kinds)
    results: list[PruneResult] = []
    listed = list_subscriptions(
        aws, bus_name, kinds=wanted, created_after=moment - older_than_s if skip_recent else None
    )
    for subscription in listed:
        if wanted is not None and subscription.kind not in wanted:
            continue
        if not subscription.stale(older_than_s, moment):
            results.append(PruneResult(subscription, "kept"))
        elif dry_run:
            results.append(PruneResult(subscription, "would remove"))
        else:
            try:
                remove_subscription(aws, bus_name, subscription)
            except SdkError as exc:
                results.append(PruneResult(subscription, f"failed: {exc}"))
            else:
                results.append(PruneResult(subscription, "removed"))
    return results
