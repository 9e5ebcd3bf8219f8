"""The account pool: one small stack per account and region (`rollouts bootstrap`, as `cdk bootstrap` is).

It holds the pool's table (`topology.POOL_TABLE_NAME`, well-known: every experiment stack reaches it by name and
imports its export `topology.POOL_TABLE_EXPORT`, so no experiment deploys without it and CloudFormation refuses to
delete it while one uses it) and writes the pool's settings into it at deploy (`quotas.PoolSettings`: the account's
AgentCore quotas as `rollouts bootstrap` read them from Service Quotas, or their documented defaults, or overrides,
and the reserve). The table holds leases only (seconds long): it is not retained when the stack is deleted.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import custom_resources as cr
from constructs import Construct

from rollout_pipeline import topology
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.pool_schema import POOL_PK, POOL_SK, settings_update
from rollout_pipeline.quotas import PoolSettings
from stacks import nag
from stacks.functions import LOG_RETENTION_DAYS
from stacks.monitoring import expire_every_log_group, give_every_function_a_log_group


class PoolStack(Stack):
    """The pool table, its settings item, and the export experiment stacks import."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: PoolSettings, **kwargs: object) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        string = dynamodb.AttributeType.STRING
        self.settings = settings
        self.table = dynamodb.Table(
            self,
            "Table",
            table_name=topology.POOL_TABLE_NAME,
            partition_key=dynamodb.Attribute(name=keys.PK, type=string),
            sort_key=dynamodb.Attribute(name=keys.SK, type=string),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=RemovalPolicy.DESTROY,
        )
        update = settings_update(topology.POOL_TABLE_NAME, settings)
        call = cr.AwsSdkCall(
            service="DynamoDB",
            action="updateItem",
            parameters=update,
            physical_resource_id=cr.PhysicalResourceId.of(f"{POOL_PK}/{POOL_SK}"),
        )
        self.writer = cr.AwsCustomResource(
            self,
            "Settings",
            on_create=call,
            on_update=call,
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(resources=[self.table.table_arn]),
            install_latest_aws_sdk=False,
        )
        self.writer.node.add_dependency(self.table)
        CfnOutput(
            self,
            "PoolTableName",
            value=self.table.table_name,
            export_name=topology.POOL_TABLE_EXPORT,
            description="The account pool's table: every experiment stack of this account and region imports it",
        )
        # The custom resource's handler logs like the experiment stacks' functions: a month, gone with the stack
        # (CDK's default for its log group is two years, retained).
        give_every_function_a_log_group(self, LOG_RETENTION_DAYS, RemovalPolicy.DESTROY)
        expire_every_log_group(self, LOG_RETENTION_DAYS, RemovalPolicy.DESTROY)
        nag.acknowledge_pool(self)
