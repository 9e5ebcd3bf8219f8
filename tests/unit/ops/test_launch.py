"""Deploying (`Experiment.launch`, `rollouts deploy`) without AWS: a stand-in CDK CLI (tests/fake_cdk.py) and botocore's
Stubber for the CloudFormation reads. What is checked: the CLI invocation built from the settings, the outputs
parsed into the attached experiment, idempotence, the diff shown and confirmed, and one clear error per problem."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, main
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ops import cdk as cdk_module
from rollout_pipeline.ops import preflight
from rollout_pipeline.ops.launch import Deployment, changed_settings, preflight_problem
from rollout_pipeline.sdk import Experiment, NoCredentials, SdkError
from rollout_pipeline.sdk.errors import DeployFailed
from tests.fake_cdk import REPO as REPO_ROOT
from tests.fake_cdk import FakeCdkProject

REGION = "us-east-1"
MODEL_URL = "https://models.example.org/v1"
STACK = "Rollouts-t1"
NOW = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)


def outputs(name: str = "t1", **config: Any) -> dict[str, str]:
    base = f"rollouts-{name}"
    return {
        "ExperimentName": name,
        "ExperimentConfig": ExperimentConfig(name=name, model_base_url=MODEL_URL, **config).to_env(),
        "InputBucketName": f"{base}-input",
        "ResultsBucketName": f"{base}-results",
        "RolloutQueueUrl": f"https://sqs.{REGION}.amazonaws.com/123456789012/{base}-rollouts",
        "TrainerQueueUrl": f"https://sqs.{REGION}.amazonaws.com/123456789012/{base}-trainer",
        "EventBusName": base,
        "LedgerTableName": f"{base}-ledger",
    }


class NoServiceQuotas:
    """A Service Quotas client that cannot be read (the bootstrap then uses the documented quotas)."""

    def get_paginator(self, _operation: str) -> Any:
        raise RuntimeError("AccessDeniedException")


class StubbedSession:
    """A boto3 session stand-in whose clients are real botocore clients under a Stubber (no network)."""

    def __init__(self) -> None:
        self.cloudformation = boto3.client(
            "cloudformation", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s"
        )
        self.stub = Stubber(self.cloudformation)
        self.stub.activate()
        self.region_name = REGION
        self.profile_name = "research"
        self.dynamodb = boto3.client("dynamodb", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
        self.pool = Stubber(self.dynamodb)
        self.pool.activate()
        self.pool_exists = True
        self.sts = boto3.client("sts", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
        self.ssm = boto3.client("ssm", region_name=REGION, aws_access_key_id="k", aws_secret_access_key="s")
        self.bootstrap = (Stubber(self.sts), Stubber(self.ssm))
        for stubber in self.bootstrap:
            stubber.activate()

    def cdk_bootstrapped(self, version: str | None = "21") -> None:
        """The account (STS) and its CDK bootstrap version parameter (SSM); None: not bootstrapped."""
        self.bootstrap[0].add_response("get_caller_identity", {"Account": "123456789012"})
        if version is None:
            self.bootstrap[1].add_client_error("get_parameter", "ParameterNotFound")
        else:
            self.bootstrap[1].add_response("get_parameter", {"Parameter": {"Value": version}})

    def pool_present(self, present: bool = True) -> None:
        """The account pool's table (`rollouts bootstrap`): present (the usual case) or not."""
        if present:
            self.pool.add_response("describe_table", {"Table": {"TableName": "rollouts-pool"}})
        else:
            self.pool.add_client_error("describe_table", "ResourceNotFoundException")

    def client(self, service: str, **_kwargs: Any) -> Any:
        if service == "dynamodb":
            return self.dynamodb
        if service == "service-quotas":
            return NoServiceQuotas()
        if service in ("sts", "ssm"):
            return self.sts if service == "sts" else self.ssm
        assert service == "cloudformation", f"unexpected {service} client"
        return self.cloudformation

    def get_credentials(self) -> Any:
        return None

    def no_stack(self) -> None:
        self.stub.add_client_error(
            "describe_stacks", "ValidationError", f"Stack with id {STACK} does not exist", 400, {"StackName": STACK}
        )

    def stack(self, status: str, outputs_: dict[str, str] | None = None) -> None:
        stack: dict[str, Any] = {"StackName": STACK, "StackStatus": status, "CreationTime": NOW}
        if outputs_ is not None:
            stack["Outputs"] = [{"OutputKey": k, "OutputValue": v} for k, v in outputs_.items()]
        self.stub.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": STACK})


