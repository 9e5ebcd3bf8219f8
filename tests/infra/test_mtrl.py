"""`-c mtrl_environment=true`: the forwarder SageMaker MTRL invokes (its ARN an output, invocable from this account
only), the MTRL reporter fed by a rule on the bus, and the agent's job-runtime grants, least privilege, cdk-nag
clean (the synth itself fails on an unacknowledged finding) and cfn-lint clean. Nothing of it without the mode."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout_pipeline import routing, topology
from rollout_pipeline.config import MTRL_RUNTIME_ENV, ConfigError, ExperimentConfig
from stacks.mtrl import OUTPUT_FORWARDER_ARN, OUTPUT_INVOKE_POLICY_ARN
from tests.infra.conftest import Synthesized, credential_less, stack_context, synthesize
from tests.infra.test_cfn_lint import lint_errors


@pytest.fixture(scope="module")
def synth_mtrl(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    with credential_less():
        return synthesize(tmp_path_factory.mktemp("cdk.out.mtrl"), agent_kind="rft", mtrl_environment="true")


def _statements(synthesized: Synthesized, role: Any) -> list[dict[str, Any]]:
    role_id = synthesized.logical_id(role)
    found: list[dict[str, Any]] = []
    for resource in synthesized.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} in resource["Properties"]["Roles"]:
            found.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    return found


def _actions(statements: list[dict[str, Any]]) -> set[str]:
    actions: set[str] = set()
    for statement in statements:
        value = statement["Action"]
        actions.update([value] if isinstance(value, str) else value)
    return actions


def test_the_template_is_cfn_lint_clean(synth_mtrl: Synthesized) -> None:
    assert lint_errors(synth_mtrl) == []


def test_the_forwarder_arn_is_an_output_for_custom_agent_lambda_config(synth_mtrl: Synthesized) -> None:
    mtrl = synth_mtrl.stack.mtrl
    assert mtrl is not None
    forwarder = synth_mtrl.logical_id(mtrl.forwarder.function)
    assert synth_mtrl.outputs[OUTPUT_FORWARDER_ARN]["Value"] == {"Fn::GetAtt": [forwarder, "Arn"]}
    policy = synth_mtrl.resources[synth_mtrl.outputs[OUTPUT_INVOKE_POLICY_ARN]["Value"]["Ref"]]
    assert policy["Properties"]["PolicyDocument"]["Statement"] == [
        {
            "Action": "lambda:InvokeFunction",
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [forwarder, "Arn"]},
            "Sid": "InvokeMtrlForwarder",
        }
    ]
    function = synth_mtrl.resources[forwarder]["Properties"]
    spec = topology.MTRL_FUNCTIONS["mtrl_forwarder"]
    assert (function["Handler"], function["Timeout"], function["MemorySize"]) == (
        "mtrl_forwarder.handler",
        spec.timeout_s,
        spec.memory_mb,
    )


def test_only_this_account_may_invoke_the_forwarder(synth_mtrl: Synthesized) -> None:
    mtrl = synth_mtrl.stack.mtrl
    assert mtrl is not None
    forwarder = synth_mtrl.logical_id(mtrl.forwarder.function)
    (permission,) = [
        resource["Properties"]
        for resource in synth_mtrl.of_type("AWS::Lambda::Permission").values()
        if resource["Properties"]["FunctionName"] == {"Fn::GetAtt": [forwarder, "Arn"]}
    ]
    assert permission == {
        "Action": "lambda:InvokeFunction",
        "FunctionName": {"Fn::GetAtt": [forwarder, "Arn"]},
        "Principal": {"Ref": "AWS::AccountId"},
        "SourceAccount": {"Ref": "AWS::AccountId"},
    }


def test_the_forwarder_may_do_what_ingesting_one_row_does_and_nothing_else(synth_mtrl: Synthesized) -> None:
    mtrl = synth_mtrl.stack.mtrl
    assert mtrl is not None
    actions = _actions(_statements(synth_mtrl, mtrl.forwarder.role))
    assert not any(action.startswith(("sagemaker:", "bedrock-agentcore:", "lambda:")) for action in actions)
    assert {"sqs:SendMessage", "events:PutEvents", "s3:PutObject", "dynamodb:PutItem"} <= actions
    assert "s3:GetObject" not in actions


def test_the_reporter_reads_the_ledger_and_reports_to_this_accounts_jobs_only(synth_mtrl: Synthesized) -> None:
    mtrl = synth_mtrl.stack.mtrl
    assert mtrl is not None
    statements = _statements(synth_mtrl, mtrl.reporter.role)
    by_action = {
        action: s for s in statements for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {a for a in by_action if not a.startswith(("logs:", "sqs:"))} == {
        "dynamodb:GetItem",
        "sagemaker:CompleteRollout",
        "sagemaker:UpdateReward",
    }
    assert ":job/*" in json.dumps(by_action["sagemaker:CompleteRollout"]["Resource"])
    assert "AWS::AccountId" in json.dumps(by_action["sagemaker:CompleteRollout"]["Resource"])
    env = synth_mtrl.resources[synth_mtrl.logical_id(mtrl.reporter.function)]["Properties"]["Environment"]
    assert "job-runtime.sagemaker." in json.dumps(env["Variables"][MTRL_RUNTIME_ENV])


def test_a_rule_sends_the_forwarded_rollouts_terminal_events_to_the_reporter(synth_mtrl: Synthesized) -> None:
    mtrl = synth_mtrl.stack.mtrl
    assert mtrl is not None
    queue = synth_mtrl.logical_id(mtrl.report.queue)
    (rule,) = [
        r["Properties"]
        for r in synth_mtrl.of_type("AWS::Events::Rule").values()
        if any(t["Arn"] == {"Fn::GetAtt": [queue, "Arn"]} for t in r["Properties"].get("Targets", []))
    ]
    assert rule["EventPattern"] == routing.mtrl_report_event_pattern()
    assert rule["EventBusName"] == {"Ref": synth_mtrl.logical_id(synth_mtrl.stack.events.bus)}
    spec = topology.MTRL_FUNCTIONS["mtrl_reporter"]
    (mapping,) = [
        m["Properties"]
        for m in synth_mtrl.of_type("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    ]
    assert (mapping["BatchSize"], mapping["ScalingConfig"]) == (
        spec.batch_size,
        {"MaximumConcurrency": spec.max_concurrency},
    )
    assert synth_mtrl.resources[queue]["Properties"]["VisibilityTimeout"] == spec.visibility_timeout_s


def test_the_agent_may_call_the_job_runtime_of_this_accounts_jobs(synth_mtrl: Synthesized) -> None:
    statements = {s.get("Sid"): s for s in _statements(synth_mtrl, synth_mtrl.stack.agent.runtime.role)}
    assert sorted(statements["MtrlJobRuntime"]["Action"]) == [
        "sagemaker:CompleteRollout",
        "sagemaker:Sample",
        "sagemaker:SampleWithResponseStream",
        "sagemaker:UpdateReward",
    ]
    assert ":job/*" in json.dumps(statements["MtrlJobRuntime"]["Resource"])
    assert statements["MtrlBearerToken"]["Condition"] == {
        "StringEquals": {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}}
    }
    (runtime,) = synth_mtrl.of_type("AWS::BedrockAgentCore::Runtime").values()
    env = runtime["Properties"]["EnvironmentVariables"]
    assert env[MTRL_RUNTIME_ENV] == {
        "Fn::Join": ["", ["https://job-runtime.sagemaker.", {"Ref": "AWS::Region"}, ".api.aws"]]
    }


def test_without_the_mode_there_is_no_forwarder_and_no_job_runtime_grant(synth: Synthesized) -> None:
    assert synth.stack.mtrl is None
    assert OUTPUT_FORWARDER_ARN not in synth.outputs
    assert "sagemaker:" not in json.dumps(synth.artifact.template)
    (runtime,) = synth.of_type("AWS::BedrockAgentCore::Runtime").values()
    assert MTRL_RUNTIME_ENV not in runtime["Properties"]["EnvironmentVariables"]


def test_the_mode_needs_the_rft_host() -> None:
    with pytest.raises(ConfigError, match="mtrl_environment needs agent_kind=rft"):
        ExperimentConfig.from_context(stack_context(mtrl_environment="true"))
    assert ExperimentConfig.from_context(stack_context(mtrl_environment="true", agent_kind="rft")).mtrl_environment
