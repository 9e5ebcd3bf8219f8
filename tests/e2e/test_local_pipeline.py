"""End to end: the local pipeline (moto server, the Lambda handlers as queue consumers, agent processes behind the
local ACR adapter) from a dataset dropped in the input bucket to the events the trainer SDK receives."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.demo import run_demo
from rollout_pipeline.local.model_server import model_server_available
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.sdk.replay import REPLAYED
from tests.integration.lifecycle.test_agent_compat import ART_AGENT_SOURCE

pytestmark = pytest.mark.slow

ROWS = [
    {"id": "q-right", "question": "What is 40 + 2?", "answer": "#### 42"},
    {"id": "q-wrong", "question": "What is 40 + 1? WRONG", "answer": "#### 41"},
    {"id": "q-three", "question": "What is 6 * 7?", "answer": "#### 42"},
]
GROUP_SIZE = 2
WAIT_S = 120.0


def _reply(request: RecordedRequest) -> str:
    text = json.dumps(request.body.get("messages") or [])
    return "I think it is\n#### 40" if "WRONG" in text else "Let me compute.\n#### 42"


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(_reply) as server:
        yield server


def _dataset(tmp_path: Path) -> Path:
    path = tmp_path / "e2e.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def _run_batch(pipeline: LocalPipeline, dataset: Path) -> tuple[str, list[Any]]:
    batch_id = pipeline.experiment.submit_file(dataset)
    events = []
    for event in pipeline.experiment.events(batch_id=batch_id, timeout=WAIT_S):
        events.append(event)
        if event.detail_type is DetailType.BATCH_COMPLETED:
            break
    return batch_id, events


def _sessions_left(pipeline: LocalPipeline, grace_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + grace_s
    while pipeline.active_sessions() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pipeline.active_sessions()


def _assert_complete_batch(events: list[Any], expected_rewards: dict[str, float]) -> None:
    by_type = Counter(e.detail_type for e in events)
    assert by_type[DetailType.BATCH_ACCEPTED] == 1
    assert by_type[DetailType.BATCH_COMPLETED] == 1, f"no Batch Completed within {WAIT_S} s: {by_type}"
    assert by_type[DetailType.ROLLOUT_COMPLETED] == len(ROWS) * GROUP_SIZE, by_type
    assert by_type[DetailType.ROLLOUT_FAILED] == 0
    assert len({e.event_id for e in events}) == len(events), "each event handed over once"

    groups = {e.detail.input_id: e.detail for e in events if e.detail_type is DetailType.GROUP_COMPLETED}
    assert set(groups) == set(expected_rewards), "one Group Completed per input"
    for input_id, reward in expected_rewards.items():
        assert groups[input_id].rewards == [reward] * GROUP_SIZE
        assert groups[input_id].succeeded == GROUP_SIZE

    completed = [e for e in events if e.detail_type is DetailType.ROLLOUT_COMPLETED]
    assert len({(e.detail.input_id, e.detail.index) for e in completed}) == len(ROWS) * GROUP_SIZE
    for event in completed:
        rollout = event.detail
        assert rollout.reward == expected_rewards[rollout.input_id]
        assert rollout.result_uri.startswith("s3://rollouts-")
        assert rollout.timings.finished_at is not None
        # A batch stream re-reads the ledger while its new subscription's rule may still be propagating; a copy
        # rebuilt there can reach the consumer before the published one, and carries no `notified_at`.
        assert (rollout.timings.notified_at is None) == (REPLAYED in event.envelope)

    done = next(e.detail for e in events if e.detail_type is DetailType.BATCH_COMPLETED)
    assert done.rollouts_total == done.succeeded == len(ROWS) * GROUP_SIZE
    assert done.failed == 0


def test_example_agent_pipeline_ends_every_group_and_stops_every_session(
    model: FakeModelServer, tmp_path: Path
) -> None:
    settings = LocalSettings(
        experiment="e2e-math",
        group_size=GROUP_SIZE,
        model_url=model.base_url,
        model_id="fake-model",
        max_sessions=3,
        warm_processes=1,
        sweep_interval_s=2.0,
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as pipeline:
        batch_id, events = _run_batch(pipeline, _dataset(tmp_path))
        left = _sessions_left(pipeline)
        dead = pipeline.dead_letters()
        stopped = list(pipeline.runtime.stopped_sessions)
    _assert_complete_batch(events, {"q-right": 1.0, "q-wrong": 0.0, "q-three": 1.0})
    assert left == [], "every terminal rollout stopped its session"
    assert not any(dead.values()), dead
    sessions = {e.detail.session_id for e in events if e.detail_type is DetailType.ROLLOUT_COMPLETED}
    assert sessions <= set(stopped)
    assert all(s.startswith(batch_id) for s in sessions)
    # The agent really called the model, with the experiment's model id.
    assert {r.body.get("model") for r in model.requests} >= {"fake-model"}


def test_unmodified_art_agent_runs_in_the_pipeline(model: FakeModelServer, tmp_path: Path) -> None:
    agent_dir = tmp_path / "art_agent"
    agent_dir.mkdir()
    (agent_dir / "plain_art_agent.py").write_text(ART_AGENT_SOURCE)
    settings = LocalSettings(
        experiment="e2e-art",
        group_size=GROUP_SIZE,
        model_url=model.base_url,
        model_id="fake-model",
        max_sessions=3,
        warm_processes=1,
        sweep_interval_s=2.0,
        work_dir=tmp_path / "work",
        agent_module="plain_art_agent",
        agent_env={"PYTHONPATH": str(agent_dir)},
    )
    with LocalPipeline(settings) as pipeline:
        _, events = _run_batch(pipeline, _dataset(tmp_path))
        left = _sessions_left(pipeline)
    # The plain ART agent rewards "#### 42" answers with 1.0.
    _assert_complete_batch(events, {"q-right": 1.0, "q-wrong": 0.0, "q-three": 1.0})
    assert left == []
    art_result = next(e.detail for e in events if e.detail_type is DetailType.ROLLOUT_COMPLETED).result
    assert art_result is not None
    assert art_result["status_code"] == 200
    assert "payload" in art_result


@pytest.mark.real_model
@pytest.mark.skipif(not model_server_available(), reason="the local model is not installed (make setup-model)")
def test_demo_with_the_real_local_model(tmp_path: Path) -> None:
    out = tmp_path / "demo.txt"
    settings = LocalSettings(
        experiment="e2e-real",
        group_size=2,
        work_dir=tmp_path / "work",
        sampling_params={"temperature": 0.7, "max_tokens": 96},
    )
    with out.open("w") as stream:
        report = run_demo(settings, rows=2, timeout_s=600, out=stream)
    text = out.read_text()
    assert report.ok, text
    assert "Group Completed" in text
    assert "COMPLETED" in text
    assert text.count("advantages [") == 2  # one per group
    assert f"groups 2: {report.groups_with_signal} (" in text
    assert report.report_path is not None, report.report_error
    page = report.report_path.read_text()
    assert report.batch_id in page
    assert 'id="chart-rewards" data-points="4"' in page  # the batch's 4 rollouts, every one scored
    assert report.completed is not None
    assert report.completed.duration_s is not None
    duration = f"{report.completed.duration_s:.1f} s"
    assert f"COMPLETED in {duration}" in text  # the terminal and the report agree on the batch's duration
    assert f"<b>{duration}</b><span>batch duration</span>" in page
