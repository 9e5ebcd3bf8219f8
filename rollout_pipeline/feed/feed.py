"""The feed: the one way work reaches the rollout queue, with one verb per caller.

- `submit` (ingestion, per chunk of accepted groups, and once more when ingestion ends): sends the groups' messages
  at once when the window is off, else hands them to the release window (`feed.window`), which releases what fits
  and keeps the rest pending;
- `after_terminal` (the outbox drain, after it published a terminal rollout): a rollout ended, the window may have
  room;
- `after_dispatch` (the dispatcher, after its SQS batch): the queue drained, the window may have room;
- `sweep` (the sweeper's backstop): counts every batch in the window again, re-sends a release whose sender
  crashed, and releases what has room, so nothing stalls the window for longer than a sweep;
- `retry` (the outbox drain: a failed attempt's next one), `resend` (the dispatcher: a rollout that found no limit
  in time goes round again), `hold` (the budget: a rollout comes back when the budget may allow it): a rollout
  already released goes back into the queue, outside the window (it was counted when it was released).

Each caller hands over the batch view it already holds; the feed reads a batch only in the sweep, or when the view
a chunk came with is too old to show the room its rollouts made (ingestion's views carry no counters). Every
release but ingestion's is best effort: a failure is logged and the next terminal rollout, dispatch or sweep
releases instead. `wiring.Wiring.feed` builds one per process, so its memory of the window (which spares a read
per terminal rollout, `ReleaseWindow.no_room_known`) is shared by every stage there.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Final

from rollout_pipeline.config import ExperimentConfig, HandlerSettings
from rollout_pipeline.contracts import RolloutMessage
from rollout_pipeline.feed.messages import QueuedGroup, bodies_of
from rollout_pipeline.feed.window import ReleaseWindow, max_release, window_size
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ports import MessageQueue

log = logging.getLogger(__name__)

#: Batches of the window one sweep counts again at most (a Query each), oldest first.
SWEEP_BATCHES: Final = 100
#: SendMessageBatch carries at most this many messages.
_SQS_BATCH: Final = 10


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What one `Feed.submit` did."""

    #: Rollouts of the chunk taken in: sent at once (no window) or handed to the window.
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
        self, ledger: Ledger, queue: MessageQueue, settings: HandlerSettings, *, send_threads: int = 4
    ) -> None:
        self.ledger = ledger
        self.queue = queue
        self.queue_url = settings.rollout_queue_url
        self.config = settings.experiment
        self.window = window_size(settings.experiment)
        self.send_threads = send_threads
        self.releases = ReleaseWindow(
            ledger.release,
            ledger.groups.read_groups,
            self._send_in_order,
            size=self.window,
            most=max_release(settings.experiment),
            slots=settings.experiment.max_sessions,
        )
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ verbs

    def submit(self, batch: BatchView, groups: Sequence[QueuedGroup] = ()) -> SubmitResult:
        """Ingestion's chunk of accepted groups (line order) of `batch` (the view ingestion holds): sent at once
        without a window, else handed to the window, which releases what fits and keeps the rest pending. Without
        groups (ingestion ended, `batch` its final view): the window learns the batch's total and releases what
        has room. Raises when the chunk could not be recorded (it is then not checkpointed, and handed over again
        by the redelivery)."""
        rollouts = sum(group.group_size for group in groups)
        if not self.window:
            bodies = bodies_of(groups)
            self._send_at_once(bodies)
            return SubmitResult(rollouts=rollouts, sent=len(bodies), drained=True)
        done = self.releases.release(submitted=batch, chunk=groups)
        if done.refused:
            log.warning("batch %s: the release window holds too many batches; sent at once", batch.batch_id)
            bodies = bodies_of(groups)
            self._send_at_once(bodies)
            return SubmitResult(rollouts=rollouts, sent=len(bodies), drained=True)
        if done.short_of_room and batch.rollouts_total is None:  # the view may not show the room made since
            try:
                fresh = self.ledger.batches.read_batch(batch.batch_id)
                if fresh is not None and fresh.terminal > batch.terminal:
                    done = replace(self.releases.release([fresh]), drained=done.drained)
            except Exception:  # handed over: a terminal rollout or the sweep releases it
                log.exception("batch %s: release deferred", batch.batch_id)
        return SubmitResult(rollouts=rollouts, sent=done.rollouts, drained=done.drained)

    def after_terminal(self, batch: BatchView | None) -> None:
        """A rollout of `batch` ended (its view, read after the terminal transaction): release if there is room.
        No read at all when this process's last view of the window already shows there is none."""
        if batch is not None:
            self._release_if_room([batch])

    def after_dispatch(self, batches: Iterable[BatchView]) -> None:
        """A dispatcher handled an SQS batch of these batches' rollouts (views read before its dispatches: their
        `terminal` can only be behind, which only hides room): release if there is room. One release sends at most
        what the dispatchers hold, so rollouts longer than it takes to start that many would otherwise wait for
        the first terminal rollout or the sweep."""
        self._release_if_room(list(batches))

    def sweep(self) -> FeedSweepResult:
        """The backstop: count every batch in the window again from its view (at most `SWEEP_BATCHES`, oldest
        first), forget batches that no longer exist, re-send a release whose sender crashed, and release what has
        room. A crashed or failed release, or a count that fell behind, never stalls the window for longer."""
        result = FeedSweepResult()
        if not self.window:
            return result
        try:
            state = self.ledger.release.read_window()
            views: list[BatchView] = []
            gone: list[str] = []
            for batch_id, _entry in state.in_order()[:SWEEP_BATCHES]:
                view = self.ledger.batches.read_batch(batch_id)
                if view is None:
                    gone.append(batch_id)
                else:
                    views.append(view)
            done = self.releases.release(views, forget=gone, recount=True)
        except Exception:  # the next sweep looks again
            log.exception("feed sweep: the release window could not be swept")
            result.errors += 1
            return result
        result.batches = len(state.entries)
        result.rollouts = done.rollouts
        result.recovered = done.recovered
        return result

    def retry(self, group: QueuedGroup, index: int, attempt: int) -> None:
        """Send rollout `index` of `group` again at its next `attempt` (built from the group item)."""
        self.queue.send_all(self.queue_url, group.bodies([index], attempt=attempt))

    def resend(self, message: RolloutMessage, delay_s: int = 0) -> None:
        """Send `message` again as a fresh one (its receive count starts over), visible after `delay_s` (SQS
        DelaySeconds): it found no limit in time."""
        self.queue.send_all(self.queue_url, [message.model_dump_json(exclude_none=True)], delay_s)

    def hold(self, message: RolloutMessage, delay_s: int) -> None:
        """`resend` to come back after `delay_s`: its budget is spent for now."""
        self.resend(message, delay_s)

    # -------------------------------------------------------------------------------------------- internals

    def _release_if_room(self, batches: list[BatchView]) -> None:
        if not self.window or not batches or self.releases.no_room_known(batches):
            return
        try:
            self.releases.release(batches)
        except Exception:  # the next terminal rollout, or the sweep, releases instead
            log.exception("release after %s deferred", ", ".join(b.batch_id for b in batches))

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


