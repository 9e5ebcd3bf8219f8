"""A batch's events as the ledger accounts for them: what a private subscription made after they were published
never received.

The outbox publishes an event only after the ledger holds the state it reports (a rollout's terminal state, a
complete group, a complete batch; `Batch Accepted` once ingestion has ended), and every event has a stable
`event_id` (`ids.event_id`). So the events already due for a batch can be rebuilt from the ledger with the same ids
and contents (`details`, the module the publishers use), and a consumer that de-duplicates by `event_id` sees
each event once whether it came from its queue or from here. Differences from the published copy: the rebuilt
event's `timings.notified_at` is None (the ledger does not keep when an event left), and its envelope carries
`"replayed": "ledger"` instead of EventBridge's `id` and `time`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from rollout_pipeline.contracts import (
    EVENT_SOURCE,
    INLINE_RESULT_BYTES,
    DetailType,
    RolloutCompleted,
    RolloutFailed,
    redact_secrets,
    utcnow,
)
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.details import (
    batch_accepted_detail,
    batch_completion_detail,
    group_completion_detail,
    rollout_event,
    with_members,
)
from rollout_pipeline.ledger.items import BatchState, RolloutRecord
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.sdk.transport import AnyDetail, Event

#: The envelope key that marks an event rebuilt from the ledger.
REPLAYED: Final = "replayed"

#: Reads a result object for inlining (None when it cannot be read: the event still carries `result_uri`).
FetchResult = Callable[[str], dict[str, Any] | None]


def ledger_events(
    ledger: Ledger,
    batch_ids: Iterable[str],
    *,
    detail_types: Collection[DetailType] | None = None,
    skip: Callable[[str], bool] = lambda _event_id: False,
    fetch_result: FetchResult | None = None,
    prices: PriceBook | None = None,
) -> list[Event]:
    """Every event already due for `batch_ids`, in the order the pipeline publishes them per batch (`Batch
    Accepted`; per group, its rollouts' terminal events, then `Group Completed`; `Batch Completed`), leaving out
    the types not in `detail_types` and the ids `skip` says were handled. A successful rollout's result is inlined
    (`fetch_result`) when it is small enough to travel in the event, as published; its `cost` priced with `prices`."""
    wanted = set(detail_types) if detail_types is not None else set(DetailType)
    events: list[Event] = []

    def add(detail: AnyDetail, detail_type: DetailType) -> None:
        if detail_type in wanted and not skip(detail.event_id):
            events.append(_event(detail_type, detail))

    for batch_id in batch_ids:
        batch = ledger.batches.read_batch(batch_id)
        if batch is None:
            continue  # not ingested yet: everything it publishes is still ahead
        if batch.status is not BatchState.INGESTING:
            add(batch_accepted_detail(batch), DetailType.BATCH_ACCEPTED)
        options = batch.options
        records: dict[str, list[RolloutRecord]] = defaultdict(list)
        needs_rollouts = wanted & {DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED, DetailType.GROUP_COMPLETED}
        if needs_rollouts:
            for rec in ledger.rollouts.batch_rollouts(batch_id):
                if rec.terminal:
                    records[rec.input_id].append(rec)
        for group in ledger.batches.groups(batch_id) if needs_rollouts else ():
            members = sorted(records.get(group.input_id, []), key=lambda rec: rec.index)
            for rec in members:
                detail = _rollout_detail(rec, fetch_result, skip, prices)
                if detail is not None:
                    add(detail, _rollout_type(detail))
            completed = group_completion_detail(group, options.policy_version if options else None)
            if completed is not None:
                add(with_members(completed, members), DetailType.GROUP_COMPLETED)
        done = batch_completion_detail(batch)
        # Published by the rollout that claims it (which stamps `completed_at`), or by ingestion for a batch with
        # nothing to run: until then it is still ahead, and comes through the subscription.
        if done is not None and (batch.completed_at is not None or not batch.rollouts_total):
            add(done, DetailType.BATCH_COMPLETED)
    return events


def _rollout_type(detail: RolloutCompleted | RolloutFailed) -> DetailType:
    return DetailType.ROLLOUT_COMPLETED if isinstance(detail, RolloutCompleted) else DetailType.ROLLOUT_FAILED


def _rollout_detail(
    rec: RolloutRecord, fetch_result: FetchResult | None, skip: Callable[[str], bool], prices: PriceBook | None = None
) -> RolloutCompleted | RolloutFailed | None:
    detail = rollout_event(rec, notified_at=rec.finished_at or utcnow(), prices=prices)
    if skip(detail.event_id):
        return None
    detail = detail.model_copy(update={"timings": detail.timings.model_copy(update={"notified_at": None})})
    small = rec.result_size is not None and rec.result_size <= INLINE_RESULT_BYTES
    if isinstance(detail, RolloutCompleted) and small and detail.result_uri and fetch_result is not None:
        result = fetch_result(detail.result_uri)
        if result is not None:
            detail = detail.model_copy(update={"result": redact_secrets(result)})
    return detail


def _event(detail_type: DetailType, detail: AnyDetail) -> Event:
    envelope = {
        "source": EVENT_SOURCE,
        "detail-type": detail_type.value,
        "detail": detail.model_dump(mode="json", exclude_none=True),
        REPLAYED: "ledger",
    }
    return Event(detail_type=detail_type, detail=detail, envelope=envelope)
