"""The feed: the one way work reaches the rollout queue, with one verb per caller.

- `submit` (ingestion, per chunk of accepted groups, and once more when ingestion ends): sends the groups' messages
  at once when the window is off, else records them as pending and releases what fits (`feed.window`);
- `after_terminal` (the outbox drain, after it published a terminal rollout): a rollout ended, the window may have
  room;
- `after_dispatch` (the dispatcher, after its SQS batch): the queue drained, the window may have room;
- `sweep` (the sweeper's backstop): releases for every batch whose cursor has not moved for a while, so a crashed
  or failed release never stalls a batch.

Each caller hands over the batch view it already holds; the feed reads a batch only in the sweep, or when the view
a chunk came with is too old to show the room its rollouts made (ingestion's views carry no counters). Every
release but ingestion's is best effort: a failure is logged and the next terminal rollout, dispatch or sweep
releases instead. `wiring.Wiring.feed` builds one per process, so its memory of each batch's cursor (which spares a
read per terminal rollout, `ReleaseWindow.no_room_known`) is shared by every stage there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from rollout_pipeline.config import HandlerSettings
from rollout_pipeline.feed.messages import QueuedGroup, bodies_of
from rollout_pipeline.feed.window import ReleaseResult, ReleaseWindow, max_release, window_size
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.release import PendingGroup
from rollout_pipeline.ports import MessageQueue

log = logging.getLogger(__name__)

#: The sweep releases for batches whose cursor was last written longer ago than this (others are moving).
SWEEP_AGE_S: Final = 30
#: SendMessageBatch carries at most this many messages.
_SQS_BATCH: Final = 10


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What one `Feed.submit` did."""

    #: Rollouts of the chunk taken in: sent at once (no window) or recorded as pending.
    rollouts: int = 0
    #: Rollouts sent to the queue by this call (the chunk's at once, or what its release sent).
    sent: int = 0
    #: Nothing of the batch is left pending after this call (so far: a later chunk may add some).
    drained: bool = False


@dataclass
class FeedSweepResult:
    """What one `Feed.sweep` did."""

    batches: int = 0
    rollouts: int = 0
    recovered: int = 0
    errors: int = 0


class Feed:
    """Work into the rollout queue (see the module doc). Build one per process (`wiring.Wiring.feed`)."""

    def __init__(
        self,
        ledger: Ledger,
        queue: MessageQueue,
        settings: HandlerSettings,
        *,
        send_threads: int = 4,
    ) -> None:
        self.ledger = ledger
        self.queue = queue
        self.queue_url = settings.rollout_queue_url
        self.window = window_size(settings.experiment)
        self.send_threads = send_threads
        self.releases = ReleaseWindow(
            ledger.release, ledger.batches.read_groups, self._send_in_order, most=max_release(settings.experiment)
        )
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ verbs

    def submit(self, batch: BatchView, groups: Sequence[QueuedGroup] = ()) -> SubmitResult:
        """Ingestion's chunk of accepted groups (line order) of `batch` (the view ingestion holds): sent at once
        without a window, else recorded as pending and released as far as the window has room. Without groups
        (ingestion ended, `batch` its final view): release what is left, or close the window's cursor. Raises
        when the messages or the pending groups could not be written (the chunk is then not checkpointed)."""
        rollouts = sum(group.group_size for group in groups)
        if not self.window:
            bodies = bodies_of(groups)
            self._send_at_once(bodies)
            return SubmitResult(rollouts=rollouts, sent=len(bodies), drained=True)
        if groups:
            pending = [PendingGroup(g.input_id, g.line or 0, g.group_size) for g in groups]
            self.ledger.release.add_pending(batch.batch_id, pending, window=self.window)
        try:
            done = self.releases.release(batch, known={group.input_id: group for group in groups})
            if done.short_of_room and batch.rollouts_total is None:  # the view may not show the room made since
                fresh = self.ledger.batches.read_batch(batch.batch_id)
                if fresh is not None and fresh.terminal > batch.terminal:
                    done = self.releases.release(fresh, known={group.input_id: group for group in groups})
        except Exception:  # recorded as pending (or as being sent): a terminal rollout or the sweep releases them
            log.exception("batch %s: release deferred", batch.batch_id)
            return SubmitResult(rollouts=rollouts)
        return SubmitResult(rollouts=rollouts, sent=done.rollouts, drained=done.drained)

    def after_terminal(self, batch: BatchView | None) -> None:
        """A rollout of `batch` ended (its view, read after the terminal transaction): release if there is room.
        No read at all when this process's last view of the cursor already shows there is none."""
        if batch is not None:
            self._release_if_room(batch)

    def after_dispatch(self, batches: Iterable[BatchView]) -> None:
        """A dispatcher handled an SQS batch of these batches' rollouts (views read before its dispatches: their
        `terminal` can only be behind, which only hides room): release if there is room. One release sends at most
        what the dispatchers hold, so rollouts longer than it takes to start that many would otherwise wait for
        the first terminal rollout or the sweep."""
        for batch in batches:
            self._release_if_room(batch)

    def sweep(self, *, age_s: int = SWEEP_AGE_S) -> FeedSweepResult:
        """Release for every batch whose cursor is still open and was last written more than `age_s` ago."""
        result = FeedSweepResult()
        try:
            due = self.ledger.release.due(self.ledger.release.epoch() - age_s)
        except Exception:  # the next sweep looks again
            log.exception("feed sweep: the release cursors could not be read")
            result.errors += 1
            return result
        for batch_id in due:
            result.batches += 1
            try:
                batch = self.ledger.batches.read_batch(batch_id)
                done = self.releases.release(batch) if batch is not None else ReleaseResult()
            except Exception:
                log.exception("feed sweep: release of batch %s failed", batch_id)
                result.errors += 1
                continue
            result.rollouts += done.rollouts
            result.recovered += done.recovered
        return result

    # -------------------------------------------------------------------------------------------- internals

    def _release_if_room(self, batch: BatchView) -> None:
        if self.releases.no_room_known(batch):
            return
        try:
            self.releases.release(batch)
        except Exception:  # the next terminal rollout, or the sweep, releases instead
            log.exception("release of batch %s deferred", batch.batch_id)

    def _send_in_order(self, bodies: list[str]) -> None:
        """Send a release's message bodies, in order (one SQS batch after the other)."""
        self.queue.send_all(self.queue_url, bodies)

    def _send_at_once(self, bodies: list[str]) -> None:
        """Send a chunk's message bodies (no window: their order is the queue's), split over up to `send_threads`
        threads in slices of whole SQS batches; raise if any slice failed."""
        if not bodies:
            return
        batches = (len(bodies) + _SQS_BATCH - 1) // _SQS_BATCH
        workers = min(self.send_threads, batches)
        if workers <= 1:
            self.queue.send_all(self.queue_url, bodies)
            return
        per_worker = ((batches + workers - 1) // workers) * _SQS_BATCH
        slices = [bodies[start : start + per_worker] for start in range(0, len(bodies), per_worker)]
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.send_threads, thread_name_prefix="feed-send")
            executor = self._executor
        futures = [executor.submit(self.queue.send_all, self.queue_url, part) for part in slices]
        for future in futures:
            future.result()
