"""A batch's events as the ledger accounts for them, and a stream that hands them over before the live ones.

The pipeline publishes an event only once the ledger holds the state it reports (a rollout's terminal state, a
complete group, a complete batch whose `Batch Completed` was claimed; `Batch Accepted` once ingestion has ended; a
budget announcement, stored with its claim; a success of an oversampled group once it was let in or out),
and every event has a stable `event_id` (`ids.event_id`). So the events a batch has published so far can be rebuilt
from the ledger with the same ids and contents (`details`, the module the publishers build them with): what a
stream made after them never received (a trainer that starts late, a second consumer, a subscription whose rule
was not matching yet). Differences from the published copies: a rebuilt rollout event's `timings.notified_at` is
None (the ledger does not keep when an event left), its envelope has no EventBridge `id` and `time` but
`"replayed": "ledger"`, and its result is inlined only with `fetch_result`.

`batch_events` is the one rebuild: streamed group by group (the dataset export's join), it feeds every stream of
a batch (`CatchUpStream`, under `subscription.SubscribedStream`) and, through `group_events`, the resume path
(`exp.events.completed_groups`). `CatchUpStream` is the one seam between rebuilt and live events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from rollout_pipeline.contracts import (
    EVENT_SOURCE,
    INLINE_RESULT_BYTES,
    BudgetExhausted,
    BudgetWarning,
    DetailType,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    detail_type_of,
    redact_secrets,
)
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.details import (
    batch_accepted_detail,
    batch_completion_detail,
    group_completion_detail,
    rollout_event,
    with_members,
)
from rollout_pipeline.ledger.items import BUDGET_EVENT_KINDS, BatchState, GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.sdk.dataset import FetchResult, join_groups
from rollout_pipeline.sdk.delivery import EventStream, SeenIds
from rollout_pipeline.sdk.transport import AnyDetail, Delivery, Event, QueueReader

#: The envelope key that marks an event rebuilt from the ledger.
REPLAYED: Final = "replayed"
#: `replay(skip)`: the events rebuilt from the ledger, leaving out those whose id `skip` accepts.
Replay = Callable[[Callable[[str], bool]], Iterable[Event]]
_ROLLOUT_TYPES: Final = frozenset({DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED})
#: The budget announcements' details, by the kinds the ledger names their claims with.
_BUDGET_MODELS: Final[dict[str, type[BudgetWarning] | type[BudgetExhausted]]] = dict(
    zip(BUDGET_EVENT_KINDS, (BudgetWarning, BudgetExhausted), strict=True)
)
_BUDGET_TYPES: Final = frozenset({DetailType.BUDGET_WARNING, DetailType.BUDGET_EXHAUSTED})


def group_events(
    group: GroupItem,
    records: Iterable[RolloutRecord],
    *,
    policy_version: str | None,
    fetch_result: FetchResult | None = None,
    inline_limit: int | None = INLINE_RESULT_BYTES,
    keep: Callable[[RolloutCompleted | RolloutFailed], bool] | None = None,
    prices: PriceBook | None = None,
) -> tuple[list[RolloutCompleted | RolloutFailed], GroupCompleted | None]:
    """One group's published events as the ledger accounts for them: each terminal rollout's `Rollout Completed`
    / `Rollout Failed` (index order; only those `keep` accepts, else all), and `Group Completed` with its members
    once the group is complete (else None). A kept successful rollout's result object is inlined (`fetch_result`,
    secret fields redacted as the publisher does) when its size is at most `inline_limit` (None: whatever its
    size); a rollout's `cost` priced with `prices`, as published."""
    ended = [rec for rec in records if rec.terminal]
    succeeded = {rec.index for rec in ended if rec.state is RolloutState.SUCCEEDED} | set(group.rewards)
    pending = {index for index in succeeded if _unclaimed(group, index)}
    terminal = sorted((rec for rec in ended if rec.index not in pending), key=lambda rec: rec.index)
    rollouts: list[RolloutCompleted | RolloutFailed] = []
    for rec in terminal:
        detail = rollout_event(rec, notified_at=None, prices=prices, group=group)
        if keep is not None and not keep(detail):
            continue
        fits = inline_limit is None or (rec.result_size is not None and rec.result_size <= inline_limit)
        if isinstance(detail, RolloutCompleted) and fetch_result is not None and detail.result_uri and fits:
            result = fetch_result(detail.result_uri)
            if result is not None:
                detail = detail.model_copy(update={"result": redact_secrets(dict(result))})
        rollouts.append(detail)
    completed = group_completion_detail(group, policy_version)
    return rollouts, with_members(completed, terminal) if completed is not None and not pending else None


