"""The ART backend's pure parts: config, task -> row, event -> ART dump (no AWS, no ART rollout extra needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rollout_pipeline.contracts import FailureReason, RolloutCompleted, RolloutFailed, Timings
from rollout_pipeline.trainers import art

SID = "0b9f1c9e-5d2a-4c1e-9a57-6a1f0f0c1d2e"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def verl_task(**overrides: object) -> dict[str, object]:
    task: dict[str, object] = {
        "payload": {"question": "1+1?", "answer": "2"},
        "group_id": "4d5e6f70-uid",
        "global_steps": 12,
        "llm": {"model": "openai/Qwen3-0.6B", "base_url": "http://gw:8000/v1", "api_key": SID},
    }
    task.update(overrides)
    return task


def test_unknown_and_missing_config_keys_are_errors() -> None:
    with pytest.raises(ValueError, match="surprise"):
        art.PipelineSession(SID, None, experiment="e", surprise=1)
    with pytest.raises(ValueError, match="exactly one"):
        art.PipelineSession(SID, None)
    with pytest.raises(ValueError, match="exactly one"):
        art.PipelineSession(SID, None, experiment="e", outputs_file="o.json")
    assert art.PipelineSession(SID, None, experiment="e").config.max_attempts == 1


def test_verl_task_becomes_one_row_of_its_group() -> None:
    row = art.build_row(verl_task(), SID)
    assert row == {
        "question": "1+1?",
        "answer": "2",
        "id": "4d5e6f70-uid",
        "_rollout": {
            "base_url": "http://gw:8000/v1",
            "model_id": "Qwen3-0.6B",
            "capture_key": SID,
            "token_capture": "none",
        },
    }
    assert art.policy_version_of(verl_task()) == "12"
    assert art.policy_version_of(verl_task(global_steps=None)) is None


def test_slime_task_shape_is_accepted() -> None:
    task = {"question": "q", "_config": {"base_url": "http://gw/v1", "model_id": "m", "api_key": SID}}
    row = art.build_row(task, SID)
    assert row["id"] == SID
    assert row["question"] == "q"
    assert row["_rollout"]["model_id"] == "m"


def test_a_key_that_is_not_the_rollouts_capture_key_never_travels() -> None:
    task = verl_task(llm={"model": "m", "base_url": "http://gw/v1", "api_key": "sk-live-long-lived"})
    with pytest.raises(ValueError, match="long-lived credential"):
        art.build_row(task, SID)


@pytest.mark.parametrize(
    ("task", "match"),
    [
        (verl_task(payload="text"), "payload"),
        (verl_task(group_id=None), "group_id"),
        (verl_task(group_id="a/b"), "group_id"),
        (verl_task(llm={"model": "m"}), "missing"),
    ],
)
def test_bad_tasks_are_contract_errors(task: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        art.build_row(task, SID)


def _timings() -> Timings:
    return Timings(
        submitted_at=T0,
        dispatched_at=T0 + timedelta(seconds=1),
        finished_at=T0 + timedelta(seconds=5),
        notified_at=T0 + timedelta(seconds=5.25),
    )


def test_success_maps_to_the_pipelines_scalar_reward_and_metrics() -> None:
    event = RolloutCompleted(
        event_id="e1", exp_id="x", batch_id="art-1", input_id="g", index=0, rollout_id="g-0", session_id="s",
        attempt=1, policy_version="12", rewards=[0.0, 0.75], reward=0.75, result_uri="s3://b/k", timings=_timings(),
    )  # fmt: skip
    dump = art.to_dump(event, {"rewards": [0.0, 0.75], "metrics": {"turns": 3, "note": "x"}})
    assert dump.is_successful()
    assert dump.reward == 0.75
    assert dump.task_output is not None
    assert dump.task_output["reward"] == 0.75
    assert dump.task_output["excluded"] is False
    assert dump.metrics == {
        "turns": 3.0,
        "pipeline/attempt": 1.0,
        "pipeline/queue_s": 1.0,
        "pipeline/run_s": 4.0,
        "pipeline/notify_s": 0.25,
    }


@pytest.mark.parametrize("reason", list(FailureReason))
def test_every_typed_failure_is_an_exception_never_a_reward(reason: FailureReason) -> None:
    event = RolloutFailed(
        event_id="e2", exp_id="x", batch_id="art-1", input_id="g", index=0, rollout_id="g-0", reason=reason,
        error="it broke", attempts_used=1, timings=_timings(),
    )  # fmt: skip
    dump = art.to_dump(event)
    assert not dump.is_successful()
    assert dump.reward is None
    assert dump.exception == f"{reason.value}: it broke"
    assert dump.task_output is not None
    assert dump.task_output["excluded"] is True  # masked by the trainer (on_rollout_failure), never a reward of 0
