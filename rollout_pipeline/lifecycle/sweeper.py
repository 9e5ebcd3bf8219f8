"""The sweeper (scheduled): rollouts past their deadline, and outbox entries nobody finished.

Deadlines: query each `deadline` GSI shard for `sk < now` (bounded pages, never a scan). For each dispatched
attempt: first look for its result object (a late or lost event): if it is there, complete the attempt from it.
Else one transaction: a new attempt (queued n+1, outbox `enqueue`) while attempts remain, else the terminal
`Rollout Failed` (timeout); either way the old session's slot is held and its stop is in the outbox. Then the
outbox is drained (retry message sent, event published, session stopped: `lifecycle.stops`). Outbox: entries
older than `deps.outbox_age_s` are drained. Every step is conditional on `(state, attempt)`, so repeated or
concurrent sweeps change nothing twice. Last, the release window's backstop (`feed.feed.Feed.sweep`), the
budget's check (`lifecycle.budget.check`: its warning and exhaustion are announced even when nothing dispatches),
the private subscriptions whose owner is gone (`lifecycle.subscriptions`) and a heartbeat to the account pool with
the sessions in flight (`limits.Limits.heartbeat`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rollout_pipeline import ids
from rollout_pipeline.contracts import FailureReason, FileOptions
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import RolloutRecord
from rollout_pipeline.ledger.rollouts import (
    DISPATCHED,
)
from rollout_pipeline.lifecycle import budget, outbox
from rollout_pipeline.lifecycle.cancel import cancel_rollout
from rollout_pipeline.lifecycle.completion import complete_if_written
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.failures import end_attempt
from rollout_pipeline.lifecycle.subscriptions import prune_gone
from rollout_pipeline.metric_names import (
    ACCOUNT_SESSIONS_PERCENT,
    IN_FLIGHT,
    SWEEP_ERRORS,
    TIMED_OUT,
)
from rollout_pipeline.observability import bind_log_ids, clear_log_ids

log = logging.getLogger(__name__)


@dataclass
class SweepResult:
    """What one sweep did."""

    expired_seen: int = 0
    completed_late: int = 0  # past the deadline, but the result object was there: completed, not expired
    retried: int = 0
    timed_out: int = 0
    cancelled: int = 0
    outbox_drained: int = 0
    #: Rollouts released to the queue by the backstop of the release window (`Feed.sweep`).
    released: int = 0
    #: Private subscriptions removed: their owner is gone (`lifecycle.subscriptions`).
    subscriptions_removed: list[str] = field(default_factory=list)
    #: The sweep reached its deadline (`wait_until`) and left the rest to the next run.
    out_of_time: bool = False
    errors: list[str] = field(default_factory=list)


def sweep(
    deps: LifecycleDeps, *, page_size: int = 50, max_pages: int = 4, wait_until: float | None = None
) -> SweepResult:
    """One sweep over every shard of both sparse indexes (bounded: `page_size` x `max_pages` per shard).
    `wait_until` (`deps.clock.monotonic()`: the Lambda's remaining time) bounds every wait for call budget, and the
    sweep itself: past it, no new rollout, outbox or shard is started, and the next run picks up the rest (every
    step is conditional, so nothing is done twice). After a mass expiry one run would otherwise outlast its timeout
    every minute, finishing nothing."""
    report = SweepResult()
    now = deps.now()
    now_epoch = int(now.timestamp())
    options_cache: dict[str, tuple[FileOptions, bool]] = {}

    def out_of_time() -> bool:
        if wait_until is not None and deps.clock.monotonic() >= wait_until:
            report.out_of_time = True
        return report.out_of_time

    pages = {"limit": page_size, "max_pages": max_pages}
    for rec in _due(deps, keys.DEADLINE_INDEX, now_epoch, out_of_time, **pages):
        report.expired_seen += 1
        bind_log_ids(batch_id=rec.batch_id, rollout_id=ids.rollout_id(rec.input_id, rec.index))
        try:
            _expire(rec, deps, options_cache, report, wait_until)
        except Exception as exc:  # one bad item must not stop the sweep
            log.exception("sweeping %s/%s failed", rec.batch_id, ids.rollout_id(rec.input_id, rec.index))
            report.errors.append(f"{rec.batch_id}/{rec.input_id}#{rec.index}: {exc}")
            deps.metrics.count(SWEEP_ERRORS)
    cutoff = int(now.timestamp() - deps.outbox_age_s)
    for rec in _due(deps, keys.OUTBOX_INDEX, cutoff, out_of_time, **pages):
        fresh = deps.ledger.rollouts.get_rollout(rec.batch_id, rec.input_id, rec.index)
        if fresh is None or not fresh.outbox:
            continue
        bind_log_ids(batch_id=rec.batch_id, rollout_id=ids.rollout_id(rec.input_id, rec.index))
        try:
            if outbox.drain(fresh, deps, wait_until=wait_until):
                report.outbox_drained += 1
        except Exception as exc:
            log.warning("outbox of %s/%s#%s not drained: %s", rec.batch_id, rec.input_id, rec.index, exc)
            report.errors.append(f"outbox {rec.batch_id}/{rec.input_id}#{rec.index}: {exc}")
            deps.metrics.count(SWEEP_ERRORS)
    clear_log_ids()
    if not out_of_time():
        swept = deps.feed.sweep()
        report.released = swept.rollouts + swept.recovered
    if report.out_of_time:
        log.warning(
            "sweep reached its deadline: the next run continues (%d rollouts past due seen)", report.expired_seen
        )
    deps.metrics.sample(IN_FLIGHT, deps.limits.shards.in_flight())
    try:  # the last rollouts' stops may cross a budget's 80% or 100% after the last dispatch: announce it
        budget.check(deps)
    except Exception as exc:
        log.warning("budget check failed: %s", exc)
        report.errors.append(f"budget: {exc}")
        deps.metrics.count(SWEEP_ERRORS)
    if deps.subscriptions is not None and not out_of_time():
        try:
            report.subscriptions_removed = prune_gone(deps.subscriptions, now.timestamp())
        except Exception as exc:  # the bus or the queues could not be listed: the next run tries again
            log.warning("subscriptions not looked at: %s", exc)
            report.errors.append(f"subscriptions: {exc}")
            deps.metrics.count(SWEEP_ERRORS)
    _heartbeat(deps, report)
    return report


def _heartbeat(deps: LifecycleDeps, report: SweepResult) -> None:
    """Tell the account pool this experiment is alive, with its sessions in flight (just read): they keep counting
    against the account's active sessions while nothing else of the experiment runs. Then sample the account's
    sessions against its quota (`Limits.heartbeat`: what every experiment holds, as their entries say)."""
    try:
        percent = deps.limits.heartbeat()
        if percent is not None:
            deps.metrics.sample(ACCOUNT_SESSIONS_PERCENT, percent)
    except Exception as exc:  # the pool's heartbeat must not fail the sweep
        log.warning("account pool heartbeat failed: %s", exc)
        report.errors.append(f"pool heartbeat: {exc}")
        deps.metrics.count(SWEEP_ERRORS)


def _due(
    deps: LifecycleDeps, index: str, before_epoch: int, out_of_time: Callable[[], bool], *, limit: int, max_pages: int
) -> Iterator[RolloutRecord]:
    """The rollouts due in every shard of the sparse `index` (bounded pages per shard), until `out_of_time()`."""
    for shard in range(keys.INDEX_SHARDS):
        if out_of_time():
            return
        for rec in deps.ledger.rollouts.query_due(index, shard, before_epoch, limit=limit, max_pages=max_pages):
            if out_of_time():
                return
            yield rec


def _options(
    batch_id: str, deps: LifecycleDeps, cache: dict[str, tuple[FileOptions, bool]]
) -> tuple[FileOptions, bool]:
    if batch_id not in cache:
        batch = deps.ledger.batches.read_batch(batch_id)
        options = (batch.options if batch is not None else None) or FileOptions.defaults(deps.config)
        cache[batch_id] = (options, batch is not None and batch.cancelled)
    return cache[batch_id]


def _expire(
    stale: RolloutRecord,
    deps: LifecycleDeps,
    cache: dict[str, tuple[FileOptions, bool]],
    report: SweepResult,
    wait_until: float | None = None,
) -> None:
    rec = deps.ledger.rollouts.get_rollout(stale.batch_id, stale.input_id, stale.index)  # the index may lag
    now = deps.now()
    if rec is None or rec.state != DISPATCHED or rec.deadline is None or rec.deadline >= now.timestamp():
        return
    options, cancelled = _options(rec.batch_id, deps, cache)
    if cancelled:
        if (
            cancel_rollout(
                exp_id=rec.exp_id,
                batch_id=rec.batch_id,
                input_id=rec.input_id,
                index=rec.index,
                deps=deps,
                rec=rec,
                known=True,
                policy_version=options.policy_version,
            )
            == "cancelled"
        ):
            report.cancelled += 1
        return
    if complete_if_written(rec, deps) is not None:  # written in time, its event late: never thrown away
        report.completed_late += 1
        return
    retried, after = end_attempt(
        deps,
        rec,
        options.max_attempts,
        reason=FailureReason.TIMEOUT,
        error=f"no result within {options.rollout_timeout_s} s in any of {rec.attempt} attempt(s)",
    )
    if after is None:
        return
    if retried:
        report.retried += 1
    else:
        report.timed_out += 1
    deps.metrics.count(TIMED_OUT)
    if after.outbox:
        try:
            outbox.drain(after, deps, owner=True, wait_until=wait_until)
        except Exception as exc:  # the outbox keeps it; the next sweep drains it
            log.warning("side effects of %s/%s#%s pending: %s", rec.batch_id, rec.input_id, rec.index, exc)
            report.errors.append(f"drain {rec.batch_id}/{rec.input_id}#{rec.index}: {exc}")
