"""Wire formats other people's code depends on: dataset rows, per-file options, rollout messages, the
ART-compatible agent payload, result objects and the five event details.

JSON Schemas of the events are generated from these models into `rollout_pipeline/schemas/`
(`python -m rollout_pipeline.schemas`); a test fails when they drift.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollout_pipeline import ids
from rollout_pipeline.config import ExperimentConfig, SamplingParams

EVENT_SOURCE: Final = "rollout.pipeline"
#: Rows bigger than this are rejected (ACR itself accepts 100 MB; a dataset row this big is a mistake).
MAX_ROW_BYTES: Final = 1024 * 1024
#: Payloads bigger than this travel by reference (claim check in S3) instead of inline.
CLAIM_CHECK_BYTES: Final = 32 * 1024
#: Results up to this size are inlined into `Rollout Completed` (EventBridge entries are capped at 256 KB).
INLINE_RESULT_BYTES: Final = 64 * 1024

RESERVED_ROW_KEYS: Final = frozenset({"id", "_rollout"})
#: Field names of long-lived credentials. They never travel in rows, `_rollout`, the ledger, queues, result objects
#: or events: the agent gets its model credential out of band (`ExperimentConfig.model_secret_name`, read by the
#: agent at start; local mode: the agent's environment). Values under these names are redacted from anything the
#: pipeline inlines into events (`redact_secrets`).
SECRET_FIELDS: Final = frozenset(
    {"api_key", "apikey", "openai_api_key", "aws_secret_access_key", "secret_access_key", "password", "client_secret"}
)
REDACTED: Final = "[redacted]"
#: `_rollout.capture_key`: a per-rollout trace key for a token-capture gateway (ART's gateway keys each rollout's
#: tokens by its own per-rollout session id, sent as the OpenAI api key). It is an id, not a credential, so it may
#: travel; the agent receives it as `_rollout.api_key`, which is where an unmodified ART agent reads its model key.
CAPTURE_KEY: Final = "capture_key"
CAPTURE_KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$")


def is_secret_field(name: str) -> bool:
    """True for a field name that holds a long-lived credential (case and `-`/`_` insensitive)."""
    return name.lower().replace("-", "_") in SECRET_FIELDS


def redact_secrets(value: Any) -> Any:
    """A copy of `value` with the values of every secret field (at any depth) replaced by `REDACTED`."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_field(str(k)) else redact_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(v) for v in value]
    return value


#: `_rollout` keys the pipeline owns; a row may not set them.
SYSTEM_ROLLOUT_KEYS: Final = frozenset(
    {
        "exp_id",
        "input_id",
        "s3_bucket",
        "batch_id",
        "rollout_id",
        "index",
        "attempt",
        "group_size",
        "session_id",
        "policy_version",
    }
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime) -> str:
    """ISO-8601 in UTC, as the ledger stores times."""
    return value.astimezone(UTC).isoformat()


def parse_iso(value: Any) -> datetime | None:
    """A stored ISO-8601 time (a trailing `Z` allowed; naive = UTC), or None when absent or unreadable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


# --------------------------------------------------------------------------------------------- per-file options


class FileOptions(BaseModel):
    """Options of one dataset file / submission: experiment defaults overridden by S3 object metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_size: int = Field(ge=1, le=1024)
    rollout_timeout_s: int = Field(ge=10, le=28_800)
    max_attempts: int = Field(ge=1, le=10)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    policy_version: str | None = Field(default=None, max_length=128)

    @classmethod
    def defaults(cls, config: ExperimentConfig) -> FileOptions:
        return cls(
            group_size=config.group_size,
            rollout_timeout_s=config.rollout_timeout_s,
            max_attempts=config.max_attempts,
            sampling_params=config.sampling_params,
            policy_version=config.policy_version,
        )

    @classmethod
    def from_metadata(cls, config: ExperimentConfig, metadata: Mapping[str, str]) -> FileOptions:
        """Experiment defaults overridden by the object's user metadata; `ValueError` names the bad key."""
        values = cls.defaults(config).model_dump()
        for field_name, meta_key in _METADATA_KEYS.items():
            raw = metadata.get(meta_key)
            if raw is None:
                continue
            if field_name == "sampling_params":
                try:
                    parsed = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"metadata {meta_key}: not valid JSON ({exc.msg})") from None
                if not isinstance(parsed, dict):
                    raise ValueError(f"metadata {meta_key}: must be a JSON object")
                values[field_name] = {**values[field_name], **parsed}
            else:
                values[field_name] = raw
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "options"
            key = _METADATA_KEYS.get(field, field)
            raise ValueError(f"metadata {key}: {err['msg']} (got {err.get('input')!r})") from None

    def to_metadata(self) -> dict[str, str]:
        """The S3 user metadata that reproduces these options on upload."""
        meta = {
            _METADATA_KEYS["group_size"]: str(self.group_size),
            _METADATA_KEYS["rollout_timeout_s"]: str(self.rollout_timeout_s),
            _METADATA_KEYS["max_attempts"]: str(self.max_attempts),
        }
        sampling = self.sampling_params.model_dump(exclude_none=True)
        if sampling:
            meta[_METADATA_KEYS["sampling_params"]] = json.dumps(sampling, separators=(",", ":"))
        if self.policy_version is not None:
            meta[_METADATA_KEYS["policy_version"]] = self.policy_version
        return meta


