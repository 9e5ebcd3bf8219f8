"""`Experiment.destroy` / `rollouts destroy` against an experiment's resources in moto and a stand-in CDK CLI
(tests/fake_cdk.py): refuses while rollouts are in flight unless forced (then cancels them), prunes the SDK's
subscriptions from the bus, empties the results as asked, then runs `cdk destroy` with the deployed settings."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.contracts import EVENT_SOURCE
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment, SdkError
from rollout_pipeline.sdk.errors import DeployFailed
from tests.fake_cdk import FakeCdkProject

REGION = "us-east-1"
STACK = "Rollouts-test-exp"


@pytest.fixture
def project(tmp_path: Path) -> FakeCdkProject:
    return FakeCdkProject(tmp_path / "project")


def _rules(experiment: Experiment) -> list[str]:
    found = clients.client("events").list_rules(EventBusName=experiment.bus_name)["Rules"]
    return sorted(rule["Name"] for rule in found)


def test_destroy_prunes_subscriptions_deletes_results_and_runs_cdk_destroy(
    experiment: Experiment, project: FakeCdkProject
) -> None:
    s3, sqs = clients.client("s3"), clients.client("sqs")
    stack_rules = _rules(experiment)
    name, queue_url = experiment.open_subscription({"source": [EVENT_SOURCE]}, suffix="tap-0123abcd")
    assert name in _rules(experiment)
    for index in range(3):
        s3.put_object(Bucket=experiment.results_bucket, Key=f"test-exp/q/{index}.json", Body=b"{}")
    out = io.StringIO()

    experiment.destroy(keep_results=False, project_dir=project.root, out=out)

    (call,) = project.calls()
    argv = call["argv"]
    assert argv[:4] == ["destroy", STACK, "-c", "experiment=test-exp"]
    assert argv[-2:] == ["--no-notices", "--force"]
    assert f"model_base_url={experiment.config.model_base_url}" in argv, "synth sees the deployed settings"
    assert "group_size=2" in argv
    assert call["telemetry"] == "1"
    assert _rules(experiment) == stack_rules, "the SDK's subscription is gone, the stack's own rules stay"
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=queue_url.rsplit("/", 1)[-1])
    assert experiment.results_bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    shown = out.getvalue()
    assert "removed 1 subscription(s)" in shown
    assert f"deleted 3 object version(s) of {experiment.results_bucket}" in shown
    assert "destroying Rollouts-test-exp: done" in shown


def test_destroy_keeps_the_results_by_default(experiment: Experiment, project: FakeCdkProject) -> None:
    s3 = clients.client("s3")
    s3.put_object(Bucket=experiment.results_bucket, Key="kept.json", Body=b"{}")
    out = io.StringIO()
    experiment.destroy(project_dir=project.root, out=out)
    assert project.verbs() == ["destroy"]
    assert s3.get_object(Bucket=experiment.results_bucket, Key="kept.json")["Body"].read() == b"{}"
    assert f"kept (results_retention=retain): {experiment.table_name}, {experiment.input_bucket}, " in out.getvalue()


def test_destroy_refuses_while_rollouts_are_queued_unless_forced(
    experiment: Experiment, project: FakeCdkProject
) -> None:
    batch_id = experiment.submit([{"id": "q1", "prompt": "hi"}])

    with pytest.raises(SdkError, match=r"has 2 rollout\(s\) in flight or queued: .* force=True \(--force\)"):
        experiment.destroy(project_dir=project.root, out=io.StringIO())
    assert project.calls() == [], "nothing ran"

    out = io.StringIO()
    experiment.destroy(force=True, project_dir=project.root, out=out)
    assert experiment.status(batch_id).failed_by_reason == {"cancelled": 2}
    assert f"cancelled 1 unfinished batch(es): {batch_id}" in out.getvalue()
    assert project.verbs() == ["destroy"]


def test_a_stack_that_deletes_its_results_needs_keep_results_false(
    resources: ExperimentResources, project: FakeCdkProject
) -> None:
    outputs = resources.stack_outputs()
    config = resources.config.model_copy(update={"results_retention": "destroy"})
    experiment = Experiment.from_outputs({**outputs, "ExperimentConfig": config.to_env()}, region=REGION)
    with pytest.raises(SdkError, match=r"results_retention=destroy\): export what you need, then destroy with"):
        experiment.destroy(project_dir=project.root, out=io.StringIO())
    assert project.calls() == []


def test_a_failed_destroy_is_one_line_with_the_cli_error(experiment: Experiment, project: FakeCdkProject) -> None:
    lines = [f"noise {i}" for i in range(50)] + ["❌  Rollouts-test-exp: Error: bucket is not empty", "more noise"]
    project.script({"destroy": {"exit": 1, "lines": lines}})
    with pytest.raises(DeployFailed) as failed:
        experiment.destroy(project_dir=project.root, out=io.StringIO())
    message = str(failed.value)
    assert message.startswith("destroy of Rollouts-test-exp failed: Rollouts-test-exp: Error: bucket is not empty")
    assert "noise" not in message


def test_cli_destroy_needs_the_experiment(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_pipeline.cli import EXIT_ERROR, main

    monkeypatch.delenv("ROLLOUTS_EXPERIMENT", raising=False)
    assert main(["destroy", "--yes"]) == EXIT_ERROR
    assert "no experiment: pass -e/--experiment NAME" in capsys.readouterr().err