def _unclaimed(group: GroupItem, index: int) -> bool:
    """A success of an oversampled group that is not full, not let in yet (`lifecycle.oversample`): whether it is
    surplus is not known, so neither its event nor its group's is rebuilt until it is (the live ones come)."""
    return group.target is not None and not group.full and index not in group.kept


def ledger_event(detail: AnyDetail) -> Event:
    """A rebuilt detail as an `Event` (its envelope marked `"replayed": "ledger"`)."""
    detail_type = detail_type_of(detail)
    envelope = {
        "source": EVENT_SOURCE,
        "detail-type": detail_type.value,
        "detail": detail.model_dump(mode="json"),
        REPLAYED: "ledger",
    }
    return Event(detail_type=detail_type, detail=detail, envelope=envelope)


def batch_events(
    ledger: Ledger,
    batch_id: str,
    *,
    detail_types: Collection[DetailType] | None = None,
    skip: Callable[[str], bool] | None = None,
    fetch_result: FetchResult | None = None,
    prices: PriceBook | None = None,
) -> Iterator[Event]:
    """Every event the batch has published so far, rebuilt from the ledger, in the order the pipeline publishes them
    (`Batch Accepted`; the announcements of its own budget in force, `budget_details`; group by group, in input-id
    order, its rollouts' terminal events then `Group Completed`; `Batch Completed`), leaving out the types not in
    `detail_types` and the ids `skip` accepts (whose results are not read); a rollout's `cost` priced with `prices`,
    as published. Streamed: the group and rollout items are read as two sorted Queries joined group by group
    (`dataset.join_groups`), so memory holds one group. Nothing for a batch not in the ledger (yet). The
    experiment-wide events are `experiment_events`."""
    wanted = frozenset(DetailType) if detail_types is None else frozenset(detail_types)

    def due(detail: AnyDetail) -> bool:
        return detail_type_of(detail) in wanted and (skip is None or not skip(detail.event_id))

    batch = ledger.batches.read_batch(batch_id)
    if batch is None:
        return
    if batch.status is not BatchState.INGESTING and due(accepted := batch_accepted_detail(batch)):
        yield ledger_event(accepted)
    if wanted & _BUDGET_TYPES:
        own = budget_details(batch.budget_events, batch.budget_usd)
        yield from (ledger_event(detail) for detail in own if due(detail))
    if wanted & {*_ROLLOUT_TYPES, DetailType.GROUP_COMPLETED}:
        policy_version = batch.options.policy_version if batch.options else None
        for group, members in join_groups(
            ledger.groups.batch_groups(batch_id), ledger.rollouts.batch_rollouts(batch_id)
        ):
            rollouts, completed = group_events(
                group,
                members.values(),
                policy_version=policy_version,
                fetch_result=fetch_result,
                keep=due,
                prices=prices,
            )
            yield from (ledger_event(detail) for detail in rollouts)
            if completed is not None and due(completed):
                yield ledger_event(completed)
    done = batch_completion_detail(batch)
    # Published by the rollout that claims it (which stamps `completed_at`), or by ingestion for a batch with
    # nothing to run: until then it is still ahead. The batch as read first: complete then, every group read
    # after it was complete too, so a rebuilt `Batch Completed` never comes before one of its batch's events.
    if done is not None and (batch.completed_at is not None or not batch.rollouts_total) and due(done):
        yield ledger_event(done)


