"""A dispatcher's warm takes through the warm queue (`lifecycle.warm`): a receive is a take (no two SQS batches hold
one offer), an offer past its `offer_until` is deleted without a read, a refused one is replaced, the rest is given
back, an empty queue is not asked again at once, and notes to the pool are rate-limited. Injected clocks: nothing
here waits."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.lifecycle.warm import DEMAND_NOTE_S, EMPTY_RECHECK_S, WarmOffer, WarmTaker, offer_until
from tests.doubles import ManualClock

NOW = 1_000_000.0
URL = "https://sqs.local/warm"


class MemorySqs:
    """The warm queue with SQS's semantics that matter here: a received message is hidden until deleted or released;
    `receives` counts the requests."""

    def __init__(self) -> None:
        self.visible: dict[str, str] = {}
        self.hidden: dict[str, str] = {}
        self.receives = 0
        self._ids = itertools.count()

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        for body in bodies:
            self.visible[f"r{next(self._ids)}"] = body

    def receive(self, queue_url: str, max_messages: int) -> list[tuple[str, str]]:
        self.receives += 1
        got = list(self.visible.items())[: min(10, max_messages)]
        for receipt, _body in got:
            self.hidden[receipt] = self.visible.pop(receipt)
        return got

    def delete(self, queue_url: str, receipts: Sequence[str]) -> None:
        for receipt in receipts:
            self.hidden.pop(receipt)

    def release(self, queue_url: str, receipts: Sequence[str]) -> None:
        for receipt in receipts:
            self.visible[receipt] = self.hidden.pop(receipt)


class PoolNotes:
    """The pool item's notes (the only ledger calls a taker makes)."""

    def __init__(self) -> None:
        self.takes: list[float] = []
        self.demands: list[float] = []

    def note(self, what: str, now: float) -> None:
        (self.takes if what == "took_at" else self.demands).append(now)


CONFIG = ExperimentConfig(name="exp", warm_sessions=64)


def offers(queue: MemorySqs, n: int, *, until: float = NOW + 600, first: int = 0) -> list[str]:
    sessions = [f"warm-{i:04d}" for i in range(first, first + n)]
    queue.send_all(URL, [WarmOffer(s, NOW - 10, until).body() for s in sessions])
    return sessions


def taker(queue: MemorySqs, clock: ManualClock, notes: PoolNotes | None = None) -> WarmTaker:
    return WarmTaker(queue, URL, notes or PoolNotes(), CONFIG, wall=clock, monotonic=clock)  # type: ignore[arg-type]


def test_a_receive_is_a_take_no_two_batches_hold_one_offer() -> None:
    queue, clock = MemorySqs(), ManualClock(NOW)
    offers(queue, 60)
    a, b = taker(queue, clock), taker(queue, clock)
    first, second = a.offers(25), b.offers(25)
    assert (len(first), len(second)) == (25, 25)
    assert queue.receives == 6  # ten an SQS receive at most
    held = [first.next() for _ in range(25)] + [second.next() for _ in range(25)]
    assert len({o.session_id for o in held if o is not None}) == 50
    for offer in held[:30]:
        assert offer is not None
        (first if offer in held[:25] else second).taken(offer)
    first.close()
    second.close()
    # 30 taken and deleted; the 20 handed out and never settled given back with the 10 never received.
    assert (len(queue.visible), len(queue.hidden)) == (30, 0)


def test_an_offer_past_its_end_is_deleted_unread_and_the_next_one_given() -> None:
    queue, clock, notes = MemorySqs(), ManualClock(NOW), PoolNotes()
    offers(queue, 2, until=NOW - 1)  # stale: not kept alive in time, or too old for a rollout
    (fresh,) = offers(queue, 1, first=2)
    batch = taker(queue, clock, notes).offers(3)
    offer = batch.next()
    assert offer is not None
    assert offer.session_id == fresh
    assert batch.next() is None
    assert batch.taker.counts["stale"] == 2
    batch.taken(offer)
    batch.close()
    assert queue.visible == queue.hidden == {}
    assert notes.takes == notes.demands == []  # no read, no write of the ledger


def test_a_refused_offer_is_replaced_and_the_unused_ones_given_back() -> None:
    queue, clock = MemorySqs(), ManualClock(NOW)
    offers(queue, 5)
    batch = taker(queue, clock).offers(2)
    one, two = batch.next(), batch.next()
    assert one is not None
    assert two is not None
    batch.refused(one)  # its session left the pool (stopped, or taken through an earlier offer)
    batch.give_back(two)  # its rollout was cancelled
    assert batch.next() == two  # the next rollout of the batch takes it
    replacement = batch.next()  # one more received in place of the refused one
    assert replacement is not None
    assert replacement.session_id not in (one.session_id, two.session_id)
    batch.taken(two)
    batch.close()
    assert (len(queue.visible), len(queue.hidden)) == (3, 0)  # the replacement given back, the refused one deleted


def test_an_empty_queue_is_asked_twice_then_left_alone_for_a_while() -> None:
    queue, clock = MemorySqs(), ManualClock(NOW)
    process = taker(queue, clock)
    assert len(process.offers(25)) == 0
    assert queue.receives == 2  # a short poll may miss the messages of a small queue: asked once more
    clock.advance(EMPTY_RECHECK_S / 2)
    offers(queue, 3)
    assert len(process.offers(25)) == 0
    assert queue.receives == 2
    clock.advance(EMPTY_RECHECK_S / 2)
    assert len(process.offers(25)) == 3


def test_a_process_tells_the_pool_of_its_takes_at_most_once_per_note_interval() -> None:
    """A take tells the pool (its fill waits while a burst of takes runs at the invoke rate), but one process's
    burst costs one pool write per `DEMAND_NOTE_S`, not one per rollout."""
    clock, notes = ManualClock(NOW), PoolNotes()
    process = taker(MemorySqs(), clock, notes)
    for _ in range(100):
        clock.advance(DEMAND_NOTE_S / 20)  # 100 takes over 5 intervals
        process.note("took_at")
        process.note("demand_at")
    assert (len(notes.takes), len(notes.demands)) == (5, 5)


def test_an_offer_ends_before_the_idle_timeout_and_while_a_rollout_still_fits_the_sessions_life() -> None:
    config = ExperimentConfig(name="exp", warm_sessions=8, rollout_timeout_s=900, idle_timeout_s=900)
    assert offer_until(config, warmed_at=0.0, kept_at=100.0) == 100.0 + 900 - 60  # 60 s before the idle timeout
    old = config.warm_shelf_life_s  # max_lifetime_s - rollout_timeout_s - 600
    assert offer_until(config, warmed_at=0.0, kept_at=old - 100) == old  # then its life would not cover a rollout
