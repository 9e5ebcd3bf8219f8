"""GRPO groups from the event stream: a group is complete when its `Group Completed` event (and, within a grace
period, its per-rollout events) arrived; advantages are computed from the group's rewards."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

from rollout_pipeline.contracts import (
    ADVANTAGE_EPS,
    BatchCompleted,
    DetailType,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    grpo_advantages,
)
from rollout_pipeline.sdk.delivery import EventStream
from rollout_pipeline.sdk.transport import Delivery, RolloutDetail


@dataclass
class Group:
    """A complete GRPO group: the `Group Completed` event plus the per-rollout events received for it (never those
    of its surplus rollouts, with `oversample`)."""

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
        return [i for i in members_of(self.completed) if i not in self.rollouts]

    @property
    def valid_size(self) -> int:
        """Members with a reward: the rewards a trainer may learn from."""
        return self.completed.succeeded

    @property
    def excluded(self) -> list[int]:
        """Indices of members that failed: the trainer masks them (never a reward of 0)."""
        return sorted(int(i) for i in self.completed.failures)

    @property
    def zero_variance(self) -> bool:
        """Every valid reward is equal (or fewer than two): every advantage is 0."""
        return self.completed.zero_variance

    def advantages(self, eps: float = ADVANTAGE_EPS) -> list[float | None]:
        """GRPO advantages `(r - mean) / (std + eps)` over the successful rollouts; None for failed ones
        (`contracts.grpo_advantages`, the formula the dataset export and re-scoring use too)."""
        return grpo_advantages(self.completed.rewards, eps)


def members_of(detail: GroupCompleted) -> list[int]:
    """The indices of a completed group's members: every rollout but its surplus ones."""
    cut = set(detail.surplus)
    return [i for i in range(detail.group_size) if i not in cut]


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
        self._lock = threading.RLock()  # the groups' state; never held while the stream waits

    def __iter__(self) -> GroupStream:
        return self

    def __next__(self) -> Group:
        with self._lock:
            if self._current is not None:
                current, self._current = self._current, None
                self._stream.ack(current)
        while True:
            with self._lock:
                ready = self._pop_ready(force=False)
                if ready is not None:
                    return ready
                if self._batch_done and not self._parked and self._drained():
                    self._stream.close()
                    raise StopIteration
                budget = self._budget()
            delivery = self._stream.next_delivery(budget)  # `close()` from another thread ends this wait
            with self._lock:
                if delivery is not None and self._stream.closed:
                    self._stream.redeliver(delivery)
                elif delivery is not None:
                    self._take(delivery)
                    continue
                if self._stream.closed or self._stream.expired():
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
            if force or now >= deadline or all(i in rollouts for i in members_of(detail)):
                del self._parked[key]
                received = self._rollouts.pop(key, {})
                self._buffered -= len(received)
                rollouts = {i: r for i, r in received.items() if i not in detail.surplus}
                self._current = delivery
                self._covered += detail.group_size
                return Group(completed=detail, rollouts=dict(sorted(rollouts.items())))
        return None

    def _evict(self) -> None:
        while self._buffered > self._max_buffered and self._rollouts:
            _key, dropped = self._rollouts.popitem(last=False)
            self._buffered -= len(dropped)

    def close(self, *, ack_current: bool = False) -> None:
        """Stop; parked groups and (unless `ack_current`) the last yielded group are given back for redelivery.
        Returns at once when another thread is waiting for the next group (it then stops)."""
        with self._lock:
            if self._current is not None:
                current, self._current = self._current, None
                if ack_current:
                    self._stream.ack(current)
                else:
                    self._stream.redeliver(current)
            for delivery, _detail, _deadline in self._parked.values():
                self._stream.redeliver(delivery)
            self._parked.clear()
        self._stream.close()

    def __enter__(self) -> GroupStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(ack_current=exc_type is None)


GROUP_DETAIL_TYPES: Final = (*_GROUP_TYPES, DetailType.BATCH_COMPLETED)
