"""Where the release window advances in the lifecycle (`ledger.window`): after a terminal rollout, after a
dispatcher's SQS batch (the queue drained), and in the sweep as a backstop (a crashed or failed releaser never stalls
a batch). Each is best effort: a failure is logged and the next terminal rollout, dispatch or sweep releases
instead."""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass

from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.ledger.release import ReleaseLedger
from rollout_pipeline.ledger.window import Releaser, max_release
from rollout_pipeline.lifecycle.deps import LifecycleDeps

log = logging.getLogger(__name__)

#: The sweeper releases for batches whose cursor was last written longer ago than this (others are moving).
SWEEP_AGE_S = 30


_releasers: weakref.WeakKeyDictionary[ReleaseLedger, Releaser] = weakref.WeakKeyDictionary()
_releasers_lock = threading.Lock()


def releaser(deps: LifecycleDeps) -> Releaser:
    """The releaser of the lifecycle's ledger (one per ledger object, so it remembers the cursors it saw)."""
    with _releasers_lock:
        found = _releasers.get(deps.ledger.release)
        if found is None:
            found = _releasers[deps.ledger.release] = _new_releaser(deps)
        return found


def _new_releaser(deps: LifecycleDeps) -> Releaser:
    return Releaser(deps.ledger.release, deps.queue, deps.settings.rollout_queue_url, most=max_release(deps.config))


def release_if_room(deps: LifecycleDeps, batch: BatchView | None) -> None:
    """Release rollouts of `batch` if the window has room: after one of them ended (its view read after), and after
    a dispatcher's SQS batch (a view read before its dispatches: its `terminal` can only be behind, which only hides
    room; one release sends at most what the dispatchers hold, so rollouts longer than it takes to start that many
    would otherwise wait for the first terminal rollout or the sweep). No read at all when this process's last view
    of the cursor already shows there is none."""
    if batch is None:
        return
    rel = releaser(deps)
    if rel.no_room_known(batch):
        return
    try:
        rel.release(batch)
    except Exception:  # the next terminal rollout, or the sweeper, releases instead
        log.exception("release of batch %s deferred", batch.batch_id)


@dataclass
class SweptReleases:
    """What one sweep of the release cursors did."""

    batches: int = 0
    rollouts: int = 0
    recovered: int = 0
    errors: int = 0


def sweep_releases(deps: LifecycleDeps, *, age_s: int = SWEEP_AGE_S) -> SweptReleases:
    """Release for every batch whose cursor is still open and was last written more than `age_s` ago."""
    report = SweptReleases()
    rel = releaser(deps)
    try:
        due = rel.ledger.due(int(deps.now().timestamp()) - age_s)
    except Exception:  # the next sweep looks again
        log.exception("sweeper: the release cursors could not be read")
        report.errors += 1
        return report
    for batch_id in due:
        report.batches += 1
        try:
            batch = deps.ledger.batches.read_batch(batch_id)
            if batch is None:
                continue
            done = rel.release(batch)
        except Exception:
            log.exception("sweeper: release of batch %s failed", batch_id)
            report.errors += 1
            continue
        report.rollouts += done.rollouts
        report.recovered += done.recovered
    return report
