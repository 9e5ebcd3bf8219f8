"""For dataset authors and ingestion: dataset rows and per-file options (S3 object metadata)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollout_pipeline import ids
from rollout_pipeline.config import WARMUP_KEY, ExperimentConfig, SamplingParams
from rollout_pipeline.contracts.common import json_size, json_type
from rollout_pipeline.contracts.secrets import is_secret_field

#: At most this many rollouts per group (`group_size` + `oversample`).
MAX_ROLLOUTS_PER_GROUP: Final = 1024
#: Rows bigger than this are rejected (ACR itself accepts 100 MB; a dataset row this big is a mistake).
MAX_ROW_BYTES: Final = 1024 * 1024

RESERVED_ROW_KEYS: Final = frozenset({"id", "_rollout"})
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
        "attempt_token",
        WARMUP_KEY,
    }
)
#: `_rollout.capture_key`: a per-rollout trace key for a token-capture gateway (ART's gateway keys each rollout's
#: tokens by its own per-rollout session id, sent as the OpenAI api key). It is an id, not a credential, so it may
#: travel; the agent receives it as `_rollout.api_key`, which is where an unmodified ART agent reads its model key.
CAPTURE_KEY: Final = "capture_key"
CAPTURE_KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$")


class FileOptions(BaseModel):
    """Options of one dataset file / submission: experiment defaults overridden by S3 object metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_size: int = Field(ge=1, le=1024)
    rollout_timeout_s: int = Field(ge=10, le=28_800)
    max_attempts: int = Field(ge=1, le=10)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    policy_version: str | None = Field(default=None, max_length=128)
    #: The batch's own budget (USD): its rollouts wait once its published cost reaches it (`budget set --batch`).
    budget_usd: float | None = Field(default=None, gt=0, le=1e9)
    #: Extra rollouts per group: `group_size + oversample` run, and once `group_size` of them have ended with a
    #: reward the rest are cancelled as `surplus` (docs/lifecycle.md, "Trainer-ready groups").
    oversample: int = Field(default=0, ge=0, le=1024)

    @model_validator(mode="after")
    def _rollouts_fit(self) -> FileOptions:
        if self.rollouts_per_group > MAX_ROLLOUTS_PER_GROUP:
            raise ValueError(
                f"group_size + oversample ({self.group_size} + {self.oversample}) exceeds {MAX_ROLLOUTS_PER_GROUP} "
                "rollouts per group"
            )
        return self

    @property
    def rollouts_per_group(self) -> int:
        """The rollouts each group runs: `group_size`, plus `oversample` extra ones."""
        return self.group_size + self.oversample

    @classmethod
    def defaults(cls, config: ExperimentConfig) -> FileOptions:
        return cls(
            group_size=config.group_size,
            rollout_timeout_s=config.rollout_timeout_s,
            max_attempts=config.max_attempts,
            sampling_params=config.sampling_params,
            policy_version=config.policy_version,
            oversample=config.oversample,
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
        if self.budget_usd is not None:
            meta[_METADATA_KEYS["budget_usd"]] = f"{self.budget_usd:g}"
        if self.oversample:
            meta[_METADATA_KEYS["oversample"]] = str(self.oversample)
        return meta


#: S3 user-metadata key (as boto3 returns it: lower case, without `x-amz-meta-`) of each option.
_METADATA_KEYS: Final = {
    "group_size": "group-size",
    "rollout_timeout_s": "rollout-timeout-s",
    "max_attempts": "max-attempts",
    "sampling_params": "sampling-params",
    "policy_version": "policy-version",
    "budget_usd": "budget-usd",
    "oversample": "oversample",
}


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
        raise RowError("not_an_object", f"row must be a JSON object, got {json_type(value)}")
    if "id" in value and value["id"] is not None:
        try:
            input_id = ids.validate_input_id(value["id"])
        except ids.InvalidId as exc:
            raise RowError("invalid_id", str(exc)) from None
    else:
        input_id = ids.derived_input_id(position)
    overrides = value.get("_rollout") or {}
    if not isinstance(overrides, Mapping):
        raise RowError("invalid_rollout", f"_rollout must be an object, got {json_type(overrides)}")
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
