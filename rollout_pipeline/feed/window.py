"""The release window: a batch's rollouts reach the rollout queue in group (line) order, at most `window` of them
released and not yet terminal, so whatever order the queue delivers in, its reordering stays within the window.

The feed (`feed.feed.Feed`) records each ingest chunk's accepted groups as pending (`ReleaseLedger.add_pending`)
and releases; it releases again after a terminal rollout, after a dispatcher's SQS batch, and in the sweep as a
backstop (`ReleaseLedger.due`). One release (`ReleaseWindow.release`):

1. room = window - (released - terminal): rollouts of the batch in the queue, waiting or running. Nothing happens
   while the room is below `min_release` (a quarter of the window, at most 16: one release per chunk of groups,
   never per rollout), unless nothing released is left in flight;
2. the next whole groups in line order that fit in the room and in what the dispatchers hold at once
   (`max_release`: a release at the batch's start, when every slot is free, is held and ordered as a whole; at
   least one group when nothing is in flight, however big);
3. one conditional write moves the cursor past them and records them as being sent (with a lease);
4. their messages are sent (attempt 1; `submitted_at` the batch's creation, so they rank as the batch's in the
   admission order) and a second conditional write confirms them.

A release that crashed between 3 and 4 is recovered by the next release once the lease has expired: it re-sends
the recorded groups (messages the crashed one did send are absorbed by the dispatch transaction, which starts each
attempt once). Nothing is released for a cancelled batch (its cursor leaves the index); retries and limit re-sends
are not releases (they re-send an already released rollout), so nothing is counted twice; rejected rows are never
pending. Costs per release: a GetItem of the cursor, a Query of the pending items (two per page), a BatchGetItem of
the groups (not at ingestion, which has them), two conditional writes and the SendMessageBatch calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.feed.messages import QueuedGroup, bodies_of
from rollout_pipeline.ledger.items import BatchView, GroupItem
from rollout_pipeline.ledger.release import PendingGroup, ReleaseCursor, ReleaseLedger
from rollout_pipeline.topology import dispatchers_hold

#: An unconfirmed release is re-sent by someone else after this long (its sender crashed or stalled).
RELEASE_LEASE_S: Final = 60
#: A release waits for at most this much room (a bigger window releases as often, in chunks this big).
MAX_MIN_RELEASE: Final = 16
#: At most this many groups per release.
MAX_GROUPS_PER_RELEASE: Final = 500
#: Batches whose last cursor a window remembers.
_KNOWN_MAX: Final = 1024
_EPOCH: Final = datetime.fromtimestamp(0, UTC)


def window_size(config: ExperimentConfig) -> int:
    """The experiment's window (rollouts of a batch released and not yet terminal): `release_window`, else
    `max_sessions` plus what the dispatchers hold at once (`dispatch_concurrency` x their SQS batch size). So the
    window never holds back the slots, and when they bind, what waits behind the running rollouts fits in the
    dispatchers' hands, where the admission board orders it. 0: no window (every rollout sent at ingestion)."""
    if config.release_window is not None:
        return config.release_window
    return config.max_sessions + max_release(config)


def max_release(config: ExperimentConfig) -> int:
    """The most one release sends: what the dispatchers hold at once (`dispatch_concurrency` x their SQS batch
    size), so a release that finds the slots free (the batch's start) is held, and ordered, as a whole."""
    return dispatchers_hold(config)


