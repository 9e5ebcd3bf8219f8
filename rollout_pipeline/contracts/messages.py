"""For the dispatcher and agent authors: the rollout-queue message and the ART-compatible agent payload."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout_pipeline import ids
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts.attempts import ATTEMPT_TOKEN_KEY
from rollout_pipeline.contracts.rows import CAPTURE_KEY, SYSTEM_ROLLOUT_KEYS, FileOptions

#: Payloads bigger than this travel by reference (claim check in S3) instead of inline.
CLAIM_CHECK_BYTES: Final = 32 * 1024


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
    line: int | None = Field(
        default=None, ge=1, description="The group's line in its file: submission order within the batch"
    )
    payload: dict[str, Any] | None = Field(default=None, description="The row minus reserved keys, when inline")
    payload_ref: str | None = Field(default=None, description="s3://bucket/key of the payload (claim check)")
    rollout_overrides: dict[str, Any] = Field(default_factory=dict, description="The row's own `_rollout` keys")
    limit_requeues: int = Field(default=0, ge=0, description="Times re-sent because a limit or ACR throttled")
    waiting_since: datetime | None = Field(default=None, description="First re-send because of a limit")
    budget_held_since: datetime | None = Field(
        default=None, description="Held because its budget is spent since then (not time waiting for limits)"
    )

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
        return ids.validate_input_id(v, accept_plus=True)  # accepted before '+' was refused: still in flight

    @property
    def rollout_id(self) -> str:
        return ids.rollout_id(self.input_id, self.index)

    @property
    def session_id(self) -> str:
        return ids.session_id(self.exp_id, self.batch_id, self.input_id, self.index, self.attempt)

    @property
    def ref(self) -> ids.AttemptRef:
        """The attempt this message starts."""
        return ids.AttemptRef(self.batch_id, self.input_id, self.index, self.attempt)


def build_agent_payload(
    *,
    row_payload: Mapping[str, Any],
    rollout_overrides: Mapping[str, Any],
    message: RolloutMessage,
    options: FileOptions,
    config: ExperimentConfig,
    results_bucket: str,
    attempt_token: str | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The ART-compatible request body: the row plus `_rollout` (ART's keys first, then ours; `attempt_token`
    when given, see `contracts.attempts`). `session_id`: the session the attempt runs in when it is not the
    attempt's own (`message.session_id`): a warm session's. The pipeline's own `_rollout` keys a message carries
    (rows may not set them: `rows.SYSTEM_ROLLOUT_KEYS`; a message sent by other means might) are dropped, so no
    request is ever marked as a warm-up or carries another attempt's token."""
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
    rollout.update(
        {
            k: v
            for k, v in rollout_overrides.items()
            if k not in ("sampling_params", CAPTURE_KEY) and k not in SYSTEM_ROLLOUT_KEYS
        }
    )
    if CAPTURE_KEY in rollout_overrides:
        rollout["api_key"] = rollout_overrides[CAPTURE_KEY]
    rollout.update(
        {
            "batch_id": message.batch_id,
            "rollout_id": message.rollout_id,
            "index": message.index,
            "attempt": message.attempt,
            "group_size": message.group_size,
            "session_id": session_id or message.session_id,
            "policy_version": options.policy_version,
        }
    )
    if attempt_token is not None:
        rollout[ATTEMPT_TOKEN_KEY] = attempt_token
    return {**row_payload, "_rollout": rollout}
