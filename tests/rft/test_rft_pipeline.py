"""End to end with the real SageMaker RFT SDK: the example RFT agent, unchanged, through the local pipeline.

The local pipeline (moto server, the Lambda handlers as queue consumers, agent processes behind the local ACR
adapter) detects that `rollout_pipeline.agent.examples.rft_math_agent` is an RFT agent and serves it through the RFT
host. The agent calls a fake OpenAI-compatible model on loopback through the front door and reports its reward with
the SDK's own `@sagemaker_rft_handler` / `RolloutFeedbackClient`."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.agent.host import resolve_kind
from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.contracts import DetailType, FailureReason
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft-local"
RFT_AGENT = "rollout_pipeline.agent.examples.rft_math_agent"
ROWS = [
    {"id": "q-right", "question": "7 + 8", "answer": "15"},
    {"id": "q-wrong", "question": "WRONG 7 + 7", "answer": "14"},
    {"id": "q-fail", "question": "2 + 2", "answer": "4", "fail": "the tool server is down"},
    {"id": "q-none", "question": "1 + 1", "answer": "2", "no_reward": True},
]
GROUP_SIZE = 2
WAIT_S = 150.0


def _reply(request: RecordedRequest) -> str:
    text = json.dumps(request.body.get("messages") or [])
    return "13" if "WRONG" in text else "15"


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(_reply) as server:
        yield server


def test_the_example_rft_agent_is_detected_by_the_host() -> None:
    assert resolve_kind(RFT_AGENT, "auto") == "rft"


def test_the_unchanged_rft_agent_runs_through_the_local_pipeline(model: FakeModelServer, tmp_path: Path) -> None:
    dataset = tmp_path / "rft.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    settings = LocalSettings(
        experiment="e2e-rft",
        group_size=GROUP_SIZE,
        model_url=model.base_url,
        model_id="fake-model",
        max_sessions=4,
        max_attempts=1,
        warm_processes=2,
        sweep_interval_s=2.0,
        work_dir=tmp_path / "work",
        agent_module=RFT_AGENT,
        agent_env={"SAGEMAKER_JOB_ARN": JOB},
        model_api_key="local-model-key",
    )
    events: list[Any] = []
    with LocalPipeline(settings) as pipeline:
        batch_id = pipeline.experiment.submit_file(dataset)
        for event in pipeline.experiment.events(batch_id=batch_id, timeout=WAIT_S):
            events.append(event)
            if event.detail_type is DetailType.BATCH_COMPLETED:
                break
        deadline = time.monotonic() + 10
        while pipeline.active_sessions() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = pipeline.active_sessions()
        dead = pipeline.dead_letters()

    by_type = Counter(e.detail_type for e in events)
    assert by_type[DetailType.BATCH_COMPLETED] == 1, by_type
    completed = [e.detail for e in events if e.detail_type is DetailType.ROLLOUT_COMPLETED]
    failed = [e.detail for e in events if e.detail_type is DetailType.ROLLOUT_FAILED]
    rewards = {(d.input_id, d.index): d.reward for d in completed}
    assert rewards == {("q-right", 0): 1.0, ("q-right", 1): 1.0, ("q-wrong", 0): 0.0, ("q-wrong", 1): 0.0}
    reasons = {(d.input_id, d.index): (d.reason, d.error) for d in failed}
    assert {key: reason for key, (reason, _) in reasons.items()} == {
        ("q-fail", 0): FailureReason.AGENT_ERROR,
        ("q-fail", 1): FailureReason.AGENT_ERROR,
        ("q-none", 0): FailureReason.INVALID_RESULT,
        ("q-none", 1): FailureReason.INVALID_RESULT,
    }
    assert all("the tool server is down" in reasons[("q-fail", index)][1] for index in range(GROUP_SIZE))
    for detail in completed:
        assert detail.result is not None
        assert detail.result["rft"]["reported_status"] == "ready", "the SDK reported through the front door"
    assert left == [], "every session stopped"
    assert not any(dead.values()), dead

    # The model saw the SDK's RFT headers (trajectory = the session), our key and model id, never the AWS bearer.
    sessions = {d.session_id for d in [*completed, *failed] if d.input_id != "q-fail"}
    calls = model.requests
    assert calls
    assert {call.header("X-Amzn-SageMaker-Trajectory-Id") for call in calls} == sessions
    assert {call.header("X-Amzn-SageMaker-Job-Arn") for call in calls} == {JOB}
    assert {call.header("Authorization") for call in calls} == {"Bearer local-model-key"}
    assert {call.body.get("model") for call in calls} == {"fake-model"}
    assert not any("sagemaker-api-key" in json.dumps(call.headers) for call in calls)


def test_the_unchanged_rft_agent_runs_in_warm_sessions(model: FakeModelServer, tmp_path: Path) -> None:
    """The warm pool with the example RFT agent: the agent host answers the warm-ups (the RFT SDK's handler never
    sees one) and every rollout of the batch after the pause runs in a warm session, unchanged."""
    from rollout_pipeline.local.demo import run_demo

    dataset = tmp_path / "rft-warm.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS[:2]))
    settings = LocalSettings(
        experiment="e2e-rft-warm",
        group_size=GROUP_SIZE,
        model_url=model.base_url,
        model_id="fake-model",
        max_sessions=4,
        max_attempts=1,
        warm_sessions=4,
        warm_processes=1,
        work_dir=tmp_path / "work",
        agent_module=RFT_AGENT,
        agent_env={"SAGEMAKER_JOB_ARN": JOB},
        model_api_key="local-model-key",
    )
    import io

    out = io.StringIO()
    report = run_demo(settings, dataset=dataset, rows=None, timeout_s=WAIT_S, write_html_report=False, out=out)
    assert report.ok, out.getvalue()
    assert (report.warm_ready, report.warm_started, report.warm_reuses) == (4, 4, 4), out.getvalue()
    assert report.rollouts_ok == 4
    assert report.sessions_left == []
