"""`rollouts report` through the CLI entry point against moto: a cancelled batch read through the SDK's status and
export paths becomes one self-contained HTML file whose failure chart holds the batch's rollouts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, main
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment
from tests.conftest import REGION
from tests.integration.sdk.test_sdk_submit import _deploy_stack

pytest.importorskip("matplotlib")

E = ["-e", "test-exp", "--region", REGION]


@pytest.fixture
def experiment(resources: ExperimentResources) -> Experiment:
    _deploy_stack(resources.stack_outputs())
    return Experiment.attach("test-exp", region=REGION)


def _points(page: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r'id="chart-([a-z]+)" data-points="(\d+)"', page)}


def test_report_of_a_cancelled_batch(
    experiment: Experiment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch_id = experiment.submit([{"id": "q1", "p": 1}, {"id": "q2", "p": 2}], group_size=2)
    experiment.cancel(batch_id)
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"detail-type": "Batch Accepted", "detail": {"batch_id": batch_id}}) + "\nnot json\n")
    target = tmp_path / "r.html"

    assert main(["report", *E, "--batch", batch_id, "-o", str(target), "--events", str(events)]) == EXIT_OK
    assert f"report of batch {batch_id} (4 rollouts) written to {target}" in capsys.readouterr().out
    page = target.read_text()
    assert not re.search(r"<script|<link|(src|href)=\"https?:", page), "self-contained: nothing to fetch"
    points = _points(page)
    assert points["failures"] == 4  # every rollout cancelled
    assert points["retries"] == 4
    assert points["rewards"] == 0
    assert points["latency"] == 0
    assert "cancelled" in page


def test_report_of_an_unknown_batch_is_one_error_line(
    experiment: Experiment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *E, "--batch", "nope-000000000000", "-o", str(tmp_path / "r.html")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no batch 'nope-000000000000'" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.html").exists()