def start_warnings(config: ExperimentConfig, rollouts: int) -> tuple[str, ...]:
    """Why some of a batch's `rollouts` may wait longer than `max_limit_wait_s` for a session once in the queue,
    and so fail `throttled`, if every running rollout ran to `rollout_timeout_s`: with the window, what the window
    lets wait beyond `max_sessions` (work beyond the window waits as pending, which no limit counts); without it,
    the batch's own rollouts beyond `max_sessions` (other batches' queued work comes on top)."""
    if rollouts <= 0:
        return ()
    window, slots = window_size(config), config.max_sessions
    waiting = max(0, min(window, rollouts) - slots) if window else max(0, rollouts - slots)
    waits_s = math.ceil(waiting / slots) * config.rollout_timeout_s
    if waits_s <= config.max_limit_wait_s:
        return ()
    if window:
        why = (
            f"the release window ({window}) lets {waiting} rollouts wait beyond max_sessions ({slots}): with "
            f"rollouts running up to rollout_timeout_s ({config.rollout_timeout_s} s), one may wait {waits_s} s"
        )
        fix = "lower release_window (or raise max_limit_wait_s)"
    else:
        why = (
            f"without a release window all {rollouts} rollouts are queued at once for max_sessions "
            f"({slots}): with rollouts running up to rollout_timeout_s ({config.rollout_timeout_s} s), the last may "
            f"wait {waits_s} s"
        )
        fix = "turn the release window on (release_window unset) or raise max_limit_wait_s"
    return (
        f"rollouts may not start within max_limit_wait_s ({config.max_limit_wait_s} s) and then fail throttled: "
        f"{why}; {fix}",
    )
