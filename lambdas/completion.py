"""Completion Lambda: completion queue (S3 Object Created events of results) -> terminal state + events."""

from __future__ import annotations

import time
from typing import Any

from lambdas.glue import RunResult, lifecycle_function, records, wait_budget_s
from rollout_pipeline.lifecycle.completion import complete_records
from rollout_pipeline.lifecycle.deps import LifecycleDeps


def run(deps: LifecycleDeps, event: dict[str, Any], context: Any) -> RunResult:
    batch = records(event)
    result = complete_records(batch, deps, wait_until=time.monotonic() + wait_budget_s(context, 30.0))
    return RunResult.of_batch("completed batch", len(batch), result)


function = lifecycle_function("completion", run)
handler = function.handler
