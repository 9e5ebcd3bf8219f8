"""The agent an ART user writes first runs unchanged against the real local model (SmolLM2 behind llama-cpp-python),
four sessions at once, as `rollouts local demo` runs it: ART's own Strands math example (`OpenAIModel`, streaming,
content as a list of text parts; tests/agents/art_strands_math/, copied from ART unchanged) and a plain `openai`
client agent that streams with content parts. Each rollout gets a whole model reply (no warning from the agent
host) and its agent's own reward; at least 95% of them must (here: every one of 4: one group of four, all at once)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.demo import DemoResult, run_demo
from rollout_pipeline.local.model_server import model_server_available
from rollout_pipeline.local.pipeline import LocalSettings

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.slow,
    pytest.mark.timeout(600),  # 10-30 s each on an idle 2-core machine; minutes on a loaded one
    pytest.mark.skipif(not model_server_available(), reason="the local model is not installed (make setup-model)"),
]

AGENTS = Path(__file__).resolve().parents[1] / "agents"
ROWS = [{"id": "sum", "prompt": "What is 7 + 6?", "answer": "13"}]
#: Rollouts that must get a whole reply and their own reward.
SHARE = 0.95


def _demo(tmp_path: Path, module: str, agent_dir: Path, max_tokens: int) -> tuple[DemoResult, str]:
    dataset = tmp_path / "sums.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    settings = LocalSettings(
        experiment="e2e-first-agent",
        group_size=4,
        max_sessions=4,  # `rollouts local demo`'s default: four sessions ask the model at once
        work_dir=tmp_path / "work",
        agent_module=module,
        agent_env={"PYTHONPATH": str(agent_dir)},
        # Greedy: the same replies every run, so the test never depends on a lucky draw; what it checks (whole replies
        # to 4 sessions streaming at once) does not depend on the temperature.
        sampling_params={"temperature": 0.0, "max_tokens": max_tokens},
    )
    out = io.StringIO()
    report = run_demo(settings, dataset=dataset, rows=None, timeout_s=400, write_html_report=False, out=out)
    return report, out.getvalue()


def _whole_replies_with_rewards(report: DemoResult) -> int:
    good = 0
    for event in report.events:
        detail = event["detail"]
        if event["detail-type"] != DetailType.ROLLOUT_COMPLETED or detail["warning"]:
            continue
        calls = ((detail.get("result") or {}).get("_rollout_usage") or {}).get("model_calls") or {}
        good += calls.get("calls", 0) >= 1 and "rewards" in detail["result"]
    return good


@pytest.mark.parametrize(
    ("module", "agent_dir", "max_tokens"),
    [
        pytest.param("rl_app", AGENTS / "art_strands_math", 256, id="art-strands-example"),
        pytest.param("openai_stream_agent", AGENTS, 16, id="plain-openai-streaming"),
    ],
)
def test_an_unchanged_agent_gets_whole_replies_and_its_own_rewards(
    tmp_path: Path, module: str, agent_dir: Path, max_tokens: int
) -> None:
    report, text = _demo(tmp_path, module, agent_dir, max_tokens)
    total = len(ROWS) * 4
    assert report.completed is not None, text
    assert _whole_replies_with_rewards(report) >= SHARE * total, text
    assert report.model_warnings == 0, text
    assert report.ok, text
