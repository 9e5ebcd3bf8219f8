"""Ingest Lambda: S3 dataset "Object Created" events (via the ingest SQS queue) -> rollout messages + ledger.

Thin: parses the SQS batch, calls `rollout_pipeline.ingest.Ingestion`, reports partial batch failures
(`batchItemFailures`). Settings, adapters and the ingestion object are built once per container, lazily.
Environment: `HandlerSettings` variables, `POWERTOOLS_SERVICE_NAME`, `POWERTOOLS_METRICS_NAMESPACE`.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from rollout_pipeline.ingest.core import Ingestion
from rollout_pipeline.lifecycle.metrics import SUBMITTED
from rollout_pipeline.observability import SERVICES, install_log_ids

logger = Logger(service=SERVICES["ingest"])
metrics = Metrics(service=SERVICES["ingest"])  # namespace: POWERTOOLS_METRICS_NAMESPACE

_ingestion: Ingestion | None = None


def _get_ingestion() -> Ingestion:
    """Build settings and adapters once per container (boto3 is imported on first use only)."""
    global _ingestion  # noqa: PLW0603 - one instance per container by design
    if _ingestion is None:
        from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
        from rollout_pipeline.adapters.s3 import S3ObjectStore
        from rollout_pipeline.adapters.sqs import SqsQueue
        from rollout_pipeline.config import HandlerSettings
        from rollout_pipeline.ingest.core import IngestPorts
        from rollout_pipeline.ledger.batches import BatchLedger

        settings = HandlerSettings.from_environ()
        _ingestion = Ingestion(
            IngestPorts(
                store=S3ObjectStore(),
                queue=SqsQueue(),
                publisher=EventBridgePublisher(settings.bus_name),
                ledger=BatchLedger(settings.table_name, ttl_days=settings.experiment.ledger_ttl_days),
                settings=settings,
            )
        )
    return _ingestion


def reset() -> None:
    """Forget the cached ingestion (tests change the environment between cases)."""
    global _ingestion  # noqa: PLW0603
    _ingestion = None


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """SQS batch handler: one ingest message per record; a failed record is reported, the others are acked."""
    ingestion = _get_ingestion()
    metrics.add_dimension(name="Experiment", value=ingestion.exp_id)
    install_log_ids(logger, ingestion.exp_id)
    failures: list[dict[str, str]] = []
    for record in event.get("Records") or []:
        message_id = record.get("messageId", "")
        try:
            body = json.loads(record["body"])
            result = ingestion.handle_message(
                body,
                # The lease owner is the message: a redelivery of this same message (after a crash or timeout)
                # takes its own lease back at once; duplicates of the S3 event are other messages and ack.
                owner=message_id or str(getattr(context, "aws_request_id", "")),
                remaining_ms=getattr(context, "get_remaining_time_in_millis", None),
            )
        except Exception:
            logger.exception("ingest message failed; it will be retried", extra={"message_id": message_id})
            failures.append({"itemIdentifier": message_id})
            continue
        logger.info(
            "ingest message done",
            extra={
                "message_id": message_id,
                "batch_id": result.batch_id,
                "outcome": result.outcome,
                "rows_accepted": result.rows_accepted,
                "rows_rejected": result.rows_rejected,
                "rollouts_enqueued": result.rollouts_enqueued,
            },
        )
        metrics.add_metric(name="RowsAccepted", unit=MetricUnit.Count, value=result.rows_accepted)
        metrics.add_metric(name="RowsRejected", unit=MetricUnit.Count, value=result.rows_rejected)
        metrics.add_metric(name="RolloutsEnqueued", unit=MetricUnit.Count, value=result.rollouts_enqueued)
        metrics.add_metric(name=SUBMITTED, unit=MetricUnit.Count, value=result.rollouts_enqueued)
    return {"batchItemFailures": failures}
