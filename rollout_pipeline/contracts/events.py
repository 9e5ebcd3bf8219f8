"""For subscribers (trainers, the SDK, any rule on the bus): the seven event details. JSON Schemas are generated
from these models into `rollout_pipeline/schemas/` (`python -m rollout_pipeline.schemas`); a test fails on drift."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout_pipeline.contracts.common import utcnow
from rollout_pipeline.contracts.results import FailureReason

EVENT_SOURCE: Final = "rollout.pipeline"
#: Results up to this size are inlined into `Rollout Completed` (EventBridge entries are capped at 256 KB).
INLINE_RESULT_BYTES: Final = 64 * 1024


class DetailType(StrEnum):
    ROLLOUT_COMPLETED = "Rollout Completed"
    ROLLOUT_FAILED = "Rollout Failed"
    GROUP_COMPLETED = "Group Completed"
    BATCH_ACCEPTED = "Batch Accepted"
    BATCH_COMPLETED = "Batch Completed"
    BUDGET_WARNING = "Budget Warning"
    BUDGET_EXHAUSTED = "Budget Exhausted"


class _Detail(BaseModel):
    """Fields every event detail carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str = Field(description="Stable id: the same logical event always carries the same id")
    exp_id: str
    batch_id: str
    emitted_at: datetime = Field(default_factory=utcnow)


