"""Cancel: a cancelled batch dispatches nothing more, stops what runs, and ends every rollout once as `cancelled`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rollout_pipeline import ids
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.ledger.items import RolloutRecord
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.rollouts import DISPATCHED
from rollout_pipeline.lifecycle import publishing, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.failures import fail_rollout
from rollout_pipeline.lifecycle.warm_pool import halt_if_nothing_runs
from rollout_pipeline.metric_names import CANCELLED

log = logging.getLogger(__name__)

_MAX_ROUNDS = 6


@dataclass
class CancelResult:
    """What `cancel_batch` did (counts by what it found). `found` is False for an unknown or rejected batch.

    `cancelled`: rollouts this call ended as cancelled; `already_terminal`: rollouts it found ended (before, or by
    a dispatcher that saw the cancel flag first); `sessions_stopped`: running sessions whose stop was confirmed;
    `stops_pending`: running sessions whose stop failed or was refused, left in the outbox for the sweeper (which
    retries them; AgentCore's idle timeout ends them at the latest)."""

    batch_id: str
    found: bool = True
    cancelled: int = 0
    already_terminal: int = 0
    sessions_stopped: int = 0
    stops_pending: int = 0
    #: Warm sessions of the pool stopped because nothing else is left to run (`warm_pool.halt_if_nothing_runs`).
    warm_sessions_stopped: int = 0
    drain_errors: list[str] = field(default_factory=list)


def cancel_rollout(
    *,
    exp_id: str,
    batch_id: str,
    input_id: str,
    index: int,
    deps: LifecycleDeps,
    rec: RolloutRecord | None = None,
    known: bool = False,
    policy_version: str | None = None,
    reason: FailureReason = FailureReason.CANCELLED,
    error: str = "the batch was cancelled",
) -> str:
    """End one rollout as `Rollout Failed` (`reason`: cancelled, or surplus for an oversampled group that is full)
    whatever state it is in; idempotent.

    Returns "cancelled" (this call ended it), "already_terminal", with side effects drained.
    `known=True` means `rec` was just read (None = no item), saving a read.
    """
    for _ in range(_MAX_ROUNDS):
        if not known:
            rec = deps.ledger.rollouts.get_rollout(batch_id, input_id, index)
        known = False
        if rec is not None and rec.terminal:
            if rec.outbox:
                publishing.drain(rec, deps)
            return "already_terminal"
        outbox = frozenset({OUTBOX_PUBLISH})
        from_state: str | None = None
        attempt = 0
        session_id: str | None = None
        if rec is not None:
            # dispatched: the slot stays held until the session's stop (after the event) is confirmed; queued
            # with the previous attempt's stop still pending: the outbox keeps it (finish ADDs to it)
            from_state, attempt, session_id = rec.state, rec.attempt, rec.session_id
        after = fail_rollout(
            deps,
            ids.AttemptRef(batch_id, input_id, index, attempt),
            exp_id=exp_id,
            from_state=from_state,
            reason=reason,
            error=error,
            outbox=outbox,
            session_id=session_id,
            policy_version=policy_version,
            hold_slot_until=stops.hold_until(deps, rec),
            rec=rec,
        )
        if after is None:
            continue
        deps.metrics.count(CANCELLED)
        publishing.drain(after, deps, owner=True)
        return "cancelled"
    raise LedgerError(f"could not cancel {ids.rollout_id(input_id, index)} of {batch_id}: it kept changing")


def cancel_batch(batch_id: str, deps: LifecycleDeps) -> CancelResult:
    """Cancel a batch: status `cancelled`, queued rollouts never dispatched, running sessions stopped, every
    rollout (also those never dispatched: indices 0..group_size-1 of every group item) ended exactly once as
    `Rollout Failed` reason `cancelled`, slots freed, events published. Idempotent: call it again after a
    crash or a side-effect error to finish the job."""
    report = CancelResult(batch_id=batch_id)
    if not deps.ledger.batches.cancel(batch_id):
        report.found = False
        return report
    batch = deps.ledger.batches.read_batch(batch_id)
    options = batch.options if batch is not None else None
    exp_id = batch.exp_id if batch is not None and batch.exp_id else deps.config.name
    for group in deps.ledger.groups.batch_groups(batch_id):
        input_id = group.input_id
        existing = {rec.index: rec for rec in deps.ledger.rollouts.iter_rollouts(batch_id, input_id)}
        for index in range(group.group_size):
            rec = existing.get(index)
            if rec is not None and rec.terminal and not rec.outbox:
                report.already_terminal += 1
                continue
            try:
                outcome = cancel_rollout(
                    exp_id=exp_id,
                    batch_id=batch_id,
                    input_id=input_id,
                    index=index,
                    deps=deps,
                    rec=rec,
                    known=True,
                    policy_version=options.policy_version if options else None,
                )
            except Exception as exc:  # keep going: the sweeper drains outboxes, a second call finishes the rest
                log.warning("cancel of %s/%s#%s incomplete: %s", batch_id, input_id, index, exc)
                report.drain_errors.append(f"{input_id}#{index}: {exc}")
                after = deps.ledger.rollouts.get_rollout(batch_id, input_id, index)
                if after is not None and after.terminal and after.reason == FailureReason.CANCELLED.value:
                    report.cancelled += 1  # ended in the ledger; only its side effects (stop, events) are pending
                    report.stops_pending += bool(after.stop_sessions)
                continue
            if outcome == "cancelled":
                report.cancelled += 1
                if rec is not None and rec.state == DISPATCHED:
                    after = deps.ledger.rollouts.get_rollout(batch_id, input_id, index)
                    if after is not None and after.stop_sessions:
                        report.stops_pending += 1  # re-filed for the sweeper: not stopped (yet)
                    else:
                        report.sessions_stopped += 1
            else:
                report.already_terminal += 1
    try:
        report.warm_sessions_stopped = halt_if_nothing_runs(deps, batch_id)
    except Exception as exc:  # the pool's idle stop (warm_idle_stop_s) still ends them
        log.warning("warm pool not stopped after the cancel of %s: %s", batch_id, exc)
        report.drain_errors.append(f"warm pool: {exc}")
    return report
