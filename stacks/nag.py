"""cdk-nag (AwsSolutions) on every synth, and the stack's acknowledged findings, each with its reason.

Acknowledgments sit on the narrowest construct (the one policy or role) and name the exact IAM5 finding. A stack
hands this module what its findings sit on (`ExperimentFindings`, or the stack itself for the pool's): this module
imports no stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from aws_cdk import Acknowledgment, App, CfnElement, Stack, Token, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from rollout_pipeline import topology
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ids import CLAIMS_PREFIX
from rollout_pipeline.ops.permissions import SUBSCRIPTION_PREFIXES

IAM4: Final = "AwsSolutions-IAM4"
IAM5: Final = "AwsSolutions-IAM5"
BASIC_EXECUTION_POLICY: Final = "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"


def add_checks(app: App) -> None:
    """Run the AwsSolutions pack on every synth; an unacknowledged finding fails the synth."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def ack(scope: IConstruct, finding: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=finding, reason=reason))


def iam5(resource: str) -> str:
    return f"{IAM5}[Resource::{resource}]"


def logical_id(construct: IConstruct) -> str:
    element = construct if isinstance(construct, CfnElement) else construct.node.default_child
    assert isinstance(element, CfnElement)
    return str(Stack.of(construct).resolve(Stack.of(construct).get_logical_id(element)))


def bucket_prefix(bucket: s3.IBucket, prefix: str) -> str:
    """How cdk-nag spells `bucket.arn_for_objects(prefix + "*")`."""
    return f"<{logical_id(bucket)}.Arn>/{prefix}*"


