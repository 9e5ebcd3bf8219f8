"""The DynamoDB ledger table (schema in `rollout_pipeline.ledger.keys`) and its least-privilege grants."""

from __future__ import annotations

from typing import Final

from aws_cdk import CfnResource
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from rollout_pipeline import access
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger import keys
from stacks.retention import removal_policy

#: The physical id (before the table's name) of the custom resource that sets the table's deletion protection.
DELETION_PROTECTION_ID: Final = "ledger-deletion-protection"
#: The physical id (before the table's name) of the custom resource that stamps the ledger's layout.
LAYOUT_STAMP_ID: Final = "ledger-layout"
#: The functions' actions on the ledger: item reads and writes (no code of theirs calls BatchWriteItem or Scan).
READ_WRITE_ACTIONS: Final = access.LEDGER_ITEM_ACTIONS


class LedgerTableConstruct(Construct):
    """On-demand table with PITR, TTL on `expires_at` and the two sparse GSIs `deadline` and `outbox`."""

    def __init__(self, scope: Construct, construct_id: str, *, config: ExperimentConfig) -> None:
        super().__init__(scope, construct_id)
        string, number = dynamodb.AttributeType.STRING, dynamodb.AttributeType.NUMBER
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=keys.PK, type=string),
            sort_key=dynamodb.Attribute(name=keys.SK, type=string),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=keys.TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            # Never on at create: a failed first create deletes the table (RetainExceptOnCreate), and DeleteTable
            # refuses a protected one, which fails the rollback. `protect_after` turns it on later.
            deletion_protection=False,
            removal_policy=removal_policy(config),
        )
        self._config = config
        for index, pk, sk in (
            (keys.DEADLINE_INDEX, keys.DEADLINE_PK, keys.DEADLINE_SK),
            (keys.OUTBOX_INDEX, keys.OUTBOX_PK, keys.OUTBOX_SK),
        ):
            self.table.add_global_secondary_index(
                index_name=index,
                partition_key=dynamodb.Attribute(name=pk, type=string),
                sort_key=dynamodb.Attribute(name=sk, type=number),
                projection_type=dynamodb.ProjectionType.ALL,
            )

    def protect_after(self, dependency: IConstruct) -> None:
        """Deletion protection as `results_retention` wants it (on for `retain`), set by `UpdateTable` once
        `dependency` (the runtime, the create's likeliest failure) exists.

        Its DeletionPolicy is the table's: a failed create deletes it (turning protection off, so the table can go
        too); `cdk destroy` of a retained stack keeps it (and the table protected); `destroy` turns it off first.
        """
        wanted = self._config.results_retention == "retain"

        def protection(enabled: bool) -> cr.AwsSdkCall:
            return cr.AwsSdkCall(
                service="DynamoDB",
                action="updateTable",
                parameters={"TableName": self.table.table_name, "DeletionProtectionEnabled": enabled},
                physical_resource_id=cr.PhysicalResourceId.of(f"{DELETION_PROTECTION_ID}-{self.table.table_name}"),
                # Turning it off for a table already gone: nothing to do.
                ignore_error_codes_matching=None if enabled else "ResourceNotFoundException",
            )

        self.deletion_protection = cr.AwsCustomResource(
            self,
            "DeletionProtection",
            on_create=protection(wanted),
            on_update=protection(wanted),
            on_delete=protection(False),
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [iam.PolicyStatement(actions=["dynamodb:UpdateTable"], resources=[self.table.table_arn])]
            ),
            install_latest_aws_sdk=False,
        )
        self.deletion_protection.node.add_dependency(dependency)
        custom = self.deletion_protection.node.find_child("Resource").node.default_child
        assert isinstance(custom, CfnResource)
        custom.apply_removal_policy(removal_policy(self._config))

    def stamp_layout(self) -> cr.AwsCustomResource:
        """Put the ledger's layout stamp (`keys.layout_item()`, `LIMIT`/`LAYOUT`) on create, and again on an update
        that changes `keys.LAYOUT_VERSION` (CloudFormation updates a custom resource only when its properties change;
        a rollback puts the old version back). Make the functions depend on it: they refuse another layout, and
        the stamp must be there before they are created or updated."""
        put = cr.AwsSdkCall(
            service="DynamoDB",
            action="putItem",
            parameters={"TableName": self.table.table_name, "Item": keys.layout_item()},
            physical_resource_id=cr.PhysicalResourceId.of(f"{LAYOUT_STAMP_ID}-{self.table.table_name}"),
        )
        self.layout_stamp = cr.AwsCustomResource(
            self,
            "LayoutStamp",
            on_create=put,
            on_update=put,
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [iam.PolicyStatement(actions=["dynamodb:PutItem"], resources=[self.table.table_arn])]
            ),
            install_latest_aws_sdk=False,
        )
        return self.layout_stamp

    def index_arn(self, index_name: str) -> str:
        return f"{self.table.table_arn}/index/{index_name}"

    def grant_list_batches(self, grantee: iam.IGrantable) -> None:
        """Query on the `deadline` index alone: the experiment's newest batches (`BatchLedger.recent_batch_ids`,
        which `Budget Exhausted` lists as waiting when a dispatcher announces it)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:Query"], resource_arns=[self.index_arn(keys.DEADLINE_INDEX)]
        )

    def grant_read_write(self, grantee: iam.IGrantable, *, query_indexes: bool = False) -> None:
        """Item reads/writes on the table; with `query_indexes`, Query on the two named GSIs (no `index/*`)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=list(READ_WRITE_ACTIONS), resource_arns=[self.table.table_arn]
        )
        if query_indexes:
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["dynamodb:Query"],
                resource_arns=[self.index_arn(keys.DEADLINE_INDEX), self.index_arn(keys.OUTBOX_INDEX)],
            )
