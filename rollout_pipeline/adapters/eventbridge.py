"""EventBridge adapter (EventPublisher): PutEvents in batches of 10 entries and < 1 MB, failed entries retried."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rollout_pipeline.adapters.clients import client
from rollout_pipeline.contracts import EVENT_SOURCE, detail_type_of
from rollout_pipeline.ports import PublishError

PUT_EVENTS_BATCH = 10
PUBLISH_ATTEMPTS = 4
#: PutEvents: "the total entry size must be less than 1MB" per call (botocore's current events model); entry size
#: as EventBridge computes it (`entry_size`). Kept a little below the limit.
PUT_EVENTS_MAX_BYTES = 1_000_000
_TIME_BYTES = 14


def entry_size(entry: dict[str, Any]) -> int:
    """Size of one PutEvents entry as EventBridge counts it: UTF-8 bytes of Source, DetailType, Detail and each
    resource, plus 14 for Time when set."""
    size = _TIME_BYTES if entry.get("Time") is not None else 0
    for name in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(name) or "").encode())
    return size + sum(len(str(r).encode()) for r in entry.get("Resources") or [])


def put_events_batches(entries: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split entries into PutEvents calls of at most 10 entries and `PUT_EVENTS_MAX_BYTES` in total, in order."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for entry in entries:
        this = entry_size(entry)
        if current and (len(current) >= PUT_EVENTS_BATCH or size + this > PUT_EVENTS_MAX_BYTES):
            batches.append(current)
            current, size = [], 0
        current.append(entry)
        size += this
    if current:
        batches.append(current)
    return batches


class EventBridgePublisher:
    def __init__(self, bus_name: str, events_client: Any | None = None, sleep: Any = time.sleep) -> None:
        self.bus_name = bus_name
        self._client = events_client
        self._sleep = sleep
        self.calls = 0

    @property
    def events(self) -> Any:
        if self._client is None:
            self._client = client("events")
        return self._client

    def publish(self, details: Sequence[Any]) -> None:
        entries = [
            {
                "Source": EVENT_SOURCE,
                "DetailType": str(detail_type_of(d)),
                "Detail": d.model_dump_json(),
                "EventBusName": self.bus_name,
                "Resources": [],
            }
            for d in details
        ]
        for batch in put_events_batches(entries):
            self._put(batch)

    def _put(self, entries: list[dict[str, Any]]) -> None:
        pending = entries
        last_error = ""
        for attempt in range(PUBLISH_ATTEMPTS):
            self.calls += 1
            resp = self.events.put_events(Entries=pending)
            if not resp.get("FailedEntryCount"):
                return
            results = resp.get("Entries") or []
            failed = [entry for entry, res in zip(pending, results, strict=False) if res.get("ErrorCode")]
            last_error = "; ".join(
                f"{r.get('ErrorCode')}: {r.get('ErrorMessage')}" for r in results if r.get("ErrorCode")
            )
            pending = failed or pending
            self._sleep(min(0.1 * 2**attempt, 1.0))
        raise PublishError(f"{len(pending)} event(s) not accepted by bus {self.bus_name}: {last_error}")