def account_arn(stack: Stack, service: str) -> str:
    """`arn:partition:service:region:account` as cdk-nag prints it (pseudo parameters unless the env is known)."""

    def show(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value

    partition = show(stack.partition, "Partition")
    return f"arn:{partition}:{service}:{show(stack.region, 'Region')}:{show(stack.account, 'AccountId')}"


def default_policy(role: iam.IRole) -> IConstruct:
    return role.node.find_child("DefaultPolicy")


@dataclass(frozen=True)
class ExperimentFindings:
    """What the deliberate findings of an experiment stack sit on."""

    stack: Stack
    config: ExperimentConfig
    #: The dead-letter queue of the bus's rule targets.
    undelivered: IConstruct
    input_bucket: s3.IBucket
    results_bucket: s3.IBucket
    #: Each pipeline function's role, by the function's name (`topology.FUNCTION_NAMES`).
    function_roles: Mapping[str, iam.IRole]
    #: The AgentCore runtime, and its role.
    runtime: IConstruct
    runtime_role: iam.IRole
    #: The warm pool's queue of offers, when the pool is on.
    warm_queue: IConstruct | None = None


def _acknowledge_warm_queue(warm_queue: IConstruct | None) -> None:
    if warm_queue is not None:
        ack(
            warm_queue,
            "AwsSolutions-SQS3",
            "The warm pool's offers: each is received and given back many times, and one never taken expires; a "
            "dead-letter queue would only retire offers of live warm sessions.",
        )


def acknowledge(found: ExperimentFindings) -> None:
    """Acknowledge the deliberate findings of an experiment stack."""
    stack, exp = found.stack, found.config.name
    input_bucket, results_bucket = found.input_bucket, found.results_bucket
    roles = found.function_roles

    ack(
        found.undelivered,
        "AwsSolutions-SQS3",
        "This queue is itself a dead-letter queue: EventBridge rule targets send it the events they cannot deliver.",
    )
    _acknowledge_warm_queue(found.warm_queue)
    ingest_policy = default_policy(roles["ingest"])
    ack(
        ingest_policy,
        iam5(bucket_prefix(input_bucket, "datasets/")),
        "Ingest reads any dataset file the user uploads under datasets/ and writes its errors object beside it.",
    )
    ack(
        ingest_policy,
        iam5(bucket_prefix(input_bucket, CLAIMS_PREFIX)),
        "Ingest writes oversized row payloads under claims/, one object per row, keyed by batch and input id.",
    )
    ack(
        default_policy(roles["dispatch"]),
        iam5(bucket_prefix(input_bucket, CLAIMS_PREFIX)),
        "Dispatch reads the oversized row payloads ingest wrote under claims/ (keys known only at run time).",
    )
    invokers = ["dispatch", *(["sweeper"] if found.config.warm_pool_on else [])]  # the warm pool's warm-ups
    for name in invokers:
        ack(
            default_policy(roles[name]),
            iam5(f"<{logical_id(found.runtime)}.AgentRuntimeArn>/*"),
            "grant_invoke_runtime covers the endpoints of this one runtime only (runtime ARN + '/*').",
        )
    for name in (n for n in topology.FUNCTION_NAMES if n != "ingest"):
        ack(
            default_policy(roles[name]),
            iam5(bucket_prefix(results_bucket, f"{exp}/")),
            "Reads the result objects the agent writes under this experiment's prefix (one key per session).",
        )

    _acknowledge_reaper(stack, exp, roles["sweeper"])
    agent_policy = default_policy(found.runtime_role)
    logs_arn = f"{account_arn(stack, 'logs')}:log-group:"
    agent_findings = {
        iam5(bucket_prefix(results_bucket, f"{exp}/")): (
            "The agent writes one result object per session under its experiment prefix, nothing else in the bucket."
        ),
        iam5(f"{logs_arn}/aws/bedrock-agentcore/runtimes/*"): (
            "AgentCore Runtime L2 default: the runtime creates its log group under /aws/bedrock-agentcore/runtimes/."
        ),
        iam5(f"{logs_arn}/aws/bedrock-agentcore/runtimes/*:log-stream:*"): (
            "AgentCore Runtime L2 default: one log stream per session under the runtime's log groups."
        ),
        iam5(f"{logs_arn}*"): "AgentCore Runtime L2 default: logs:DescribeLogGroups only works on log-group:*.",
        iam5("*"): (
            "AgentCore Runtime L2 default: X-Ray, ecr:GetAuthorizationToken and namespace-conditioned PutMetricData "
            "do not support resource-level permissions."
            + (
                " MTRL environment mode: sagemaker:CallWithBearerToken (the job runtime's bearer tokens) is granted "
                "on * as AWS's AmazonSageMakerJobRuntimeAccess does, conditioned on aws:ResourceAccount."
                if found.config.mtrl_environment
                else ""
            )
        ),
        iam5(
            f"{account_arn(stack, 'bedrock-agentcore')}:workload-identity-directory/default/workload-identity/*"
        ): "AgentCore Runtime L2 default: the runtime's workload identity is created by the service at deploy time.",
    }
    for finding, reason in agent_findings.items():
        ack(agent_policy, finding, reason)

    for child in stack.node.children:
        if child.node.id.startswith("BucketNotificationsHandler"):
            ack(
                child.node.find_child("Role"),
                f"{IAM4}[{BASIC_EXECUTION_POLICY}]",
                "CDK's singleton handler that turns on S3 EventBridge notifications only needs to write its logs.",
            )


def _acknowledge_reaper(stack: Stack, exp: str, sweeper_role: iam.IRole) -> None:
    """The sweeper removes the private subscriptions of processes that are gone (`lifecycle.subscriptions`)."""
    sweeper_policy = default_policy(sweeper_role)
    bus = topology.bus_name(exp)
    for prefix in SUBSCRIPTION_PREFIXES:
        ack(
            sweeper_policy,
            iam5(f"{account_arn(stack, 'sqs')}:{bus}-{prefix}*"),
            "The sweeper removes the private subscription queues of processes that are gone (named at run time).",
        )
        ack(
            sweeper_policy,
            iam5(f"{account_arn(stack, 'events')}:rule/{bus}/{bus}-{prefix}*"),
            "The rules of those private subscriptions, on this experiment's bus only.",
        )
    ack(
        sweeper_policy,
        iam5("*"),
        "events:ListRules supports no resource-level permission; the sweeper lists by this experiment's name prefix.",
    )


def acknowledge_pool(stack: Stack) -> None:
    """Acknowledge the deliberate findings of the account pool's stack."""
    for child in stack.node.children:
        if child.node.id.startswith("AWS679f53fac002430cb0da5b7982bd2287"):  # AwsCustomResource's singleton
            ack(
                child.node.find_child("ServiceRole"),
                f"{IAM4}[{BASIC_EXECUTION_POLICY}]",
                "CDK's singleton handler that writes the pool's settings item at deploy only needs to write its logs.",
            )
            ack(
                child,
                "AwsSolutions-L1",
                "CDK's AwsCustomResource handler runtime is chosen by the CDK version; it runs only at deploy.",
            )
