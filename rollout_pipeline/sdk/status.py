"""Batch status from the ledger: counts by state, failures by reason, reward statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout_pipeline.contracts import iso, stats_from_sums
from rollout_pipeline.ledger.items import BatchState, BatchView, RolloutState

#: `BatchStatus.status` of a batch whose every rollout is terminal (the ledger keeps `accepted` on the batch item).
COMPLETED = "completed"


@dataclass(frozen=True)
class BatchStatus:
    """Where a batch stands. `status`: `ingesting` (rows still being read), `accepted` (rollouts to run),
    `completed` (every rollout terminal), `cancelled`, or `rejected` (the whole file). `queued` = accepted rollouts
    not yet running (including retries waiting)."""

    batch_id: str
    status: str
    source: str | None
    rollouts_total: int | None
    succeeded: int
    failed: int
    running: int
    queued: int | None
    failed_by_reason: dict[str, int] = field(default_factory=dict)
    reward_mean: float | None = None
    reward_std: float | None = None
    reward_count: int = 0
    rows_accepted: int = 0
    rows_rejected: int = 0
    created_at: str | None = None
    completed_at: str | None = None
    error: str | None = None
    errors_uri: str | None = None

    @property
    def terminal(self) -> int:
        return self.succeeded + self.failed

    @property
    def done(self) -> bool:
        """Every rollout is terminal (ingestion finished and the counts add up)."""
        return self.rollouts_total is not None and self.status != "ingesting" and self.terminal >= self.rollouts_total

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "status": self.status,
            "done": self.done,
            "source": self.source,
            "rollouts_total": self.rollouts_total,
            "queued": self.queued,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "failed_by_reason": self.failed_by_reason,
            "reward_mean": self.reward_mean,
            "reward_std": self.reward_std,
            "reward_count": self.reward_count,
            "rows_accepted": self.rows_accepted,
            "rows_rejected": self.rows_rejected,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "errors_uri": self.errors_uri,
        }


def batch_status(batch: BatchView, rollout_states: Mapping[Any, int]) -> BatchStatus:
    """Combine the batch counters with the rollout items' states (running = dispatched, not yet terminal)."""
    total = batch.rollouts_total
    succeeded, failed = batch.succeeded, batch.failed
    running = rollout_states.get(RolloutState.DISPATCHED, 0)
    if total is not None:
        queued: int | None = max(0, total - succeeded - failed - running)
    else:  # still ingesting: count what has been enqueued so far
        enqueued = batch.rollouts_enqueued
        queued = max(0, enqueued - succeeded - failed - running) if enqueued else None
    mean, std = stats_from_sums(batch.reward_count, batch.reward_sum, batch.reward_sumsq)
    phase = batch.status.value
    if batch.status is BatchState.ACCEPTED and total is not None and succeeded + failed >= total:
        phase = COMPLETED
    return BatchStatus(
        batch_id=batch.batch_id,
        status=phase,
        source=batch.source,
        rollouts_total=total,
        succeeded=succeeded,
        failed=failed,
        running=running,
        queued=queued,
        failed_by_reason=dict(batch.failed_by_reason),
        reward_mean=mean,
        reward_std=std,
        reward_count=batch.reward_count,
        rows_accepted=batch.rows_accepted,
        rows_rejected=batch.rows_rejected,
        created_at=iso(batch.created_at) if batch.created_at else None,
        completed_at=iso(batch.completed_at) if batch.completed_at else None,
        error=batch.error,
        errors_uri=batch.errors_uri,
    )
