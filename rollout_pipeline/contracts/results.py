"""For agent authors and the completion stage: ART result objects, what they say, and the one way to read one."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from rollout_pipeline.config import RESULT_USAGE_KEY
from rollout_pipeline.contracts.common import json_type

if TYPE_CHECKING:
    from rollout_pipeline.ports import ObjectReader

#: Rewards beyond this magnitude cannot be summed (with their squares) in DynamoDB numbers, whose magnitude stops
#: below 1e126 (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/HowItWorks.NamingRulesDataTypes.html):
#: such a result is invalid.
MAX_ABS_REWARD: Final = 1e60


class FailureReason(StrEnum):
    AGENT_ERROR = "agent_error"
    TIMEOUT = "timeout"
    INVALID_RESULT = "invalid_result"
    INVOKE_REJECTED = "invoke_rejected"
    CANCELLED = "cancelled"
    THROTTLED = "throttled"
    #: Cancelled because its group already had the valid rollouts it needed (`oversample`): not a failure of the
    #: rollout, and never part of the group the trainer receives.
    SURPLUS = "surplus"


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
    non-empty list) within +-`MAX_ABS_REWARD`; anything else is an agent error. Unreadable content is an invalid
    result."""

    def invalid(error: str, parsed: dict[str, Any] | None = None) -> ResultOutcome:
        return ResultOutcome(success=False, reason=FailureReason.INVALID_RESULT, error=error, body=parsed)

    if max_bytes is not None and len(body) > max_bytes:
        return invalid(f"result is larger than {max_bytes} bytes")
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return invalid("result is not valid JSON")
    if not isinstance(parsed, dict):
        return invalid(f"result must be a JSON object, got {json_type(parsed)}")
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
    values = [rewards] if _valid_number(rewards) else rewards if isinstance(rewards, list) else []
    if not values or not all(_valid_number(r) for r in values):
        return invalid(
            f"rewards must be a finite number or a non-empty list of finite numbers, got {rewards!r}"[:500],
            parsed,
        )
    if any(abs(r) > MAX_ABS_REWARD for r in values):
        return invalid(f"rewards beyond +-{MAX_ABS_REWARD:g} are not supported", parsed)
    if isinstance(rewards, list):
        floats = [float(r) for r in rewards]
        return ResultOutcome(success=True, rewards=floats, reward=floats[-1], body=parsed)
    return ResultOutcome(success=True, rewards=float(rewards), reward=float(rewards), body=parsed)


class ModelCalls(BaseModel):
    """What a rollout's model calls came back as, as the agent host saw them (`agent.replies`): `calls` answered,
    `cut` short (the stream ended before the model said why it stopped), `empty` (no text, no tool call), `errors`
    (an HTTP error or an error event), and `max_tokens` (stopped at the sampling limit: counted, not a warning)."""

    model_config = ConfigDict(frozen=True)

    calls: int = 0
    cut: int = 0
    empty: int = 0
    errors: int = 0
    max_tokens: int = 0

    @property
    def warning(self) -> str | None:
        """One line when a reply the agent may have scored was cut short, empty or failed; None otherwise."""
        parts = [
            f"{count} {what}"
            for count, what in ((self.cut, "cut short"), (self.empty, "empty"), (self.errors, "failed"))
            if count
        ]
        if not parts:
            return None
        return (
            f"model replies: {', '.join(parts)} of {self.calls} call(s); the agent's result was computed from "
            "them (the agent's log has each reply)"
        )


class ReportedUsage(BaseModel):
    """What the agent host reported the session used, beside the result (`config.RESULT_USAGE_KEY`)."""

    model_config = ConfigDict(frozen=True)

    cpu_s: float
    peak_rss_mb: float | None = None
    rollouts: int = 1
    model_calls: ModelCalls | None = None

    @property
    def session_cpu_s(self) -> float | None:
        """The session's CPU seconds: the process's, when the process ran this rollout only (it is the session)."""
        return self.cpu_s if self.rollouts == 1 else None


def reported_usage(body: Any) -> ReportedUsage | None:
    """The host's usage report in a result object (`rollout_pipeline.agent.usage`), or None when it carries none or
    an unusable one (not a finite, non-negative number of CPU seconds)."""
    raw = body.get(RESULT_USAGE_KEY) if isinstance(body, dict) else None
    if not isinstance(raw, dict):
        return None
    cpu: Any = raw.get("cpu_s")
    rollouts: Any = raw.get("rollouts", 1)
    rss: Any = raw.get("peak_rss_mb")
    if not _valid_number(cpu) or float(cpu) < 0 or not isinstance(rollouts, int) or isinstance(rollouts, bool):
        return None
    return ReportedUsage(
        cpu_s=float(cpu),
        peak_rss_mb=float(rss) if _valid_number(rss) else None,
        rollouts=max(rollouts, 0),
        model_calls=_model_calls(raw.get("model_calls")),
    )


def _model_calls(raw: Any) -> ModelCalls | None:
    """The host's model-call counts, when they are counts (anything else: None)."""
    if not isinstance(raw, dict):
        return None
    counts: dict[str, int] = {}
    for name in ModelCalls.model_fields:
        value = raw.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return None
        counts[name] = value
    return ModelCalls(**counts)


class ResultRead(BaseModel):
    """One read of a result object: its full size, the limit it was read under and what it says (`outcome.body`
    is the parsed object whenever it is a JSON object within the limit)."""

    model_config = ConfigDict(frozen=True)

    size: int
    limit: int
    outcome: ResultOutcome
    #: The bytes read (the whole object, or its first `limit` + 1 bytes): where the token of a result that cannot
    #: be parsed is looked for (`attempts.text_carries_attempt_token`).
    raw: bytes = Field(default=b"", repr=False, exclude=True)

    @property
    def too_large(self) -> bool:
        return self.size > self.limit


def read_result(store: ObjectReader, bucket: str, key: str, *, max_bytes: int) -> ResultRead:
    """Read at most `max_bytes` of a result object and parse it (`parse_result`): the one reader of result objects
    (completion, the inline result of `Rollout Completed`, the SDK). `ObjectNotFound` when it does not exist."""
    body, size = store.get_bytes(bucket, key, max_bytes)
    if size > max_bytes:
        outcome = ResultOutcome(
            success=False,
            reason=FailureReason.INVALID_RESULT,
            error=f"result is {size} bytes; larger than the limit of {max_bytes} bytes",
        )
    else:
        outcome = parse_result(body, max_bytes=max_bytes)
    return ResultRead(size=size, limit=max_bytes, outcome=outcome, raw=body)
