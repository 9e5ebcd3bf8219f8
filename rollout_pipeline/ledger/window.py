"""The release window: a batch's rollouts reach the rollout queue in group (line) order, at most `window` of them
released and not yet terminal, so whatever order the queue delivers in, its reordering stays within the window.

Ingestion records each chunk's accepted groups as pending (`ReleaseLedger.add_pending`) instead of sending them,
then releases; completion releases after a terminal rollout and a dispatcher after its SQS batch
(`lifecycle.release.release_if_room`), and the sweeper as a backstop (`ReleaseLedger.due`).
One release (`Releaser.release`):

1. room = window - (released - terminal): rollouts of the batch in the queue, waiting or running. Nothing happens
   while the room is below `min_release` (a quarter of the window, at most 16: one release per chunk of groups,
   never per rollout), unless nothing released is left in flight;
2. the next whole groups in line order that fit in the room and in what the dispatchers hold at once
   (`max_release`: a release at the batch's start, when every slot is free, is held and ordered as a whole; at
   least one group when nothing is in flight, however big);
3. one conditional write moves the cursor past them and records them as being sent (with a lease);
4. their messages are sent (attempt 1; `submitted_at` the batch's creation, so they rank as the batch's in the
   admission order) and a second conditional write confirms them.

A releaser that crashed between 3 and 4 is recovered by the next release once the lease has expired: it re-sends
the recorded groups (messages the crashed one did send are absorbed by the dispatch transaction, which starts each
attempt once). Nothing is released for a cancelled batch (its cursor leaves the index); retries and limit re-sends
are not releases (they re-send an already released rollout), so nothing is counted twice; rejected rows are never
pending. Costs per release: a GetItem of the cursor, a Query of the pending items (two per page), a BatchGetItem of
the groups (not at ingestion, which has them), two conditional writes and the SendMessageBatch calls.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import RolloutMessage
from rollout_pipeline.ledger.items import BatchView, GroupItem
from rollout_pipeline.ledger.release import PendingGroup, ReleaseCursor, ReleaseLedger
from rollout_pipeline.ports import MessageQueue
from rollout_pipeline.topology import dispatchers_hold

#: An unconfirmed release is re-sent by someone else after this long (its releaser crashed or stalled).
RELEASE_LEASE_S: Final = 60
#: A release waits for at most this much room (a bigger window releases as often, in chunks this big).
MAX_MIN_RELEASE: Final = 16
#: At most this many groups per release.
MAX_GROUPS_PER_RELEASE: Final = 500
#: Batches whose last cursor a releaser remembers.
_KNOWN_MAX: Final = 1024


def release_window(config: ExperimentConfig) -> int:
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
class Released:
    """What one `Releaser.release` did."""

    rollouts: int = 0
    groups: int = 0
    recovered: int = 0
    closed: bool = False
    #: The release found no pending group left after it (so far: ingestion may still add some).
    drained: bool = False


class Releaser:
    """Releases a batch's pending groups to the rollout queue (see the module doc)."""

    def __init__(
        self,
        ledger: ReleaseLedger,
        queue: MessageQueue,
        queue_url: str,
        *,
        lease_s: int = RELEASE_LEASE_S,
        most: int | None = None,
    ) -> None:
        """`most`: rollouts one release sends at most (`max_release`; None: the room)."""
        self.ledger = ledger
        self.most = most
        self.queue = queue
        self.queue_url = queue_url
        self.lease_s = lease_s
        #: The last cursor this releaser saw per batch (None: nothing to release, for good); see `no_room_known`.
        self._known: dict[str, ReleaseCursor | None] = {}
        self._lock = threading.Lock()

    def _note(self, batch_id: str, cursor: ReleaseCursor | None) -> None:
        with self._lock:
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
            self._known[batch_id] = cursor if cursor is not None and cursor.open else None

    def no_room_known(self, batch: BatchView) -> bool:
        """True when this releaser's last view of the batch's cursor already proves a release would do nothing:
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
        known: Mapping[str, RolloutMessage] | None = None,
    ) -> Released:
        """One release for `batch` (its view: `terminal`, status, `rollouts_total`); `known`: the first message of
        groups the caller already holds (input id -> index 0), saving their reads."""
        cursor = cursor or self.ledger.cursor(batch.batch_id)
        self._note(batch.batch_id, cursor)
        if cursor is None or not cursor.open:
            return Released()
        if batch.cancelled:
            closed = self.ledger.close(batch.batch_id, cursor)
            if closed:
                self._note(batch.batch_id, None)
            return Released(closed=closed)
        recovered = 0
        if cursor.sending:
            if cursor.lease_until >= self.ledger.epoch():
                return Released()  # another releaser is sending: its confirmation is the next step
            retaken = self.ledger.retake(batch.batch_id, cursor, lease_s=self.lease_s)
            if retaken is None:
                return Released()
            self._send(batch, retaken.sending, known)
            recovered = len(retaken.sending)
            if not self.ledger.confirm(batch.batch_id, retaken):
                return Released(recovered=recovered)
            cursor = replace(retaken, sending=(), lease_until=0)
        in_flight = max(0, cursor.released - batch.terminal)
        room = cursor.window - in_flight
        if in_flight > 0 and room < min_release(cursor.window):
            return Released(recovered=recovered)
        if self.most is not None:
            room = min(room, max(self.most, 1))
        chosen: list[PendingGroup] = []
        chunk_sk = cursor.chunk_sk
        size = 0
        more = False
        for item_sk, group in self.ledger.next_groups(batch.batch_id, cursor, max_groups=MAX_GROUPS_PER_RELEASE + 1):
            fits = size + group.group_size <= room or (not chosen and in_flight == 0)
            if not fits or len(chosen) >= MAX_GROUPS_PER_RELEASE:
                more = True
                break
            chosen.append(group)
            chunk_sk = item_sk  # a look ahead from the item holding the last group released skips released lines
            size += group.group_size
        if not chosen:
            if not more and batch.rollouts_total is not None:
                closed = self.ledger.close(batch.batch_id, cursor)
                if closed:
                    self._note(batch.batch_id, None)
                return Released(recovered=recovered, closed=closed, drained=True)
            return Released(recovered=recovered, drained=not more)
        advanced = self.ledger.advance(batch.batch_id, cursor, chosen, chunk_sk=chunk_sk, lease_s=self.lease_s)
        if advanced is None:
            return Released(recovered=recovered)
        self._send(batch, advanced.sending, known)
        confirmed = self.ledger.confirm(batch.batch_id, advanced)
        if confirmed:
            self._note(batch.batch_id, replace(advanced, sending=(), lease_until=0))
        return Released(rollouts=size, groups=len(chosen), recovered=recovered, drained=confirmed and not more)

    def _send(self, batch: BatchView, input_ids: Sequence[str], known: Mapping[str, RolloutMessage] | None) -> None:
        known = known or {}
        missing = [i for i in input_ids if i not in known]
        groups = self.ledger.groups(batch.batch_id, missing) if missing else {}
        bodies: list[str] = []
        for input_id in input_ids:
            first = known.get(input_id)
            if first is not None and batch.created_at is not None:
                first = first.model_copy(update={"submitted_at": batch.created_at})  # one batch, one admission time
            if first is None:
                group = groups.get(input_id)
                if group is None:
                    raise LookupError(f"group {batch.batch_id}/{input_id} to release is not in the ledger")
                first = first_message(batch, group)
            bodies.extend(
                first.model_copy(update={"index": index}).model_dump_json() for index in range(first.group_size)
            )
        if bodies:
            self.queue.send_all(self.queue_url, bodies)


def first_message(batch: BatchView, group: GroupItem) -> RolloutMessage:
    """Attempt 1 of index 0 of a group, as ingestion would have sent it (`submitted_at`: the batch's creation, so
    every released group ranks as its batch's in the admission order)."""
    return RolloutMessage(
        exp_id=group.exp_id or batch.exp_id,
        batch_id=batch.batch_id,
        input_id=group.input_id,
        index=0,
        attempt=1,
        group_size=group.group_size,
        submitted_at=batch.created_at or _epoch(),
        line=group.line or None,
        payload=dict(group.payload) if group.payload is not None else None,
        payload_ref=group.payload_ref,
        rollout_overrides=dict(group.overrides),
    )


def _epoch() -> datetime:
    from datetime import UTC

    return datetime.fromtimestamp(0, UTC)
