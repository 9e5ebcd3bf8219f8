"""Dispatcher Lambda: rollout queue (SQS batch, partial batch response) -> one ACR session per rollout attempt."""

from __future__ import annotations

import time
from typing import Any

from lambdas.glue import RunResult, lifecycle_function, records, wait_budget_s
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import dispatch_records


def run(deps: LifecycleDeps, event: dict[str, Any], context: Any) -> RunResult:
    batch = records(event)
    result = dispatch_records(batch, deps, wait_until=time.monotonic() + wait_budget_s(context))
    return RunResult.of_batch("dispatched batch", len(batch), result)


function = lifecycle_function("dispatch", run)
handler = function.handler
