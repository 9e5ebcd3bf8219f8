"""The release window: the experiment's rollouts reach the rollout queue in admission order (batches by creation,
groups by line), at most `window` of them released and not yet terminal across every batch, so whatever order the
queue delivers in, its reordering stays within the window, and what waits in the queue always fits in the
dispatchers' hands.

The feed (`feed.feed.Feed`) hands each ingest chunk's accepted groups to the window (`ReleaseWindow.release` with
the chunk); it releases again after a terminal rollout, after a dispatcher's SQS batch, and in the sweep as a
backstop. One release:

1. read the window item (`ReleaseLedger.read_window`): every batch's place (released, terminal as last counted,
   the last line released and handed over), and what is being sent;
2. room = window - rollouts released and not terminal, the terminal counts refreshed from the batch views the
   caller holds. Nothing is sent while the room is below `min_release` (a quarter of the window, at most 16: one
   release per chunk of groups, never per rollout), unless nothing released is left in flight;
3. the next whole groups in admission order (the oldest batch's first, then the next batch's) that fit in the room,
   in what the dispatchers hold at once (`max_release`), and while sessions are free in the free sessions (so a
   release that can all start at once does, whatever order the queue delivers it in); at least one group when
   nothing is in flight, however big. A chunk's groups that do not fit are written as pending (`put_pending`);
4. one conditional write of the window item (its version) moves the batches' places past them and records them as
   being sent (with a lease), the refreshed counts with them; their messages are sent (attempt 1, `submitted_at` the
   batch's creation, so they rank as the batch's in the admission order) and a second conditional write confirms.

A release that crashed between the two writes is recovered by the next release once the lease has expired: it
re-sends the recorded groups (messages the crashed one did send are absorbed by the dispatch transaction, which
starts each attempt once). A batch leaves the window once ingestion ended and every rollout it released is
terminal, or once it is cancelled (nothing more of it is released). Retries and limit re-sends are not releases
(they re-send a released rollout), so nothing is counted twice; rejected rows are never handed over.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import iso, parse_iso
from rollout_pipeline.feed.messages import QueuedGroup, bodies_of
from rollout_pipeline.ledger.items import BatchView, GroupItem
from rollout_pipeline.ledger.release import PendingGroup, ReleaseLedger, Sending, WindowEntry, WindowState
from rollout_pipeline.topology import dispatchers_hold

log = logging.getLogger(__name__)

#: An unconfirmed release is re-sent by someone else after this long (its sender crashed or stalled).
RELEASE_LEASE_S: Final = 60
#: A release waits for at most this much room (a bigger window releases as often, in chunks this big).
MAX_MIN_RELEASE: Final = 16
#: At most this many groups per release.
MAX_GROUPS_PER_RELEASE: Final = 500
#: At most this many batches' pending groups are looked at in one release (each a Query).
MAX_BATCHES_PER_RELEASE: Final = 8
#: The window holds at most this many batches at once (each a ~150-byte attribute of the window item, 400 KB at
#: most); a batch submitted beyond them is sent at once, as without a window.
MAX_WINDOW_BATCHES: Final = 1000
#: A process's last view of the window showing nothing pending is trusted this long (s): a batch another process
#: hands over meanwhile waits at most this much for the first terminal rollout or dispatch that looks again.
NOTHING_PENDING_TRUST_S: Final = 5.0
#: A conflicting write (another release wrote the window first) is tried again on a fresh read this many times.
WRITE_TRIES: Final = 4
#: A chunk handed over by a submit must be recorded: its write is tried this many times, after a jittered pause that
#: doubles from `SUBMIT_BACKOFF_S` up to `SUBMIT_BACKOFF_MAX_S` (several trainer processes submitting at once, and
#: every dispatcher and drain releasing, all write the one window item of the experiment).
SUBMIT_WRITE_TRIES: Final = 16
SUBMIT_BACKOFF_S: Final = 0.02
SUBMIT_BACKOFF_MAX_S: Final = 0.5
_EPOCH: Final = datetime.fromtimestamp(0, UTC)


def window_size(config: ExperimentConfig) -> int:
    """The experiment's window (rollouts released and not yet terminal, every batch together): `release_window`,
    else `max_sessions` plus what the dispatchers hold at once (`dispatch_concurrency` x their SQS batch size). So
    the window never holds back the slots, and when they bind, what waits behind the running rollouts fits in the
    dispatchers' hands, where the admission board orders it. 0: no window (every rollout sent at ingestion)."""
    if config.release_window is not None:
        return config.release_window
    return config.max_sessions + max_release(config)


