"""Ending a rollout as failed: the one conditional transition every failure path shares (invoke rejected,
timeout, cancelled), with its metrics; and the one rule for an attempt that will bring no result (retry while
attempts remain, else fail)."""

from __future__ import annotations

from rollout_pipeline import ids
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger.items import RolloutRecord, Terminal
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH
from rollout_pipeline.ledger.rollouts import DISPATCHED, FAILED
from rollout_pipeline.lifecycle import costing, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.metric_names import ESTIMATED_COST, RETRIED, failed_metric
from rollout_pipeline.metric_names import FAILED as FAILED_METRIC

MAX_ERROR_CHARS = 2000


def fail_rollout(
    deps: LifecycleDeps,
    ref: AttemptRef,
    *,
    exp_id: str,
    from_state: str | None,
    reason: FailureReason,
    error: str,
    outbox: frozenset[str],
    session_id: str | None = None,
    policy_version: str | None = None,
    hold_slot_until: int | None = None,
    rec: RolloutRecord | None = None,
    session_started: bool = True,
) -> RolloutRecord | None:
    """Move the rollout from `from_state` (at `ref`'s attempt) to failed(`reason`) with `outbox` side effects
    pending, its cost recorded (`costing.terminal_cost`: every session it started; `rec`, the item as read, or read
    here when the rollout has one; `session_started=False`: the ended attempt's invoke was refused, no session ran).

    Returns the rollout as it is now, for the caller to drain its outbox, or None when the condition failed
    (another delivery or worker already moved it: nothing changed)."""
    if rec is None and from_state is not None:
        rec = deps.ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)
    now = deps.now()
    cost = costing.terminal_cost(deps, rec, at=now, session_started=session_started)
    outcome = Terminal(
        state=FAILED,
        finished_at=now,
        reason=reason.value,
        error=error[:MAX_ERROR_CHARS],
        cost=cost,
        session_started=session_started,
    )
    done = deps.ledger.rollouts.finish(
        ref,
        exp_id=exp_id,
        from_state=from_state,
        outcome=outcome,
        outbox=outbox,
        session_id=session_id,
        policy_version=policy_version,
        hold_slot_until=hold_slot_until,
    )
    if not done:
        return None
    deps.metrics.add(ESTIMATED_COST, cost.usd)
    deps.metrics.count(FAILED_METRIC)
    deps.metrics.count(failed_metric(reason.value))
    return deps.ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)


def end_attempt(
    deps: LifecycleDeps, rec: RolloutRecord, max_attempts: int, *, reason: FailureReason, error: str
) -> tuple[bool, RolloutRecord | None]:
    """End dispatched attempt `rec`, which will bring no result (its deadline passed, its session never started):
    a new attempt while attempts remain, else `Rollout Failed` with `reason`. Either way the attempt's session keeps
    its slot until its stop is confirmed (`stops.hold_until`). Returns (retried, the rollout after the transition),
    the rollout None when another caller moved it first."""
    hold = stops.hold_until(deps, rec)
    if rec.attempt < max_attempts:
        next_sid = ids.session_id(rec.exp_id, rec.batch_id, rec.input_id, rec.index, rec.attempt + 1)
        if not deps.ledger.rollouts.requeue_for_retry(
            rec, next_session_id=next_sid, stop_pending=True, hold_slot_until=hold
        ):
            return True, None
        deps.metrics.count(RETRIED)
        return True, deps.ledger.rollouts.get_rollout(rec.batch_id, rec.input_id, rec.index)
    after = fail_rollout(
        deps,
        rec.ref,
        exp_id=rec.exp_id,
        from_state=DISPATCHED,
        reason=reason,
        error=error,
        outbox=frozenset({OUTBOX_PUBLISH}),
        session_id=rec.session_id,
        hold_slot_until=hold,
        rec=rec,
    )
    return False, after
