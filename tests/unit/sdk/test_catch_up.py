"""The seam of a stream that catches up, in memory (`sdk.replay.CatchUpStream` over `tests.doubles.MemoryEventQueue`):
the rebuilt events first, then the live ones; a live copy of a rebuilt event is dropped and deleted even while the
rebuilt one is still held (a parked `Group Completed`), and the ledger is read again when a live `Batch Completed`
comes, before it is handed over."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from rollout_pipeline.contracts import EVENT_SOURCE, GroupMember, detail_type_of
from rollout_pipeline.ledger.items import GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.sdk.delivery import EventFilter, SeenIds
from rollout_pipeline.sdk.replay import CatchUpStream, group_events, ledger_event
from rollout_pipeline.sdk.transport import Delivery, Event
from tests.doubles import ManualClock, MemoryEventQueue
from tests.sdk_events import B1, B2, accepted, batch_done, completed, group_done


def envelope(detail: Any) -> str:
    detail_type = str(detail_type_of(detail))
    return json.dumps(
        {"source": EVENT_SOURCE, "detail-type": detail_type, "detail": json.loads(detail.model_dump_json())}
    )


def stream(
    queue: MemoryEventQueue,
    ledger: list[list[Any]],
    seen: SeenIds | None = None,
    *,
    reconcile_after_s: tuple[float, ...] = (),
    skips: list[Callable[[str], bool]] | None = None,
) -> CatchUpStream:
    """A stream whose n-th read of the ledger returns `ledger[n]` (the last one again after that); each read's
    `skip` is appended to `skips`."""
    reads = iter(ledger)
    last: list[Any] = []

    def replay(skip: Callable[[str], bool]) -> Iterator[Event]:
        nonlocal last
        last = next(reads, last)
        if skips is not None:
            skips.append(skip)
        return (ledger_event(detail) for detail in last)

    clock = ManualClock()
    receive = queue.receive

    def timed_receive(wait_s: float, max_messages: int = 10) -> list[Delivery]:
        got = receive(wait_s, max_messages)
        if not got:
            clock.sleep(max(wait_s, 0.1))  # a poll that found nothing takes its time
        return got

    queue.receive = timed_receive  # type: ignore[method-assign]
    return CatchUpStream(
        queue,  # type: ignore[arg-type]
        seen or SeenIds(),
        replay=replay,
        reconcile_after_s=reconcile_after_s,
        event_filter=EventFilter(B1),
        timeout=5,
        poll_wait_s=1,
        consume_others=True,
        clock=clock,
        sleep=clock.sleep,
    )


def test_rebuilt_events_come_first_and_their_live_copies_are_deleted_even_while_one_is_held() -> None:
    earlier = [accepted(B1), completed(B1, "q1", 0, 1.0), group_done(B1, "q1", [1.0])]
    live = [completed(B1, "q1", 0, 1.0), group_done(B1, "q1", [1.0]), completed(B1, "q2", 0, 0.0)]
    queue = MemoryEventQueue([envelope(d) for d in live] + [envelope(completed(B2, "q9", 0, 1.0))])
    catch_up = stream(queue, [earlier])

    handed = []
    held = None
    while (delivery := catch_up.next_delivery(0.5)) is not None:
        handed.append(delivery.event.event_id)
        if delivery.event.detail_type.value == "Group Completed":
            held = delivery  # parked, as GroupStream parks it: not acknowledged yet
        else:
            catch_up.ack(delivery)
    assert held is not None
    assert not held.receipt, "the rebuilt copy of the group event was handed over"
    assert handed == [d.event_id for d in earlier] + [live[2].event_id]
    assert sorted(queue.deleted) == [0, 1, 2, 3], "the live copies and the other batch's event are deleted"


def test_a_live_batch_completed_reads_the_ledger_again_before_it_is_handed_over() -> None:
    missed = completed(B1, "q2", 0, 0.5)  # published before the queue's rule matched: only the ledger has it
    done = batch_done(B1, 2)
    queue = MemoryEventQueue([envelope(done)])
    first = [accepted(B1), completed(B1, "q1", 0, 1.0)]
    catch_up = stream(queue, [first, [*first, missed, done]])

    handed = [event.event_id for event in catch_up]
    assert handed == [*(d.event_id for d in first), missed.event_id, done.event_id]
    assert queue.deleted == [0], "the live Batch Completed was a copy of the rebuilt one"


def test_what_its_seen_ids_hold_is_not_rebuilt_and_the_ledger_is_read_again_when_due() -> None:
    """The rebuild leaves out the ids the stream's `seen` holds (by default the process's: what another stream of
    it handed over; the ledger is told to skip them, so their results are not read), and the ledger is read again
    `reconcile_after_s` after the stream was made (an event a new rule did not match yet is there)."""
    handed_elsewhere = accepted(B1)
    seen = SeenIds()
    seen.add(handed_elsewhere.event_id)
    first = [handed_elsewhere, completed(B1, "q1", 0, 1.0)]
    missed = completed(B1, "q2", 0, 0.5)
    skips: list[Callable[[str], bool]] = []
    catch_up = stream(MemoryEventQueue([]), [first, [*first, missed]], seen, reconcile_after_s=(3.0,), skips=skips)

    assert [event.event_id for event in catch_up] == [first[1].event_id, missed.event_id]
    assert len(skips) == 2, "read at the first read, and once more when due"
    assert skips[0](handed_elsewhere.event_id)
    assert skips[1](first[1].event_id), "what it rebuilt before is not read again"


def test_a_rebuilt_event_has_every_field_of_its_published_copy_also_those_that_are_none() -> None:
    rollout = completed(B1, "q0", 0, 1.0)
    group = group_done(B1, "q0", [1.0])
    member = GroupMember(index=0, status="succeeded", reward=1.0)
    for detail in (rollout, group.model_copy(update={"members": [member]})):
        published = json.loads(envelope(detail))["detail"]
        assert ledger_event(detail).envelope["detail"] == published  # a trainer reads detail["warning"] either way


def test_an_oversampled_group_is_rebuilt_only_once_each_success_is_let_in_or_out() -> None:
    """Five successes of a group of 3 + 2 ended together: while two are not yet claimed (their drains run), whether
    they are surplus is not known, so their events and the group's wait for the live ones."""

    def success(index: int) -> RolloutRecord:
        return RolloutRecord(
            batch_id=B1, input_id="fast", index=index, state=RolloutState.SUCCEEDED, attempt=1, exp_id="e", reward=1.0
        )

    records = [success(i) for i in range(5)]
    rewards = dict.fromkeys(range(5), 1.0)
    base = GroupItem(exp_id="e", batch_id=B1, input_id="fast", line=1, group_size=5, target=3, terminal=5)
    claiming = replace(base, rewards=rewards, kept=frozenset({0, 3}))
    rollouts, group = group_events(claiming, records, policy_version=None)
    assert ([r.index for r in rollouts], group) == ([0, 3], None)

    settled = replace(base, rewards=rewards, kept=frozenset({0, 3, 1}))
    rollouts, group = group_events(settled, records, policy_version=None)
    assert [(r.index, r.surplus) for r in rollouts] == [(0, False), (1, False), (2, True), (3, False), (4, True)]
    assert group is not None
    assert (group.valid_size, group.surplus, [m.index for m in group.members]) == (3, [2, 4], [0, 1, 3])
