"""EventBridge and SQS adapter (`ports.BusSubscriptions`): the private subscriptions on an experiment's bus, listed
by their rules' names (ListRules by name prefix: one call a page, the descriptions included) and removed whole
(targets, rule, queue). What the names, tags and descriptions mean is `bus_subscriptions`' (the caller passes them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

#: Errors that say a part is already gone (EventBridge, and SQS as the Query protocol and the JSON one spell it).
_GONE: Final = frozenset(
    {"ResourceNotFoundException", "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


class EventBridgeSubscriptions:
    """`events` and `sqs` are boto3 clients (or lazy ones); `prefixes` the rule names to list (`{bus}-tap-`...),
    `seen_tag` the queue tag their owners refresh, `target_id` the id of each rule's one target."""

    def __init__(
        self, events: Any, sqs: Any, bus_name: str, *, prefixes: Sequence[str], seen_tag: str, target_id: str
    ) -> None:
        self.events = events
        self.sqs = sqs
        self.bus_name = bus_name
        self.prefixes = tuple(prefixes)
        self.seen = seen_tag
        self.target_id = target_id

    def listed(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for prefix in self.prefixes:
            for page in self.events.get_paginator("list_rules").paginate(EventBusName=self.bus_name, NamePrefix=prefix):
                found += [(str(r["Name"]), str(r.get("Description") or "")) for r in page.get("Rules", [])]
        return found

    def seen_tag(self, name: str) -> str | None:
        url = self._queue_url(name)
        if url is None:
            return None
        try:
            tags = self.sqs.list_queue_tags(QueueUrl=url).get("Tags") or {}
        except Exception as exc:
            if _code(exc) in _GONE:
                return None
            raise
        value = tags.get(self.seen)
        return None if value is None else str(value)

    def remove(self, name: str) -> None:
        url = self._queue_url(name)
        steps: list[Callable[[], Any]] = [
            lambda: self.events.remove_targets(Rule=name, EventBusName=self.bus_name, Ids=[self.target_id]),
            lambda: self.events.delete_rule(Name=name, EventBusName=self.bus_name),
        ]
        if url is not None:
            steps.append(lambda: self.sqs.delete_queue(QueueUrl=url))
        for step in steps:
            try:
                step()
            except Exception as exc:
                if _code(exc) not in _GONE:
                    raise

    def _queue_url(self, name: str) -> str | None:
        try:
            return str(self.sqs.get_queue_url(QueueName=name)["QueueUrl"])
        except Exception as exc:
            if _code(exc) in _GONE:
                return None
            raise
