"""`rollouts local demo --warm-sessions N` end to end: the warm pool fills before the batch, every rollout of the
batch starts in a warm session (the local AgentCore counts the warm-ups its agent host answered and the rollouts run
in them), the example ART agent runs unchanged, and no session is left running."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline.agent.testing import FakeModelServer
from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.local.demo import run_demo
from rollout_pipeline.local.pipeline import LocalSettings

pytestmark = pytest.mark.slow

ROWS = [{"id": f"q{i}", "question": "What is 40 + 2?", "answer": "#### 42"} for i in range(2)]


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(lambda _request: "Let me compute.\n#### 42") as server:
        yield server


def test_a_batch_after_a_pause_starts_every_rollout_in_a_warm_session(model: FakeModelServer, tmp_path: Path) -> None:
    dataset = tmp_path / "warm.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    settings = LocalSettings(
        experiment="e2e-warm",
        group_size=2,
        model_url=model.base_url,
        model_id="fake-model",
        max_sessions=4,
        warm_sessions=4,
        warm_processes=1,
        work_dir=tmp_path / "work",
    )
    out = io.StringIO()
    report = run_demo(settings, dataset=dataset, rows=None, timeout_s=240, write_html_report=False, out=out)
    text = out.getvalue()
    assert report.ok, text
    assert report.warm_ready == 4
    assert (report.warm_started, report.warm_reuses) == (4, 4), text  # every rollout in a warm session
    assert report.warmups >= 4  # answered by the agent host (a refill after the batch may add more)
    assert report.sessions_left == []  # the pool stopped at the end, every rollout's session stopped
    assert "4 of 4 rollouts started in a warm session" in text
    assert text.count("(attempt 1, warm session)") == 4


def test_the_demo_takes_warm_sessions_on_the_command_line(
    model: FakeModelServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "warm.jsonl"
    dataset.write_text(json.dumps(ROWS[0]) + "\n")
    args = ["local", "demo", "--model-url", model.base_url, "--dataset", str(dataset), "--group-size", "2"]
    args += ["--max-sessions", "2", "--warm-sessions", "3", "--no-report", "--work-dir", str(tmp_path / "w")]
    assert main(args) == EXIT_OK
    text = capsys.readouterr().out
    assert "starting 2 session(s) ahead of the batch (3 asked: capped by --max-sessions 2)" in text  # count against it
    assert "2 of 2 rollouts started in a warm session" in text
