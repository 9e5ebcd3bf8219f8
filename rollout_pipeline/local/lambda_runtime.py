"""Run Lambda handlers locally as consumers of the same SQS queues, with Lambda's SQS event-source semantics.

Each consumer long-polls its queue, hands up to `batch_size` messages to the handler as an SQS event
(`{"Records": [...]}` with the same record fields Lambda sends), deletes the messages the handler did not report in
`batchItemFailures`, and leaves failed ones (or the whole batch when the handler raised) to be redelivered. The only
difference from Lambda: a failed message becomes visible again after `retry_delay_s` instead of the queue's full
visibility timeout, so a local run retries in seconds, not minutes. `max_concurrency` workers per consumer mirror
the event source's maximum concurrency.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollout_pipeline.adapters.clients import ClientFactory, default_factory
from rollout_pipeline.topology import SQS_RECEIVE_MAX

if TYPE_CHECKING:
    from lambdas.glue import Handler

log = logging.getLogger(__name__)


@dataclass
class LambdaContext:
    """The parts of the Lambda context object the handlers use."""

    function_name: str
    timeout_s: float
    memory_limit_in_mb: int = 1024
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = ""
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_s - (time.monotonic() - self._started)) * 1000))


def sqs_event(messages: list[dict[str, Any]], queue_arn: str, region: str) -> dict[str, Any]:
    """The event Lambda's SQS event source passes to a handler."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": dict(m.get("Attributes") or {}),
                "messageAttributes": dict(m.get("MessageAttributes") or {}),
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for m in messages
        ]
    }


@dataclass
class ConsumerStats:
    batches: int = 0
    messages: int = 0
    failed: int = 0
    handler_errors: int = 0


class QueueConsumer:
    """One "event source mapping": a queue, a handler, and up to `max_concurrency` polling workers."""

    def __init__(
        self,
        name: str,
        queue_url: str,
        handler: Handler,
        *,
        region: str,
        clients: ClientFactory | None = None,
        batch_size: int = 10,
        max_concurrency: int = 2,
        timeout_s: float = 60.0,
        wait_time_s: int = 1,
        retry_delay_s: int = 2,
        idle_s: float = 0.0,
    ) -> None:
        self.name = name
        self.queue_url = queue_url
        self.handler = handler
        self.region = region
        self.clients = clients or default_factory()
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.wait_time_s = wait_time_s
        self.retry_delay_s = retry_delay_s
        #: A pause after an empty receive (for short polls, `wait_time_s=0`: a long poll already waits).
        self.idle_s = idle_s
        self.stats = ConsumerStats()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._queue_arn = ""

    def start(self) -> None:
        sqs = self.clients.client("sqs")
        attrs = sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["QueueArn"])
        self._queue_arn = attrs["Attributes"]["QueueArn"]
        for i in range(self.max_concurrency):
            thread = threading.Thread(target=self._run, name=f"{self.name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def request_stop(self) -> None:
        """Stop taking new batches (a batch being handled runs on); `stop` then waits for the workers."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.poll_once() and self.idle_s > 0:
                    self._stop.wait(self.idle_s)
            except Exception:  # a consumer must outlive any single failure, as Lambda's poller does
                if self._stop.is_set():  # shutting down: what it polls may be gone already
                    log.debug("consumer %s: poll failed while stopping", self.name, exc_info=True)
                    return
                log.exception("consumer %s: poll failed", self.name)
                self._stop.wait(1.0)

    def poll_once(self) -> int:
        """Receive one batch and run the handler on it; return how many messages were received. As Lambda's poller
        does, a batch of more than SQS's 10 per receive is gathered from several receives while they come full."""
        sqs = self.clients.client("sqs")
        messages: list[dict[str, Any]] = []
        for _ in range(math.ceil(self.batch_size / SQS_RECEIVE_MAX)):
            got = (
                sqs.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=min(SQS_RECEIVE_MAX, self.batch_size - len(messages)),
                    WaitTimeSeconds=0 if messages else self.wait_time_s,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages")
                or []
            )
            messages += got
            if len(got) < SQS_RECEIVE_MAX or len(messages) >= self.batch_size:
                break
        if not messages:
            return 0
        failed_ids = self._invoke(messages)
        done = [m for m in messages if m["MessageId"] not in failed_ids]
        for start in range(0, len(done), 10):
            chunk = done[start : start + 10]
            sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)],
            )
        for message in messages:
            if message["MessageId"] in failed_ids:
                sqs.change_message_visibility(
                    QueueUrl=self.queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=self.retry_delay_s,
                )
        with self._lock:
            self.stats.batches += 1
            self.stats.messages += len(messages)
            self.stats.failed += len(failed_ids)
        return len(messages)

    def _invoke(self, messages: list[dict[str, Any]]) -> set[str]:
        context = LambdaContext(function_name=self.name, timeout_s=self.timeout_s)
        try:
            response = self.handler(sqs_event(messages, self._queue_arn, self.region), context)
        except Exception:
            if self._stop.is_set():
                log.debug("consumer %s: handler raised while stopping", self.name, exc_info=True)
            else:
                log.exception("consumer %s: handler raised; the whole batch will be retried", self.name)
            with self._lock:
                self.stats.handler_errors += 1
            return {m["MessageId"] for m in messages}
        failures = (response or {}).get("batchItemFailures") or [] if isinstance(response, dict) else []
        return {str(f["itemIdentifier"]) for f in failures}


class Schedule:
    """Call a scheduled handler (the sweeper) every `interval_s`, like an EventBridge schedule."""

    def __init__(self, name: str, handler: Handler, interval_s: float, timeout_s: float = 120.0) -> None:
        self.name = name
        self.handler = handler
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.runs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """Run no more (a run in progress goes on); `stop` then waits for it."""
        self._stop.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    def run_once(self) -> Any:
        event = {"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}}
        self.runs += 1
        return self.handler(event, LambdaContext(function_name=self.name, timeout_s=self.timeout_s))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:
                if self._stop.is_set():
                    log.debug("schedule %s failed while stopping", self.name, exc_info=True)
                    return
                log.exception("schedule %s failed", self.name)