def experiment_events(
    ledger: Ledger, *, detail_types: Collection[DetailType] | None = None, skip: Callable[[str], bool] | None = None
) -> Iterator[Event]:
    """The experiment-wide events in force (`batch_id` "": its budget's announcements, as published; every stream of
    a batch gets them), rebuilt from the ledger with one read, leaving out the types not in `detail_types` and the
    ids `skip` accepts."""
    wanted = _BUDGET_TYPES if detail_types is None else _BUDGET_TYPES & frozenset(detail_types)
    if not wanted:
        return
    state = ledger.experiment.budget()
    for detail in budget_details(state.events, state.budget_usd):
        if detail_type_of(detail) in wanted and (skip is None or not skip(detail.event_id)):
            yield ledger_event(detail)


def budget_details(events: Mapping[str, str], current: float | None) -> list[BudgetWarning | BudgetExhausted]:
    """The announcements a budget item holds (`events`, JSON by kind) that are still in force: those of the budget
    that holds now, `current` (None: the deployed one, which the ledger does not hold); one raised since has had
    none yet."""
    details = [_BUDGET_MODELS[kind].model_validate_json(text) for kind, text in events.items()]
    return [detail for detail in details if current is None or detail.budget_usd == current]


class CatchUpStream(EventStream):
    """An `EventStream` that hands over the events `replay` rebuilds from the ledger before the live ones of its
    queue, each `event_id` once (by its `seen`: the process's, or one of the stream's own).

    `replay` is read at the first read (after the stream's queue exists, so nothing falls between the two), again
    `reconcile_after_s` seconds after the stream was made, and when a live `Batch Completed` comes: that one is held
    until the ledger was read again (it then holds everything of the batch), so an event the queue missed comes
    before it. A live copy of an event handed over from the ledger is deleted, never handed over (also while the
    rebuilt one is held, e.g. a parked `Group Completed`); an event already handed over (`seen`) is not rebuilt.
    The ledger is read lazily (`batch_events`): one group at a time."""

    def __init__(
        self,
        reader: QueueReader,
        seen: SeenIds,
        *,
        replay: Replay | None,
        reconcile_after_s: Sequence[float] = (),
        **options: Any,
    ) -> None:
        super().__init__(reader, seen, **options)
        self._replay = replay
        self._replay_due = replay is not None
        self._made = self._clock()
        self._due: deque[float] = deque(sorted(reconcile_after_s))
        self._pending: Iterator[Event] | None = None
        self._rebuilt = SeenIds()  # handed over from the ledger: their live copies are deleted
        self._held: list[Delivery] = []
        self._reread: set[str] = set()

    def _handled(self, event_id: str) -> bool:
        return event_id in self._rebuilt or event_id in self._seen

    def _read_ledger(self) -> None:
        if self._replay is not None:
            self._pending = iter(self._replay(self._handled))

    def _refill(self) -> bool:
        now = self._clock()
        while self._due and now - self._made >= self._due[0]:
            self._due.popleft()
            self._replay_due = True
        if not self._replay_due:
            return False
        self._replay_due = False
        self._read_ledger()
        return self._pending is not None

    def _pop_buffered(self) -> Delivery | None:
        while True:
            rebuilt = self._next_rebuilt()
            if rebuilt is not None:
                return rebuilt
            delivery = self._held.pop() if self._held else super()._pop_buffered()
            if delivery is None:
                return None
            event = delivery.event
            assert event is not None  # the base stream hands over events only
            if event.event_id in self._rebuilt:
                self._reader.delete(delivery)  # the live copy of an event already handed over from the ledger
                continue
            live_end = event.detail_type is DetailType.BATCH_COMPLETED and bool(delivery.receipt)
            if live_end and self._replay is not None and event.event_id not in self._reread:
                self._reread.add(event.event_id)
                self._held.append(delivery)  # handed over after what the ledger holds now
                self._read_ledger()
                continue
            return delivery

    def _next_rebuilt(self) -> Delivery | None:
        while self._pending is not None:
            event = next(self._pending, None)
            if event is None:
                self._pending = None
                return None
            if not self._filter.matches(event) or self._handled(event.event_id):
                continue
            self._rebuilt.add(event.event_id)
            return Delivery("", event)
        return None

    def close(self, *, ack_current: bool = False) -> None:
        with self._lock:
            self._pending = None
            while self._held:
                self._reader.redeliver(self._held.pop())
        super().close(ack_current=ack_current)
