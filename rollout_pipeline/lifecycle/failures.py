"""Ending a rollout as failed: the one conditional transition every failure path shares (invoke rejected,
timeout, cancelled), with its metrics."""

from __future__ import annotations

from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger.items import RolloutRecord, Terminal
from rollout_pipeline.ledger.rollouts import FAILED
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.metrics import FAILED as FAILED_METRIC
from rollout_pipeline.lifecycle.metrics import failed_metric

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
) -> RolloutRecord | None:
    """Move the rollout from `from_state` (at `ref`'s attempt) to failed(`reason`) with `outbox` side effects
    pending.

    Returns the rollout as it is now, for the caller to drain its outbox, or None when the condition failed
    (another delivery or worker already moved it: nothing changed)."""
    done = deps.ledger.rollouts.finish(
        ref,
        exp_id=exp_id,
        from_state=from_state,
        outcome=Terminal(state=FAILED, finished_at=deps.now(), reason=reason.value, error=error[:MAX_ERROR_CHARS]),
        outbox=outbox,
        session_id=session_id,
        policy_version=policy_version,
        hold_slot_until=hold_slot_until,
    )
    if not done:
        return None
    deps.metrics.count(FAILED_METRIC)
    deps.metrics.count(failed_metric(reason.value))
    return deps.ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)
