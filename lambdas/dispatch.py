"""Dispatcher Lambda: rollout queue (SQS batch, partial batch response) -> one ACR session per rollout attempt."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from rollout_pipeline.lifecycle.dispatch import dispatch_records
from rollout_pipeline.lifecycle.handlers import NAMESPACE, flush_metrics, get_deps, wait_budget_s
from rollout_pipeline.observability import SERVICES, clear_log_ids, install_log_ids

logger = Logger(service=SERVICES["dispatch"])
metrics = Metrics(namespace=NAMESPACE, service=SERVICES["dispatch"])


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics(raise_on_empty_metrics=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    deps = get_deps()
    install_log_ids(logger, deps.config.name)
    wait_until = time.monotonic() + wait_budget_s(context)
    records = event.get("Records") or []
    result = dispatch_records(records, deps, wait_until=wait_until)
    flush_metrics(deps.metrics, metrics, deps.config.name)
    clear_log_ids()
    logger.info(
        "dispatched batch",
        extra={"records": len(records), "outcomes": dict(result.outcomes), "failures": result.failures},
    )
    return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in result.failures]}
