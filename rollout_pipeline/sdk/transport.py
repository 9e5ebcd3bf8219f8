"""The trainer queue as the SDK sees it: EventBridge envelopes parsed into `Event`s, and receive / delete / redeliver
of SQS messages (`QueueReader`)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from pydantic import ValidationError

from rollout_pipeline.contracts import (
    EVENT_SOURCE,
    BatchAccepted,
    BatchCompleted,
    BudgetExhausted,
    BudgetWarning,
    DetailType,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    parse_detail,
)
from rollout_pipeline.sdk._aws import AwsClients, aws_errors, error_code

logger = logging.getLogger(__name__)
#: The log record attribute that marks the "no reward signal" warning (a caller that shows it itself filters it out).
NO_REWARD_SIGNAL = "no_reward_signal"
#: Batches whose "no reward signal" warning this process has logged (once per batch, however often it is read).
_warned_no_signal: set[tuple[str, str]] = set()

AnyDetail: TypeAlias = (
    RolloutCompleted | RolloutFailed | GroupCompleted | BatchAccepted | BatchCompleted | BudgetWarning | BudgetExhausted
)
RolloutDetail: TypeAlias = RolloutCompleted | RolloutFailed


@dataclass(frozen=True)
class Event:
    """One pipeline event as received from the trainer queue."""

    detail_type: DetailType
    detail: AnyDetail
    envelope: dict[str, Any] = field(repr=False)
    message_id: str = ""
    receive_count: int = 1

    @property
    def event_id(self) -> str:
        """The stable id of the logical event (the same across redeliveries and republishing)."""
        return self.detail.event_id

    @property
    def batch_id(self) -> str:
        return self.detail.batch_id

    @property
    def exp_id(self) -> str:
        return self.detail.exp_id


def parse_envelope(body: str) -> tuple[dict[str, Any], Event | None]:
    """Parse an SQS body holding an EventBridge event; `None` as event when it is not a pipeline event."""
    try:
        envelope = json.loads(body)
    except json.JSONDecodeError:
        return {}, None
    if not isinstance(envelope, dict) or envelope.get("source") != EVENT_SOURCE:
        return envelope if isinstance(envelope, dict) else {}, None
    try:
        detail_type = DetailType(str(envelope.get("detail-type")))
        detail: AnyDetail = parse_detail(detail_type, envelope.get("detail") or {})  # type: ignore[assignment]
    except (ValueError, ValidationError) as exc:
        logger.warning("ignoring an unreadable %r event: %s", envelope.get("detail-type"), exc)
        return envelope, None
    if isinstance(detail, BatchCompleted):
        _warn_no_reward_signal(detail)
    return envelope, Event(detail_type=detail_type, detail=detail, envelope=envelope)


def _warn_no_reward_signal(detail: BatchCompleted) -> None:
    """Log `BatchCompleted.reward_signal_warning` once per batch and process (a trainer should not learn silently
    from a batch whose advantages are all zero)."""
    warning = detail.reward_signal_warning
    key = (detail.exp_id, detail.batch_id)
    if warning is None or key in _warned_no_signal:
        return
    if len(_warned_no_signal) > 10_000:
        _warned_no_signal.clear()
    _warned_no_signal.add(key)
    logger.warning("%s", warning, extra={NO_REWARD_SIGNAL: True})


@dataclass
class Delivery:
    """A received message: its receipt handle and the event it carries (None: not a pipeline event). An empty
    receipt: an event that came from elsewhere than a queue (the ledger); deleting or redelivering it does nothing."""

    receipt: str
    event: Event | None
    message_id: str = ""


class QueueReader:
    """Receive / delete / redeliver on one SQS queue. Stale receipt handles are tolerated (logged, not raised)."""

    def __init__(self, aws: AwsClients, queue_url: str, *, visibility_s: int | None = None) -> None:
        self.aws = aws
        self.queue_url = queue_url
        self.visibility_s = visibility_s

    def receive(self, wait_s: float, max_messages: int = 10) -> list[Delivery]:
        wait = max(0, min(20, int(wait_s)))
        kwargs: dict[str, Any] = {}
        if self.visibility_s is not None:  # else the queue's own visibility timeout
            kwargs["VisibilityTimeout"] = self.visibility_s
        with aws_errors("receive from the trainer queue"):
            resp = self.aws.client("sqs").receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=wait,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
                **kwargs,
            )
        deliveries = []
        for message in resp.get("Messages") or []:
            _envelope, event = parse_envelope(message.get("Body", ""))
            if event is not None:
                count = int((message.get("Attributes") or {}).get("ApproximateReceiveCount", "1"))
                event = Event(event.detail_type, event.detail, event.envelope, message.get("MessageId", ""), count)
            deliveries.append(Delivery(message["ReceiptHandle"], event, message.get("MessageId", "")))
        return deliveries

    def delete(self, delivery: Delivery) -> None:
        self._call("delete_message", delivery)

    def redeliver(self, delivery: Delivery, after_s: int = 0) -> None:
        """Make the message visible again at once (for another consumer, or a retry), or after `after_s`."""
        self._call("change_message_visibility", delivery, VisibilityTimeout=after_s)

    def _call(self, operation: str, delivery: Delivery, **kwargs: Any) -> None:
        from botocore.exceptions import ClientError

        if not delivery.receipt:  # not received from a queue (rebuilt from the ledger: `sdk.replay`)
            return

        try:
            with aws_errors(operation):
                getattr(self.aws.client("sqs"), operation)(
                    QueueUrl=self.queue_url, ReceiptHandle=delivery.receipt, **kwargs
                )
        except Exception as exc:
            cause = exc.__context__ if isinstance(exc.__context__, ClientError) else exc
            # The message was received again elsewhere (its handle is stale) or already deleted: nothing to do.
            logger.debug("%s failed (%s): %s", operation, error_code(cause) or type(exc).__name__, exc)
