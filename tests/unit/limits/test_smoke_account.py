"""`rollouts smoke`'s account-only checks against botocore's Stubber on the real service models (no network): the
calls they make are valid requests, and each outcome is one line with what to do."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from rollout_pipeline.ops.smoke import Smoke

REGION = "us-west-2"
ACCOUNT = "123456789012"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:Rollouts-exp-AlarmTopic"
BUCKET = "rollouts-exp-input"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/Rollouts-exp-IngestRole"
SERVICES = ("cloudwatch", "sns", "sqs", "cloudformation", "lambda", "sts", "iam", "service-quotas")


class Account:
    """A stand-in `Experiment` (what the smoke reads of it) whose clients are stubbed real clients."""

    def __init__(self) -> None:
        session = boto3.session.Session(
            aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=REGION
        )
        self.clients = {s: session.client(s) for s in SERVICES}  # type: ignore[call-overload]
        self.stubs = {s: Stubber(c) for s, c in self.clients.items()}
        for stub in self.stubs.values():
            stub.activate()
        self.experiment = SimpleNamespace(
            name="exp",
            bus_name="rollouts-exp",
            input_bucket=BUCKET,
            outputs={"AlarmTopicArn": TOPIC},
            aws=SimpleNamespace(endpoint_url=None, region=REGION, session=session),
            client=lambda service: self.clients[service],
        )

    def smoke(self) -> Smoke:
        ticks = iter(range(0, 10_000, 50))  # every reading of the clock is 50 s later: bounded waits end at once
        return Smoke(self.experiment, clock=lambda: float(next(ticks)), poll_wait_s=0)  # type: ignore[arg-type]

    def verify(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()


@pytest.fixture
def account() -> Iterator[Account]:
    stubbed = Account()
    yield stubbed
    stubbed.verify()


def alarm_setup(account: Account) -> None:
    cw, sqs, sns = account.stubs["cloudwatch"], account.stubs["sqs"], account.stubs["sns"]
    cw.add_response(
        "describe_alarms",
        {"MetricAlarms": [{"AlarmName": "Rollouts-exp-DlqNotEmpty", "StateValue": "OK"}]},
        {"ActionPrefix": TOPIC, "AlarmTypes": ["MetricAlarm"]},
    )
    queue_url = f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/rollouts-exp-smoke-alarm"
    sqs.add_response("create_queue", {"QueueUrl": queue_url}, {"QueueName": ANY, "Attributes": ANY, "tags": ANY})
    sqs.add_response(
        "get_queue_attributes",
        {"Attributes": {"QueueArn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:rollouts-exp-smoke-alarm"}},
        {"QueueUrl": queue_url, "AttributeNames": ["QueueArn"]},
    )
    sqs.add_response("set_queue_attributes", {}, {"QueueUrl": queue_url, "Attributes": ANY})
    sns.add_response(
        "subscribe",
        {"SubscriptionArn": f"{TOPIC}:sub"},
        {"TopicArn": TOPIC, "Protocol": "sqs", "Endpoint": ANY, "ReturnSubscriptionArn": True},
    )
    cw.add_response(
        "set_alarm_state",
        {},
        {"AlarmName": "Rollouts-exp-DlqNotEmpty", "StateValue": "ALARM", "StateReason": ANY},
    )


def alarm_teardown(account: Account) -> None:
    account.stubs["cloudwatch"].add_response(
        "set_alarm_state", {}, {"AlarmName": "Rollouts-exp-DlqNotEmpty", "StateValue": "OK", "StateReason": ANY}
    )
    account.stubs["sns"].add_response("unsubscribe", {}, {"SubscriptionArn": f"{TOPIC}:sub"})
    account.stubs["sqs"].add_response("delete_queue", {}, {"QueueUrl": ANY})


def test_alarm_delivery_passes_when_the_notification_arrives(account: Account) -> None:
    alarm_setup(account)
    notification = {"AlarmName": "Rollouts-exp-DlqNotEmpty", "NewStateValue": "ALARM"}
    body = json.dumps({"Type": "Notification", "TopicArn": TOPIC, "Message": json.dumps(notification)})
    account.stubs["sqs"].add_response(
        "receive_message",
        {"Messages": [{"MessageId": "m", "ReceiptHandle": "r", "Body": body}]},
        {"QueueUrl": ANY, "MaxNumberOfMessages": 10, "WaitTimeSeconds": ANY},
    )
    alarm_teardown(account)
    smoke = account.smoke()
    with contextlib.ExitStack() as stack:
        smoke._alarm_delivery(stack)
    (check,) = smoke.checks
    assert (check.name, check.status) == ("alarm delivery", "pass")
    assert "Rollouts-exp-DlqNotEmpty reached" in check.message
    assert smoke._cleaned == 3


def test_alarm_delivery_fails_with_the_topic_policy_to_fix(account: Account) -> None:
    alarm_setup(account)
    account.stubs["sqs"].add_response(
        "receive_message", {}, {"QueueUrl": ANY, "MaxNumberOfMessages": 10, "WaitTimeSeconds": ANY}
    )
    alarm_teardown(account)
    smoke = account.smoke()
    with contextlib.ExitStack() as stack:
        smoke._alarm_delivery(stack)
    (check,) = smoke.checks
    assert check.status == "fail"
    assert "cloudwatch.amazonaws.com sns:Publish" in check.message


def missing_key_setup(account: Account) -> None:
    account.stubs["cloudformation"].add_response(
        "list_stack_resources",
        {
            "StackResourceSummaries": [
                {
                    "LogicalResourceId": "IngestFunction1A2B3C4D",
                    "PhysicalResourceId": "Rollouts-exp-IngestFunction",
                    "ResourceType": "AWS::Lambda::Function",
                    "LastUpdatedTimestamp": "2026-11-24T00:00:00Z",
                    "ResourceStatus": "CREATE_COMPLETE",
                }
            ]
        },
        {"StackName": "Rollouts-exp"},
    )
    account.stubs["lambda"].add_response(
        "get_function_configuration", {"Role": ROLE}, {"FunctionName": "Rollouts-exp-IngestFunction"}
    )
    account.stubs["sts"].add_client_error(
        "assume_role",
        "AccessDenied",
        http_status_code=403,
        expected_params={"RoleArn": ROLE, "RoleSessionName": ANY, "DurationSeconds": 900},
    )


def simulated(account: Account, smoke: Smoke, result: dict[str, Any]) -> None:
    """The simulator's answer to exactly the request the stack's grant needs: ListBucket of the bucket with the
    `s3:prefix` context the grant is conditioned on (the missing key, under `datasets/`)."""
    key = f"datasets/smoke-{smoke.token}/missing.jsonl"
    account.stubs["iam"].add_response(
        "simulate_principal_policy",
        {"EvaluationResults": [{"EvalActionName": "s3:ListBucket", **result}]},
        {
            "PolicySourceArn": ROLE,
            "ActionNames": ["s3:ListBucket"],
            "ResourceArns": [f"arn:aws:s3:::{BUCKET}"],
            "ContextEntries": [{"ContextKeyName": "s3:prefix", "ContextKeyValues": [key], "ContextKeyType": "string"}],
        },
    )


@pytest.mark.parametrize(("decision", "status"), [("allowed", "pass"), ("implicitDeny", "fail")])
def test_missing_key_asks_the_policy_simulator_when_the_role_cannot_be_assumed(
    account: Account, decision: str, status: str
) -> None:
    missing_key_setup(account)
    smoke = account.smoke()
    simulated(account, smoke, {"EvalDecision": decision})
    smoke._missing_key()
    (check,) = smoke.checks
    assert check.status == status, check.line()
    assert "with s3:prefix 'datasets/smoke-" in check.message
    assert "the simulator shows what the role's policies allow, not what S3 answers" in check.message
    if status == "fail":
        assert "403" in check.message


def test_missing_key_is_skipped_when_the_simulator_lacks_context_values(account: Account) -> None:
    missing_key_setup(account)
    smoke = account.smoke()
    simulated(account, smoke, {"EvalDecision": "implicitDeny", "MissingContextValues": ["s3:prefix"]})
    smoke._missing_key()
    (check,) = smoke.checks
    assert check.status == "skipped", check.line()
    assert "needs the context values s3:prefix" in check.message


def test_missing_key_is_skipped_with_a_reason_when_nothing_can_tell(account: Account) -> None:
    missing_key_setup(account)
    account.stubs["iam"].add_client_error("simulate_principal_policy", "AccessDenied", http_status_code=403)
    smoke = account.smoke()
    smoke._missing_key()
    (check,) = smoke.checks
    assert check.status == "skipped"
    assert "iam:SimulatePrincipalPolicy" in check.message


def test_agentcore_metric_dimensions_are_printed(account: Account) -> None:
    metrics: list[dict[str, Any]] = [
        {
            "MetricName": "ActiveSessionCount",
            "Dimensions": [{"Name": "Resource", "Value": "arn"}, {"Name": "Name", "Value": "n"}],
        },
        {"MetricName": "Invocations", "Dimensions": [{"Name": "Resource", "Value": "arn"}]},
    ]
    account.stubs["cloudwatch"].add_response(
        "list_metrics", {"Metrics": metrics}, {"Namespace": "AWS/Bedrock-AgentCore"}
    )
    smoke = account.smoke()
    smoke._metrics()
    (check,) = smoke.checks
    assert check.status == "pass"
    assert "ActiveSessionCount [['Name', 'Resource']]; Invocations [['Resource']]" in check.message


def test_no_agentcore_metrics_points_at_transaction_search(account: Account) -> None:
    account.stubs["cloudwatch"].add_response("list_metrics", {"Metrics": []}, {"Namespace": "AWS/Bedrock-AgentCore"})
    smoke = account.smoke()
    smoke._metrics()
    (check,) = smoke.checks
    assert check.status == "fail"
    assert "Transaction Search" in check.message


def test_quota_codes_found_and_missing(account: Account) -> None:
    def quota(code: str, name: str, value: float) -> dict[str, Any]:
        return {"ServiceCode": "bedrock-agentcore", "QuotaCode": code, "QuotaName": name, "Value": value}

    listed = [
        quota("L-3E5722B2", "Active Session Workloads per Account", 5000),
        quota("L-8EE2AEA2", "Rate of new Runtime session creation", 25),
        quota("L-46ED137C", "Rate of Runtime data plane APIs", 1000),
    ]
    stub = account.stubs["service-quotas"]
    stub.add_response("list_service_quotas", {"Quotas": listed[:1]}, {"ServiceCode": "bedrock-agentcore"})
    stub.add_response("list_aws_default_service_quotas", {"Quotas": listed}, {"ServiceCode": "bedrock-agentcore"})
    smoke = account.smoke()
    smoke._quotas()
    (check,) = smoke.checks
    assert check.status == "fail"  # "Endpoints per Agent" is not listed
    assert "L-3E5722B2 'Active Session Workloads per Account' = 5000 applied" in check.message
    assert "L-8EE2AEA2 'Rate of new Runtime session creation' = 25 default" in check.message
    assert "not listed: L-0B3AF7ED, L-9B442722 'Endpoints per Agent'" in check.message
