"""`rollouts local demo --budget-usd X` shows the budget end to end (the local pipeline with the fake ACR in place of
agent processes): the warning, the exhaustion with what waits, the pause (only what was in flight ends), the demo
raising the budget as `rollouts budget set` would, and the batch completing with every rollout once."""

from __future__ import annotations

import gc
import io
import logging
from pathlib import Path

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.costs import PIPELINE_USD_PER_ROLLOUT
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.demo import run_demo
from rollout_pipeline.local.pipeline import LocalSettings

pytestmark = pytest.mark.timing


def test_the_demo_pauses_on_its_budget_and_completes_once_it_is_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    usage = {"_rollout_usage": {"cpu_s": 0.0, "rollouts": 1}}  # CPU measured as nothing: the pipeline's part dominates
    settings = LocalSettings(
        experiment="demo-budget",
        group_size=4,
        max_sessions=2,
        model_url="http://127.0.0.1:9/v1",
        sweep_interval_s=2.0,
        runtime_factory=lambda resources: FakeAgentRuntime(
            store=S3ObjectStore(), behaviour=AgentBehaviour(delay_s=1.0, extra=usage)
        ),
        work_dir=tmp_path / "work",
        # about 5 rollouts (a session of about a second at 128 MB, plus the pipeline's own part, each); a rollout
        # lasts 1 s and 2 run at once, so at most a few start between two reads of the spend (FRESH_S)
        experiment_settings={"budget_usd": 5 * PIPELINE_USD_PER_ROLLOUT, "session_memory_gb": 0.125},
    )
    out = io.StringIO()
    with caplog.at_level(logging.WARNING):
        report = run_demo(settings, rows=4, timeout_s=300, write_html_report=False, out=out)
        gc.collect()  # a stream left open would remove its subscription now, with the local endpoint gone
    text = out.getvalue()
    # (another test's stream collected here may warn about its own experiment's subscription: not this demo's)
    left = [m for m in (r.getMessage() for r in caplog.records) if "delete it by hand" in m and "demo-budget" in m]
    assert left == []
    # completed, every rollout once, nothing dead-lettered (whether the last stops came within the summary's grace
    # is the demo's own check, tested elsewhere)
    assert report.completed is not None, text
    assert not any(report.dead_letters.values()), text
    assert (report.budget_warnings, report.budget_exhaustions) == (1, 1), text
    assert report.waited_on_budget > 0, text  # queued while paused, none failed
    assert report.ended_after_pause <= settings.max_sessions, text  # only what was in flight
    assert report.rollouts_ok == 16
    assert "Budget Exhausted" in text
    assert "  paused: 0 running" in text
    assert "as `rollouts budget set -e demo-budget" in text
    assert "budget: 1 warning, 1 exhausted" in text
    assert "what this run would cost on AgentCore" in text
