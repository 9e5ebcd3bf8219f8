"""Sweeper Lambda (schedule): time out rollouts past their deadline (retry or fail) and drain the outbox."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger, Metrics

from rollout_pipeline.lifecycle.handlers import NAMESPACE, flush_metrics, get_deps, wait_budget_s
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.observability import SERVICES, clear_log_ids, install_log_ids

logger = Logger(service=SERVICES["sweeper"])
metrics = Metrics(namespace=NAMESPACE, service=SERVICES["sweeper"])


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics(raise_on_empty_metrics=False)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:  # noqa: ARG001
    deps = get_deps()
    install_log_ids(logger, deps.config.name)
    report = sweep(deps, wait_until=time.monotonic() + wait_budget_s(context, 30.0))
    flush_metrics(deps.metrics, metrics, deps.config.name)
    clear_log_ids()
    summary = asdict(report)
    logger.info("sweep done", extra=summary)
    return summary
