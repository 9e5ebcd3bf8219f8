"""`Experiment.launch` / `rollouts deploy` of an existing stack (an update) against an experiment in moto and a
stand-in CDK CLI: drain before upgrading (`rollout_pipeline.ops.upgrade`). An update refuses while anything is in
flight (slots on the sharded counters or on the single counter of ledger layout 1, messages in the rollout or ingest
queue) unless forced; a new ledger layout or a new `endpoints` refuses even when forced."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.ledger import keys
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ops import upgrade
from rollout_pipeline.ops.launch import Deployment
from rollout_pipeline.sdk import Experiment, SdkError
from tests.fake_cdk import FakeCdkProject
from tests.integration.sdk.test_sdk_submit import _deploy_stack

REGION = "us-east-1"
STACK = "Rollouts-test-exp"
DIFFERS = ["Stack Rollouts-test-exp", "[~] AWS::Lambda::Function Dispatch", "✨  Number of stacks with differences: 1"]


@pytest.fixture
def project(tmp_path: Path, resources: ExperimentResources) -> FakeCdkProject:
    project = FakeCdkProject(tmp_path / "project")
    project.script({"diff": {"exit": 1, "lines": DIFFERS}, "deploy": {"outputs": {STACK: resources.stack_outputs()}}})
    _deploy_stack(resources.stack_outputs())
    return project


@pytest.fixture
def experiment(resources: ExperimentResources) -> Experiment:
    return Experiment.from_outputs(resources.stack_outputs(), region=REGION)


def update(resources: ExperimentResources, project: FakeCdkProject, **changes: Any) -> tuple[Deployment, io.StringIO]:
    """A deploy of the running experiment's own settings, with `changes`."""
    settings: dict[str, Any] = {
        **resources.config.model_dump(mode="json", exclude={"name"}),
        "allow_private_model_url": True,  # local mode's loopback model URL
        **changes,
    }
    out = io.StringIO()
    deployment = Deployment(
        "test-exp",
        settings,
        project_dir=project.root,
        region=REGION,
        checks=lambda _plan, _aws: [],
        confirm=lambda _question: True,
        out=out,
        poll_s=3600,
    )
    return deployment, out


def test_an_update_refuses_while_rollouts_are_queued_unless_forced(
    resources: ExperimentResources, project: FakeCdkProject, experiment: Experiment
) -> None:
    experiment.submit([{"id": "q1", "prompt": "hi"}])
    deployment, _out = update(resources, project, max_sessions=resources.config.max_sessions + 1)
    with pytest.raises(SdkError, match=r"has 0 session\(s\) holding a slot, 2 rollout message\(s\) queued in flight"):
        deployment.deploy(yes=True)
    assert project.verbs() == ["diff"], "nothing deployed"

    deployment, out = update(resources, project, max_sessions=resources.config.max_sessions + 1)
    deployment.deploy(yes=True, force=True)
    assert project.verbs() == ["diff", "diff", "deploy"]
    assert "going on as forced" in out.getvalue()


def test_an_update_of_a_drained_experiment_goes_through(
    resources: ExperimentResources, project: FakeCdkProject
) -> None:
    deployment, _out = update(resources, project, max_sessions=resources.config.max_sessions + 1)
    deployment.deploy(yes=True)
    assert project.verbs() == ["diff", "deploy"]


def test_the_single_counter_of_layout_one_counts(resources: ExperimentResources, project: FakeCdkProject) -> None:
    """Slots taken by code before the shards sit on `LIMIT`/`SESSIONS`: the sharded counters alone say 0."""
    clients.client("dynamodb").put_item(
        TableName=resources.table_name, Item={**keys.legacy_sessions_key(), "in_flight": {"N": "3"}}
    )
    deployment, _out = update(resources, project)
    with pytest.raises(SdkError, match=r"3 session\(s\) holding a slot \(3 on the single counter of ledger layout 1\)"):
        deployment.deploy(yes=True)


def test_a_new_ledger_layout_needs_a_drained_experiment_even_when_forced(
    resources: ExperimentResources, project: FakeCdkProject, experiment: Experiment
) -> None:
    clients.client("dynamodb").delete_item(TableName=resources.table_name, Key=keys.layout_key())  # an old stack
    experiment.submit([{"id": "q1", "prompt": "hi"}])
    deployment, _out = update(resources, project)
    with pytest.raises(
        SdkError, match=rf"moves its ledger from layout 1 to {keys.LAYOUT_VERSION}.*\(force does not apply\)"
    ):
        deployment.deploy(yes=True, force=True)
    assert project.verbs() == ["diff"]
    assert upgrade.deployed_layout(experiment) == keys.UNSTAMPED_LAYOUT

    for url in (resources.rollout_queue_url,):  # drained
        clients.client("sqs").purge_queue(QueueUrl=url)
    deployment, _out = update(resources, project)
    deployment.deploy(yes=True)
    assert project.verbs() == ["diff", "diff", "deploy"]


def test_changing_endpoints_needs_a_drained_experiment_even_when_forced(
    resources: ExperimentResources, project: FakeCdkProject, experiment: Experiment
) -> None:
    """A session's endpoint is a hash of its id modulo `endpoints`: changed, the stops of running sessions go to
    another qualifier."""
    experiment.submit([{"id": "q1", "prompt": "hi"}])
    deployment, _out = update(resources, project, endpoints=resources.config.endpoints + 1)
    with pytest.raises(SdkError, match=r"changing endpoints re-routes the stops of running sessions.*does not apply"):
        deployment.deploy(yes=True, force=True)
    assert project.verbs() == ["diff"]
