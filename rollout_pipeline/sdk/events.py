"""Consuming the trainer queue: pushed pipeline events, each `event_id` handed to user code once.

Delivery rules (see docs/sdk.md):

- a message is deleted only once user code is done with it: the iterator advanced past it, the handler returned,
  or the `with` block exited without an exception. A crash or an exception releases it (visibility 0), so it is
  delivered again: nothing is lost;
- every `event_id` is handed over once per process: a bounded LRU of acknowledged ids drops redeliveries and the
  duplicates at-least-once delivery produces (the duplicate message is deleted);
- filters (batch id, detail types): a message that does not match is released for other consumers (visibility 0),
  or deleted with `consume_others=True`. One consumer per trainer queue is the recommended setup.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, TypeAlias

from pydantic import ValidationError

from rollout_pipeline.contracts import (
    EVENT_SOURCE,
    BatchAccepted,
    BatchCompleted,
    DetailType,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    parse_detail,
    reward_stats,
)
from rollout_pipeline.sdk._aws import AwsClients, aws_errors, error_code

logger = logging.getLogger(__name__)

AnyDetail: TypeAlias = RolloutCompleted | RolloutFailed | GroupCompleted | BatchAccepted | BatchCompleted
RolloutDetail: TypeAlias = RolloutCompleted | RolloutFailed

#: SQS long-poll wait (seconds) when nothing caps it.
DEFAULT_POLL_WAIT_S: Final = 20
DEFAULT_SEEN_IDS: Final = 100_000
#: Back-off when a receive returned only messages for other consumers: every receive counts towards the queue's
#: maxReceiveCount (its DLQ), so a filtering consumer must not spin on them.
_IDLE_BACKOFF_MIN_S: Final = 0.5
_IDLE_BACKOFF_MAX_S: Final = 5.0
_SHORT_POLL_PAUSE_S: Final = 0.2


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
    return envelope, Event(detail_type=detail_type, detail=detail, envelope=envelope)


class SeenIds:
    """A bounded, thread-safe LRU of event ids already handed to user code."""

    def __init__(self, max_size: int = DEFAULT_SEEN_IDS) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        self.max_size = max_size
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, event_id: object) -> bool:
        with self._lock:
            if event_id in self._ids:
                self._ids.move_to_end(str(event_id))
                return True
            return False

    def add(self, event_id: str) -> None:
        with self._lock:
            self._ids[event_id] = None
            self._ids.move_to_end(event_id)
            while len(self._ids) > self.max_size:
                self._ids.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)


@dataclass
class Delivery:
    """A received message: its receipt handle and the event it carries (None: not a pipeline event)."""

    receipt: str
    event: Event | None
    message_id: str = ""


class QueueReader:
    """Receive / delete / release on one SQS queue. Stale receipt handles are tolerated (logged, not raised)."""

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

    def release(self, delivery: Delivery, after_s: int = 0) -> None:
        """Make the message visible again at once (for another consumer, or a retry), or after `after_s`."""
        self._call("change_message_visibility", delivery, VisibilityTimeout=after_s)

    def _call(self, operation: str, delivery: Delivery, **kwargs: Any) -> None:
        from botocore.exceptions import ClientError

        try:
            with aws_errors(operation):
                getattr(self.aws.client("sqs"), operation)(
                    QueueUrl=self.queue_url, ReceiptHandle=delivery.receipt, **kwargs
                )
        except Exception as exc:
            cause = exc.__context__ if isinstance(exc.__context__, ClientError) else exc
            # The message was received again elsewhere (its handle is stale) or already deleted: nothing to do.
            logger.debug("%s failed (%s): %s", operation, error_code(cause) or type(exc).__name__, exc)


class EventFilter:
    """Which events a consumer wants: by batch id(s) and detail type(s); `None` means all."""

    def __init__(
        self, batch_id: str | Iterable[str] | None = None, detail_types: Iterable[DetailType | str] | None = None
    ) -> None:
        if isinstance(batch_id, str):
            self.batch_ids: frozenset[str] | None = frozenset({batch_id})
        else:
            self.batch_ids = frozenset(batch_id) if batch_id is not None else None
        self.detail_types = frozenset(DetailType(t) for t in detail_types) if detail_types is not None else None

    def matches(self, event: Event) -> bool:
        if self.batch_ids is not None and event.batch_id not in self.batch_ids:
            return False
        return self.detail_types is None or event.detail_type in self.detail_types


class EventStream(Iterator[Event]):
    """An iterator over pipeline events from the trainer queue (see the module docstring for delivery rules).

    Use it in a `with` block to acknowledge the last event when the block ends normally::

        with experiment.events(batch_id=batch) as stream:
            for event in stream:
                handle(event)          # raising here releases the event for redelivery

    Stops after `timeout` seconds in total, after `max_events` events, or when `close()` is called.
    """

    def __init__(
        self,
        reader: QueueReader,
        seen: SeenIds,
        *,
        event_filter: EventFilter | None = None,
        timeout: float | None = None,
        max_events: int | None = None,
        consume_others: bool = False,
        poll_wait_s: float = DEFAULT_POLL_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._reader = reader
        self._seen = seen
        self._filter = event_filter or EventFilter()
        self._deadline = None if timeout is None else clock() + max(0.0, timeout)
        self._max_events = max_events
        self._consume_others = consume_others
        self._poll_wait_s = max(0.0, poll_wait_s)
        self._clock = clock
        self._sleep = sleep
        self._buffer: deque[Delivery] = deque()
        self._current: Delivery | None = None
        self._handed = 0
        self._closed = False
        self._backoff = 0.0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------------- iteration

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        with self._lock:
            self._ack_current()
            if self._max_events is not None and self._handed >= self._max_events:
                self.close()
                raise StopIteration
            while not self.expired():
                delivery = self.next_delivery(self.remaining())
                if delivery is not None:
                    assert delivery.event is not None
                    self._current = delivery
                    self._handed += 1
                    return delivery.event
                if self._closed:
                    break
            self.close()
            raise StopIteration

    def next_delivery(self, budget_s: float | None) -> Delivery | None:
        """The next matching, not yet seen delivery, waiting at most `budget_s` (None: one long poll).

        The caller owns the returned delivery: it must `ack` or `release` it. Returns None when the budget ran
        out (or the stream is closed) without a matching event.
        """
        with self._lock:
            start = self._clock()
            polls = 0
            while not self._closed:
                delivery = self._pop_buffered()
                if delivery is not None:
                    return delivery
                if budget_s is None:
                    if polls:
                        return None
                    left = self._poll_wait_s
                else:
                    left = budget_s - (self._clock() - start)
                    if left <= 0 and polls:
                        return None
                if self._backoff and (left > 0 or budget_s is None):
                    pause = self._backoff if budget_s is None else min(self._backoff, left)
                    self._sleep(pause)
                    left = max(0.0, left - pause)
                wait = math.ceil(min(self._poll_wait_s, max(0.0, left)))
                received = self._reader.receive(wait)
                polls += 1
                self._buffer.extend(received)
                if not received and wait == 0 and budget_s is not None and left > 0:
                    self._sleep(min(_SHORT_POLL_PAUSE_S, left))  # short polling: pause instead of spinning
            return None

    def _pop_buffered(self) -> Delivery | None:
        skipped = False
        while self._buffer:
            delivery = self._buffer.popleft()
            event = delivery.event
            if event is None or not self._filter.matches(event):
                self._skip(delivery)
                skipped = True
                continue
            if event.event_id in self._seen:
                self._reader.delete(delivery)  # a duplicate of an event already handled
                continue
            self._backoff = 0.0
            return delivery
        if skipped:
            # Only other consumers' messages (released again): back off instead of spinning on them.
            self._backoff = min(max(self._backoff * 2, _IDLE_BACKOFF_MIN_S), _IDLE_BACKOFF_MAX_S)
        return None

    def ack(self, delivery: Delivery) -> None:
        """Done with this delivery: delete its message and remember its event id."""
        if delivery.event is not None:
            self._seen.add(delivery.event.event_id)
        self._reader.delete(delivery)

    def release(self, delivery: Delivery) -> None:
        """Not done: make the message visible again so it is delivered again."""
        self._reader.release(delivery)

    def ack_duplicate(self, delivery: Delivery) -> None:
        """Delete a second copy of an event whose first copy is still held (not yet confirmed)."""
        self._reader.delete(delivery)

    def _skip(self, delivery: Delivery) -> None:
        if self._consume_others:
            self._reader.delete(delivery)
        else:
            # Visibility is global in SQS: hiding it longer would hide it from its rightful consumer too.
            self._reader.release(delivery)

    def _ack_current(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            self.ack(current)

    def remaining(self) -> float | None:
        """Seconds left before `timeout` (None: no timeout)."""
        return None if self._deadline is None else max(0.0, self._deadline - self._clock())

    def expired(self) -> bool:
        """True once `timeout` has passed."""
        return self._deadline is not None and self._clock() >= self._deadline

    @property
    def closed(self) -> bool:
        return self._closed

    # --------------------------------------------------------------------------------------------- closing

    @property
    def handed(self) -> int:
        """How many events this stream handed to user code."""
        return self._handed

    def close(self, *, ack_current: bool = False) -> None:
        """Stop: the last handed event is acknowledged only with `ack_current=True` (else redelivered);
        received but not yet handed messages are released at once."""
        with self._lock:
            if self._current is not None:
                if ack_current:
                    self._ack_current()
                else:
                    current, self._current = self._current, None
                    self.release(current)
            while self._buffer:
                self._reader.release(self._buffer.popleft())
            self._closed = True

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ack_current=exc_type is None)


# ------------------------------------------------------------------------------------------------------ groups


@dataclass
class Group:
    """A complete GRPO group: the `Group Completed` event plus the per-rollout events received for it."""

    completed: GroupCompleted
    rollouts: dict[int, RolloutDetail] = field(default_factory=dict)

    @property
    def batch_id(self) -> str:
        return self.completed.batch_id

    @property
    def input_id(self) -> str:
        return self.completed.input_id

    @property
    def group_size(self) -> int:
        return self.completed.group_size

    @property
    def rewards(self) -> list[float | None]:
        """Scalar reward by rollout index; None where the rollout failed."""
        return list(self.completed.rewards)

    @property
    def missing(self) -> list[int]:
        """Indices whose per-rollout event was not received (yet): the group event alone still has the rewards."""
        return [i for i in range(self.group_size) if i not in self.rollouts]

    def advantages(self, eps: float = 1e-6) -> list[float | None]:
        """GRPO advantages `(r - mean) / (std + eps)` over the successful rollouts; None for failed ones."""
        values = [r for r in self.completed.rewards if r is not None]
        mean, std = reward_stats(values)
        if mean is None or std is None:
            return [None] * len(self.completed.rewards)
        return [None if r is None else (r - mean) / (std + eps) for r in self.completed.rewards]


_GROUP_TYPES: Final = (DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED, DetailType.GROUP_COMPLETED)
DEFAULT_GROUP_GRACE_S: Final = 5.0
DEFAULT_MAX_BUFFERED_ROLLOUTS: Final = 100_000


class GroupStream(Iterator[Group]):
    """Complete GRPO groups of a batch, in the order they complete.

    Per-rollout events are acknowledged when buffered (their content is in memory); the `Group Completed` message
    is acknowledged when the iterator advances past the group. Events can arrive out of order: a group whose
    per-rollout events are not all in yet waits up to `grace_s` for them, then is yielded anyway (`Group.missing`).
    After a crash the redelivered `Group Completed` still carries every reward, so advantages stay computable.
    """

    def __init__(
        self,
        stream: EventStream,
        *,
        grace_s: float = DEFAULT_GROUP_GRACE_S,
        max_buffered_rollouts: int = DEFAULT_MAX_BUFFERED_ROLLOUTS,
        stop_on_batch_completed: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._grace_s = grace_s
        self._max_buffered = max_buffered_rollouts
        self._stop_on_batch_completed = stop_on_batch_completed
        self._clock = clock
        self._rollouts: OrderedDict[tuple[str, str], dict[int, RolloutDetail]] = OrderedDict()
        self._buffered = 0
        self._parked: OrderedDict[tuple[str, str], tuple[Delivery, GroupCompleted, float]] = OrderedDict()
        self._current: Delivery | None = None
        self._batch_done = False
        self._expected = 0
        self._covered = 0
        self._drain_until = 0.0

    def __iter__(self) -> GroupStream:
        return self

    def __next__(self) -> Group:
        if self._current is not None:
            current, self._current = self._current, None
            self._stream.ack(current)
        while True:
            ready = self._pop_ready(force=False)
            if ready is not None:
                return ready
            if self._batch_done and not self._parked and self._drained():
                self._stream.close()
                raise StopIteration
            delivery = self._stream.next_delivery(self._budget())
            if delivery is not None:
                self._take(delivery)
            elif self._stream.closed or self._stream.expired():
                ready = self._pop_ready(force=True)
                if ready is not None:
                    return ready
                self._stream.close()
                raise StopIteration

    def _drained(self) -> bool:
        """After `Batch Completed`: every rollout is covered by a yielded group, or no group came for a while."""
        return self._covered >= self._expected or self._clock() >= self._drain_until

    def _budget(self) -> float | None:
        deadlines = [deadline for _d, _g, deadline in self._parked.values()]
        if self._batch_done:
            deadlines.append(self._drain_until)
        remaining = self._stream.remaining()
        if not deadlines:
            return remaining
        wait = max(0.0, min(deadlines) - self._clock())
        return wait if remaining is None else min(wait, remaining)

    def _take(self, delivery: Delivery) -> None:
        event = delivery.event
        assert event is not None
        detail = event.detail
        if isinstance(detail, RolloutCompleted | RolloutFailed):
            key = (detail.batch_id, detail.input_id)
            bucket = self._rollouts.setdefault(key, {})
            if detail.index not in bucket:
                self._buffered += 1
            bucket[detail.index] = detail
            self._stream.ack(delivery)
            self._evict()
        elif isinstance(detail, GroupCompleted):
            key = (detail.batch_id, detail.input_id)
            parked = self._parked.get(key)
            if parked is not None:
                held, held_detail, deadline = parked
                if delivery.message_id and delivery.message_id == held.message_id:
                    # The held message came back (its visibility ran out): only the new receipt is valid.
                    self._parked[key] = (delivery, held_detail, deadline)
                else:  # another copy of the same event: the held one stands for it
                    self._stream.ack_duplicate(delivery)
                return
            self._parked[key] = (delivery, detail, self._clock() + self._grace_s)
            self._drain_until = self._clock() + self._grace_s
        elif isinstance(detail, BatchCompleted):
            self._stream.ack(delivery)
            if self._stop_on_batch_completed:
                # Events are not ordered: groups may still be on their way. Stop once the groups yielded cover
                # every rollout, or when none arrived for `grace_s`.
                self._batch_done = True
                self._expected = detail.rollouts_total
                self._drain_until = self._clock() + self._grace_s
        else:
            self._stream.ack(delivery)

    def _pop_ready(self, *, force: bool) -> Group | None:
        now = self._clock()
        for key, (delivery, detail, deadline) in self._parked.items():
            rollouts = self._rollouts.get(key, {})
            if force or now >= deadline or all(i in rollouts for i in range(detail.group_size)):
                del self._parked[key]
                rollouts = self._rollouts.pop(key, {})
                self._buffered -= len(rollouts)
                self._current = delivery
                self._covered += detail.group_size
                return Group(completed=detail, rollouts=dict(sorted(rollouts.items())))
        return None

    def _evict(self) -> None:
        while self._buffered > self._max_buffered and self._rollouts:
            _key, dropped = self._rollouts.popitem(last=False)
            self._buffered -= len(dropped)

    def close(self, *, ack_current: bool = False) -> None:
        """Stop; parked groups and (unless `ack_current`) the last yielded group are released for redelivery."""
        if self._current is not None:
            current, self._current = self._current, None
            if ack_current:
                self._stream.ack(current)
            else:
                self._stream.release(current)
        for delivery, _detail, _deadline in self._parked.values():
            self._stream.release(delivery)
        self._parked.clear()
        self._stream.close()

    def __enter__(self) -> GroupStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ack_current=exc_type is None)


GROUP_DETAIL_TYPES: Final = (*_GROUP_TYPES, DetailType.BATCH_COMPLETED)


# ------------------------------------------------------------------------------------------------------- async

_END: Final = object()


def _next_or_end(iterator: Iterator[Any]) -> Any:
    try:
        return next(iterator)
    except StopIteration:
        return _END


class AsyncStream(AsyncIterator[Any]):
    """Async view of an `EventStream` or `GroupStream`: each step runs in a worker thread (the loop never blocks).

    `async with` acknowledges the last item when the block ends normally, like the sync `with`.
    """

    def __init__(self, stream: EventStream | GroupStream) -> None:
        self._stream = stream

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        item = await asyncio.to_thread(_next_or_end, self._stream)
        if item is _END:
            raise StopAsyncIteration
        return item

    async def aclose(self, *, ack_current: bool = False) -> None:
        await asyncio.to_thread(lambda: self._stream.close(ack_current=ack_current))

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(ack_current=exc_type is None)