@pytest.fixture
def project(tmp_path: Path) -> FakeCdkProject:
    return FakeCdkProject(tmp_path / "project")


@pytest.fixture
def session() -> StubbedSession:
    return StubbedSession()


def deployment(
    project: FakeCdkProject,
    session: StubbedSession,
    answers: list[bool] | None = None,
    *,
    pool: bool = True,
    **settings: Any,
) -> tuple[Deployment, io.StringIO, list[str]]:
    session.pool_present(pool)  # whether the account pool exists (one DescribeTable per deploy)
    out = io.StringIO()
    questions: list[str] = []

    def confirm(question: str) -> bool:
        questions.append(question)
        return (answers or [False]).pop(0)

    return (
        Deployment(
            "t1",
            {"model_base_url": MODEL_URL, **settings},
            project_dir=project.root,
            region=REGION,
            session=session,
            checks=lambda _plan, _aws: [],
            guard=lambda _experiment, _changed, _force, _say: None,  # tests/integration/ops/test_upgrade_guard.py
            confirm=confirm,
            out=out,
            poll_s=3600,  # the stand-in CLI ends at once: no event polls during a test
        ),
        out,
        questions,
    )


def test_deploy_creates_the_stack_with_the_settings_as_context_and_returns_the_attached_experiment(
    project: FakeCdkProject, session: StubbedSession
) -> None:
    session.no_stack()
    project.script({"deploy": {"outputs": {STACK: outputs(group_size=4)}, "lines": ["Rollouts-t1: deploying..."]}})
    deploy, out, questions = deployment(project, session, group_size=4, sampling_params={"temperature": 0.5})

    experiment = deploy.deploy(yes=True)

    (call,) = project.calls()
    argv = call["argv"]
    assert argv[:5] == ["deploy", STACK, "-c", "experiment=t1", "-c"]
    assert argv[4:10] == [
        "-c",
        "group_size=4",
        "-c",
        f"model_base_url={MODEL_URL}",
        "-c",
        'sampling_params={"temperature":0.5}',
    ]
    assert argv[10:15] == ["--no-notices", "--require-approval", "never", "--outputs-file", argv[14]]
    assert argv[14].endswith("outputs-t1.json")
    assert call["telemetry"] == "1"
    assert call["env"]["AWS_REGION"] == REGION, "the CLI deploys where the SDK looked"
    assert call["env"]["AWS_PROFILE"] == "research", "with the given session's profile"
    assert questions == [], "told not to ask"
    assert isinstance(experiment, Experiment)
    assert experiment.name == "t1"
    assert experiment.config.group_size == 4
    assert experiment.results_bucket == "rollouts-t1-results"
    assert "creating Rollouts-t1: done" in out.getvalue()
    session.stub.assert_no_pending_responses()


def test_an_account_without_the_pool_gets_it_first(project: FakeCdkProject, session: StubbedSession) -> None:
    session.no_stack()
    session.cdk_bootstrapped()
    project.script({"deploy": {"outputs": {STACK: outputs()}}})
    deploy, out, _questions = deployment(project, session, pool=False)
    deploy.deploy(yes=True)
    first, second = project.calls()
    assert first["argv"][:4] == ["deploy", "RolloutsPool", "-c", "rollouts_pool=true"]
    assert "-c" in first["argv"]
    assert "new_session_quota=25.0" in first["argv"], "the documented quota when Service Quotas cannot be read"
    assert second["argv"][:2] == ["deploy", STACK]
    assert "creating it first (`rollouts bootstrap`)" in out.getvalue()