def min_release(window: int) -> int:
    """The smallest room worth a release: a quarter of the window, at most `MAX_MIN_RELEASE` (at least one)."""
    return max(1, min(window // 4, MAX_MIN_RELEASE))


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """What one `ReleaseWindow.release` did."""

    rollouts: int = 0
    groups: int = 0
    recovered: int = 0
    closed: bool = False
    #: The release found no pending group left after it (so far: ingestion may still add some).
    drained: bool = False
    #: The batch had groups to release but too little room for them, by the view given.
    short_of_room: bool = False


#: Reads the group items of a batch by input id (`BatchLedger.read_groups`).
GroupReader = Callable[[str, Sequence[str]], Mapping[str, GroupItem]]
#: Sends rollout message bodies to the rollout queue.
Sender = Callable[[list[str]], None]


class ReleaseWindow:
    """Releases a batch's pending groups to the rollout queue (see the module doc)."""

    def __init__(
        self,
        ledger: ReleaseLedger,
        read_groups: GroupReader,
        send: Sender,
        *,
        lease_s: int = RELEASE_LEASE_S,
        most: int | None = None,
    ) -> None:
        """`most`: rollouts one release sends at most (`max_release`; None: the room)."""
        self.ledger = ledger
        self.read_groups = read_groups
        self.send = send
        self.most = most
        self.lease_s = lease_s
        #: The last cursor this window saw per batch (None: nothing to release, for good); see `no_room_known`.
        self._known: dict[str, ReleaseCursor | None] = {}
        self._lock = threading.Lock()

    def _note(self, batch_id: str, cursor: ReleaseCursor | None) -> None:
        with self._lock:
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
            self._known[batch_id] = cursor if cursor is not None and cursor.open else None

    def no_room_known(self, batch: BatchView) -> bool:
        """True when this window's last view of the batch's cursor already proves a release would do nothing:
        no cursor or a closed one once a rollout has ended (a windowed batch's cursor exists before its first
        message is sent, and a closed one never reopens), or too little room (`released` only grows, so a view
        that is behind can only overestimate the room, never hide it)."""
        with self._lock:
            if batch.batch_id not in self._known:
                return False
            cursor = self._known[batch.batch_id]
        if cursor is None:
            return batch.terminal > 0
        if cursor.sending or batch.cancelled:
            return False
        in_flight = cursor.released - batch.terminal
        return in_flight > 0 and cursor.window - in_flight < min_release(cursor.window)

    def release(
        self,
        batch: BatchView,
        *,
        cursor: ReleaseCursor | None = None,
        known: Mapping[str, QueuedGroup] | None = None,
    ) -> ReleaseResult:
        """One release for `batch` (its view: `terminal`, status, `rollouts_total`); `known`: groups the caller
        already holds (by input id), saving their reads."""
        cursor = cursor or self.ledger.cursor(batch.batch_id)
        self._note(batch.batch_id, cursor)
        if cursor is None or not cursor.open:
            return ReleaseResult()
        if batch.cancelled:
            return ReleaseResult(closed=self._close(batch.batch_id, cursor))
        recovered = 0
        if cursor.sending:
            if cursor.lease_until >= self.ledger.epoch():
                return ReleaseResult()  # another release is being sent: its confirmation is the next step
            retaken = self.ledger.retake(batch.batch_id, cursor, lease_s=self.lease_s)
            if retaken is None:
                return ReleaseResult()
            self._send(batch, retaken.sending, known)
            recovered = len(retaken.sending)
            if not self.ledger.confirm(batch.batch_id, retaken):
                return ReleaseResult(recovered=recovered)
            cursor = replace(retaken, sending=(), lease_until=0)
        in_flight = max(0, cursor.released - batch.terminal)
        room = cursor.window - in_flight
        if in_flight > 0 and room < min_release(cursor.window):
            return ReleaseResult(recovered=recovered, short_of_room=True)
        if self.most is not None:
            room = min(room, max(self.most, 1))
        chosen, chunk_sk, more = self._next_groups(batch.batch_id, cursor, room, in_flight)
        if not chosen:
            if not more and batch.rollouts_total is not None:
                closed = self._close(batch.batch_id, cursor)
                return ReleaseResult(recovered=recovered, closed=closed, drained=True)
            return ReleaseResult(recovered=recovered, drained=not more, short_of_room=more)
        advanced = self.ledger.advance(batch.batch_id, cursor, chosen, chunk_sk=chunk_sk, lease_s=self.lease_s)
        if advanced is None:
            return ReleaseResult(recovered=recovered)
        self._send(batch, advanced.sending, known)
        confirmed = self.ledger.confirm(batch.batch_id, advanced)
        if confirmed:
            self._note(batch.batch_id, replace(advanced, sending=(), lease_until=0))
        size = sum(group.group_size for group in chosen)
        return ReleaseResult(rollouts=size, groups=len(chosen), recovered=recovered, drained=confirmed and not more)

    def _next_groups(
        self, batch_id: str, cursor: ReleaseCursor, room: int, in_flight: int
    ) -> tuple[list[PendingGroup], str, bool]:
        """The next whole groups in line order that fit in `room` (at least one when nothing is in flight), the
        sort key of the pending item holding the last of them, and whether more are pending after them."""
        chosen: list[PendingGroup] = []
        chunk_sk = cursor.chunk_sk
        size = 0
        for item_sk, group in self.ledger.next_groups(batch_id, cursor, max_groups=MAX_GROUPS_PER_RELEASE + 1):
            fits = size + group.group_size <= room or (not chosen and in_flight == 0)
            if not fits or len(chosen) >= MAX_GROUPS_PER_RELEASE:
                return chosen, chunk_sk, True
            chosen.append(group)
            chunk_sk = item_sk  # a look ahead from the item holding the last group released skips released lines
            size += group.group_size
        return chosen, chunk_sk, False

    def _close(self, batch_id: str, cursor: ReleaseCursor) -> bool:
        closed = self.ledger.close(batch_id, cursor)
        if closed:
            self._note(batch_id, None)
        return closed

    def _send(self, batch: BatchView, input_ids: Sequence[str], known: Mapping[str, QueuedGroup] | None) -> None:
        """Send the messages of the groups `input_ids`: those the caller holds as they are, the others from their
        group items; every one with the batch's creation as its submission time (one batch, one admission time)."""
        known = known or {}
        missing = [i for i in input_ids if i not in known]
        items = self.read_groups(batch.batch_id, missing) if missing else {}
        submitted_at = batch.created_at or _EPOCH
        groups: list[QueuedGroup] = []
        for input_id in input_ids:
            group = known.get(input_id)
            if group is not None:
                groups.append(replace(group, submitted_at=batch.created_at or group.submitted_at))
                continue
            item = items.get(input_id)
            if item is None:
                raise LookupError(f"group {batch.batch_id}/{input_id} to release is not in the ledger")
            groups.append(QueuedGroup.of_item(item, exp_id=batch.exp_id, submitted_at=submitted_at))
        bodies = bodies_of(groups)
        if bodies:
            self.send(bodies)
