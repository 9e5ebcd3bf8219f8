"""Private subscriptions to an experiment's event bus: an SQS queue plus a rule, made and removed by the SDK.
`tap` (what `rollouts watch` reads) and the ART backend's per-process queues are built on them."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rollout_pipeline.contracts import EVENT_SOURCE, DetailType
from rollout_pipeline.sdk._aws import AwsClients, aws_errors
from rollout_pipeline.sdk.delivery import EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.transport import QueueReader

logger = logging.getLogger(__name__)


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
    name, queue_url = open_subscription(aws, bus_name, pattern, suffix=f"tap-{uuid.uuid4().hex[:8]}")
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


def open_subscription(
    aws: AwsClients, bus_name: str, pattern: Mapping[str, Any], *, suffix: str, retention_s: int = 3600
) -> tuple[str, str]:
    """A private SQS queue subscribed to the event bus `bus_name` by a rule with `pattern`; returns (name, queue URL).

    Close it with `close_subscription`. Needs `sqs:CreateQueue`/`DeleteQueue`/
    `SetQueueAttributes` and `events:PutRule`/`PutTargets`/`RemoveTargets`/`DeleteRule`.
    """
    name = f"{bus_name}-{suffix}"[:64]
    sqs, events = aws.client("sqs"), aws.client("events")
    queue_url: str | None = None
    rule_made = False
    try:
        with aws_errors("create a subscription queue on the event bus"):
            queue_url = str(
                sqs.create_queue(
                    QueueName=name,
                    Attributes={"MessageRetentionPeriod": str(retention_s), "SqsManagedSseEnabled": "true"},
                )["QueueUrl"]
            )
            queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            rule_arn = events.put_rule(
                Name=name, EventBusName=bus_name, EventPattern=json.dumps(pattern), State="ENABLED"
            )["RuleArn"]
            rule_made = True
            policy = {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "events.amazonaws.com"},
                        "Action": "sqs:SendMessage",
                        "Resource": queue_arn,
                        "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
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
            sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
            events.put_targets(Rule=name, EventBusName=bus_name, Targets=[{"Id": "tap", "Arn": queue_arn}])
    except BaseException:
        _remove(aws, bus_name, name, queue_url, rule_made)
        raise
    return name, queue_url


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