#: S3 user-metadata key (as boto3 returns it: lower case, without `x-amz-meta-`) of each option.
_METADATA_KEYS: Final = {
    "group_size": "group-size",
    "rollout_timeout_s": "rollout-timeout-s",
    "max_attempts": "max-attempts",
    "sampling_params": "sampling-params",
    "policy_version": "policy-version",
}


# ------------------------------------------------------------------------------------------------- dataset rows


class RowError(ValueError):
    """A dataset row was rejected; `reason` is a short machine-readable kind, the message explains it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DatasetRow(BaseModel):
    """One accepted row: its input id, the agent payload (row minus reserved keys) and per-row `_rollout`."""

    model_config = ConfigDict(frozen=True)

    position: int
    input_id: str
    payload: dict[str, Any]
    rollout_overrides: dict[str, Any] = Field(default_factory=dict)


def parse_row(raw: str | bytes | Mapping[str, Any], position: int) -> DatasetRow:
    """Validate one row (a JSON text or an already-decoded value); raise `RowError` with the reason."""
    if isinstance(raw, str | bytes):
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode())
        if size > MAX_ROW_BYTES:
            raise RowError("oversized", f"row is {size} bytes; the limit is {MAX_ROW_BYTES}")
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise RowError("invalid_json", f"invalid JSON: {detail}") from None
    else:
        value = raw
        size = json_size(value) if isinstance(value, Mapping) else 0
        if size > MAX_ROW_BYTES:
            raise RowError("oversized", f"row is {size} bytes; the limit is {MAX_ROW_BYTES}")
    if not isinstance(value, Mapping):
        raise RowError("not_an_object", f"row must be a JSON object, got {_json_type(value)}")
    if "id" in value and value["id"] is not None:
        try:
            input_id = ids.validate_input_id(value["id"])
        except ids.InvalidId as exc:
            raise RowError("invalid_id", str(exc)) from None
    else:
        input_id = ids.derived_input_id(position)
    overrides = value.get("_rollout") or {}
    if not isinstance(overrides, Mapping):
        raise RowError("invalid_rollout", f"_rollout must be an object, got {_json_type(overrides)}")
    secrets_given = sorted(k for k in [*value.keys(), *overrides.keys()] if is_secret_field(str(k)))
    if secrets_given:
        raise RowError(
            "secret_field",
            f"rows may not carry credentials ({', '.join(secrets_given)}): they would be stored and sent in "
            "plain text; give the agent its model key out of band (model_secret_name in the experiment config)",
        )
    capture_key = overrides.get(CAPTURE_KEY)
    if capture_key is not None and not (isinstance(capture_key, str) and CAPTURE_KEY_PATTERN.match(capture_key)):
        raise RowError(
            "invalid_rollout",
            f"_rollout.{CAPTURE_KEY} must be a per-rollout trace id: 1-256 letters, digits, '.', '_', ':' or '-'",
        )
    owned = sorted(SYSTEM_ROLLOUT_KEYS & overrides.keys())
    if owned:
        raise RowError("invalid_rollout", f"_rollout may not set {', '.join(owned)} (set by the pipeline)")
    if "sampling_params" in overrides:
        try:
            SamplingParams.model_validate(overrides["sampling_params"])
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise RowError("invalid_rollout", f"_rollout.sampling_params {where}: {err['msg']}".rstrip()) from None
    payload = {k: v for k, v in value.items() if k not in RESERVED_ROW_KEYS}
    return DatasetRow(position=position, input_id=input_id, payload=payload, rollout_overrides=dict(overrides))


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )


# --------------------------------------------------------------------------------------------- rollout messages


class RolloutMessage(BaseModel):
    """Body of a rollout-queue message: one attempt of one rollout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1] = 1
    exp_id: str
    batch_id: str
    input_id: str
    index: int = Field(ge=0)
    attempt: int = Field(ge=1)
    group_size: int = Field(ge=1)
    submitted_at: datetime
    payload: dict[str, Any] | None = Field(default=None, description="The row minus reserved keys, when inline")
    payload_ref: str | None = Field(default=None, description="s3://bucket/key of the payload (claim check)")
    rollout_overrides: dict[str, Any] = Field(default_factory=dict, description="The row's own `_rollout` keys")
    limit_requeues: int = Field(default=0, ge=0, description="Times re-sent because a limit or ACR throttled")
    waiting_since: datetime | None = Field(default=None, description="First re-send because of a limit")

    @field_validator("exp_id")
    @classmethod
    def _exp(cls, v: str) -> str:
        return ids.validate_exp_id(v)

    @field_validator("batch_id")
    @classmethod
    def _batch(cls, v: str) -> str:
        return ids.validate_batch_id(v)

    @field_validator("input_id")
    @classmethod
    def _input(cls, v: str) -> str:
        return ids.validate_input_id(v)

    @property
    def rollout_id(self) -> str:
        return ids.rollout_id(self.input_id, self.index)

    @property
    def session_id(self) -> str:
        return ids.session_id(self.exp_id, self.batch_id, self.input_id, self.index, self.attempt)


