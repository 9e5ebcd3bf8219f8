"""For SageMaker's managed multi-turn RL (MTRL) and the forwarder Lambda: MTRL's custom-agent Lambda contract.

An MTRL job (`CreateJob(JobCategory="AgentRFT")` whose `AgentConfig` is `CustomAgentLambdaConfig{LambdaArn}`)
invokes the Lambda once per rollout with

    {"prompt": str, "metadata": {"jobArn": str, "rolloutId": str},
     "inferenceParams": {"temperature": float, "topP": float, "maxTokens": int}}

or the same object as a JSON string in `body`. The Lambda hands the rollout off and returns `{}` at once, or
`{"errorType": "ValidationError" | "InternalServerError" | "AccessDenied", "errorMessage": str}`; AWS's template
refuses an empty prompt and ids that do not match `[\\w\\-.]+`. The agent then samples from the job runtime and
reports with `CompleteRollout` and `UpdateReward` (SageMaker developer guide, "Preparing your agent", scenario
"Custom Agent with Lambda Forwarder": https://docs.aws.amazon.com/sagemaker/latest/dg/model-customize-mtrl-agent.html).

Here: `parse_mtrl_event` (the event -> an `MtrlRollout`, or `MtrlRefusal` with its `errorType`), the rollout's
dataset row (`MtrlRollout.row`: the row is the prompt, the job's ids travel in its `metadata`, `inferenceParams` as
`_rollout.sampling_params`), and its pipeline ids: one batch per (job, rollout id), `mtrl_batch_id`, deterministic,
so a repeated invocation finds the batch it made; the batch's `source` (`mtrl_source`) names the job and rollout
again for whoever reports its end to MTRL (`parse_mtrl_source`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from rollout_pipeline import ids
from rollout_pipeline.config import SamplingParams
from rollout_pipeline.contracts.common import json_type
from rollout_pipeline.contracts.secrets import is_secret_field

VALIDATION_ERROR: Final = "ValidationError"
INTERNAL_ERROR: Final = "InternalServerError"
ACCESS_DENIED: Final = "AccessDenied"
MtrlErrorType = Literal["ValidationError", "InternalServerError", "AccessDenied"]

#: AWS's template's id rule, ASCII only: a rollout id reaches ledger keys and the session's paths.
ROLLOUT_ID_RE: Final = re.compile(r"[\w\-.]{1,256}", re.ASCII)
#: A SageMaker job ARN; groups: region, account.
JOB_ARN_RE: Final = re.compile(r"arn:aws[a-z-]*:sagemaker:([a-z0-9-]+):(\d{12}):[A-Za-z0-9/_+=.@:-]{1,1024}")
#: Every batch the forwarder makes starts with this (the reporter's event rule matches it).
MTRL_BATCH_PREFIX: Final = "mtrl-"
#: `source` of such a batch: `mtrl:{job arn}#{rollout id}` (an ARN has no `#`, a rollout id neither).
MTRL_SOURCE_PREFIX: Final = "mtrl:"
#: `inferenceParams` (camel case) -> `_rollout.sampling_params` (the RFT host turns them back: `rft_host.CAMEL_CASE`).
SNAKE_CASE: Final = {"temperature": "temperature", "topP": "top_p", "maxTokens": "max_tokens"}
#: The longest prompt: the row must stay within a dataset row's limit (`contracts.rows.MAX_ROW_BYTES`, 1 MiB).
MAX_PROMPT_CHARS: Final = 512 * 1024


class MtrlRefusal(ValueError):
    """An invocation refused: `response()` is what the Lambda returns to MTRL."""

    def __init__(self, error_type: MtrlErrorType, message: str) -> None:
        super().__init__(message)
        self.error_type: MtrlErrorType = error_type

    def response(self) -> dict[str, str]:
        return error_response(self.error_type, str(self))


def error_response(error_type: MtrlErrorType, message: str) -> dict[str, str]:
    """The contract's error answer."""
    return {"errorType": error_type, "errorMessage": message[:1000]}


def mtrl_batch_id(job_arn: str, rollout_id: str) -> str:
    """The pipeline batch of one MTRL rollout: the same for every invocation about it."""
    digest = hashlib.sha256(f"{job_arn}\n{rollout_id}".encode()).hexdigest()[:24]
    return ids.validate_batch_id(f"{MTRL_BATCH_PREFIX}{digest}")


def mtrl_source(job_arn: str, rollout_id: str) -> str:
    return f"{MTRL_SOURCE_PREFIX}{job_arn}#{rollout_id}"


