"""`rollouts deploy --dry-run` through the real CDK CLI (node_modules/.bin/cdk, installed by `make setup`):
validates the settings and synthesizes the stack offline, without credentials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_pipeline.ops.cdk import CdkCli
from rollout_pipeline.ops.launch import Deployment
from tests.fake_cdk import REPO

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not (REPO / "node_modules" / ".bin" / "cdk").exists(), reason="run `make setup` (CDK CLI)")
def test_dry_run_synthesizes_the_stack_offline(no_aws_credentials: None, tmp_path: Path) -> None:
    cli = CdkCli(REPO, output_dir=tmp_path / "cdk.out", log_dir=tmp_path / "logs")
    deployment = Deployment(
        "dry-run-test",
        {"model_base_url": "https://models.example.org/v1", "group_size": 3},
        project_dir=REPO,
        cli=cli,
        out=(tmp_path / "out.txt").open("w"),
    )

    template = deployment.synth()

    assert template == tmp_path / "cdk.out" / "Rollouts-dry-run-test.template.json"
    resources = json.loads(template.read_text())["Resources"]
    assert len(resources) > 50
    outputs = json.loads(template.read_text())["Outputs"]
    config = json.loads(outputs["ExperimentConfig"]["Value"])
    assert config["group_size"] == 3
    assert config["model_base_url"] == "https://models.example.org/v1"