def build_agent_payload(
    *,
    row_payload: Mapping[str, Any],
    rollout_overrides: Mapping[str, Any],
    message: RolloutMessage,
    options: FileOptions,
    config: ExperimentConfig,
    results_bucket: str,
) -> dict[str, Any]:
    """The ART-compatible request body: the row plus `_rollout` (ART's keys first, then ours)."""
    sampling = {
        **options.sampling_params.model_dump(exclude_none=True),
        **dict(rollout_overrides.get("sampling_params") or {}),
    }
    rollout: dict[str, Any] = {
        "exp_id": message.exp_id,
        "input_id": message.input_id,
        "s3_bucket": results_bucket,
        "base_url": config.model_base_url,
        "model_id": config.model_id,
        "sampling_params": sampling,
    }
    rollout.update({k: v for k, v in rollout_overrides.items() if k not in ("sampling_params", CAPTURE_KEY)})
    if CAPTURE_KEY in rollout_overrides:
        rollout["api_key"] = rollout_overrides[CAPTURE_KEY]
    rollout.update(
        {
            "batch_id": message.batch_id,
            "rollout_id": message.rollout_id,
            "index": message.index,
            "attempt": message.attempt,
            "group_size": message.group_size,
            "session_id": message.session_id,
            "policy_version": options.policy_version,
        }
    )
    return {**row_payload, "_rollout": rollout}


# ------------------------------------------------------------------------------------------------ result objects


class FailureReason(StrEnum):
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    INVALID_RESULT = "invalid_result"
    INVOKE_REJECTED = "invoke_rejected"
    CANCELLED = "cancelled"
    THROTTLED = "throttled"


class ResultOutcome(BaseModel):
    """What a result object says: success with rewards, or a failure with its reason and error text."""

    model_config = ConfigDict(frozen=True)

    success: bool
    rewards: float | list[float] | None = None
    reward: float | None = None
    reason: FailureReason | None = None
    error: str | None = None
    body: dict[str, Any] | None = None


def scalar_reward(rewards: float | list[float]) -> float:
    """The scalar reward of a rollout: the number itself, or the last turn's reward of a list."""
    return rewards[-1] if isinstance(rewards, list) else rewards


