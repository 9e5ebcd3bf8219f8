"""The release window's rule (`feed.window.ReleaseWindow`) on an in-memory window item with a movable clock: whole
groups in admission order (batches by creation, groups by line), at most `window` rollouts released and not yet
terminal across every batch, one conditional write per release, a crashed release re-sent once its lease has
expired, nothing released for a cancelled batch, a chunk never lost."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rollout_pipeline.feed.messages import QueuedGroup
from rollout_pipeline.feed.window import NOTHING_PENDING_TRUST_S, RELEASE_LEASE_S, ReleaseWindow, min_release
from rollout_pipeline.ledger.items import BatchState, BatchView
from tests.doubles import ManualClock, MemoryGroups, MemoryReleaseLedger, RecordingQueue

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


def view(
    terminal: int = 0, *, batch_id: str = "batch-1", total: int | None = None, cancelled: bool = False, age: int = 0
) -> BatchView:
    return BatchView(
        exp_id="exp",
        batch_id=batch_id,
        status=BatchState.CANCELLED if cancelled else BatchState.ACCEPTED,
        created_at=CREATED + timedelta(seconds=age),
        rollouts_total=total,
        terminal=terminal,
    )


class Harness:
    def __init__(self, window: int = 8, *, most: int | None = None, slots: int | None = None) -> None:
        self.ledger = MemoryReleaseLedger()
        self.groups = MemoryGroups()
        self.queue = RecordingQueue()
        self.window = self.new_window(window, most=most, slots=slots)

    def new_window(self, window: int = 8, *, most: int | None = None, slots: int | None = None) -> ReleaseWindow:
        def send(bodies: list[str]) -> None:
            self.queue.send_all("q", bodies)

        return ReleaseWindow(self.ledger, self.groups.read, send, size=window, most=most, slots=slots)  # type: ignore[arg-type]

    def chunk(self, batch_id: str, lines: range, size: int = 4) -> list[QueuedGroup]:
        return [self.groups.add(batch_id, f"{batch_id[-1]}g{line}", line, size, CREATED) for line in lines]

    def submit(self, chunks: Sequence[Sequence[QueuedGroup]], batch: BatchView | None = None) -> None:
        for chunk in chunks:
            self.window.release(submitted=batch or view(), chunk=chunk)


def rollouts(input_ids: Sequence[str], group_size: int = 4) -> list[tuple[str, int]]:
    return [(i, index) for i in input_ids for index in range(group_size)]


def test_whole_groups_in_line_order_never_more_than_the_window_in_flight() -> None:
    h = Harness()
    chunk = h.chunk("batch-1", range(1, 11))
    h.window.release(submitted=view(), chunk=chunk[:3])
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"]), "the chunk's first groups, released from what it holds"
    assert h.groups.reads == 0
    assert {m["submitted_at"][:10] for m in h.queue.sent} == {"2026-01-01"}, "the batch's time: one admission rank"
    h.submit([chunk[3:6], chunk[6:9], chunk[9:]])
    assert len(h.queue.sent) == 8, "the window is full: the rest is pending"

    assert h.window.release([view(0)]).rollouts == 0, "the window is full"
    assert h.window.no_room_known([view(1)]), "no read needed while the last window seen proves there is no room"
    writes = h.ledger.writes
    assert h.window.release([view(1)]).rollouts == 0, "room for 1 < min_release"
    assert min_release(8) == 2
    assert h.window.release([view(3)]).rollouts == 0, "room for 3: the next group (4) does not fit"
    assert h.ledger.writes == writes, "no write for a release that sends nothing"
    assert h.window.release([view(4)]).rollouts == 4
    assert h.window.release([view(8)]).rollouts == 4
    terminal = 8
    for _ in range(20):
        terminal = min(40, terminal + 4)
        h.window.release([view(terminal, total=40)])
    assert h.queue.rollouts() == rollouts([f"1g{i}" for i in range(1, 11)]), "every rollout once, in line order"
    assert h.ledger.state.entries == {}, "the batch left the window once everything was released and terminal"


def test_a_group_larger_than_the_window_goes_alone_when_nothing_is_in_flight() -> None:
    h = Harness(window=4)
    h.submit([h.chunk("batch-1", range(1, 4), size=6)])
    assert h.queue.rollouts() == rollouts(["1g1"], 6)
    assert h.window.release([view(5)]).groups == 0, "one rollout of it still in flight"
    assert h.window.release([view(6)]).groups == 1
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"], 6)


def test_a_release_that_read_an_old_window_loses_its_write_and_reads_again() -> None:
    h = Harness()
    h.ledger.stale_once = h.ledger.state
    h.submit([h.chunk("batch-1", range(1, 4))])
    stale = h.ledger.state
    assert h.window.release([view(8)]).rollouts == 4
    h.ledger.stale_once = stale
    assert h.new_window().release([view(8)]).rollouts == 0, "its write lost; read again, the room is taken"
    assert h.queue.rollouts() == rollouts(["1g1", "1g2", "1g3"]), "nothing sent twice"


def test_a_crashed_release_is_recovered_once_its_lease_has_expired() -> None:
    h = Harness()
    h.queue.fail_next = True
    h.submit([h.chunk("batch-1", range(1, 6))])
    assert h.queue.sent == []
    assert h.ledger.state.sending == (("batch-1", ("1g1", "1g2")),), "recorded as being sent"
    assert h.window.release([view(0)]).recovered == 0, "the lease still holds: its owner may be sending"
    h.ledger.now += RELEASE_LEASE_S + 1
    done = h.new_window().release([view(0)])
    assert (done.recovered, done.rollouts) == (8, 0)
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"]), "re-sent once (from the group items), no more"
    assert h.ledger.state.sending == ()
    assert h.new_window().release([view(4)]).rollouts == 4
    assert h.queue.rollouts() == rollouts(["1g1", "1g2", "1g3"])


def test_a_chunk_handed_over_while_another_release_is_sent_waits_as_pending() -> None:
    h = Harness(window=16)
    h.queue.fail_next = True
    h.submit([h.chunk("batch-1", range(1, 3))])
    being_sent = h.ledger.state.sending
    h.window.release(submitted=view(), chunk=h.chunk("batch-1", range(3, 5)))
    assert h.ledger.state.sending == being_sent, "the release being sent is left as it is"
    assert h.ledger.state.entries["batch-1"].added == 4, "the chunk is recorded"
    h.ledger.now += RELEASE_LEASE_S + 1
    h.window.release([view(0)])
    assert h.queue.rollouts() == rollouts(["1g1", "1g2", "1g3", "1g4"])


def test_a_cancelled_batch_leaves_the_window_and_releases_nothing_more() -> None:
    h = Harness()
    h.submit([h.chunk("batch-1", range(1, 6))])
    done = h.window.release([view(8, cancelled=True)])
    assert (done.rollouts, done.closed) == (0, 1)
    assert h.window.release([view(8)]).rollouts == 0, "gone for good"
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"])


def test_a_resumed_chunk_releases_nothing_twice() -> None:
    h = Harness()
    chunk = h.chunk("batch-1", range(1, 4))
    h.submit([chunk, chunk])
    h.window.release([view(8)])
    h.submit([chunk])
    h.window.release([view(12, total=12)])
    assert h.queue.rollouts() == rollouts(["1g1", "1g2", "1g3"])


def test_one_release_sends_at_most_what_the_dispatchers_hold() -> None:
    h = Harness(window=16, most=8)
    h.submit([h.chunk("batch-1", range(1, 11))])
    assert len(h.queue.sent) == 8, "the batch's start: what the dispatchers hold, not the window"
    assert h.window.release([view(4)]).rollouts == 8, "the window has room for 12: one release sends 8 of them"
    assert h.queue.rollouts() == rollouts(["1g1", "1g2", "1g3", "1g4"])


def test_while_sessions_are_free_a_release_sends_what_can_start_at_once() -> None:
    """A release that can all start at once is not reordered by the queue: the first group starts at once."""
    h = Harness(window=28, most=20, slots=8)
    h.submit([h.chunk("batch-1", range(1, 31))])
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"]), "the free sessions, not what the dispatchers hold"
    assert h.window.release([view(0)]).rollouts == 20, "the sessions are taken: the rest of the room, in order"
    assert h.window.release([view(0)]).rollouts == 0, "28 in flight"


def test_the_window_is_one_for_every_batch_and_releases_the_oldest_batch_first() -> None:
    h = Harness(window=8)
    older, newer = view(batch_id="batch-a"), view(batch_id="batch-b", age=5)
    h.window.release(submitted=newer, chunk=h.chunk("batch-b", range(1, 4)))
    h.window.release(submitted=older, chunk=h.chunk("batch-a", range(1, 4)))
    assert h.queue.rollouts() == rollouts(["bg1", "bg2"]), "the window is full: the older batch waits too"
    h.window.release([view(8, batch_id="batch-b")])
    assert h.queue.rollouts()[8:] == rollouts(["ag1", "ag2"]), "the room goes to the older batch first"
    h.window.release([view(8, batch_id="batch-a")])
    assert h.queue.rollouts()[16:] == rollouts(["ag3", "bg3"]), "then the newer one"
    in_flight = h.ledger.state.in_flight
    assert in_flight == 8, "one window for both batches"


def test_no_room_known_reads_nothing_for_a_batch_outside_the_window() -> None:
    h = Harness()
    assert not h.window.no_room_known([view(1)]), "nothing seen yet: read"
    h.window.release([view(1)])
    assert h.window.no_room_known([view(1)]), "seen: nothing pending anywhere"


def test_a_window_holds_the_messages_as_they_would_be_sent() -> None:
    h = Harness()
    h.submit([h.chunk("batch-1", range(1, 3))])
    first: dict[str, Any] = h.queue.sent[0]
    assert (first["input_id"], first["index"], first["attempt"], first["line"]) == ("1g1", 0, 1, 1)
    assert first["payload"] == {"q": 1}
    assert json.loads(json.dumps(first))["group_size"] == 4


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_window_never_holds_more_than_its_size_whatever_the_order_of_events(seed: int) -> None:
    import random

    rng = random.Random(seed)
    h = Harness(window=12, most=8, slots=6)
    batches = [view(batch_id=f"batch-{name}", age=age) for age, name in enumerate("xyz")]
    chunks = {b.batch_id: h.chunk(b.batch_id, range(1, 9), size=rng.choice([1, 2, 3])) for b in batches}
    totals = {b.batch_id: sum(g.group_size for g in chunks[b.batch_id]) for b in batches}
    terminal = dict.fromkeys(totals, 0)
    for batch in batches:
        h.window.release(submitted=batch, chunk=chunks[batch.batch_id][:4])
    for batch in batches:
        ended = replace(batch, rollouts_total=totals[batch.batch_id])
        h.window.release(submitted=ended, chunk=chunks[batch.batch_id][4:])
    for _ in range(400):
        sent = {b: sum(1 for m in h.queue.sent if m["batch_id"] == b) for b in totals}
        running = [b for b in totals if sent[b] > terminal[b]]
        assert sum(sent[b] - terminal[b] for b in totals) <= 12
        if not running:
            break
        batch_id = rng.choice(running)
        terminal[batch_id] += 1
        h.window.release([view(terminal[batch_id], batch_id=batch_id, total=totals[batch_id])])
    assert sorted(h.queue.rollouts()) == sorted(
        (g.input_id, i) for b in totals for g in chunks[b] for i in range(g.group_size)
    ), "every rollout of every batch exactly once"
    assert h.ledger.state.entries == {}


def test_a_batch_whose_rollouts_may_wait_past_max_limit_wait_s_is_warned_about() -> None:
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.feed.feed import start_warnings

    config = ExperimentConfig(name="exp", max_sessions=100, rollout_timeout_s=3600, max_limit_wait_s=7200)
    assert start_warnings(config, 10_000) == (), "the window lets 50 wait for 100 sessions: one hour at most"
    wide = config.model_copy(update={"release_window": 400})
    (warning,) = start_warnings(wide, 10_000)
    assert "the release window (400) lets 300 rollouts wait" in warning
    assert "10800 s" in warning, "3 rounds of 100 sessions, each up to an hour"
    assert start_warnings(wide, 150) == (), "what the batch lets wait: 50"
    off = config.model_copy(update={"release_window": 0})
    (warning,) = start_warnings(off, 400)
    assert "all 400 rollouts are queued at once" in warning
    assert "release_window unset" in warning
    assert start_warnings(off, 200) == ()


def test_a_batch_another_process_hands_over_is_released_within_seconds_by_this_one() -> None:
    """A process whose last view showed nothing pending looks again once that view is a few seconds old: a batch
    ingestion handed over meanwhile (no room then) is released by this process's next terminal rollout."""
    h = Harness(window=8)
    clock = ManualClock(100.0)
    lifecycle = h.new_window(8)
    lifecycle.monotonic = clock.monotonic
    h.window.release(submitted=view(batch_id="batch-a"), chunk=h.chunk("batch-a", range(1, 3)))
    lifecycle.release([view(0, batch_id="batch-a")])
    h.window.release(submitted=view(batch_id="batch-b", age=5), chunk=h.chunk("batch-b", range(1, 3)))
    assert len(h.queue.sent) == 8, "the window is full: batch b waits"
    ended = view(8, batch_id="batch-a", total=8)
    assert not lifecycle.no_room_known([ended]), "batch a's end is to be recorded"
    assert lifecycle.release([ended]).closed == 1
    assert h.queue.rollouts()[8:] == rollouts(["bg1", "bg2"]), "the release that recorded a's end released b"
    h.window.release(submitted=view(batch_id="batch-c", age=9), chunk=h.chunk("batch-c", range(1, 2)))
    assert lifecycle.no_room_known([view(1, batch_id="batch-b")]), "its view: nothing pending, and fresh"
    clock.advance(NOTHING_PENDING_TRUST_S + 1)
    assert not lifecycle.no_room_known([view(1, batch_id="batch-b")]), "too old to trust: look again"


