"""MTRL's custom-agent Lambda contract (`contracts.mtrl`) and the forwarder's answers, without AWS: every malformed
invocation is refused with MTRL's `ValidationError` (a job of another account: `AccessDenied`, a store failing:
`InternalServerError`) before anything is written; a good one is one row, one batch per (job, rollout id)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from lambdas.mtrl_forwarder import function_scope
from rollout_pipeline.config import ExperimentConfig, HandlerSettings
from rollout_pipeline.contracts import FileOptions, parse_row
from rollout_pipeline.contracts.mtrl import (
    MTRL_BATCH_PREFIX,
    MtrlRefusal,
    mtrl_batch_id,
    mtrl_source,
    parse_mtrl_event,
    parse_mtrl_source,
)
from rollout_pipeline.ingest.core import IngestResult
from rollout_pipeline.ingest.mtrl import MtrlForwarder

ACCOUNT, REGION = "123456789012", "us-east-1"
JOB = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:job/mtrl-unit"
GOOD: dict[str, Any] = {
    "prompt": "What is 7 + 8?",
    "metadata": {"jobArn": JOB, "rolloutId": "traj_01-a.b"},
    "inferenceParams": {"temperature": 0.8, "topP": 0.9, "maxTokens": 128},
}


def _with(**changes: Any) -> dict[str, Any]:
    event = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            event[outer][inner] = value
        elif value is None:
            event.pop(key, None)
        else:
            event[key] = value
    return event


@dataclass
class _Ingestion:
    """Stands in for `Ingestion`: records submissions; `fail` makes them raise."""

    fail: Exception | None = None
    outcome: str = "accepted"
    submitted: list[dict[str, Any]] = field(default_factory=list)
    exp_id: str = "unit"
    settings: HandlerSettings = field(
        default_factory=lambda: HandlerSettings(
            table_name="t",
            input_bucket="i",
            results_bucket="r",
            rollout_queue_url="q",
            bus_name="b",
            experiment=ExperimentConfig(name="unit", agent_kind="rft", mtrl_environment=True, rollout_timeout_s=300),
        )
    )

    def submit_once(self, batch_id: str, rows: list[Any], **kwargs: Any) -> IngestResult:
        if self.fail is not None:
            raise self.fail
        self.submitted.append({"batch_id": batch_id, "rows": rows, **kwargs})
        return IngestResult(self.outcome, batch_id, rows_accepted=1, rollouts_enqueued=1)  # type: ignore[arg-type]


def _forward(event: Any, ingestion: _Ingestion | None = None, **scope: Any) -> tuple[dict[str, Any], _Ingestion]:
    stage = ingestion or _Ingestion()
    forwarder = MtrlForwarder(stage)  # type: ignore[arg-type]
    result = forwarder.forward(event, owner="req-1", account=scope.get("account", ACCOUNT), region=REGION)
    return result.response, stage


MALFORMED: dict[str, Any] = {
    "not an object": ["prompt"],
    "no prompt": _with(prompt=None),
    "empty prompt": _with(prompt="   "),
    "prompt not a string": _with(prompt=["a", "b"]),
    "no metadata": _with(metadata=None),
    "metadata not an object": _with(metadata="job"),
    "no job ARN": _with(**{"metadata.jobArn": None}),
    "job ARN not SageMaker's": _with(**{"metadata.jobArn": "arn:aws:s3:::bucket/key"}),
    "no rollout id": _with(**{"metadata.rolloutId": None}),
    "empty rollout id": _with(**{"metadata.rolloutId": ""}),
    "rollout id with a slash": _with(**{"metadata.rolloutId": "a/b"}),
    "rollout id with a space": _with(**{"metadata.rolloutId": "a b"}),
    "rollout id not ASCII": _with(**{"metadata.rolloutId": "tr\u00e4j"}),
    "rollout id too long": _with(**{"metadata.rolloutId": "x" * 257}),
    "inferenceParams not an object": _with(inferenceParams=[1]),
    "topP out of range": _with(**{"inferenceParams.topP": 1.5}),
    "maxTokens not positive": _with(**{"inferenceParams.maxTokens": 0}),
    "temperature not a number": _with(**{"inferenceParams.temperature": "hot"}),
    "body not JSON": {"body": "{not json"},
    "body not an object": {"body": json.dumps([GOOD])},
    "body of the wrong type": {"body": 42},
    "a credential in the params": _with(inferenceParams={"api_key": "sk-123"}),
}


@pytest.mark.parametrize("event", list(MALFORMED.values()), ids=list(MALFORMED))
def test_a_malformed_invocation_is_a_validation_error_and_nothing_is_submitted(event: Any) -> None:
    response, stage = _forward(event)
    assert response["errorType"] == "ValidationError", response
    assert response["errorMessage"]
    assert stage.submitted == []


def test_the_refusal_names_the_field() -> None:
    assert "metadata.rolloutId" in _forward(MALFORMED["rollout id with a slash"])[0]["errorMessage"]
    assert "inferenceParams.topP" in _forward(MALFORMED["topP out of range"])[0]["errorMessage"]
    assert "prompt" in _forward(MALFORMED["empty prompt"])[0]["errorMessage"]


def test_a_job_of_another_account_is_access_denied_and_of_another_region_a_validation_error() -> None:
    response, stage = _forward(GOOD, account="999999999999")
    assert response["errorType"] == "AccessDenied"
    other_region = _with(**{"metadata.jobArn": JOB.replace(REGION, "eu-west-1")})
    assert _forward(other_region)[0]["errorType"] == "ValidationError"
    assert stage.submitted == []


def test_a_store_failure_is_an_internal_server_error_for_mtrl_to_retry() -> None:
    response, _stage = _forward(GOOD, _Ingestion(fail=RuntimeError("DynamoDB unreachable")))
    assert response["errorType"] == "InternalServerError"
    assert "DynamoDB" not in response["errorMessage"], "internal details stay in the function's log"


@pytest.mark.parametrize("shape", ["object", "body string", "body object"])
def test_a_good_invocation_is_one_row_of_one_rollout_and_answers_at_once(shape: str) -> None:
    event = {"object": GOOD, "body string": {"body": json.dumps(GOOD)}, "body object": {"body": GOOD}}[shape]
    response, stage = _forward(event)
    assert response == {}
    (submitted,) = stage.submitted
    assert submitted["batch_id"] == mtrl_batch_id(JOB, "traj_01-a.b")
    assert submitted["source"] == mtrl_source(JOB, "traj_01-a.b")
    options: FileOptions = submitted["options"]
    assert (options.group_size, options.max_attempts, options.rollout_timeout_s) == (1, 1, 300)
    (row,) = submitted["rows"]
    assert row.input_id == "traj_01-a.b"
    assert row.payload == {"prompt": GOOD["prompt"], "metadata": {"jobArn": JOB, "rolloutId": "traj_01-a.b"}}
    assert row.rollout_overrides == {"sampling_params": {"temperature": 0.8, "top_p": 0.9, "max_tokens": 128}}


@pytest.mark.parametrize("outcome", ["already_done", "in_progress"])
def test_a_repeated_invocation_answers_at_once_too(outcome: str) -> None:
    response, _stage = _forward(GOOD, _Ingestion(outcome=outcome))
    assert response == {}


def test_ids_batches_and_sources() -> None:
    batch = mtrl_batch_id(JOB, "r-1")
    assert batch.startswith(MTRL_BATCH_PREFIX)
    assert batch == mtrl_batch_id(JOB, "r-1") != mtrl_batch_id(JOB, "r-2") != mtrl_batch_id(JOB + "x", "r-1")
    assert parse_mtrl_source(mtrl_source(JOB, "r-1")) == (JOB, "r-1")
    for source in (None, "sdk", "mtrl:not-an-arn#r", f"mtrl:{JOB}", f"mtrl:{JOB}#a/b"):
        assert parse_mtrl_source(source) is None
    # A rollout id that is not a valid input id still names one group, by its digest.
    rollout = parse_mtrl_event(_with(**{"metadata.rolloutId": "-starts-with-a-dash"}))
    assert rollout.input_id.startswith("mtrl-")
    assert parse_row(rollout.row(), 1).input_id == rollout.input_id


def test_the_refusal_is_the_contracts_answer() -> None:
    with pytest.raises(MtrlRefusal) as refused:
        parse_mtrl_event({"prompt": ""})
    assert refused.value.response() == {"errorType": "ValidationError", "errorMessage": str(refused.value)}


class _Context:
    invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:rollouts-exp-mtrl-forwarder"


def test_the_function_knows_its_account_and_region_from_its_own_arn() -> None:
    assert function_scope(_Context()) == (ACCOUNT, REGION)
    assert function_scope(object()) == (None, None)