def test_a_fresh_account_is_told_to_bootstrap_the_cdk_before_the_pool_is_deployed(
    project: FakeCdkProject, session: StubbedSession
) -> None:
    session.cdk_bootstrapped(None)
    deploy, _out, _questions = deployment(project, session, pool=False)
    with pytest.raises(SdkError) as raised:
        deploy.deploy(yes=True)
    assert str(raised.value) == (
        "cdk bootstrap: not bootstrapped: run `npx cdk bootstrap aws://123456789012/us-east-1`"
    )
    assert project.calls() == [], "nothing deployed, not even the pool"


def test_deploying_the_same_settings_changes_nothing(project: FakeCdkProject, session: StubbedSession) -> None:
    session.stack("CREATE_COMPLETE")
    session.stack("CREATE_COMPLETE", outputs())  # the attach
    project.script(
        {
            "diff": {
                "exit": 0,
                "lines": [
                    "Stack Rollouts-t1",
                    "There were no differences",
                    "",
                    "✨  Number of stacks with differences: 0",
                ],
            }
        }
    )
    deploy, out, questions = deployment(project, session)

    experiment = deploy.deploy()

    assert project.verbs() == ["diff"], "no deploy when cdk diff finds nothing"
    assert "--fail" in project.calls()[0]["argv"]
    assert questions == []
    assert experiment.name == "t1"
    assert "Rollouts-t1 is up to date: nothing to deploy" in out.getvalue()
    session.stub.assert_no_pending_responses()


def test_other_settings_show_what_changes_and_ask_first(project: FakeCdkProject, session: StubbedSession) -> None:
    session.stack("UPDATE_COMPLETE")
    session.stack("UPDATE_COMPLETE", outputs(group_size=8))  # the settings the stack runs with
    session.stack("UPDATE_COMPLETE", outputs(group_size=8))  # attached for the update's check
    diff_lines = [
        "Stack Rollouts-t1",
        "Resources",
        "[~] AWS::Lambda::Function Dispatch",
        "✨  Number of stacks with differences: 1",
    ]
    project.script({"diff": {"exit": 1, "lines": diff_lines}})
    deploy, out, questions = deployment(project, session, answers=[False], group_size=4)

    with pytest.raises(SdkError, match="deploy of Rollouts-t1 cancelled: nothing changed"):
        deploy.deploy()

    assert project.verbs() == ["diff"]
    assert questions == ["Deploy these changes to Rollouts-t1?"]
    shown = out.getvalue()
    assert "group_size: 8 -> 4" in shown
    assert "[~] AWS::Lambda::Function Dispatch" in shown


def test_a_failed_deploy_names_the_first_failed_resource_and_its_reason(
    project: FakeCdkProject, session: StubbedSession
) -> None:
    session.no_stack()
    project.script({"deploy": {"exit": 1, "lines": [f"wall of output line {i}" for i in range(200)]}})

    def event(logical: str, kind: str, status: str, reason: str = "", seconds: int = 0) -> dict[str, Any]:
        return {
            "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/Rollouts-t1/x",
            "EventId": f"{logical}-{status}",
            "StackName": STACK,
            "LogicalResourceId": logical,
            "ResourceType": kind,
            "ResourceStatus": status,
            "ResourceStatusReason": reason,
            "Timestamp": datetime.now(UTC) + timedelta(seconds=seconds),
        }

    newest_first = [
        event(
            STACK,
            "AWS::CloudFormation::Stack",
            "ROLLBACK_IN_PROGRESS",
            "The following resource(s) failed to create: [Runtime, Queue]. ",
            6,
        ),
        event("Queue", "AWS::SQS::Queue", "CREATE_FAILED", "Resource creation cancelled", 5),
        event("Runtime", "AWS::BedrockAgentCore::Runtime", "CREATE_FAILED", "Access denied for\n ecr:BatchGetImage", 4),
        event("Table", "AWS::DynamoDB::Table", "CREATE_COMPLETE", "", 3),
        event(STACK, "AWS::CloudFormation::Stack", "CREATE_IN_PROGRESS", "User Initiated", 1),
    ]
    session.stub.add_response("describe_stack_events", {"StackEvents": newest_first}, {"StackName": STACK})
    deploy, _out, _questions = deployment(project, session)

    with pytest.raises(DeployFailed) as failed:
        deploy.deploy(yes=True)

    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(
        "deploy of Rollouts-t1 failed at Runtime (AWS::BedrockAgentCore::Runtime) CREATE_FAILED: "
        "Access denied for ecr:BatchGetImage"
    )
    assert failed.value.resource == "Runtime"
    assert "wall of output" not in message


