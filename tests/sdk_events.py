"""Event details as the pipeline publishes them, for the SDK's tests (unit and integration): one experiment
(`EXP`), two batches (`B1`, `B2`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rollout_pipeline import ids
from rollout_pipeline.contracts import (
    BatchAccepted,
    BatchCompleted,
    DetailType,
    FailureReason,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    Timings,
    reward_stats,
)

EXP = "test-exp"
B1 = "test-aaaaaaaaaaaa"
B2 = "test-bbbbbbbbbbbb"


def completed(
    batch_id: str, input_id: str, index: int, reward: float, *, result: dict[str, Any] | None = None, uri: str = ""
) -> RolloutCompleted:
    sid = ids.session_id(EXP, batch_id, input_id, index, 1)
    return RolloutCompleted(
        event_id=ids.event_id(DetailType.ROLLOUT_COMPLETED, EXP, batch_id, input_id, index),
        exp_id=EXP,
        batch_id=batch_id,
        input_id=input_id,
        index=index,
        rollout_id=ids.rollout_id(input_id, index),
        session_id=sid,
        attempt=1,
        rewards=reward,
        reward=reward,
        result_uri=uri or f"s3://rollouts-test-exp-results/{ids.result_key(EXP, input_id, sid)}",
        result={"rewards": reward, "status_code": 200} if result is None and not uri else result,
        timings=Timings(submitted_at=datetime.now(UTC)),
    )


def failed(
    batch_id: str, input_id: str, index: int, reason: FailureReason = FailureReason.AGENT_ERROR
) -> RolloutFailed:
    return RolloutFailed(
        event_id=ids.event_id(DetailType.ROLLOUT_FAILED, EXP, batch_id, input_id, index),
        exp_id=EXP,
        batch_id=batch_id,
        input_id=input_id,
        index=index,
        rollout_id=ids.rollout_id(input_id, index),
        reason=reason,
        error="boom",
        attempts_used=1,
        timings=Timings(),
    )


def group_done(batch_id: str, input_id: str, rewards: list[float | None]) -> GroupCompleted:
    values = [r for r in rewards if r is not None]
    mean, std = reward_stats(values)
    return GroupCompleted(
        event_id=ids.event_id(DetailType.GROUP_COMPLETED, EXP, batch_id, input_id),
        exp_id=EXP,
        batch_id=batch_id,
        input_id=input_id,
        group_size=len(rewards),
        rewards=rewards,
        failures={str(i): FailureReason.AGENT_ERROR for i, r in enumerate(rewards) if r is None},
        succeeded=len(values),
        failed=len(rewards) - len(values),
        reward_mean=mean,
        reward_std=std,
    )


def batch_done(batch_id: str, total: int) -> BatchCompleted:
    return BatchCompleted(
        event_id=ids.event_id(DetailType.BATCH_COMPLETED, EXP, batch_id),
        exp_id=EXP,
        batch_id=batch_id,
        rollouts_total=total,
        succeeded=total,
        failed=0,
        failed_by_reason={},
        reward_mean=None,
        reward_std=None,
        reward_count=0,
        started_at=None,
        completed_at=datetime.now(UTC),
        duration_s=None,
    )


def accepted(batch_id: str) -> BatchAccepted:
    return BatchAccepted(
        event_id=ids.event_id(DetailType.BATCH_ACCEPTED, EXP, batch_id),
        exp_id=EXP,
        batch_id=batch_id,
        rows_accepted=1,
        rows_rejected=0,
        rollouts_enqueued=2,
        group_size=2,
    )