class Timings(BaseModel):
    """When the rollout was submitted, dispatched to ACR, finished (result written) and notified (event sent); and,
    when it ran in a warm session of the warm pool, when that session was started (it idled, billed memory, from
    then to `dispatched_at`, and saved the rollout its cold start)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    submitted_at: datetime | None = None
    dispatched_at: datetime | None = None
    finished_at: datetime | None = None
    notified_at: datetime | None = None
    session_warmed_at: datetime | None = Field(
        default=None, description="The warm session's start, when the rollout ran in one (else null)"
    )


class RolloutCost(BaseModel):
    """What a rollout cost, in USD (`rollout_pipeline.costs`; docs/costs.md): its AgentCore sessions' memory and
    CPU, and the pipeline's own AWS cost per attempt. On `Rollout Completed` / `Rollout Failed` it is the estimate
    at publication: the event goes out before the session's stop, so a session whose stop is pending is priced as
    ending then (`session_end` "estimated"); `usd_max` is the figure if no pending stop is ever confirmed (each such
    session ends at AgentCore's idle timeout or maximum lifetime). `rollouts cost` prints the exact figure once the
    stops are confirmed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: float = Field(description="The total: agentcore_memory_usd + agentcore_cpu_usd + pipeline_usd")
    agentcore_memory_usd: float = Field(description="Memory while each session lived, at the session's size")
    agentcore_cpu_usd: float = Field(description="CPU: measured CPU seconds, or the busy-time bound")
    pipeline_usd: float = Field(description="The pipeline's own AWS (DynamoDB, Lambda, SQS, EventBridge, S3)")
    cpu: Literal["measured", "bounded"] = Field(
        description="measured: the agent host reported every session's CPU seconds; bounded: busy time x vCPUs"
    )
    cpu_s: float = Field(description="CPU-seconds priced")
    session_s: float = Field(description="Session-seconds priced (memory)")
    sessions: int = Field(description="AgentCore sessions of the rollout (one per attempt that started one)")
    session_end: Literal["stopped", "estimated", "bounded"] = Field(
        description="stopped: every session's stop is confirmed; estimated: some stop was pending (priced as "
        "ending at publication); bounded: some session ended at its idle timeout or maximum lifetime"
    )
    usd_max: float = Field(description="The figure if no pending stop is ever confirmed")
    priced_as: str = Field(description="Which prices and session size (and whether this is a local run)")
    local: bool = Field(default=False, description="Local mode: what the run would cost on AgentCore")


class CostSummary(BaseModel):
    """The sum of rollout costs (`RolloutCost.usd` and its parts) of a group or a batch, as published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd: float
    agentcore_memory_usd: float
    agentcore_cpu_usd: float
    pipeline_usd: float
    rollouts: int = Field(description="Rollouts priced")
    cpu_measured: int = Field(description="Of them, rollouts whose CPU was measured (the rest are bounded)")


class RolloutCompleted(_Detail):
    """A rollout attempt succeeded: its result object had status_code 200 and valid rewards."""

    input_id: str
    index: int
    rollout_id: str
    session_id: str
    attempt: int
    policy_version: str | None = Field(default=None, description="The policy version the rollout was dispatched with")
    batch_policy_version: str | None = Field(default=None, description="The batch's, when it differs")
    rewards: float | list[float]
    reward: float = Field(description="Scalar reward: the number, or the last element of a per-turn list")
    result_uri: str
    result: dict[str, Any] | None = Field(default=None, description="The result object when small enough")
    warning: str | None = Field(
        default=None,
        description="What the agent host saw go wrong in the model replies the result was computed from (cut short, "
        "empty or failed); null when nothing did",
    )
    timings: Timings
    cost: RolloutCost | None = Field(default=None, description="What the rollout cost (estimate at publication)")
    surplus: bool = Field(
        default=False,
        description="Its group had the valid rollouts it needed before this one (oversample): not part of the group",
    )


class RolloutFailed(_Detail):
    """A rollout ended without a usable reward. A failure is never reported as reward 0."""

    input_id: str
    index: int
    rollout_id: str
    session_id: str | None = None
    reason: FailureReason
    error: str
    attempts_used: int
    policy_version: str | None = Field(default=None, description="The policy version the rollout was dispatched with")
    batch_policy_version: str | None = Field(default=None, description="The batch's, when it differs")
    result_uri: str | None = None
    warning: str | None = Field(
        default=None,
        description="What the agent host saw go wrong in the model replies the result was computed from (cut short, "
        "empty or failed); null when nothing did",
    )
    timings: Timings
    cost: RolloutCost | None = Field(default=None, description="What the rollout cost (estimate at publication)")
    surplus: bool = Field(
        default=False, description="Cancelled because its group was full (reason surplus): not part of the group"
    )


class GroupMember(BaseModel):
    """One rollout of a completed group: its terminal status, and why it failed (a failure is never a reward)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    status: Literal["succeeded", "failed"]
    reward: float | None = None
    reason: FailureReason | None = None
    error: str | None = None
    warning: str | None = Field(default=None, description="The rollout's model-reply warning, when it has one")
    attempt: int | None = None
    session_id: str | None = None
    policy_version: str | None = Field(default=None, description="The policy version the rollout was dispatched with")
    excluded: bool = Field(
        default=False,
        description="No usable reward (an infrastructure or agent failure): the trainer masks it, never scores it 0",
    )


class GroupCompleted(_Detail):
    """Every rollout of one input (a GRPO group) is terminal. With `oversample`, the group is the rollouts that
    are not `surplus`: at most `target_size` with a reward, and the failures among the rest."""

    input_id: str
    group_size: int = Field(description="Rollouts the group ran (group_size + oversample)")
    rewards: list[float | None] = Field(description="Reward by rollout index; null where failed or surplus")
    failures: dict[str, FailureReason] = Field(
        default_factory=dict, description="Failure reason by index (surplus rollouts are in `surplus`, not here)"
    )
    succeeded: int = Field(description="Members with a reward: the group's valid size")
    failed: int = Field(description="Members excluded by a failure")
    reward_mean: float | None = Field(description="Over the valid rewards")
    reward_std: float | None = Field(description="Population standard deviation of the valid rewards")
    policy_version: str | None = None
    members: list[GroupMember] = Field(
        default_factory=list,
        description="Each member's terminal status, failure reason, exclusion and dispatched policy version (no "
        "surplus rollout)",
    )
    cost: CostSummary | None = Field(default=None, description="The sum of its rollouts' costs, as published")
    valid_size: int | None = Field(
        default=None, description="Members with a reward (the rewards a trainer may learn from); = succeeded"
    )
    target_size: int | None = Field(
        default=None, description="With oversample: the valid rollouts the group asked for (the batch's group_size)"
    )
    surplus: list[int] = Field(
        default_factory=list, description="Indices cut as surplus (oversample): not part of the group"
    )
    zero_variance: bool = Field(
        default=False,
        description="Its valid rewards are all equal (or fewer than two): every GRPO advantage is 0. Not delivered "
        "to sinks when drop_zero_variance is set",
    )


class BatchAccepted(_Detail):
    """A dataset file or SDK submission was ingested: its rollouts are queued."""

    source: str | None = Field(default=None, description="s3://bucket/key?versionId=... or 'sdk'")
    rows_accepted: int
    rows_rejected: int
    rollouts_enqueued: int
    group_size: int
    errors_uri: str | None = None
    error: str | None = Field(default=None, description="Why the whole file was rejected, if it was")
    policy_version: str | None = None
    warnings: list[str] = Field(
        default_factory=list,
        description="Why some rollouts may wait for a session longer than max_limit_wait_s and fail throttled, "
        "if every running rollout ran to its timeout (each a sentence naming the settings to change)",
    )


class BatchCompleted(_Detail):
    """Every rollout of a batch is terminal."""

    # `duration_s`: `batch_duration_s(started_at, completed_at)`, the batch's creation to its completion, the figure
    # `rollouts local demo` and the report show.

    rollouts_total: int
    succeeded: int
    failed: int
    failed_by_reason: dict[str, int]
    reward_mean: float | None
    reward_std: float | None
    reward_count: int
    started_at: datetime | None
    completed_at: datetime
    duration_s: float | None
    cost: CostSummary | None = Field(default=None, description="The sum of its rollouts' costs, as published")

    @property
    def reward_signal_warning(self) -> str | None:
        """A one-line warning when the batch carries no reward signal (two rewards or more, every one equal: every
        GRPO advantage is zero), else None. Usually every rollout scored 0: rows the agent does not read as it
        expects (docs/datasets.md) or a reward that cannot be earned."""
        if self.reward_count < 2 or self.reward_std is None or self.reward_std > SIGNAL_EPS:
            return None
        value = "n/a" if self.reward_mean is None else f"{self.reward_mean:g}"
        return (
            f"no reward signal in batch {self.batch_id}: all {self.reward_count} rewards are {value} (every GRPO "
            "advantage is 0); check that the rows carry what the agent reads and that its reward can be earned"
        )


class BudgetWarning(_Detail):
    """A budget is 80% spent: at 100% dispatch pauses (`Budget Exhausted`). Once per budget value. `scope`
    "experiment": the experiment's budget (`batch_id` is ""); "batch": that batch's own."""

    scope: Literal["experiment", "batch"]
    budget_usd: float
    spent_usd: float
    threshold: float = Field(default=0.8, description="The share of the budget that warns")


class BudgetExhausted(_Detail):
    """A budget is spent: nothing new starts (queued rollouts wait: never failed, dropped or dead-lettered), the
    rollouts in flight finish and are recorded. Raising the budget (`rollouts budget set`, `set_budget`) resumes
    dispatch where it stopped. Once per budget value. `scope` and `batch_id` as for `BudgetWarning`."""

    scope: Literal["experiment", "batch"]
    budget_usd: float
    spent_usd: float
    rollouts_in_flight: int = Field(description="Sessions in flight: they finish and are recorded")
    rollouts_waiting: int = Field(description="Rollouts that have not started and wait for the budget (about)")
    waiting_by_batch: dict[str, int] = Field(
        default_factory=dict, description="Per batch with rollouts not yet ended: how many have not ended"
    )


#: Rewards closer than this are equal (no GRPO signal between them).
SIGNAL_EPS: Final = 1e-9

DETAIL_MODELS: Final[dict[DetailType, type[_Detail]]] = {
    DetailType.ROLLOUT_COMPLETED: RolloutCompleted,
    DetailType.ROLLOUT_FAILED: RolloutFailed,
    DetailType.GROUP_COMPLETED: GroupCompleted,
    DetailType.BATCH_ACCEPTED: BatchAccepted,
    DetailType.BATCH_COMPLETED: BatchCompleted,
    DetailType.BUDGET_WARNING: BudgetWarning,
    DetailType.BUDGET_EXHAUSTED: BudgetExhausted,
}


def detail_type_of(detail: _Detail) -> DetailType:
    for detail_type, model in DETAIL_MODELS.items():
        if type(detail) is model:
            return detail_type
    raise TypeError(f"not an event detail: {type(detail).__name__}")


def parse_detail(detail_type: str, detail: Mapping[str, Any] | str) -> _Detail:
    """Parse an event detail by its detail type (as received from EventBridge or the trainer queue)."""
    model = DETAIL_MODELS[DetailType(detail_type)]
    if isinstance(detail, str):
        return model.model_validate_json(detail)
    return model.model_validate(detail)


def batch_duration_s(started_at: datetime | None, completed_at: datetime | None) -> float | None:
    """A batch's duration: seconds from its creation (the ledger's `created_at`) to its completion (`completed_at`,
    stamped once). The one definition `Batch Completed`, the CLI and the report use."""
    if started_at is None or completed_at is None:
        return None
    return (completed_at - started_at).total_seconds()


def reward_stats(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and population standard deviation (GRPO normalisation), or (None, None) for no values."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(var)


#: The epsilon of the GRPO advantage's denominator (`grpo_advantages`).
ADVANTAGE_EPS: Final = 1e-6


def grpo_advantages(rewards: Sequence[float | None], eps: float = ADVANTAGE_EPS) -> list[float | None]:
    """GRPO advantages of one group, `(r - mean) / (std + eps)` with the mean and population std of its
    successful rewards (`reward_stats`); None where the reward is None (a failed rollout). The one formula of
    `Group.advantages()`, the dataset export and re-scoring."""
    mean, std = reward_stats([r for r in rewards if r is not None])
    if mean is None or std is None:
        return [None] * len(rewards)
    return [None if r is None else (r - mean) / (std + eps) for r in rewards]


def stats_from_sums(count: int, total: float, total_sq: float) -> tuple[float | None, float | None]:
    if count <= 0:
        return None, None
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    return mean, math.sqrt(var)