def parse_mtrl_source(source: str | None) -> tuple[str, str] | None:
    """(job ARN, rollout id) of a batch's `source` written by `mtrl_source`, else None."""
    if not source or not source.startswith(MTRL_SOURCE_PREFIX):
        return None
    job_arn, sep, rollout_id = source[len(MTRL_SOURCE_PREFIX) :].rpartition("#")
    if not sep or not JOB_ARN_RE.fullmatch(job_arn) or not ROLLOUT_ID_RE.fullmatch(rollout_id):
        return None
    return job_arn, rollout_id


@dataclass(frozen=True)
class MtrlRollout:
    """One rollout MTRL asked for."""

    prompt: str
    job_arn: str
    rollout_id: str
    #: `inferenceParams` as the pipeline's sampling params (snake case; unknown keys as they came).
    sampling: Mapping[str, Any]

    @property
    def region(self) -> str:
        match = JOB_ARN_RE.fullmatch(self.job_arn)
        assert match is not None
        return match.group(1)

    @property
    def account(self) -> str:
        match = JOB_ARN_RE.fullmatch(self.job_arn)
        assert match is not None
        return match.group(2)

    @property
    def batch_id(self) -> str:
        return mtrl_batch_id(self.job_arn, self.rollout_id)

    @property
    def input_id(self) -> str:
        """The rollout id when it is a valid input id (so the pipeline's events name it), else a digest of it."""
        try:
            return ids.validate_input_id(self.rollout_id)
        except ids.InvalidId:
            return f"mtrl-{hashlib.sha256(self.rollout_id.encode()).hexdigest()[:32]}"

    @property
    def source(self) -> str:
        return mtrl_source(self.job_arn, self.rollout_id)

    def row(self) -> dict[str, Any]:
        """The dataset row: the prompt, the job's ids in `metadata` (the RFT host reads them there), the inference
        params as `_rollout.sampling_params`."""
        row: dict[str, Any] = {
            "id": self.input_id,
            "prompt": self.prompt,
            "metadata": {"jobArn": self.job_arn, "rolloutId": self.rollout_id},
        }
        if self.sampling:
            row["_rollout"] = {"sampling_params": dict(self.sampling)}
        return row


def parse_mtrl_event(event: Any) -> MtrlRollout:
    """The rollout an invocation asks for; `MtrlRefusal` (`ValidationError`) naming the field otherwise."""
    body = _body(event)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _invalid(f"prompt must be a non-empty string, got {_shown(prompt)}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise _invalid(f"prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    metadata = body.get("metadata")
    if not isinstance(metadata, Mapping):
        raise _invalid(f"metadata must be an object with jobArn and rolloutId, got {json_type(metadata)}")
    job_arn, rollout_id = metadata.get("jobArn"), metadata.get("rolloutId")
    if not isinstance(job_arn, str) or not JOB_ARN_RE.fullmatch(job_arn):
        raise _invalid(f"metadata.jobArn must be a SageMaker job ARN, got {_shown(job_arn)}")
    if not isinstance(rollout_id, str) or not ROLLOUT_ID_RE.fullmatch(rollout_id):
        raise _invalid(f"metadata.rolloutId must match [\\w\\-.]+ (ASCII, at most 256), got {_shown(rollout_id)}")
    return MtrlRollout(prompt=prompt, job_arn=job_arn, rollout_id=rollout_id, sampling=_sampling(body))


def _body(event: Any) -> Mapping[str, Any]:
    if not isinstance(event, Mapping):
        raise _invalid(f"the event must be a JSON object, got {json_type(event)}")
    if "prompt" not in event and "body" in event:
        raw = event["body"]
        if isinstance(raw, Mapping):
            return raw
        if not isinstance(raw, str):
            raise _invalid(f"body must be a JSON string, got {json_type(raw)}")
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _invalid(f"body is not valid JSON ({exc.msg})") from None
        if not isinstance(parsed, Mapping):
            raise _invalid(f"body must hold a JSON object, got {json_type(parsed)}")
        return parsed
    return event


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    params = body.get("inferenceParams")
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise _invalid(f"inferenceParams must be an object, got {json_type(params)}")
    secrets = sorted(str(key) for key in params if is_secret_field(str(key)))
    if secrets:
        raise _invalid(f"inferenceParams may not carry credentials ({', '.join(secrets)})")
    snake = {SNAKE_CASE.get(str(key), str(key)): value for key, value in params.items() if value is not None}
    try:
        SamplingParams.model_validate(snake)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "inferenceParams"
        camel = next((c for c, s in SNAKE_CASE.items() if s == field), field)
        raise _invalid(f"inferenceParams.{camel}: {err['msg']} (got {err.get('input')!r})") from None
    return snake


def _invalid(message: str) -> MtrlRefusal:
    return MtrlRefusal(VALIDATION_ERROR, message)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."