def _valid_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_result(body: bytes, *, max_bytes: int | None = None) -> ResultOutcome:
    """Validate an ART result object. `status_code` 200 = success, which needs finite `rewards` (number or
    non-empty list); anything else is an agent error. Unreadable content is an invalid result."""

    def invalid(error: str, parsed: dict[str, Any] | None = None) -> ResultOutcome:
        return ResultOutcome(success=False, reason=FailureReason.INVALID_RESULT, error=error, body=parsed)

    if max_bytes is not None and len(body) > max_bytes:
        return invalid(f"result is larger than {max_bytes} bytes")
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return invalid("result is not valid JSON")
    if not isinstance(parsed, dict):
        return invalid(f"result must be a JSON object, got {_json_type(parsed)}")
    status = parsed.get("status_code", 200)
    if not isinstance(status, int) or isinstance(status, bool):
        return invalid(f"status_code must be an integer, got {status!r}", parsed)
    if status != 200:
        stop_reason = str(parsed.get("stop_reason") or "").strip()
        traceback = str(parsed.get("traceback") or "").strip()
        tail = traceback.splitlines()[-1] if traceback else ""
        error = stop_reason or tail or f"agent returned status_code {status}"
        if tail and tail not in error:
            error = f"{error} ({tail})"
        return ResultOutcome(
            success=False,
            reason=FailureReason.AGENT_ERROR,
            error=f"status_code {status}: {error}"[:2000],
            body=parsed,
        )
    if "rewards" not in parsed:
        return invalid("result has status_code 200 but no 'rewards'", parsed)
    rewards = parsed["rewards"]
    if _valid_number(rewards):
        value = float(rewards)
        return ResultOutcome(success=True, rewards=value, reward=value, body=parsed)
    if isinstance(rewards, list) and rewards and all(_valid_number(r) for r in rewards):
        values = [float(r) for r in rewards]
        return ResultOutcome(success=True, rewards=values, reward=values[-1], body=parsed)
    return invalid(
        f"rewards must be a finite number or a non-empty list of finite numbers, got {rewards!r}"[:500],
        parsed,
    )


# --------------------------------------------------------------------------------------------------------- events


class DetailType(StrEnum):
    ROLLOUT_COMPLETED = "Rollout Completed"
    ROLLOUT_FAILED = "Rollout Failed"
    GROUP_COMPLETED = "Group Completed"
    BATCH_ACCEPTED = "Batch Accepted"
    BATCH_COMPLETED = "Batch Completed"


class _Detail(BaseModel):
    """Fields every event detail carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str = Field(description="Stable id: the same logical event always carries the same id")
    exp_id: str
    batch_id: str
    emitted_at: datetime = Field(default_factory=utcnow)


class Timings(BaseModel):
    """When the rollout was submitted, dispatched to ACR, finished (result written) and notified (event sent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    submitted_at: datetime | None = None
    dispatched_at: datetime | None = None
    finished_at: datetime | None = None
    notified_at: datetime | None = None


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
    timings: Timings


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
    timings: Timings


class GroupMember(BaseModel):
    """One rollout of a completed group: its terminal status, and why it failed (a failure is never a reward)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    status: Literal["succeeded", "failed"]
    reward: float | None = None
    reason: FailureReason | None = None
    error: str | None = None
    attempt: int | None = None
    session_id: str | None = None
    policy_version: str | None = Field(default=None, description="The policy version the rollout was dispatched with")


class GroupCompleted(_Detail):
    """Every rollout of one input (a GRPO group) is terminal."""

    input_id: str
    group_size: int
    rewards: list[float | None] = Field(description="Reward by rollout index; null where the rollout failed")
    failures: dict[str, FailureReason] = Field(default_factory=dict, description="Failure reason by index")
    succeeded: int
    failed: int
    reward_mean: float | None
    reward_std: float | None
    policy_version: str | None = None
    members: list[GroupMember] = Field(
        default_factory=list, description="Each member's terminal status, failure reason and dispatched policy version"
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


class BatchCompleted(_Detail):
    """Every rollout of a batch is terminal."""

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


EventDetail = Annotated[
    RolloutCompleted | RolloutFailed | GroupCompleted | BatchAccepted | BatchCompleted,
    Field(description="Any event detail"),
]

DETAIL_MODELS: Final[dict[DetailType, type[_Detail]]] = {
    DetailType.ROLLOUT_COMPLETED: RolloutCompleted,
    DetailType.ROLLOUT_FAILED: RolloutFailed,
    DetailType.GROUP_COMPLETED: GroupCompleted,
    DetailType.BATCH_ACCEPTED: BatchAccepted,
    DetailType.BATCH_COMPLETED: BatchCompleted,
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


def reward_stats(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and population standard deviation (GRPO normalisation), or (None, None) for no values."""
    if not values:
        return None, None
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return mean, math.sqrt(var)


def stats_from_sums(count: int, total: float, total_sq: float) -> tuple[float | None, float | None]:
    if count <= 0:
        return None, None
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    return mean, math.sqrt(var)
