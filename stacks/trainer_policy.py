"""A ready-made IAM managed policy for the trainer (SDK, ART backend): attach it to the trainer's role.

Built from `rollout_pipeline.ops.permissions.TRAINER_ACTIONS` (the one home of what the SDK calls), each action on
this experiment's own resources only. The stack outputs its ARN as `TrainerPolicyArn`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from rollout_pipeline import access, routing, topology
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ids import CLAIMS_PREFIX
from rollout_pipeline.ledger import keys
from rollout_pipeline.ops.permissions import SUBSCRIPTION_PREFIXES, TRAINER_ACTIONS, ResourceKind
from stacks import nag

#: Scoped by `events:TargetArn` to the subscription queues.
PUT_TARGETS: Final = "events:PutTargets"


def subscription_queue_arns(stack: Stack, bus_name: str) -> list[str]:
    """The queues of the private subscriptions on the bus (`{bus}-{kind}-*`: `bus_subscriptions`)."""
    return [
        stack.format_arn(service="sqs", resource=f"{bus_name}-{prefix}*", arn_format=ArnFormat.NO_RESOURCE_NAME)
        for prefix in SUBSCRIPTION_PREFIXES
    ]


def subscription_rule_arns(stack: Stack, bus_name: str) -> list[str]:
    """The rules of the private subscriptions, on the experiment's bus only."""
    return [
        stack.format_arn(
            service="events",
            resource="rule",
            resource_name=f"{bus_name}/{bus_name}-{prefix}*",
            arn_format=ArnFormat.SLASH_RESOURCE_NAME,
        )
        for prefix in SUBSCRIPTION_PREFIXES
    ]


class TrainerPolicy(Construct):
    """The managed policy; `resources` maps each kind of `TRAINER_ACTIONS` to its ARNs in this stack."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        input_bucket: s3.IBucket,
        results_bucket: s3.IBucket,
        rollout_queue: sqs.IQueue,
        trainer_queue: sqs.IQueue,
        table: dynamodb.ITable,
        bus: events.IEventBus,
        runtime_resources: Sequence[str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        bus_name = topology.bus_name(config.name)
        exp_prefix = f"{config.name}/"
        self.resources: Mapping[ResourceKind, list[str]] = {
            "stack": [stack.stack_id],
            "datasets": [input_bucket.arn_for_objects(f"{routing.DATASET_PREFIX}*")],
            "claims": [input_bucket.arn_for_objects(f"{CLAIMS_PREFIX}*")],
            "results": [results_bucket.arn_for_objects(f"{exp_prefix}*")],
            "results_listing": [results_bucket.bucket_arn],
            "rollout_queue": [rollout_queue.queue_arn],
            "trainer_queue": [trainer_queue.queue_arn],
            "ledger": [table.table_arn],
            "pool": [stack.format_arn(service="dynamodb", resource="table", resource_name=topology.POOL_TABLE_NAME)],
            "ledger_batches": [f"{table.table_arn}/index/{keys.DEADLINE_INDEX}"],
            "bus": [bus.event_bus_arn],
            "runtime": list(runtime_resources),
            "subscription_queues": subscription_queue_arns(stack, bus_name),
            "subscription_rules": subscription_rule_arns(stack, bus_name),
            "listing": ["*"],
        }
        statements = []
        for kind, actions in TRAINER_ACTIONS.items():
            sid = "".join(part.capitalize() for part in kind.split("_"))
            conditions: dict[str, dict[str, list[str]]] | None = None
            if kind == "results_listing":
                conditions = {"StringLike": {"s3:prefix": [f"{exp_prefix}*"]}}
            elif kind == "pool":
                conditions = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [access.POOL_LEADING_KEY]}}
            granted = [action for action in actions if action != PUT_TARGETS]
            if len(granted) < len(actions):
                # A subscription rule may only deliver to a subscription queue (not to any target the caller names).
                statements.append(
                    iam.PolicyStatement(
                        sid=f"{sid}Targets",
                        actions=[PUT_TARGETS],
                        resources=self.resources[kind],
                        conditions={"ArnLike": {"events:TargetArn": self.resources["subscription_queues"]}},
                    )
                )
            statements.append(
                iam.PolicyStatement(sid=sid, actions=granted, resources=self.resources[kind], conditions=conditions)
            )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description=f"Trainer (rollout-pipeline SDK, ART backend) access to experiment {config.name}",
            statements=statements,
        )
        self._acknowledge(input_bucket, results_bucket, config.name, bus_name)

    def _acknowledge(self, input_bucket: s3.IBucket, results_bucket: s3.IBucket, exp: str, bus_name: str) -> None:
        stack = Stack.of(self)
        findings = {
            nag.iam5(nag.bucket_prefix(input_bucket, routing.DATASET_PREFIX)): (
                "The trainer uploads dataset files under datasets/ (keys chosen by the user)."
            ),
            nag.iam5(nag.bucket_prefix(input_bucket, CLAIMS_PREFIX)): (
                "SDK submissions write claim checks of big payloads under claims/ (one key per row); rescore and "
                "export read them back."
            ),
            nag.iam5(nag.bucket_prefix(results_bucket, f"{exp}/")): (
                "The trainer reads result objects under this experiment's prefix (one key per session)."
            ),
        }
        for prefix in SUBSCRIPTION_PREFIXES:
            findings[nag.iam5(f"{nag.account_arn(stack, 'sqs')}:{bus_name}-{prefix}*")] = (
                "The SDK's private subscription queues (Experiment.tap, the ART backend) are named at run time "
                f"{bus_name}-{prefix}<random>; the trainer creates, reads and deletes only those."
            )
            findings[nag.iam5(f"{nag.account_arn(stack, 'events')}:rule/{bus_name}/{bus_name}-{prefix}*")] = (
                "The rules of those private subscriptions, on this experiment's bus only."
            )
        findings[nag.iam5("*")] = (
            "events:ListRules and sqs:ListQueues support no resource-level permissions; the SDK lists only by this "
            "experiment's name prefix to find and prune its own stale subscriptions."
        )
        for finding, reason in findings.items():
            nag.ack(self.policy, finding, reason)
