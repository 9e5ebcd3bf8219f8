"""A batch's events rebuilt from the ledger, and a stream that catches up: those first, then the live ones.

The pipeline publishes an event only once the ledger holds the state it reports (a rollout's terminal state, a
complete group, a complete batch whose `Batch Completed` was claimed; `Batch Accepted` once ingestion has ended),
and every event has a stable `event_id` (`ids.event_id`). So the events a batch has published so far can be rebuilt
from the ledger with the same ids and contents (`details`, the module the publishers build them with): what a
trainer that starts late, or a second consumer, missed. Differences from the published copies: a rebuilt rollout
event's `timings.notified_at` is its `finished_at` (the ledger does not keep when an event left), its envelope has
no EventBridge `id` and `time` but `"replayed": "ledger"`, and its result is inlined only with `fetch_result`.

`CatchUpStream` serves the rebuilt events first, then the live stream's, each `event_id` once for the stream: a
live copy of an event it rebuilt is dropped (and deleted), whichever arrives first is the one handed over. The
resume path (`Experiment.completed_groups`) rebuilds its groups with the same `group_events`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from rollout_pipeline.contracts import (
    EVENT_SOURCE,
    INLINE_RESULT_BYTES,
    DetailType,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    detail_type_of,
    redact_secrets,
    utcnow,
)
from rollout_pipeline.details import (
    batch_accepted_detail,
    batch_completion_detail,
    group_completion_detail,
    rollout_event,
    with_members,
)
from rollout_pipeline.ledger.items import BatchState, GroupItem, RolloutRecord
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.sdk.dataset import FetchResult, join_groups
from rollout_pipeline.sdk.delivery import EventStream
from rollout_pipeline.sdk.transport import AnyDetail, Delivery, Event

#: The envelope key that marks an event rebuilt from the ledger.
REPLAYED: Final = "replayed"


def group_events(
    group: GroupItem,
    records: Iterable[RolloutRecord],
    *,
    policy_version: str | None,
    fetch_result: FetchResult | None = None,
    inline_limit: int | None = INLINE_RESULT_BYTES,
) -> tuple[list[RolloutCompleted | RolloutFailed], GroupCompleted | None]:
    """One group's published events as the ledger accounts for them: each terminal rollout's `Rollout Completed`
    / `Rollout Failed` (index order), and `Group Completed` with its members once the group is complete (else None).
    A successful rollout's result object is inlined (`fetch_result`, secret fields redacted as the publisher does)
    when its size is at most `inline_limit` (None: whatever its size)."""
    terminal = sorted((rec for rec in records if rec.terminal), key=lambda rec: rec.index)
    rollouts: list[RolloutCompleted | RolloutFailed] = []
    for rec in terminal:
        detail = rollout_event(rec, notified_at=rec.finished_at or utcnow())
        fits = inline_limit is None or (rec.result_size is not None and rec.result_size <= inline_limit)
        if isinstance(detail, RolloutCompleted) and fetch_result is not None and detail.result_uri and fits:
            result = fetch_result(detail.result_uri)
            if result is not None:
                detail = detail.model_copy(update={"result": redact_secrets(dict(result))})
        rollouts.append(detail)
    completed = group_completion_detail(group, policy_version)
    return rollouts, with_members(completed, terminal) if completed is not None else None


def ledger_event(detail: AnyDetail) -> Event:
    """A rebuilt detail as an `Event` (its envelope marked `"replayed": "ledger"`)."""
    detail_type = detail_type_of(detail)
    envelope = {
        "source": EVENT_SOURCE,
        "detail-type": detail_type.value,
        "detail": detail.model_dump(mode="json", exclude_none=True),
        REPLAYED: "ledger",
    }
    return Event(detail_type=detail_type, detail=detail, envelope=envelope)


def batch_events(ledger: Ledger, batch_id: str, *, fetch_result: FetchResult | None = None) -> Iterator[Event]:
    """Every event the batch has published so far, rebuilt from the ledger, in the order the pipeline publishes them
    (`Batch Accepted`; group by group, in input-id order, its rollouts' terminal events then `Group Completed`;
    `Batch Completed`). Streamed: the group and rollout items are read as two sorted Queries joined group by group
    (`dataset.join_groups`), so memory holds one group. Nothing for a batch not in the ledger (yet)."""
    batch = ledger.batches.read_batch(batch_id)
    if batch is None:
        return
    if batch.status is not BatchState.INGESTING:
        yield ledger_event(batch_accepted_detail(batch))
    policy_version = batch.options.policy_version if batch.options else None
    for group, members in join_groups(ledger.batches.groups(batch_id), ledger.rollouts.batch_rollouts(batch_id)):
        rollouts, completed = group_events(
            group, members.values(), policy_version=policy_version, fetch_result=fetch_result
        )
        yield from (ledger_event(detail) for detail in rollouts)
        if completed is not None:
            yield ledger_event(completed)
    done = ledger.batches.read_batch(batch_id)  # read again: the batch may have completed meanwhile
    detail = batch_completion_detail(done) if done is not None else None
    # Published once claimed (which stamps `completed_at`), or by ingestion for a batch with nothing to run.
    if detail is not None and done is not None and (done.completed_at is not None or not done.rollouts_total):
        yield ledger_event(detail)


class CatchUpStream(EventStream):
    """An `EventStream` that first hands over `replay()`'s events (a batch's, rebuilt from the ledger), then the live
    ones of its queue, each `event_id` once for this stream (its own `SeenIds`: events other consumers of the process
    handled are handed over too: a stream from the start sees the whole batch).

    A live copy of an event already rebuilt is deleted, never handed over, whichever came first in time. `replay`
    is called at the first read, after the stream's queue exists, so nothing falls between the two; again when a
    live `Batch Completed` comes (the ledger then holds everything of the batch: an event a new subscription's rule
    missed while it propagated is handed over then, before `Batch Completed`)."""

    def __init__(self, *args: Any, replay: Callable[[], Iterator[Event]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replay = replay
        self._pending: Iterator[Event] | None = None
        self._started = False
        self._rebuilt: set[str] = set()
        self._held: list[Delivery] = []
        self._reread: set[str] = set()

    def _pop_buffered(self) -> Delivery | None:
        if not self._started:
            self._started = True
            self._pending = self._replay()
        while True:
            rebuilt = self._next_rebuilt()
            if rebuilt is not None:
                return rebuilt
            delivery = self._held.pop() if self._held else super()._pop_buffered()
            if delivery is None:
                return None
            event = delivery.event
            assert event is not None
            if event.event_id in self._rebuilt:
                self._reader.delete(delivery)  # the live copy of an event already handed over from the ledger
                continue
            if event.detail_type is DetailType.BATCH_COMPLETED and event.event_id not in self._reread:
                self._reread.add(event.event_id)
                self._held.append(delivery)  # handed over after what the ledger holds now
                self._pending = self._replay()
                continue
            return delivery

    def _next_rebuilt(self) -> Delivery | None:
        while self._pending is not None:
            event = next(self._pending, None)
            if event is None:
                self._pending = None
                return None
            if event.event_id in self._rebuilt or event.event_id in self._seen or not self._filter.matches(event):
                continue
            self._rebuilt.add(event.event_id)
            return Delivery("", event)
        return None

    def close(self, *, ack_current: bool = False) -> None:
        with self._lock:
            while self._held:
                self._reader.release(self._held.pop())
        super().close(ack_current=ack_current)
