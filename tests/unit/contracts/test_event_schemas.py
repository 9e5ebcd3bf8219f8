"""The committed JSON Schemas match the models, and real event details validate against them."""

from __future__ import annotations

from datetime import UTC, datetime

import jsonschema
import pytest

from rollout_pipeline import schemas
from rollout_pipeline.contracts import (
    DETAIL_MODELS,
    BatchCompleted,
    DetailType,
    FailureReason,
    GroupCompleted,
    RolloutCompleted,
    RolloutFailed,
    Timings,
    parse_detail,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("name", sorted(schemas.generate()))
def test_committed_schema_matches_models(name: str) -> None:
    committed = (schemas.SCHEMA_DIR / name).read_text()
    assert committed == schemas.render(schemas.generate()[name]), (
        f"{name} drifted from rollout_pipeline/contracts/events.py: run `python -m rollout_pipeline.schemas`"
    )


def test_every_detail_type_has_a_schema() -> None:
    assert {schemas.schema_file_name(t) for t in DetailType} == set(schemas.generate())
    assert set(DETAIL_MODELS) == set(DetailType)


SAMPLES = [
    RolloutCompleted(
        event_id="e",
        exp_id="x",
        batch_id="b-1",
        input_id="q1",
        index=0,
        rollout_id="q1#0",
        session_id="s" * 33,
        attempt=1,
        rewards=[0.0, 1.0],
        reward=1.0,
        result_uri="s3://r/x/q1/s.json",
        result={"rewards": [0, 1]},
        timings=Timings(submitted_at=NOW, dispatched_at=NOW, finished_at=NOW, notified_at=NOW),
    ),
    RolloutFailed(
        event_id="e",
        exp_id="x",
        batch_id="b-1",
        input_id="q1",
        index=1,
        rollout_id="q1#1",
        reason=FailureReason.TIMEOUT,
        error="no result within 900 s",
        attempts_used=2,
        timings=Timings(),
    ),
    GroupCompleted(
        event_id="e",
        exp_id="x",
        batch_id="b-1",
        input_id="q1",
        group_size=2,
        rewards=[1.0, None],
        failures={"1": FailureReason.TIMEOUT},
        succeeded=1,
        failed=1,
        reward_mean=1.0,
        reward_std=0.0,
    ),
    BatchCompleted(
        event_id="e",
        exp_id="x",
        batch_id="b-1",
        rollouts_total=2,
        succeeded=1,
        failed=1,
        failed_by_reason={"timeout": 1},
        reward_mean=1.0,
        reward_std=0.0,
        reward_count=1,
        started_at=NOW,
        completed_at=NOW,
        duration_s=3.5,
    ),
]


@pytest.mark.parametrize("detail", SAMPLES, ids=lambda d: type(d).__name__)
def test_details_validate_against_committed_schema_and_round_trip(detail: object) -> None:
    model = type(detail)
    detail_type = next(t for t, m in DETAIL_MODELS.items() if m is model)
    as_json = detail.model_dump(mode="json")  # type: ignore[attr-defined]
    jsonschema.validate(as_json, schemas.load(detail_type))
    assert parse_detail(detail_type, as_json) == detail


def test_schema_rejects_unknown_failure_reason() -> None:
    bad = SAMPLES[1].model_dump(mode="json") | {"reason": "flaky"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schemas.load(DetailType.ROLLOUT_FAILED))
