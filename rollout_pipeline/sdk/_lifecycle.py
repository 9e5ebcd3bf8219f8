"""Cancel through the lifecycle stage's `cancel_batch` (FALLBACK until it lands: see `_fallback_cancel`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.batches import STATUS_ACCEPTED, STATUS_CANCELLED, STATUS_INGESTING

if TYPE_CHECKING:
    from rollout_pipeline.sdk.experiment import Experiment


def cancel_batch(experiment: Experiment, batch_id: str) -> Any:
    """Cancel a batch; returns what the lifecycle stage returns (or the fallback's updated batch item)."""
    return _fallback_cancel(experiment, batch_id)


def _fallback_cancel(experiment: Experiment, batch_id: str) -> Any:
    """THIN FALLBACK: flag the batch `cancelled` (the dispatcher skips its queued rollouts). It does not stop
    running sessions: that is the lifecycle stage's `cancel_batch`, which replaces this once it lands."""
    ddb = experiment.client("dynamodb")
    try:
        resp = ddb.update_item(
            TableName=experiment.table_name,
            Key=keys.batch_key(batch_id),
            UpdateExpression="SET #status = :cancelled",
            ConditionExpression="#status IN (:ingesting, :accepted)",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={
                ":cancelled": {"S": STATUS_CANCELLED},
                ":ingesting": {"S": STATUS_INGESTING},
                ":accepted": {"S": STATUS_ACCEPTED},
            },
            ReturnValues="ALL_NEW",
        )
    except ddb.exceptions.ConditionalCheckFailedException:
        return None
    return resp["Attributes"]
