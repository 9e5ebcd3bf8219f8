"""What a trainer's IAM principal needs: every AWS call of the SDK, as IAM actions on the experiment's resources.

The ART backend (`rollout_pipeline.trainers.art`) calls AWS only through the SDK, so this covers it too. The stack
turns it into a customer-managed policy (output `TrainerPolicyArn`, `stacks/trainer_policy.py`) to attach to the
trainer's role; `tests/integration/sdk/test_trainer_permissions.py` records the SDK's calls under moto (its requests
carry the `rollout-pipeline-sdk` user agent) and fails if one is not allowed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from rollout_pipeline import access, bus_subscriptions

ResourceKind = Literal[
    "stack",
    "datasets",
    "claims",
    "results",
    "results_listing",
    "rollout_queue",
    "trainer_queue",
    "ledger",
    "pool",
    "ledger_batches",
    "bus",
    "runtime",
    "subscription_queues",
    "subscription_rules",
    "listing",
]

#: IAM actions per resource of the experiment (what `stacks/trainer_policy.py` grants, and on what).
TRAINER_ACTIONS: Final[Mapping[ResourceKind, tuple[str, ...]]] = {
    "stack": ("cloudformation:DescribeStacks",),  # Experiment.attach reads the stack outputs
    "datasets": ("s3:PutObject",),  # submit_file uploads under datasets/
    # submit writes claim checks of big payloads under claims/; rescore and export read them back
    "claims": ("s3:PutObject", "s3:GetObject"),
    "results": ("s3:GetObject",),  # results too big to travel inline in their event
    "results_listing": ("s3:ListBucket",),  # so a missing result answers 404, not 403 (prefix {exp}/ only)
    "rollout_queue": ("sqs:SendMessage",),  # submit; SendMessageBatch is authorized as SendMessage
    "trainer_queue": (
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    ),
    "ledger": access.LEDGER_ITEM_ACTIONS,
    # The account pool's one item: `exp.capacity()` reads it, a cancel's stops renew the experiment's lease.
    "pool": access.POOL_ITEM_ACTIONS,
    # exp.cost(), export/rescore of every batch and `rollouts export --all-batches` list the experiment's
    # batches: a Query of the `deadline` index's batch partition (never a Scan of the table)
    "ledger_batches": ("dynamodb:Query",),
    "bus": ("events:PutEvents",),  # submit publishes Batch Accepted; cancel publishes the failures
    "runtime": ("bedrock-agentcore:StopRuntimeSession",),  # cancel stops running sessions
    # Private subscriptions (`exp.events.tap`, streams of some batches, the ART backend's per-process queue):
    # `{bus}-tap-*`, `{bus}-sdk-*`, `{bus}-art-*`.
    "subscription_queues": (
        "sqs:CreateQueue",
        "sqs:DeleteQueue",
        "sqs:GetQueueAttributes",
        "sqs:SetQueueAttributes",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:TagQueue",  # owner and times, so `subscriptions prune` can tell a stale subscription
        "sqs:ListQueueTags",
        "sqs:GetQueueUrl",
    ),
    "subscription_rules": (
        "events:PutRule",
        "events:PutTargets",
        "events:RemoveTargets",
        "events:DeleteRule",
        "events:TagResource",
        "events:ListTagsForResource",
        "events:ListTargetsByRule",
    ),
    # Finding this experiment's subscriptions by name prefix (prune): these List actions have no resource-level
    # permissions, so IAM needs "*" (Service Authorization Reference, EventBridge and SQS).
    "listing": ("events:ListRules", "sqs:ListQueues"),
}
#: Name prefixes (after `{bus name}-`) of the SDK's private subscription queues and rules: `rollouts watch`'s taps,
#: the SDK's streams of some batches and `RolloutClient`s (`sdk-`), the ART backend's process queues.
SUBSCRIPTION_PREFIXES: Final = tuple(f"{kind}-" for kind in bus_subscriptions.BUS_KINDS)

#: API operations authorized by an action of another name.
_RENAMED: Final[Mapping[tuple[str, str], str]] = {
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sqs", "DeleteMessageBatch"): "sqs:DeleteMessage",
    ("sqs", "ChangeMessageVisibilityBatch"): "sqs:ChangeMessageVisibility",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "CreateMultipartUpload"): "s3:PutObject",
    ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
    ("dynamodb", "TransactGetItems"): "dynamodb:GetItem",
}
_TRANSACT_WRITE_ACTIONS: Final = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def iam_actions(service: str, operation: str, params: Mapping[str, Any]) -> tuple[str, ...]:
    """The IAM actions that authorize one API call (`service` as botocore names it, e.g. `sqs`, `SendMessage`).

    https://docs.aws.amazon.com/service-authorization/latest/reference/reference_policies_actions-resources-contextkeys.html
    """
    if (service, operation) == ("dynamodb", "TransactWriteItems"):
        kinds = {kind for item in params.get("TransactItems", []) for kind in item}
        return tuple(sorted(_TRANSACT_WRITE_ACTIONS[kind] for kind in kinds))
    renamed = _RENAMED.get((service, operation))
    return (renamed,) if renamed else (f"{service}:{operation}",)