@pytest.mark.parametrize("status", ["ROLLBACK_COMPLETE", "ROLLBACK_FAILED"])
def test_a_failed_create_is_deployed_again_as_the_cdk_cli_does(
    project: FakeCdkProject, session: StubbedSession, status: str
) -> None:
    """`cdk deploy` deletes a stack whose creation failed and creates it again: the SDK asks, then lets it."""
    session.stack(status)
    project.script({"deploy": {"outputs": {STACK: outputs()}}})
    deploy, out, questions = deployment(project, session, answers=[True])

    experiment = deploy.deploy()

    asked = f"Stack Rollouts-t1 failed its creation ({status}): delete it and create it again in {REGION}?"
    assert questions == [asked]
    assert project.verbs() == ["deploy"]
    assert experiment.name == "t1"
    assert "creating Rollouts-t1: done" in out.getvalue()


@pytest.mark.parametrize("status", ["DELETE_FAILED", "UPDATE_ROLLBACK_FAILED", "CREATE_FAILED"])
def test_a_stack_in_another_failed_state_must_be_deleted_first(
    project: FakeCdkProject, session: StubbedSession, status: str
) -> None:
    session.stack(status)
    deploy, _out, _questions = deployment(project, session)
    with pytest.raises(SdkError, match=rf"{status}: delete it first \(`rollouts destroy -e t1`"):
        deploy.deploy(yes=True)
    assert project.calls() == []


def test_a_failed_stack_is_removed_with_cdk_destroy(project: FakeCdkProject, session: StubbedSession) -> None:
    session.stack("ROLLBACK_COMPLETE")
    session.stack("ROLLBACK_COMPLETE")  # no outputs: a failed create
    deploy, out, _questions = deployment(project, session)

    assert deploy.remove_failed_stack(yes=True) == "ROLLBACK_COMPLETE"

    (call,) = project.calls()
    assert call["argv"] == [
        "destroy",
        STACK,
        "-c",
        "experiment=t1",
        "-c",
        "allow_private_model_url=true",
        "--no-notices",
        "--force",
    ]
    assert "destroying Rollouts-t1: done" in out.getvalue()
    session.stub.assert_no_pending_responses()


def test_only_a_failed_stack_is_removed_that_way(project: FakeCdkProject, session: StubbedSession) -> None:
    session.stack("CREATE_COMPLETE")
    deploy, _out, _questions = deployment(project, session)
    with pytest.raises(SdkError, match="not a failed one: destroy the attached experiment"):
        deploy.remove_failed_stack(yes=True)
    assert project.calls() == []


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"group_size": 0}, "group_size: Input should be greater than or equal to 1"),
        ({"max_sessions": "many"}, "max_sessions: Input should be a valid integer"),
        ({"model_base_url": "http://127.0.0.1:8000/v1"}, "a loopback address"),
        ({"no_such_setting": 1}, "unknown setting(s) no_such_setting"),
        ({"image_uri": "docker.io/me/agent:1"}, "AgentCore runs images from Amazon ECR only"),
    ],
)
def test_a_bad_setting_is_refused_before_anything_runs(
    project: FakeCdkProject, session: StubbedSession, settings: dict[str, Any], expected: str
) -> None:
    deploy, _out, _questions = deployment(project, session, **settings)
    with pytest.raises(SdkError) as error:
        deploy.deploy(yes=True)
    assert expected in str(error.value)
    assert project.calls() == []
    session.stub.assert_no_pending_responses()


