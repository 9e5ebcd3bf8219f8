"""The release window's rule (`feed.window.ReleaseWindow`) on an in-memory ledger with an injected clock: whole groups
in line order, at most `window` rollouts released and not yet terminal, one conditional advance per release, a
crashed releaser's groups re-sent once its lease has expired, nothing released for a cancelled batch."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_pipeline.feed.window import RELEASE_LEASE_S, ReleaseWindow, min_release
from rollout_pipeline.ledger.items import BatchState, BatchView, GroupItem
from rollout_pipeline.ledger.release import PendingGroup, ReleaseCursor, pending_sk

CREATED = datetime(2026, 1, 1, tzinfo=UTC)


class MemoryReleaseLedger:
    """`ReleaseLedger`'s interface over dicts: pending items by sort key, one cursor, a movable clock."""

    table_name = "memory"

    def __init__(self, window: int) -> None:
        self.now = 1_000_000
        self.pending: dict[str, list[PendingGroup]] = {}
        self.cursor_item: ReleaseCursor | None = None
        self.window = window
        self.writes = 0

    def epoch(self) -> int:
        return self.now

    def add_pending(self, batch_id: str, groups: Sequence[PendingGroup], *, window: int) -> None:
        ordered = sorted(groups, key=lambda g: g.line)
        self.pending[pending_sk(ordered[0].line)] = ordered
        if self.cursor_item is None:
            self.cursor_item = ReleaseCursor(window=window)

    def cursor(self, batch_id: str) -> ReleaseCursor | None:
        return self.cursor_item

    def next_groups(
        self, batch_id: str, cursor: ReleaseCursor, *, max_groups: int = 1000
    ) -> Iterator[tuple[str, PendingGroup]]:
        given = 0
        for sk in sorted(self.pending):
            if sk < cursor.chunk_sk:
                continue
            for group in self.pending[sk]:
                if group.line > cursor.released_line:
                    yield sk, group
                    given += 1
                    if given >= max_groups:
                        return

    def groups(self, batch_id: str, input_ids: Sequence[str]) -> dict[str, GroupItem]:
        lines = {g.input_id: g for groups in self.pending.values() for g in groups}
        return {
            i: GroupItem(
                exp_id="exp", batch_id=batch_id, input_id=i, line=lines[i].line, group_size=lines[i].group_size
            )
            for i in input_ids
        }

    def _write(self, cursor: ReleaseCursor, after: ReleaseCursor) -> ReleaseCursor | None:
        assert self.cursor_item is not None
        if self.cursor_item.version != cursor.version:
            return None
        self.writes += 1
        self.cursor_item = after
        return after

    def advance(
        self, batch_id: str, cursor: ReleaseCursor, groups: Sequence[PendingGroup], *, chunk_sk: str, lease_s: int
    ) -> ReleaseCursor | None:
        after = replace(
            cursor,
            released=cursor.released + sum(g.group_size for g in groups),
            released_line=max(cursor.released_line, *(g.line for g in groups)),
            chunk_sk=chunk_sk,
            version=cursor.version + 1,
            sending=tuple(g.input_id for g in groups),
            lease_until=self.now + lease_s,
        )
        return self._write(cursor, after)

    def retake(self, batch_id: str, cursor: ReleaseCursor, *, lease_s: int) -> ReleaseCursor | None:
        assert self.cursor_item is not None
        if self.cursor_item.lease_until >= self.now:
            return None
        return self._write(cursor, replace(cursor, version=cursor.version + 1, lease_until=self.now + lease_s))

    def confirm(self, batch_id: str, cursor: ReleaseCursor) -> bool:
        return self._write(cursor, replace(cursor, sending=(), lease_until=0)) is not None

    def close(self, batch_id: str, cursor: ReleaseCursor) -> bool:
        return self._write(cursor, replace(cursor, version=cursor.version + 1, open=False)) is not None


class RecordingQueue:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail_next = False

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("the releaser crashed before sending")
        self.sent.extend(json.loads(b) for b in bodies)

    def rollouts(self) -> list[tuple[str, int]]:
        return [(m["input_id"], m["index"]) for m in self.sent]


def batch(terminal: int = 0, *, total: int | None = None, cancelled: bool = False) -> BatchView:
    return BatchView(
        exp_id="exp",
        batch_id="batch-1",
        status=BatchState.CANCELLED if cancelled else BatchState.ACCEPTED,
        created_at=CREATED,
        rollouts_total=total,
        terminal=terminal,
    )


def releaser_of(ledger: MemoryReleaseLedger, queue: RecordingQueue, most: int | None = None) -> ReleaseWindow:
    def send(bodies: list[str]) -> None:
        queue.send_all("q", bodies)

    return ReleaseWindow(ledger, ledger.groups, send, most=most)  # type: ignore[arg-type]


def setup(groups: int = 10, group_size: int = 4, window: int = 8) -> tuple[MemoryReleaseLedger, RecordingQueue]:
    ledger = MemoryReleaseLedger(window)
    specs = [PendingGroup(f"g{i}", i + 1, group_size) for i in range(groups)]
    for start in range(0, groups, 3):  # ingest chunks of three rows
        ledger.add_pending("batch-1", specs[start : start + 3], window=window)
    return ledger, RecordingQueue()