def test_a_view_of_a_batch_handed_over_since_the_last_view_is_released_at_once() -> None:
    """A process whose fresh last view showed nothing pending still looks again for the view of a batch that view
    did not hold (ingestion handed it over since): its first dispatch releases the batch's next groups, not the first
    one after `NOTHING_PENDING_TRUST_S`. A batch a read showed absent (sent at once, or gone) reads nothing more."""
    h = Harness(window=32, most=8)
    clock = ManualClock(100.0)
    dispatcher = h.new_window(32, most=8)
    dispatcher.monotonic = clock.monotonic
    dispatcher.release([view(batch_id="batch-0")])
    seen = dispatcher.seen()
    assert seen is not None
    assert not seen.entries, "read: nothing pending anywhere"
    assert dispatcher.no_room_known([view(batch_id="batch-0")]), "batch 0 was read absent: nothing to look for"
    h.window.release(submitted=view(batch_id="batch-a"), chunk=h.chunk("batch-a", range(1, 7)))
    assert len(h.queue.sent) == 8, "ingestion released what the dispatchers hold: 16 rollouts pending"
    assert not dispatcher.no_room_known([view(batch_id="batch-a")]), "batch a is news to that view: look again"
    assert dispatcher.release([view(batch_id="batch-a")]).rollouts == 8


