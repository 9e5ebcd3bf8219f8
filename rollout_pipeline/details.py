"""Event details built from typed ledger items: the one module between the ledger and the stages that publish.

Ingestion publishes `Batch Accepted` (and `Batch Completed` for a batch with nothing to run); the outbox
(`lifecycle.publishing`) publishes a rollout's terminal event, its group's and its batch's; the SDK rebuilds the same
details (`sdk.replay`) for a trainer that resumes or a stream from the start. Each detail carries a stable `event_id`,
so a re-publication is a duplicate.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from rollout_pipeline import ids
from rollout_pipeline.contracts import (
    SIGNAL_EPS,
    BatchAccepted,
    BatchCompleted,
    DetailType,
    FailureReason,
    GroupCompleted,
    GroupMember,
    RolloutCompleted,
    RolloutFailed,
    Timings,
    batch_duration_s,
    reward_stats,
    stats_from_sums,
    utcnow,
)
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.ledger.items import BatchView, GroupItem, RolloutRecord, RolloutState


def batch_accepted_detail(batch: BatchView, warnings: Sequence[str] = ()) -> BatchAccepted:
    """`Batch Accepted` of a batch whose ingestion has ended (stable `event_id`); `warnings`: why its rollouts may
    wait too long for a session (`feed.feed.start_warnings`)."""
    options = batch.options
    return BatchAccepted(
        event_id=ids.event_id(DetailType.BATCH_ACCEPTED, batch.exp_id, batch.batch_id),
        exp_id=batch.exp_id,
        batch_id=batch.batch_id,
        source=batch.source,
        rows_accepted=batch.rows_accepted,
        rows_rejected=batch.rows_rejected,
        rollouts_enqueued=batch.rollouts_total or 0,
        group_size=options.group_size if options else batch.group_size or 0,
        errors_uri=batch.errors_uri,
        error=batch.error,
        policy_version=options.policy_version if options else None,
        warnings=list(warnings),
    )


def batch_completion_detail(batch: BatchView, now: datetime | None = None) -> BatchCompleted | None:
    """`Batch Completed` when every rollout of the batch is terminal, else None.

    Complete = ingestion has ended (`rollouts_total` set, status not `ingesting`) and `terminal` >=
    `rollouts_total`. Counts and reward statistics come from the batch counters. `completed_at` is the item's
    (see `BatchLedger.mark_completed`) or `now`.
    """
    if not batch.complete or batch.rollouts_total is None:
        return None
    mean, std = stats_from_sums(batch.reward_count, batch.reward_sum, batch.reward_sumsq)
    started = batch.created_at
    completed = batch.completed_at or now or utcnow()
    return BatchCompleted(
        event_id=ids.event_id(DetailType.BATCH_COMPLETED, batch.exp_id, batch.batch_id),
        exp_id=batch.exp_id,
        batch_id=batch.batch_id,
        rollouts_total=batch.rollouts_total,
        succeeded=batch.succeeded,
        failed=batch.failed,
        failed_by_reason=dict(batch.failed_by_reason),
        reward_mean=mean,
        reward_std=std,
        reward_count=batch.reward_count,
        started_at=started,
        completed_at=completed,
        duration_s=batch_duration_s(started, completed),
        cost=batch.cost,
    )


def group_completion_detail(group: GroupItem, policy_version: str | None = None) -> GroupCompleted | None:
    """`Group Completed` when all `group_size` rollouts of the group are terminal, else None.

    The group the trainer gets: each rollout's reward (by index) or failure reason (an excluded member), but no
    surplus rollout of an oversampled group (`surplus`: cancelled once the group was full, or a success it did not
    let in). The mean and population std are over the valid rewards; `zero_variance` when they are all equal.
    """
    if not group.complete:
        return None
    surplus = sorted(
        {i for i, reason in group.failures.items() if reason is FailureReason.SURPLUS}
        | {i for i in group.rewards if group.surplus_success(i)}
    )
    valid = {i: r for i, r in group.rewards.items() if i not in surplus}
    failures = {i: reason for i, reason in group.failures.items() if i not in surplus}
    rewards: list[float | None] = [valid.get(index) for index in range(group.group_size)]
    mean, std = reward_stats(list(valid.values()))
    return GroupCompleted(
        event_id=ids.event_id(DetailType.GROUP_COMPLETED, group.exp_id, group.batch_id, group.input_id),
        exp_id=group.exp_id,
        batch_id=group.batch_id,
        input_id=group.input_id,
        group_size=group.group_size,
        rewards=rewards,
        failures={str(index): reason for index, reason in sorted(failures.items())},
        succeeded=len(valid),
        failed=len(failures),
        reward_mean=mean,
        reward_std=std,
        policy_version=policy_version,
        cost=group.cost,
        valid_size=len(valid),
        target_size=group.target,
        surplus=surplus,
        zero_variance=std is None or std <= SIGNAL_EPS,
    )


def rollout_event(
    rec: RolloutRecord,
    *,
    notified_at: datetime | None,
    result: dict[str, Any] | None = None,
    prices: PriceBook | None = None,
    group: GroupItem | None = None,
) -> RolloutCompleted | RolloutFailed:
    """The terminal event of a rollout, from its (terminal) ledger item; its `cost` as the item stores it, labelled
    with `prices` (`RolloutRecord.stored_cost`; none without `prices`);
    `notified_at` None: not known (an event rebuilt from the ledger, which does not keep when the event left).
    `group`: its group as read after the rollout's claim (`GroupLedger.claim_kept`), which says whether a success
    of an oversampled group is surplus."""
    timings = Timings(
        submitted_at=rec.submitted_at,
        dispatched_at=rec.dispatched_at,
        finished_at=rec.finished_at,
        notified_at=notified_at,
        session_warmed_at=None if rec.session_warmed_at is None else datetime.fromtimestamp(rec.session_warmed_at, UTC),
    )
    common: dict[str, Any] = {
        "exp_id": rec.exp_id,
        "batch_id": rec.batch_id,
        "input_id": rec.input_id,
        "index": rec.index,
        "rollout_id": ids.rollout_id(rec.input_id, rec.index),
        "policy_version": rec.policy_version,
        "batch_policy_version": rec.batch_policy_version,
        "timings": timings,
        "cost": None if prices is None else rec.stored_cost(prices.label, local=prices.local),
        "warning": rec.warning,
    }
    if rec.state is RolloutState.SUCCEEDED:
        rewards = rec.rewards if rec.rewards is not None else (rec.reward or 0.0)
        return RolloutCompleted(
            event_id=ids.event_id(DetailType.ROLLOUT_COMPLETED, rec.exp_id, rec.batch_id, rec.input_id, rec.index),
            session_id=rec.session_id or "",
            attempt=rec.attempt,
            rewards=rewards,
            reward=float(rec.reward if rec.reward is not None else 0.0),
            result_uri=rec.result_uri or "",
            result=result,
            surplus=group is not None and group.surplus_success(rec.index),
            **common,
        )
    reason = FailureReason(rec.reason or FailureReason.AGENT_ERROR)
    return RolloutFailed(
        event_id=ids.event_id(DetailType.ROLLOUT_FAILED, rec.exp_id, rec.batch_id, rec.input_id, rec.index),
        session_id=rec.session_id,
        reason=reason,
        error=rec.error or reason.value,
        attempts_used=rec.attempt,
        result_uri=rec.result_uri,
        surplus=reason is FailureReason.SURPLUS,
        **common,
    )


def group_member(rec: RolloutRecord) -> GroupMember:
    """A terminal rollout as a member of its `Group Completed`; a failure is `excluded` (the trainer masks it)."""
    succeeded = rec.state is RolloutState.SUCCEEDED
    return GroupMember(
        index=rec.index,
        status="succeeded" if succeeded else "failed",
        reward=rec.reward if succeeded else None,
        reason=None if succeeded else FailureReason(rec.reason or FailureReason.AGENT_ERROR),
        error=None if succeeded else (rec.error or rec.reason or FailureReason.AGENT_ERROR.value),
        warning=rec.warning,
        attempt=rec.attempt,
        session_id=rec.session_id,
        policy_version=rec.policy_version,
        excluded=not succeeded,
    )


def with_members(detail: GroupCompleted, records: list[RolloutRecord]) -> GroupCompleted:
    """`detail` with each terminal member's status, failure reason, exclusion and dispatched policy version; its
    surplus rollouts are not members."""
    cut = set(detail.surplus)
    members = sorted((group_member(r) for r in records if r.terminal and r.index not in cut), key=lambda m: m.index)
    return detail.model_copy(update={"members": members})