def max_release(config: ExperimentConfig) -> int:
    """The most one release sends: what the dispatchers hold at once (`dispatch_concurrency` x their SQS batch
    size), so a release is held, and ordered, as a whole."""
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
    #: Batches that left the window (done or cancelled).
    closed: int = 0
    #: Nothing handed over is left pending in the batch the caller submitted for (so far: a later chunk may add).
    drained: bool = False
    #: Groups are pending but the room, by the counts known, is too small for the next one.
    short_of_room: bool = False
    #: The batch could not join the window (it holds `MAX_WINDOW_BATCHES` already): send it at once instead.
    refused: bool = False


#: Reads the group items of a batch by input id (`GroupLedger.read_groups`).
GroupReader = Callable[[str, Sequence[str]], Mapping[str, GroupItem]]
#: Sends rollout message bodies to the rollout queue.
Sender = Callable[[list[str]], None]


@dataclass
class _Plan:
    """One release being decided: the window read, what the caller knows, what is chosen."""

    read: WindowState
    entries: dict[str, WindowEntry]
    #: Batch views the caller holds, by id (their terminal counts and status are the freshest known).
    views: Mapping[str, BatchView]
    #: Record every terminal count the views show (the sweep).
    recount: bool = False
    #: The batch whose chunk the caller hands over, and the chunk (line order, released lines skipped).
    submitted: str | None = None
    chunk: Sequence[QueuedGroup] = ()
    changed: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    chosen: dict[str, list[PendingGroup]] = field(default_factory=dict)

    def set_entry(self, batch_id: str, entry: WindowEntry) -> None:
        if entry != self.entries.get(batch_id):
            self.entries[batch_id] = entry
            self.changed.add(batch_id)

    def remove(self, batch_id: str) -> None:
        if self.entries.pop(batch_id, None) is not None:
            self.removed.add(batch_id)
            self.changed.discard(batch_id)

    @property
    def in_flight(self) -> int:
        return sum(entry.in_flight for entry in self.entries.values())

    @property
    def chosen_rollouts(self) -> int:
        return sum(group.group_size for groups in self.chosen.values() for group in groups)