class ContendedLedger(MemoryReleaseLedger):
    """A window item that other processes write first `losses` times (each lost write sees a newer version)."""

    def __init__(self, losses: int) -> None:
        super().__init__()
        self.losses = losses

    def write_window(self, read: Any, **kwargs: Any) -> Any:
        if self.losses > 0:
            self.losses -= 1
            self.state = replace(self.state, version=self.state.version + 1)  # another process's release
            return None
        return super().write_window(read, **kwargs)


def test_a_submitted_chunk_is_recorded_however_many_releases_write_the_window_first() -> None:
    """Several trainer processes submitting at once, and every dispatcher and drain releasing, all write the one
    window item: a submit backs off and reads again (more than a backstop release's tries) instead of failing."""
    h = Harness()
    pauses: list[float] = []
    h.ledger = ContendedLedger(losses=9)
    h.window = h.new_window()
    h.window.sleep = pauses.append
    h.submit([h.chunk("batch-1", range(1, 3))])
    assert h.queue.rollouts() == rollouts(["1g1", "1g2"])
    assert len(pauses) == 9
    assert all(0 <= pause <= 0.5 for pause in pauses)


def test_a_pending_group_whose_id_is_also_in_the_chunk_of_another_batch_is_read_from_the_ledger() -> None:
    """Input ids are unique within a batch, not across batches (the ART backend submits each rollout as its own
    batch, many with the same group id): a release that sends another batch's pending group whose id is also in
    the chunk being submitted reads that group from the ledger, not the chunk's namesake (it once raised
    "not in the ledger" and deferred the release to its lease's end)."""
    h = Harness(window=16, most=4)
    older = [h.groups.add("batch-a", "g1", 1, 4, CREATED), h.groups.add("batch-a", "g2", 2, 4, CREATED)]
    h.window.release(submitted=view(batch_id="batch-a"), chunk=older)
    assert h.queue.rollouts() == rollouts(["g1"]), "one release sends at most 4: batch-a's g2 waits"
    newer = [h.groups.add("batch-b", "g2", 1, 4, CREATED)]
    done = h.window.release(submitted=view(batch_id="batch-b", age=1), chunk=newer)
    assert done.rollouts == 4
    assert h.ledger.state.sending == (), "sent and confirmed, not deferred"
    assert [(m["batch_id"], m["input_id"]) for m in h.queue.sent[-4:]] == [("batch-a", "g2")] * 4