def rollouts(input_ids: Sequence[str], group_size: int = 4) -> list[tuple[str, int]]:
    return [(i, index) for i in input_ids for index in range(group_size)]


def test_whole_groups_in_line_order_never_more_than_the_window_in_flight() -> None:
    ledger, queue = setup()
    releaser = releaser_of(ledger, queue)
    assert releaser.release(batch(0)).rollouts == 8
    assert queue.rollouts() == rollouts(["g0", "g1"])
    assert {m["submitted_at"][:10] for m in queue.sent} == {"2026-01-01"}, "the batch's time: one admission rank"

    assert releaser.release(batch(0)).rollouts == 0, "the window is full"
    assert releaser.no_room_known(batch(1)), "no read needed while the last cursor seen proves there is no room"
    writes = ledger.writes
    assert releaser.release(batch(1)).rollouts == 0, "room for 1 < min_release"
    assert min_release(8) == 2
    assert releaser.release(batch(3)).rollouts == 0, "room for 3: the next group (4) does not fit"
    assert ledger.writes == writes, "no write for a release that sends nothing"
    assert releaser.release(batch(4)).rollouts == 4
    assert releaser.release(batch(8)).rollouts == 4
    terminal = 8
    for _ in range(20):
        terminal = min(40, terminal + 4)
        releaser.release(batch(terminal, total=40))
    assert queue.rollouts() == rollouts([f"g{i}" for i in range(10)]), "every rollout once, in line order"
    assert ledger.cursor_item is not None
    assert not ledger.cursor_item.open, "closed once everything was released"


def test_a_group_larger_than_the_window_goes_alone_when_nothing_is_in_flight() -> None:
    ledger, queue = setup(groups=3, group_size=6, window=4)
    releaser = releaser_of(ledger, queue)
    assert releaser.release(batch(0)).groups == 1
    assert releaser.release(batch(5)).groups == 0, "one rollout of it still in flight"
    assert releaser.release(batch(6)).groups == 1
    assert queue.rollouts() == rollouts(["g0", "g1"], 6)


def test_concurrent_releasers_advance_the_cursor_once() -> None:
    ledger, queue = setup()
    first, second = releaser_of(ledger, queue), releaser_of(ledger, queue)
    stale = ledger.cursor("batch-1")
    assert first.release(batch(0)).rollouts == 8
    assert second.release(batch(0), cursor=stale).rollouts == 0, "its conditional advance lost"
    assert queue.rollouts() == rollouts(["g0", "g1"])


def test_a_crashed_releaser_is_recovered_once_its_lease_has_expired() -> None:
    ledger, queue = setup()
    releaser = releaser_of(ledger, queue)
    queue.fail_next = True
    with pytest.raises(ConnectionError):
        releaser.release(batch(0))
    assert queue.sent == []
    assert ledger.cursor_item is not None
    assert ledger.cursor_item.sending == ("g0", "g1")
    assert releaser.release(batch(0)).recovered == 0, "the lease still holds: its owner may be sending"
    ledger.now += RELEASE_LEASE_S + 1
    done = releaser_of(ledger, queue).release(batch(0))  # type: ignore[arg-type]
    assert (done.recovered, done.rollouts) == (2, 0)
    assert queue.rollouts() == rollouts(["g0", "g1"]), "re-sent once, nothing beyond the window"
    assert ledger.cursor_item.sending == ()
    assert releaser_of(ledger, queue).release(batch(4)).rollouts == 4  # type: ignore[arg-type]
    assert queue.rollouts() == rollouts(["g0", "g1", "g2"])


def test_a_cancelled_batch_releases_nothing_more() -> None:
    ledger, queue = setup()
    releaser = releaser_of(ledger, queue)
    releaser.release(batch(0))
    done = releaser.release(batch(8, cancelled=True))
    assert (done.rollouts, done.closed) == (0, True)
    assert releaser.release(batch(8)).rollouts == 0, "closed for good"
    assert queue.rollouts() == rollouts(["g0", "g1"])


def test_no_window_no_cursor_nothing_released() -> None:
    ledger = MemoryReleaseLedger(0)
    queue = RecordingQueue()
    releaser = releaser_of(ledger, queue)
    assert releaser.release(batch(1)).rollouts == 0
    assert releaser.no_room_known(batch(1)), "a batch without a cursor once a rollout ended: never read again"


def test_one_release_sends_at_most_what_the_dispatchers_hold() -> None:
    ledger, queue = setup(window=16)
    releaser = releaser_of(ledger, queue, most=8)
    assert releaser.release(batch(0)).rollouts == 8, "the batch's start: what the dispatchers hold, not the window"
    assert releaser.release(batch(4)).rollouts == 8, "the window has room for 12: one release sends 8 of them"
    assert queue.rollouts() == rollouts(["g0", "g1", "g2", "g3"])
