"""SQS adapter (MessageQueue): sends in batches of 10, partial failures retried with backoff; receives (short polls),
deletes and releases (visibility 0) in batches of 10, best effort: an entry SQS did not take comes back after its
visibility timeout."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rollout_pipeline.adapters.clients import client

SQS_BATCH = 10
SEND_ATTEMPTS = 5


class SendError(RuntimeError):
    """Some messages could not be sent after retries."""


class SqsQueue:
    def __init__(self, sqs_client: Any | None = None, sleep: Any = time.sleep) -> None:
        self._client = sqs_client
        self._sleep = sleep
        self.calls = 0

    @property
    def sqs(self) -> Any:
        if self._client is None:
            self._client = client("sqs")
        return self._client

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        for start in range(0, len(bodies), SQS_BATCH):
            self._send_batch(queue_url, list(bodies[start : start + SQS_BATCH]), delay_seconds)

    def _send_batch(self, queue_url: str, bodies: list[str], delay_seconds: int) -> None:
        pending = {str(i): body for i, body in enumerate(bodies)}
        last_error = ""
        for attempt in range(SEND_ATTEMPTS):
            entries = [{"Id": i, "MessageBody": b, "DelaySeconds": delay_seconds} for i, b in pending.items()]
            self.calls += 1
            resp = self.sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
            failed = resp.get("Failed") or []
            for ok in resp.get("Successful") or []:
                pending.pop(ok["Id"], None)
            if not pending:
                return
            sender_faults = [f for f in failed if f.get("SenderFault")]
            if sender_faults:
                first = sender_faults[0]
                raise SendError(f"SQS rejected a message: {first.get('Code')}: {first.get('Message')}")
            last_error = "; ".join(f"{f.get('Code')}: {f.get('Message')}" for f in failed)
            self._sleep(min(0.1 * 2**attempt, 2.0))
        raise SendError(f"{len(pending)} message(s) not sent after {SEND_ATTEMPTS} attempts: {last_error}")

    def receive(self, queue_url: str, max_messages: int) -> list[tuple[str, str]]:
        self.calls += 1
        resp = self.sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=max(1, min(SQS_BATCH, max_messages)), WaitTimeSeconds=0
        )
        return [(m["ReceiptHandle"], m["Body"]) for m in resp.get("Messages") or []]

    def delete(self, queue_url: str, receipts: Sequence[str]) -> None:
        for start in range(0, len(receipts), SQS_BATCH):
            entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts[start : start + SQS_BATCH])]
            self.calls += 1
            self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)

    def release(self, queue_url: str, receipts: Sequence[str]) -> None:
        for start in range(0, len(receipts), SQS_BATCH):
            chunk = receipts[start : start + SQS_BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": 0} for i, r in enumerate(chunk)]
            self.calls += 1
            self.sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)