def test_a_missing_cli_says_to_run_make_setup(project: FakeCdkProject, session: StubbedSession) -> None:
    (project.root / "node_modules" / ".bin" / "cdk").unlink()
    deploy, _out, _questions = deployment(project, session)
    with pytest.raises(SdkError, match=r"the CDK CLI is not installed .*: run `make setup` first"):
        deploy.deploy(yes=True)


def test_preflight_errors_become_one_actionable_error() -> None:
    no_credentials = [
        preflight.Check("credentials", "error", "no usable AWS credentials (Unable to locate credentials)")
    ]
    problem = preflight_problem(no_credentials)
    assert isinstance(problem, NoCredentials)
    assert "aws configure" in str(problem)
    not_bootstrapped = [
        preflight.Check("settings", "ok", "experiment t1"),
        preflight.Check("quotas", "warning", "cannot read"),
        preflight.Check("cdk bootstrap", "error", "not bootstrapped: run `npx cdk bootstrap aws://1/us-east-1`"),
    ]
    assert str(preflight_problem(not_bootstrapped)) == (
        "preflight cdk bootstrap: not bootstrapped: run `npx cdk bootstrap aws://1/us-east-1`"
    )
    assert preflight_problem(not_bootstrapped[:2]) is None


def test_the_preflight_runs_on_the_settings_before_the_stack_is_read(
    project: FakeCdkProject, session: StubbedSession
) -> None:
    seen: list[Any] = []

    def checks(plan: Any, _aws: Any) -> list[preflight.Check]:
        seen.append(plan.merged)
        return [preflight.Check("cdk bootstrap", "error", "not bootstrapped: run `npx cdk bootstrap`")]

    deploy, _out, _q = deployment(project, session, group_size=3)
    deploy.checks = checks
    with pytest.raises(SdkError, match="preflight cdk bootstrap: not bootstrapped"):
        deploy.deploy(yes=True)
    assert seen[0]["group_size"] == "3"
    assert seen[0]["experiment"] == "t1"
    assert seen[0]["max_sessions"] == 100, "cdk.json's context underneath"
    assert project.calls() == []


def test_changed_settings_lists_each_difference() -> None:
    deployed = outputs(group_size=8, max_sessions=100)
    wanted = ExperimentConfig(name="t1", model_base_url=MODEL_URL, group_size=4, max_sessions=100)
    assert changed_settings(deployed, wanted) == ["group_size: 8 -> 4"]


def test_progress_counts_finished_resources_and_shows_the_image_build() -> None:
    events = [
        {
            "LogicalResourceId": STACK,
            "ResourceType": "AWS::CloudFormation::Stack",
            "ResourceStatus": "CREATE_IN_PROGRESS",
        },
        {"LogicalResourceId": "Table", "ResourceType": "AWS::DynamoDB::Table", "ResourceStatus": "CREATE_IN_PROGRESS"},
        {"LogicalResourceId": "Table", "ResourceType": "AWS::DynamoDB::Table", "ResourceStatus": "CREATE_COMPLETE"},
        {
            "LogicalResourceId": "Build",
            "ResourceType": cdk_module.IMAGE_BUILD_TYPE,
            "ResourceStatus": "CREATE_IN_PROGRESS",
        },
    ]
    progress = cdk_module.progress_of(events, 40)
    assert progress.done == 1
    assert progress.total == 40
    assert progress.line() == "1/40 resources, image build create in progress, in progress: Build"


def test_dry_run_synthesizes_only(project: FakeCdkProject) -> None:
    assert (
        main(
            ["deploy", "-e", "t1", "-c", f"model_base_url={MODEL_URL}", "--dry-run", "--project-dir", str(project.root)]
        )
        == EXIT_OK
    )
    (call,) = project.calls()
    assert call["argv"] == [
        "synth",
        STACK,
        "-c",
        "experiment=t1",
        "-c",
        f"model_base_url={MODEL_URL}",
        "--no-notices",
        "-q",
    ]


