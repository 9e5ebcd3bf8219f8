"""Completion Lambda: completion queue (S3 Object Created events of results) -> terminal state + events."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from rollout_pipeline.lifecycle.completion import complete_records
from rollout_pipeline.lifecycle.handlers import NAMESPACE, flush_metrics, get_deps, wait_budget_s
from rollout_pipeline.observability import SERVICES, clear_log_ids, install_log_ids

logger = Logger(service=SERVICES["completion"])
metrics = Metrics(namespace=NAMESPACE, service=SERVICES["completion"])


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics(raise_on_empty_metrics=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    deps = get_deps()
    install_log_ids(logger, deps.config.name)
    records = event.get("Records") or []
    result = complete_records(records, deps, wait_until=time.monotonic() + wait_budget_s(context, 30.0))
    flush_metrics(deps.metrics, metrics, deps.config.name)
    clear_log_ids()
    logger.info(
        "completed batch",
        extra={"records": len(records), "outcomes": dict(result.outcomes), "failures": result.failures},
    )
    return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in result.failures]}
