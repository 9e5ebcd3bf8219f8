"""A model reply cut short is never a silent reward: an unchanged agent that streams with the plain openai client
scores whatever came back, and the rollout carries the warning the agent host saw (its event, its group member,
the demo's line and summary), while the rollouts whose replies were whole carry none."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline.agent.testing import Cut, FakeModelServer, RecordedRequest
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.demo import run_demo
from rollout_pipeline.local.pipeline import LocalSettings

pytestmark = pytest.mark.slow

AGENTS = Path(__file__).resolve().parents[1] / "agents"


def _reply(request: RecordedRequest) -> str | Cut:
    prompt = json.dumps(request.body.get("messages") or [])
    return Cut("1") if "CUT" in prompt else "13"


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(_reply) as server:
        yield server


def test_a_cut_reply_is_a_warning_on_its_rollout_never_a_silent_reward(model: FakeModelServer, tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    rows = [
        {"id": "whole", "prompt": "What is 7 + 6?", "answer": "13"},
        {"id": "cut", "prompt": "CUT 7 + 6", "answer": "13"},
    ]
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = LocalSettings(
        experiment="e2e-replies",
        group_size=2,
        model_url=model.base_url,
        max_sessions=4,
        work_dir=tmp_path / "work",
        agent_module="openai_stream_agent",
        agent_env={"PYTHONPATH": str(AGENTS)},
    )
    out = io.StringIO()
    report = run_demo(settings, dataset=dataset, rows=None, timeout_s=120, write_html_report=False, out=out)
    text = out.getvalue()
    assert report.ok, text
    assert all(r.body["stream"] for r in model.requests)  # streamed, content as a list of text parts
    assert all(isinstance(r.body["messages"][-1]["content"], list) for r in model.requests)
    rollouts = {
        e["detail"]["rollout_id"]: e["detail"]
        for e in report.events
        if e["detail-type"] == DetailType.ROLLOUT_COMPLETED
    }
    assert len(rollouts) == 4
    for rollout_id, detail in rollouts.items():
        calls = detail["result"]["_rollout_usage"]["model_calls"]
        if rollout_id.startswith("cut"):
            assert detail["reward"] == 0.0  # the agent scored the cut reply: the warning says so
            assert "model replies: 1 cut short of 1 call(s)" in detail["warning"]
            assert calls == {"calls": 1, "cut": 1, "empty": 0, "errors": 0, "max_tokens": 0}
            assert f"WARNING {rollout_id}: model replies: 1 cut short" in text
        else:
            assert detail["reward"] == 1.0
            assert detail["warning"] is None
            assert calls["calls"] == 1
    groups = {
        e["detail"]["input_id"]: e["detail"] for e in report.events if e["detail-type"] == DetailType.GROUP_COMPLETED
    }
    assert all(m["warning"] for m in groups["cut"]["members"])
    assert not any(m["warning"] for m in groups["whole"]["members"])
    assert report.model_warnings == 2
    assert "WARNING model replies: 2 rollout(s) computed their result from a reply" in text
