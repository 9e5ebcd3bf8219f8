"""EventBridge adapter (EventPublisher): PutEvents in batches of 10, failed entries retried."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rollout_pipeline.adapters.clients import client
from rollout_pipeline.contracts import EVENT_SOURCE, detail_type_of
from rollout_pipeline.ports import PublishError

PUT_EVENTS_BATCH = 10
PUBLISH_ATTEMPTS = 4


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
        for start in range(0, len(entries), PUT_EVENTS_BATCH):
            self._put(entries[start : start + PUT_EVENTS_BATCH])

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
