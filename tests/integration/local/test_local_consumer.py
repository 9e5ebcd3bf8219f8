"""Local consumers give handlers Lambda's SQS event-source semantics: batches, partial failures, retries."""

from __future__ import annotations

import json
import threading
from typing import Any

from rollout_pipeline.adapters import clients
from rollout_pipeline.local.lambda_runtime import LambdaContext, QueueConsumer, Schedule
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import REGION, receive_all


def _send(queue_url: str, values: list[int]) -> None:
    sqs = clients.client("sqs")
    for value in values:
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps({"n": value}))


def test_partial_batch_failure_keeps_only_failed_messages(resources: ExperimentResources) -> None:
    seen: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        assert context.get_remaining_time_in_millis() > 0
        records = event["Records"]
        assert all(r["eventSource"] == "aws:sqs" and r["eventSourceARN"].endswith("-ingest") for r in records)
        seen.extend(json.loads(r["body"]) for r in records)
        odd = [r for r in records if json.loads(r["body"])["n"] % 2]
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in odd]}

    _send(resources.ingest_queue_url, [1, 2, 3, 4])
    consumer = QueueConsumer(
        "ingest", resources.ingest_queue_url, handler, region=REGION, batch_size=10, wait_time_s=0, retry_delay_s=0
    )
    consumer.start = lambda: None  # type: ignore[method-assign]  # drive it synchronously
    consumer._queue_arn = "arn:aws:sqs:us-east-1:123456789012:rollouts-test-exp-ingest"
    assert consumer.poll_once() == 4
    assert consumer.stats.failed == 2
    left = sorted(body["n"] for body in receive_all(resources.ingest_queue_url))
    assert left == [1, 3], "only the failed messages are redelivered"


def test_a_batch_over_ten_is_gathered_from_several_receives(resources: ExperimentResources) -> None:
    """SQS returns at most 10 messages a receive (real SQS refuses MaxNumberOfMessages above 10); a dispatcher's
    batch of 25 is gathered as Lambda's poller gathers it, and failures are handed back past the first 10."""
    batches: list[int] = []
    handled: list[int] = []

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        batches.append(len(event["Records"]))
        handled.extend(json.loads(r["body"])["n"] for r in event["Records"] if json.loads(r["body"])["n"] < 20)
        late = [r for r in event["Records"] if json.loads(r["body"])["n"] >= 20]
        return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in late]}

    _send(resources.ingest_queue_url, list(range(30)))
    consumer = QueueConsumer(
        "ingest", resources.ingest_queue_url, handler, region=REGION, batch_size=25, wait_time_s=0, retry_delay_s=0
    )
    consumer._queue_arn = "arn"
    assert consumer.poll_once() == 25
    assert batches == [25]
    left = sorted(body["n"] for body in receive_all(resources.ingest_queue_url))
    assert left == sorted(set(range(30)) - set(handled))  # the failed (>= 20) and the 5 not received


def test_handler_exception_redelivers_the_whole_batch(resources: ExperimentResources) -> None:
    def handler(event: dict[str, Any], context: LambdaContext) -> None:
        raise RuntimeError("boom")

    _send(resources.ingest_queue_url, [7, 8])
    consumer = QueueConsumer(
        "ingest", resources.ingest_queue_url, handler, region=REGION, wait_time_s=0, retry_delay_s=0
    )
    consumer._queue_arn = "arn"
    assert consumer.poll_once() == 2
    assert consumer.stats.handler_errors == 1
    assert sorted(b["n"] for b in receive_all(resources.ingest_queue_url)) == [7, 8]


def test_threaded_consumer_processes_everything_then_stops(resources: ExperimentResources) -> None:
    done: list[int] = []

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        done.extend(json.loads(r["body"])["n"] for r in event["Records"])
        return {"batchItemFailures": []}

    _send(resources.rollout_queue_url, list(range(12)))
    consumer = QueueConsumer(
        "dispatch", resources.rollout_queue_url, handler, region=REGION, max_concurrency=2, wait_time_s=0
    )
    consumer.start()
    try:
        import time

        deadline = time.monotonic() + 20
        while len(done) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.stop()
    assert sorted(done) == list(range(12))
    assert receive_all(resources.rollout_queue_url) == []


def test_schedule_passes_a_scheduled_event() -> None:
    events: list[dict[str, Any]] = []
    schedule = Schedule("sweeper", lambda event, context: events.append(event), interval_s=60)
    schedule.run_once()
    assert events[0]["detail-type"] == "Scheduled Event"
    assert schedule.runs == 1


class _EmptyQueue:
    """An SQS client with nothing to receive: the consumer is told to stop at the `stop_after`th poll."""

    def __init__(self, consumer: QueueConsumer, stop_after: int) -> None:
        self.consumer, self.stop_after, self.polls = consumer, stop_after, 0

    def client(self, _service: str) -> _EmptyQueue:
        return self

    def receive_message(self, **_request: Any) -> dict[str, Any]:
        self.polls += 1
        if self.polls >= self.stop_after:
            self.consumer._stop.set()
        return {}


class _RecordedWaits(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def _pauses_after_empty_polls(idle_s: float) -> tuple[int, list[float | None]]:
    consumer = QueueConsumer("idle", "https://queue", lambda _e, _c: {}, region=REGION, wait_time_s=0, idle_s=idle_s)
    queue = _EmptyQueue(consumer, stop_after=3)
    consumer.clients = queue  # type: ignore[assignment]
    consumer._stop = waits = _RecordedWaits()
    consumer._run()
    return queue.polls, waits.waits


def test_short_polls_pause_between_empty_receives_only_when_asked() -> None:
    assert _pauses_after_empty_polls(0.25) == (3, [0.25, 0.25, 0.25])
    assert _pauses_after_empty_polls(0.0) == (3, [])
