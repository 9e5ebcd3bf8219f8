"""Finding and pruning the private subscriptions the SDK leaves on an experiment's bus (`sdk/subscription.py` makes
them): `list_subscriptions` finds them by tag (and, for subscriptions made before tagging, by their exact name form)
and `prune_subscriptions` removes the stale ones: rule targets first, then the rule, then the queue.
`exp.subscriptions.list` / `prune`, `rollouts subscriptions` and `rollouts destroy` run them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

from rollout_pipeline import bus_subscriptions
from rollout_pipeline.sdk._aws import AwsClients, aws_errors, error_code
from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.subscription import (
    ACCESS_DENIED,
    TAG_CREATED,
    TAG_KIND,
    TAG_OWNER,
    TAG_SEEN,
    PruneResult,
    Subscription,
)

#: Subscriptions made before tagging: `{bus}-{tap|art}-{8 hex}`.
_LEGACY_SUFFIX: Final = re.compile(r"^(?P<kind>tap|art)-[0-9a-f]{8}$")
#: Rule names (after `{bus}-`) of the private subscriptions: only these are looked at by `list_subscriptions`.
_SUBSCRIPTION_NAME_KINDS: Final = (*(f"{kind}-" for kind in bus_subscriptions.BUS_KINDS), "smoke-")
_GONE: Final = frozenset(
    {"ResourceNotFoundException", "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)


_parse_time = bus_subscriptions.parse_time


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
        kind = rule_tags.get(TAG_KIND) or (_legacy_kind(bus_name, name) if bus == bus_name else None)
        if not kind:
            return None  # the stack's rules and the user's own
        targets = events.list_targets_by_rule(Rule=name, EventBusName=bus).get("Targets", [])
    except ClientError as exc:
        if error_code(exc) in _GONE:
            return None  # removed since it was listed (its owner closed it, or the sweeper removed it)
        if error_code(exc) not in ACCESS_DENIED:
            raise
        return None  # not ours to read (a trainer's policy covers its experiment bus's subscriptions only)
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
    facts = bus_subscriptions.parse_description(description)
    return None if facts is None else facts.created


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
