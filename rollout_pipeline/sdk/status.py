"""Batch status from the ledger: counts by state, failures by reason, reward statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_pipeline.contracts import iso, stats_from_sums
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.batches import as_batch
from rollout_pipeline.ledger.items import BatchItem, RolloutState, RolloutSummary
from rollout_pipeline.ledger.table import query_items

#: Upper bound on ledger query pages read for one status (1 MB each): bounded work whatever the batch size.
MAX_QUERY_PAGES: Final = 2_000


@dataclass(frozen=True)
class BatchStatus:
    """Where a batch stands. `queued` = accepted rollouts not yet running (including retries waiting)."""

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


def iter_rollout_items(ddb: Any, table_name: str, batch_id: str, projection: str | None = None) -> Iterator[Any]:
    """Every rollout item of a batch (typed), by a Query on the batch partition (never a scan); bounded pages."""
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :r)",
        "ExpressionAttributeValues": {":pk": {"S": keys.batch_pk(batch_id)}, ":r": {"S": keys.ROLLOUT_PREFIX}},
    }
    if projection:
        kwargs["ProjectionExpression"] = projection
        kwargs["ExpressionAttributeNames"] = {"#state": "state"} if "#state" in projection else {}
        if not kwargs["ExpressionAttributeNames"]:
            del kwargs["ExpressionAttributeNames"]
    yield from query_items(ddb, kwargs, max_pages=MAX_QUERY_PAGES)


def batch_status(batch_item: BatchItem | Mapping[str, Any], rollout_states: Counter[str]) -> BatchStatus:
    """Combine the batch counters with the rollout items' states (running = dispatched, not yet terminal)."""
    batch = as_batch(batch_item)
    total = batch.rollouts_total
    succeeded, failed = batch.succeeded, batch.failed
    running = rollout_states.get(RolloutState.DISPATCHED, 0)
    if total is not None:
        queued: int | None = max(0, total - succeeded - failed - running)
    else:  # still ingesting: count what has been enqueued so far
        enqueued = batch.rollouts_enqueued
        queued = max(0, enqueued - succeeded - failed - running) if enqueued else None
    mean, std = stats_from_sums(batch.reward_count, batch.reward_sum, batch.reward_sumsq)
    return BatchStatus(
        batch_id=batch.batch_id,
        status=batch.status.value,
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


@dataclass(frozen=True)
class RolloutStatus:
    """One dispatched rollout as the ledger holds it (ids, reward and reason are None when only states were read)."""

    state: str
    input_id: str | None = None
    index: int | None = None
    reward: float | None = None
    reason: str | None = None


def rollout_states(ddb: Any, table_name: str, batch_id: str, *, states_only: bool = False) -> Iterator[RolloutStatus]:
    """The rollout items of a batch (never-dispatched rollouts have none), read as `RolloutStatus`es."""
    for item in iter_rollout_items(ddb, table_name, batch_id, "#state" if states_only else None):
        rollout = RolloutSummary.of(item)
        yield RolloutStatus(
            state=rollout.state.value if rollout.state else "",
            input_id=rollout.input_id,
            index=rollout.index,
            reward=rollout.reward,
            reason=rollout.reason,
        )
