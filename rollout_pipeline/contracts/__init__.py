"""Wire formats other people's code depends on, one module per audience:

- `rows`: dataset authors and ingestion (dataset rows, per-file options as S3 object metadata);
- `messages`: the dispatcher and agent authors (rollout-queue messages, the ART-compatible agent payload);
- `results`: agent authors and completion (ART result objects, `read_result`);
- `attempts`: agent authors and completion (the attempt token a result must carry);
- `events`: subscribers (the five event details; JSON Schemas generated into `rollout_pipeline/schemas/`);
- `secrets`: the credentials rule every audience follows; `common`: times and JSON helpers.

Every name is re-exported here: `from rollout_pipeline.contracts import ...` is the stable import path.
"""

from rollout_pipeline.contracts.attempts import (
    ATTEMPT_TOKEN_KEY,
    TOKEN_TAIL_BYTES,
    attempt_token,
    carries_attempt_token,
    result_attempt_token,
    text_carries_attempt_token,
)
from rollout_pipeline.contracts.common import iso, json_size, json_type, parse_iso, utcnow
from rollout_pipeline.contracts.events import (
    ADVANTAGE_EPS,
    DETAIL_MODELS,
    EVENT_SOURCE,
    INLINE_RESULT_BYTES,
    SIGNAL_EPS,
    BatchAccepted,
    BatchCompleted,
    BudgetExhausted,
    BudgetWarning,
    CostSummary,
    DetailType,
    GroupCompleted,
    GroupMember,
    RolloutCompleted,
    RolloutCost,
    RolloutFailed,
    Timings,
    batch_duration_s,
    detail_type_of,
    grpo_advantages,
    parse_detail,
    reward_stats,
    stats_from_sums,
)
from rollout_pipeline.contracts.messages import CLAIM_CHECK_BYTES, RolloutMessage, build_agent_payload
from rollout_pipeline.contracts.results import (
    MAX_ABS_REWARD,
    FailureReason,
    ModelCalls,
    ReportedUsage,
    ResultOutcome,
    ResultRead,
    parse_result,
    read_result,
    reported_usage,
    scalar_reward,
)
from rollout_pipeline.contracts.rows import (
    CAPTURE_KEY,
    CAPTURE_KEY_PATTERN,
    MAX_ROW_BYTES,
    RESERVED_ROW_KEYS,
    SYSTEM_ROLLOUT_KEYS,
    DatasetRow,
    FileOptions,
    RowError,
    parse_row,
)
from rollout_pipeline.contracts.secrets import REDACTED, SECRET_FIELDS, is_secret_field, redact_secrets

__all__ = [
    "ADVANTAGE_EPS",
    "ATTEMPT_TOKEN_KEY",
    "CAPTURE_KEY",
    "CAPTURE_KEY_PATTERN",
    "CLAIM_CHECK_BYTES",
    "DETAIL_MODELS",
    "EVENT_SOURCE",
    "INLINE_RESULT_BYTES",
    "MAX_ABS_REWARD",
    "MAX_ROW_BYTES",
    "REDACTED",
    "RESERVED_ROW_KEYS",
    "SECRET_FIELDS",
    "SIGNAL_EPS",
    "SYSTEM_ROLLOUT_KEYS",
    "TOKEN_TAIL_BYTES",
    "BatchAccepted",
    "BatchCompleted",
    "BudgetExhausted",
    "BudgetWarning",
    "CostSummary",
    "DatasetRow",
    "DetailType",
    "FailureReason",
    "FileOptions",
    "GroupCompleted",
    "GroupMember",
    "ModelCalls",
    "ReportedUsage",
    "ResultOutcome",
    "ResultRead",
    "RolloutCompleted",
    "RolloutCost",
    "RolloutFailed",
    "RolloutMessage",
    "RowError",
    "Timings",
    "attempt_token",
    "batch_duration_s",
    "build_agent_payload",
    "carries_attempt_token",
    "detail_type_of",
    "grpo_advantages",
    "is_secret_field",
    "iso",
    "json_size",
    "json_type",
    "parse_detail",
    "parse_iso",
    "parse_result",
    "parse_row",
    "read_result",
    "redact_secrets",
    "reported_usage",
    "result_attempt_token",
    "reward_stats",
    "scalar_reward",
    "stats_from_sums",
    "text_carries_attempt_token",
    "utcnow",
]