def test_cli_deploy_reports_a_bad_setting_as_one_line(
    project: FakeCdkProject, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["deploy", "-e", "t1", "-c", "group_size=0", "--project-dir", str(project.root), "--region", REGION]
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "group_size" in err[0]
    assert project.calls() == []


@pytest.mark.parametrize("command", ["deploy", "destroy"])
def test_help_documents_every_option(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == EXIT_OK
    text = capsys.readouterr().out
    options = ["--experiment", "--region", "--project-dir", "--yes", "--verbose"]
    options += ["--context", "--dry-run", "--force"] if command == "deploy" else ["--force", "--delete-results"]
    for option in options:
        assert option in text


def test_settings_travel_as_cdk_context_text() -> None:
    assert cdk_module.context_value(True) == "true"
    assert cdk_module.context_value(None) == ""
    assert cdk_module.context_value({"b": 1, "a": 0.5}) == '{"a":0.5,"b":1}'
    assert json.loads(cdk_module.context_value(ExperimentConfig(name="x").sampling_params)) == {}
    sinks = ExperimentConfig(name="x", sinks=[{"name": "t", "url": "https://h.example/x"}]).sinks
    parsed = ExperimentConfig.from_context({"experiment": "x", "sinks": cdk_module.context_value(sinks)})
    assert parsed.sinks == sinks  # the list travels as JSON and reads back as the same sinks


class EventsSoFar:
    """A CloudFormation stand-in for the watcher: DescribeStackEvents answers with the events added so far,
    newest first, in pages of two (so paging and the stop at known events are exercised)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.calls = 0

    def add(self, logical: str, kind: str, status: str) -> None:
        self.events.append(
            {
                "EventId": f"{logical}-{status}-{len(self.events)}",
                "LogicalResourceId": logical,
                "ResourceType": kind,
                "ResourceStatus": status,
                "Timestamp": datetime.now(UTC),
            }
        )

    def describe_stack_events(self, StackName: str, NextToken: str | None = None) -> dict[str, Any]:
        self.calls += 1
        newest_first = list(reversed(self.events))
        start = int(NextToken or 0)
        page: dict[str, Any] = {"StackEvents": newest_first[start : start + 2]}
        if start + 2 < len(newest_first):
            page["NextToken"] = str(start + 2)
        return page


def test_the_watcher_reports_progress_from_new_events_only() -> None:
    cloudformation = EventsSoFar()
    reports: list[str] = []
    watcher = cdk_module.StackWatcher(
        cloudformation,
        "t1",
        datetime.now(UTC) - timedelta(seconds=5),
        lambda p: reports.append(p.line()),
        total=lambda: 3,
    )
    cloudformation.add(STACK, "AWS::CloudFormation::Stack", "CREATE_IN_PROGRESS")
    cloudformation.add("Table", "AWS::DynamoDB::Table", "CREATE_IN_PROGRESS")
    cloudformation.add("Build", cdk_module.IMAGE_BUILD_TYPE, "CREATE_IN_PROGRESS")
    watcher.poll()
    cloudformation.add("Table", "AWS::DynamoDB::Table", "CREATE_COMPLETE")
    calls_before = cloudformation.calls
    watcher.poll()
    assert cloudformation.calls - calls_before == 1, "one page: paging stops at the first known event"
    watcher.poll()  # nothing new: nothing reported
    cloudformation.add("Build", cdk_module.IMAGE_BUILD_TYPE, "CREATE_COMPLETE")
    watcher.poll()

    assert reports == [
        "0/3 resources, image build create in progress, in progress: Table, Build",
        "1/3 resources, image build create in progress, in progress: Build",
        "2/3 resources, image build create complete",
    ]


def test_the_live_line_rewrites_itself_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    line = cdk_module.LiveLine(stream, "creating Rollouts-t1")
    line(cdk_module.StackProgress(1, 10))
    line(cdk_module.StackProgress(2, 10))
    line.end("done")
    assert stream.getvalue().startswith("\rcreating Rollouts-t1: 1/10 resources\rcreating Rollouts-t1: 2/10 resources")
    assert stream.getvalue().endswith("creating Rollouts-t1: done\n")


# ------------------------------------------------------------------------------- outside a checkout's shell


def test_without_node_on_path_the_deploy_stops_with_one_line(
    project: FakeCdkProject, session: StubbedSession, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A notebook's PATH may lack Node.js: the CLI script (`#!/usr/bin/env node`) would fail later with
    `env: 'node'`."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    deploy, _out, _questions = deployment(project, session)
    with pytest.raises(SdkError, match=r"^Node.js is not on PATH \(the CDK CLI runs on it\): install the version in"):
        deploy.deploy(yes=True)
    assert project.calls() == []


def test_an_app_python_without_aws_cdk_stops_the_deploy_with_one_line(
    project: FakeCdkProject, session: StubbedSession, tmp_path: Path
) -> None:
    """A notebook's venv may lack aws-cdk-lib: `cdk diff` would fail inside the app with a traceback."""
    bare = tmp_path / "bare"
    import venv

    venv.create(bare, with_pip=False)
    python = project.root / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{bare / "bin" / "python"}" "$@"\n')
    deploy, _out, _questions = deployment(project, session)
    with pytest.raises(
        SdkError,
        match=r"the CDK app's Python \(.*\) cannot import aws_cdk, constructs, cdk_nag, cdklabs: run `make setup`",
    ) as error:
        deploy.deploy(yes=True)
    assert "\n" not in str(error.value)
    assert project.calls() == []


def test_the_app_python_rule_is_cdk_json_s() -> None:
    """`CdkCli.app_python` repeats cdk.json's `app` command: the project's .venv unless a venv is active."""
    app = json.loads((REPO_ROOT / "cdk.json").read_text())["app"]
    assert '[ -z \\"$VIRTUAL_ENV\\" ] && [ -x .venv/bin/python ]' in json.dumps(app)
    assert "exec .venv/bin/python app.py; else exec python3 app.py" in app


class CredentialsOf:
    """botocore credentials as a session resolved them: their source (`method`) and frozen values."""

    def __init__(self, method: str, token: str | None = "token") -> None:
        self.method = method
        self.token = token

    def get_frozen_credentials(self) -> Any:
        from botocore.credentials import ReadOnlyCredentials

        return ReadOnlyCredentials("AKIAFROZEN", "secret", self.token)


@pytest.mark.parametrize(
    ("profile", "method", "expected"),
    [
        ("default", "assume-role", {"AWS_PROFILE": "default"}),  # refreshed by the CLI from the profile
        ("default", "sso", {"AWS_PROFILE": "default"}),
        ("research", "shared-credentials-file", {"AWS_PROFILE": "research"}),
        ("default", "explicit", {"AWS_ACCESS_KEY_ID": "AKIAFROZEN"}),  # keys given in code: nothing else to pass
        ("default", "env", {}),  # the child inherits the environment
        ("default", "iam-role", {}),  # the child asks the instance itself
    ],
)
def test_the_cli_gets_the_sessions_credential_source_not_frozen_keys(
    project: FakeCdkProject,
    session: StubbedSession,
    profile: str,
    method: str,
    expected: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Temporary keys frozen at the start can expire during a 35-minute build: the profile goes instead."""
    for variable in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)  # this process's own (other tests' fake keys) are not the point
    session.profile_name = profile
    session.get_credentials = lambda: CredentialsOf(method)  # type: ignore[method-assign]
    session.no_stack()
    project.script({"deploy": {"outputs": {STACK: outputs()}}})
    deploy, out, _questions = deployment(project, session)

    deploy.deploy(yes=True)

    (call,) = project.calls()
    passed = {key: value for key, value in call["env"].items() if key != "AWS_REGION" and value is not None}
    assert passed == expected
    assert ("temporary keys" in out.getvalue()) == (method == "explicit")
