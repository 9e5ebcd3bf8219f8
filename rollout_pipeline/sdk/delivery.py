"""Consuming the trainer queue: pushed pipeline events, each `event_id` handed to user code once.

Delivery rules (see docs/sdk.md):

- a message is deleted only once user code is done with it: the iterator advanced past it, the handler returned,
  or the `with` block exited without an exception. A crash or an exception gives it back (visibility 0), so it is
  delivered again: nothing is lost;
- every `event_id` is handed over once per process: a bounded LRU of acknowledged ids drops redeliveries and the
  duplicates at-least-once delivery produces (the duplicate message is deleted);
- filters (batch id, detail types): a message that does not match is given back for other consumers (visibility 0),
  or deleted with `consume_others=True`. The trainer queue has one consumer: the trainer of every batch. A stream
  of some batches reads a private subscription of its own instead (`subscription.SubscribedStream`), so it never
  receives, and never wears out, other consumers' events.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Final

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.sdk.transport import Delivery, Event, QueueReader

#: SQS long-poll wait (seconds) when nothing caps it.
DEFAULT_POLL_WAIT_S: Final = 20
DEFAULT_SEEN_IDS: Final = 100_000
#: Back-off when a receive returned only messages for other consumers: every receive counts towards the queue's
#: maxReceiveCount (its DLQ), so a filtering consumer must not spin on them.
_IDLE_BACKOFF_MIN_S: Final = 0.5
_IDLE_BACKOFF_MAX_S: Final = 5.0
_SHORT_POLL_PAUSE_S: Final = 0.2


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


class EventFilter:
    """Which events a consumer wants: by batch id(s) and detail type(s); `None` means all. Experiment-wide events
    (`batch_id` "": the experiment's `Budget Warning` / `Budget Exhausted`) concern every batch: every batch filter
    lets them through."""

    def __init__(
        self, batch_id: str | Iterable[str] | None = None, detail_types: Iterable[DetailType | str] | None = None
    ) -> None:
        if isinstance(batch_id, str):
            self.batch_ids: frozenset[str] | None = frozenset({batch_id})
        else:
            self.batch_ids = frozenset(batch_id) if batch_id is not None else None
        self.detail_types = frozenset(DetailType(t) for t in detail_types) if detail_types is not None else None

    def matches(self, event: Event) -> bool:
        if self.batch_ids is not None and event.batch_id and event.batch_id not in self.batch_ids:
            return False
        return self.detail_types is None or event.detail_type in self.detail_types


class EventStream(Iterator[Event]):
    """An iterator over pipeline events from the trainer queue (see the module docstring for delivery rules).

    Use it in a `with` block to acknowledge the last event when the block ends normally::

        with experiment.events(batch_id=batch) as stream:
            for event in stream:
                handle(event)          # raising here gives the event back for redelivery

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
        sleep: Callable[[float], None] | None = None,
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
        #: Guards the buffer and the stream's state; never held while waiting (a receive, a pause), so `close()`
        #: from another thread returns at once.
        self._lock = threading.RLock()
        self._closing = threading.Event()  # set by `close()`: ends a pause at once

    # ------------------------------------------------------------------------------------------- iteration

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        with self._lock:
            self._ack_current()
            if self._max_events is not None and self._handed >= self._max_events:
                self.close()
                raise StopIteration
        while not self.expired() and not self._closed:
            delivery = self.next_delivery(self.remaining())
            if delivery is not None:
                with self._lock:
                    if not self._closed:
                        assert delivery.event is not None
                        self._current = delivery
                        self._handed += 1
                        return delivery.event
                self.redeliver(delivery)  # closed while it was being received: delivered again later
        self.close()
        raise StopIteration

    def next_delivery(self, budget_s: float | None) -> Delivery | None:
        """The next matching, not yet seen delivery, waiting at most `budget_s` (None: one long poll).

        The caller owns the returned delivery: it must `ack` or `redeliver` it. Returns None when the budget ran
        out (or the stream is closed) without a matching event. The stream's lock is not held while it waits:
        `close()` from another thread returns at once and ends a pause; a receive under way ends with its long
        poll, and what it received is given back.
        """
        start = self._clock()
        polls = 0
        while True:
            with self._lock:
                if self._closed:
                    return None
                delivery = self._pop_buffered()
                if delivery is not None:
                    return delivery
                if self._refill():
                    continue
                backoff = self._backoff
            if budget_s is None:
                if polls:
                    return None
                left = self._poll_wait_s
            else:
                left = budget_s - (self._clock() - start)
                if left <= 0 and polls:
                    return None
            if backoff and (left > 0 or budget_s is None):
                pause = backoff if budget_s is None else min(backoff, left)
                self._pause(pause)
                left = max(0.0, left - pause)
            wait = math.ceil(min(self._poll_wait_s, max(0.0, left)))
            received = self._receive(wait)
            polls += 1
            if received is None:
                return None
            if not received and wait == 0 and budget_s is not None and left > 0:
                self._pause(min(_SHORT_POLL_PAUSE_S, left))  # short polling: pause instead of spinning

    def _receive(self, wait_s: int) -> list[Delivery] | None:
        """One receive, outside the lock, into the buffer; None when the stream was closed meanwhile (what it
        received is given back; a receive that failed because the close removed the queue is not an error)."""
        if self._closed:
            return None
        try:
            received = self._reader.receive(wait_s)
        except Exception:
            if self._closed:
                return None
            raise
        with self._lock:
            if not self._closed:
                self._buffer.extend(received)
                return received
        for delivery in received:
            self._reader.redeliver(delivery)
        return None

    def _pause(self, seconds: float) -> None:
        """Wait `seconds` (the injected `sleep` when there is one), ended at once by `close()`."""
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            self._closing.wait(seconds)

    def _refill(self) -> bool:
        """Add deliveries to the buffer from elsewhere than the queue (a subclass's hook, called when the buffer is
        empty, before each receive); True when it added some."""
        return False

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
            # Only other consumers' messages (given back again): back off instead of spinning on them.
            self._backoff = min(max(self._backoff * 2, _IDLE_BACKOFF_MIN_S), _IDLE_BACKOFF_MAX_S)
        return None

    def ack(self, delivery: Delivery) -> None:
        """Done with this delivery: delete its message and remember its event id."""
        if delivery.event is not None:
            self._seen.add(delivery.event.event_id)
        self._reader.delete(delivery)

    def redeliver(self, delivery: Delivery) -> None:
        """Not done: make the message visible again so it is delivered again."""
        self._reader.redeliver(delivery)

    def ack_duplicate(self, delivery: Delivery) -> None:
        """Delete a second copy of an event whose first copy is still held (not yet confirmed)."""
        self._reader.delete(delivery)

    def _skip(self, delivery: Delivery) -> None:
        if self._consume_others:
            self._reader.delete(delivery)
        else:
            # Visibility is global in SQS: hiding it longer would hide it from its rightful consumer too.
            self._reader.redeliver(delivery)

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
        received but not yet handed messages are given back at once."""
        self._closed = True  # first, without the lock: a waiting `next_delivery` stops at its next look
        self._closing.set()
        with self._lock:
            if self._current is not None:
                if ack_current:
                    self._ack_current()
                else:
                    current, self._current = self._current, None
                    self.redeliver(current)
            while self._buffer:
                self._reader.redeliver(self._buffer.popleft())

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ack_current=exc_type is None)