class ReleaseWindow:
    """Releases the experiment's groups to the rollout queue (see the module doc)."""

    def __init__(
        self,
        ledger: ReleaseLedger,
        read_groups: GroupReader,
        send: Sender,
        *,
        size: int,
        most: int | None = None,
        slots: int | None = None,
        lease_s: int = RELEASE_LEASE_S,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`size`: the window; `most`: rollouts one release sends at most (None: the room); `slots`: the sessions
        the experiment runs at once (`max_sessions`; None: no burst rule); `monotonic`: how old a view of the
        window is (`NOTHING_PENDING_TRUST_S`)."""
        self.ledger = ledger
        self.read_groups = read_groups
        self.send = send
        self.size = size
        self.most = most
        self.slots = slots
        self.lease_s = lease_s
        #: The window as this process last read or wrote it, and when; see `no_room_known`.
        self._seen: WindowState | None = None
        self._seen_at = 0.0
        #: Batches whose views the last release held and its read did not show in the window (sent at once, left).
        self._absent: frozenset[str] = frozenset()
        self.monotonic = monotonic
        self.sleep = sleep
        self._lock = threading.Lock()
        self._releasing = threading.Lock()

    # --------------------------------------------------------------------------------------------- public

    def seen(self) -> WindowState | None:
        """The window as this process last read or wrote it."""
        with self._lock:
            return self._seen

    def no_room_known(self, views: Iterable[BatchView]) -> bool:
        """True when this process's last view of the window already proves that a release after these batch
        views would do nothing: no pending group anywhere, or too little room, and nothing of these batches to
        record (a batch leaving, its total, a terminal count that has moved by a release's worth). A view that is
        behind can only hide room (`released` only grows; another process's count of terminal rollouts
        only grows): the next release, or the sweep, finds it. "Nothing pending" is trusted for
        `NOTHING_PENDING_TRUST_S` only: another process (ingestion) may have handed over a batch since; and never
        for the view of a running batch that last view did not hold (it was handed over since)."""
        with self._lock:
            seen, age, absent = self._seen, self.monotonic() - self._seen_at, self._absent
        if seen is None or seen.sending:
            return False
        entries = dict(seen.entries)
        pending = any(entry.pending for entry in entries.values())
        for view in views:
            entry = entries.get(view.batch_id)
            if entry is None:
                over = view.cancelled or (view.rollouts_total is not None and view.terminal >= view.rollouts_total)
                if not over and view.batch_id not in absent:
                    return False
                continue
            if view.cancelled or (view.rollouts_total is not None and entry.total is None):
                return False
            fresh = replace(entry, terminal=max(entry.terminal, view.terminal))
            others = any(e.pending for name, e in entries.items() if name != view.batch_id)
            if fresh.done or (others and fresh.terminal - entry.terminal >= min_release(self.size)):
                return False
            entries[view.batch_id] = fresh
        if not pending:
            return age < NOTHING_PENDING_TRUST_S
        in_flight = sum(entry.in_flight for entry in entries.values())
        return in_flight > 0 and self.size - in_flight < min_release(self.size)

    def release(
        self,
        views: Iterable[BatchView] = (),
        *,
        submitted: BatchView | None = None,
        chunk: Sequence[QueuedGroup] = (),
        forget: Iterable[str] = (),
        recount: bool = False,
    ) -> ReleaseResult:
        """One release after the batch views the caller holds (`views`); `submitted` (its view) hands over `chunk`
        (its accepted groups, line order; empty once ingestion ended, with the final view); `forget`: batches that
        no longer exist; `recount`: record every terminal count the views show (the sweep), not only those that
        moved by a release's worth. Raises when the chunk could not be recorded (written as pending or released);
        otherwise a write that lost to another release is tried again on a fresh read, `WRITE_TRIES` times
        (`SUBMIT_WRITE_TRIES`, with a jittered back-off, when a chunk is handed over)."""
        given = {view.batch_id: view for view in views}
        if submitted is not None:
            given[submitted.batch_id] = submitted
        with self._releasing:  # this process's releases one at a time: they would only meet on the window's version
            quiet = submitted is None and not forget and not recount
            if quiet and self.no_room_known(given.values()):
                return ReleaseResult()  # the release that held the lock did what these views asked for
            done = self._release(given, submitted, chunk, forget, recount=recount)
            with self._lock:
                held = self._seen.entries if self._seen is not None else {}
                self._absent = frozenset(batch_id for batch_id in given if batch_id not in held)
            return done

    def _release(
        self,
        given: Mapping[str, BatchView],
        submitted: BatchView | None,
        chunk: Sequence[QueuedGroup],
        forget: Iterable[str],
        *,
        recount: bool,
    ) -> ReleaseResult:
        recovered = 0
        for attempt in range(WRITE_TRIES if submitted is None else SUBMIT_WRITE_TRIES):
            if attempt and submitted is not None:
                self.sleep(random.uniform(0, min(SUBMIT_BACKOFF_MAX_S, SUBMIT_BACKOFF_S * 2**attempt)))
            read = self.ledger.read_window()
            self._note(read)
            busy = bool(read.sending)
            if busy and read.lease_until < self.ledger.epoch():
                recovered += self._recover(read)
                continue
            if busy and submitted is None:
                return ReleaseResult(recovered=recovered)  # being sent: its confirmation is the next step
            plan = _Plan(read, dict(read.entries), given, recount=recount)
            for batch_id in forget:
                plan.remove(batch_id)
            done = self._release_once(plan, submitted, chunk, busy=busy)
            if done is not None:
                return replace(done, recovered=recovered)
        if submitted is not None:
            raise ConnectionError(f"the release window kept changing: batch {submitted.batch_id}'s chunk not recorded")
        return ReleaseResult(recovered=recovered)

    # ------------------------------------------------------------------------------------------- one release

    def _release_once(
        self, plan: _Plan, submitted: BatchView | None, chunk: Sequence[QueuedGroup], *, busy: bool
    ) -> ReleaseResult | None:
        """One release on the window as `plan.read` (see the module doc); `busy`: another release is being sent,
        so the chunk is only recorded as pending. None when the write lost (read again)."""
        read = plan.read
        if submitted is not None and not self._hand_over(plan, submitted, chunk, busy=busy):
            return ReleaseResult(refused=True)
        self._count(plan)
        in_flight = plan.in_flight
        room = self.size - in_flight
        pending = any(entry.pending for entry in plan.entries.values()) or bool(plan.chunk)
        short = pending and in_flight > 0 and room < min_release(self.size)
        if pending and not short and not busy:
            limit = self._limit(room, in_flight, submitting=submitted is not None)
            self._choose(plan, limit, in_flight)
            capped = limit < self._limit(room, in_flight, submitting=False)  # by the free sessions, not the room
            short = not plan.chosen and not capped and any(e.pending for e in plan.entries.values())
        self._park_chunk(plan)
        if not plan.changed and not plan.removed:
            return ReleaseResult(drained=self._drained(plan), short_of_room=short)
        sending: Sending = (
            read.sending
            if busy
            else tuple((batch_id, tuple(g.input_id for g in groups)) for batch_id, groups in plan.chosen.items())
        )
        entries = {batch_id: plan.entries[batch_id] for batch_id in plan.changed}
        written = self.ledger.write_window(
            read,
            entries=entries,
            removed=sorted(plan.removed),
            sending=sending,
            lease_s=self.lease_s,
            lease_until=read.lease_until if busy else None,
        )
        if written is None:
            return None
        self._note(written)
        if sending and not busy:
            try:
                self._send(written, sending, {g.input_id: g for g in plan.chunk})
            except Exception:  # recorded as being sent: the next release re-sends it once the lease has expired
                log.exception("release of %s deferred to its lease's end", ", ".join(b for b, _ in sending))
                return ReleaseResult(drained=self._drained(plan))
            self._confirm(written)
        return ReleaseResult(
            rollouts=plan.chosen_rollouts,
            groups=sum(len(groups) for groups in plan.chosen.values()),
            closed=len(plan.removed),
            drained=self._drained(plan),
            short_of_room=short and not plan.chosen,
        )

    def _hand_over(self, plan: _Plan, batch: BatchView, chunk: Sequence[QueuedGroup], *, busy: bool) -> bool:
        """Put the submitted batch (and its chunk, released lines skipped) into the plan; False when the window
        holds too many batches to take it."""
        entry = plan.entries.get(batch.batch_id)
        if entry is None:
            if not chunk:
                return True  # nothing handed over (or the batch has left the window already)
            if len(plan.entries) >= MAX_WINDOW_BATCHES:
                return False
            entry = WindowEntry(created=iso(batch.created_at or _EPOCH))
        fresh = [group for group in chunk if (group.line or 0) > entry.line]
        if fresh and (entry.pending or busy):  # behind groups already waiting (or a release being sent): wait
            plan.chunk = ()
            first = self.ledger.put_pending(batch.batch_id, [_pending(g) for g in fresh])
            entry = replace(entry, chunk=entry.chunk if entry.pending else first)
        else:
            plan.chunk = fresh
        if fresh:
            entry = replace(entry, added=max(entry.added, *(g.line or 0 for g in fresh)))
        if batch.rollouts_total is not None:
            entry = replace(entry, total=batch.rollouts_total)
        plan.submitted = batch.batch_id
        plan.set_entry(batch.batch_id, entry)
        return True

    def _count(self, plan: _Plan) -> None:
        """Refresh the entries from the views held: terminal counts, totals; drop cancelled and finished batches.
        A terminal count is written when it moved by a release's worth while another batch's groups wait (the room
        is theirs: they see it only once it is written), or always (`recount`); else it counts for this release's
        room only (the batch's own next view shows it again)."""
        for batch_id, view in plan.views.items():
            entry = plan.entries.get(batch_id)
            if entry is None:
                continue
            if view.cancelled:
                plan.remove(batch_id)
                continue
            fresh = replace(
                entry,
                terminal=max(entry.terminal, view.terminal),
                total=entry.total if view.rollouts_total is None else view.rollouts_total,
            )
            moved = fresh.terminal - entry.terminal
            waiting = any(other.pending for name, other in plan.entries.items() if name != batch_id)
            if fresh.total != entry.total or (
                moved >= (1 if plan.recount else min_release(self.size)) and (plan.recount or waiting)
            ):
                plan.set_entry(batch_id, fresh)
            else:
                plan.entries[batch_id] = fresh  # counted for the room; written only with the release
        for batch_id, entry in list(plan.entries.items()):
            if entry.done:
                plan.remove(batch_id)

    def _limit(self, room: int, in_flight: int, *, submitting: bool) -> int:
        """Rollouts this release may send: the room and what the dispatchers hold; a release at ingestion, no more
        than the free sessions. What can all start at once is not reordered by the queue, and the rest follows
        once a dispatcher has taken it (`Feed.after_dispatch`) or a rollout ended, so a later release never
        overtakes the first in the queue, whatever order it delivers in."""
        limit = room
        if self.most is not None:
            limit = min(limit, max(self.most, 1))
        if submitting and self.slots is not None:
            limit = min(limit, max(0, self.slots - in_flight))
        return limit

    def _choose(self, plan: _Plan, limit: int, in_flight: int) -> None:
        """The next whole groups in admission order that fit in `limit` (at least one when nothing is in
        flight); a group that does not fit ends the choice (no later group passes it)."""
        size = 0
        looked = 0
        for batch_id, entry in sorted(plan.entries.items(), key=lambda pair: (pair[1].created, pair[0])):
            direct = batch_id == plan.submitted and bool(plan.chunk)
            if not entry.pending and not direct:
                continue
            looked += 1
            if looked > MAX_BATCHES_PER_RELEASE:
                return
            line, chunk_sk = entry.line, entry.chunk
            taken: list[PendingGroup] = []
            stop = False
            seen_any = False
            for item_sk, group in self._candidates(batch_id, entry, plan):
                seen_any = True
                total = sum(len(groups) for groups in plan.chosen.values()) + len(taken)
                fits = size + group.group_size <= limit or (total == 0 and in_flight == 0)
                if not fits or total >= MAX_GROUPS_PER_RELEASE:
                    stop = True
                    break
                taken.append(group)
                size += group.group_size
                line = group.line
                chunk_sk = item_sk or chunk_sk
            if taken:
                plan.chosen[batch_id] = taken
                released = entry.released + sum(g.group_size for g in taken)
                plan.set_entry(batch_id, replace(entry, released=released, line=line, chunk=chunk_sk))
            elif not seen_any and not direct:  # its pending items are gone (expired): nothing left to release
                plan.set_entry(batch_id, replace(entry, line=entry.added))
            if stop:
                return

    def _candidates(self, batch_id: str, entry: WindowEntry, plan: _Plan) -> Iterator[tuple[str, PendingGroup]]:
        """A batch's groups to release next: the chunk handed over (no read), else its pending groups."""
        if batch_id == plan.submitted and plan.chunk:
            yield from (("", _pending(group)) for group in plan.chunk)
            return
        yield from self.ledger.next_groups(batch_id, entry, max_groups=MAX_GROUPS_PER_RELEASE + 1)

    def _park_chunk(self, plan: _Plan) -> None:
        """Write the handed-over groups that were not released as pending, and point the batch's place at them."""
        if plan.submitted is None or not plan.chunk:
            return
        released = {group.input_id for group in plan.chosen.get(plan.submitted, ())}
        rest = [_pending(group) for group in plan.chunk if group.input_id not in released]
        if not rest:
            return
        first = self.ledger.put_pending(plan.submitted, rest)
        entry = plan.entries[plan.submitted]
        plan.set_entry(plan.submitted, replace(entry, chunk=first))

    def _drained(self, plan: _Plan) -> bool:
        if plan.submitted is None:
            return False
        entry = plan.entries.get(plan.submitted)
        return entry is None or not entry.pending

    # -------------------------------------------------------------------------------------- sending and recovery

    def _recover(self, read: WindowState) -> int:
        """Take over an unconfirmed release whose lease has expired and send it again: the rollouts re-sent (0
        when another release took it over first)."""
        retaken = self.ledger.write_window(read, sending=read.sending, lease_s=self.lease_s)
        if retaken is None:
            return 0
        self._note(retaken)
        sent = self._send(retaken, read.sending, {})
        self._confirm(retaken)
        return sent

    def _confirm(self, written: WindowState) -> None:
        if self.ledger.confirm(written):
            self._note(replace(written, version=written.version + 1, sending=(), lease_until=0))

    def _send(self, state: WindowState, sending: Sending, known: Mapping[str, QueuedGroup]) -> int:
        """Send the messages of the groups recorded as being sent (those of a batch no longer in the window, that
        is cancelled, are not); the chunk's groups as the caller holds them, the others from their group items.
        Returns the rollouts sent."""
        groups: list[QueuedGroup] = []
        for batch_id, input_ids in sending:
            entry = state.entries.get(batch_id)
            if entry is None:
                continue
            submitted_at = parse_iso(entry.created) or _EPOCH
            # Input ids are unique within a batch only: the chunk's namesake of another batch is not this group.
            missing = [i for i in input_ids if i not in known or known[i].batch_id != batch_id]
            items = self.read_groups(batch_id, missing) if missing else {}
            for input_id in input_ids:
                group = known.get(input_id)
                if group is not None and group.batch_id == batch_id:
                    groups.append(replace(group, submitted_at=submitted_at))
                    continue
                item = items.get(input_id)
                if item is None:
                    raise LookupError(f"group {batch_id}/{input_id} to release is not in the ledger")
                groups.append(QueuedGroup.of_item(item, exp_id=item.exp_id, submitted_at=submitted_at))
        bodies = bodies_of(groups)
        if bodies:
            self.send(bodies)
        return len(bodies)

    def _note(self, state: WindowState) -> None:
        with self._lock:
            if self._seen is None or state.version >= self._seen.version:
                self._seen, self._seen_at = state, self.monotonic()


def _pending(group: QueuedGroup) -> PendingGroup:
    return PendingGroup(group.input_id, group.line or 0, group.group_size)
