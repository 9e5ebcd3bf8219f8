"""Consuming the trainer queue: pushed pipeline events, each `event_id` handed to user code once.

The stable import path of the SDK's event classes; the code lives in one module per concern: `transport`
(envelopes; SQS receive, delete, redeliver), `delivery` (the delivery rules: `EventStream`, `EventFilter`,
`SeenIds`), `groups` (GRPO groups and advantages) and `aio` (asyncio views).
"""

from rollout_pipeline.sdk.aio import AsyncStream
from rollout_pipeline.sdk.delivery import DEFAULT_POLL_WAIT_S, DEFAULT_SEEN_IDS, EventFilter, EventStream, SeenIds
from rollout_pipeline.sdk.groups import (
    DEFAULT_GROUP_GRACE_S,
    DEFAULT_MAX_BUFFERED_ROLLOUTS,
    GROUP_DETAIL_TYPES,
    Group,
    GroupStream,
)
from rollout_pipeline.sdk.transport import AnyDetail, Delivery, Event, QueueReader, RolloutDetail, parse_envelope

__all__ = [
    "DEFAULT_GROUP_GRACE_S",
    "DEFAULT_MAX_BUFFERED_ROLLOUTS",
    "DEFAULT_POLL_WAIT_S",
    "DEFAULT_SEEN_IDS",
    "GROUP_DETAIL_TYPES",
    "AnyDetail",
    "AsyncStream",
    "Delivery",
    "Event",
    "EventFilter",
    "EventStream",
    "Group",
    "GroupStream",
    "QueueReader",
    "RolloutDetail",
    "SeenIds",
    "parse_envelope",
]
