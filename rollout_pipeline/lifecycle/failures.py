"""Ending a rollout as failed: the one conditional transition every failure path shares (invoke rejected,
timeout, cancelled), with its metrics."""

from __future__ import annotations

from rollout_pipeline.contracts import FailureReason, iso
from rollout_pipeline.ledger.items import RolloutRecord, Terminal
from rollout_pipeline.ledger.rollouts import FAILED
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.metrics import FAILED as FAILED_METRIC
from rollout_pipeline.lifecycle.metrics import failed_metric

MAX_ERROR_CHARS = 2000


def fail_rollout(
    deps: LifecycleDeps,
    *,
    exp_id: str,
    batch_id: str,
    input_id: str,
    index: int,
    attempt: int,
    from_state: str | None,
    reason: FailureReason,
    error: str,
    outbox: frozenset[str],
    session_id: str | None = None,
    policy_version: str | None = None,
    hold_slot_until: int | None = None,
) -> RolloutRecord | None:
    """Move the rollout from `from_state` (at `attempt`) to failed(`reason`) with `outbox` side effects pending.

    Returns the rollout as it is now, for the caller to drain its outbox, or None when the condition failed
    (another delivery or worker already moved it: nothing changed)."""
    now = deps.now()
    done = deps.ledger.finish(
        exp_id=exp_id,
        batch_id=batch_id,
        input_id=input_id,
        index=index,
        attempt=attempt,
        from_state=from_state,
        outcome=Terminal(
            state=FAILED,
            finished_at=iso(now),
            reason=reason.value,
            error=error[:MAX_ERROR_CHARS],
        ),
        outbox=outbox,
        now_epoch=int(now.timestamp()),
        session_id=session_id,
        policy_version=policy_version,
        hold_slot_until=hold_slot_until,
    )
    if not done:
        return None
    deps.metrics.count(FAILED_METRIC)
    deps.metrics.count(failed_metric(reason.value))
    return deps.ledger.get_rollout(batch_id, input_id, index)
