"""Sweeper Lambda (schedule): time out rollouts past their deadline (retry or fail) and drain the outbox."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from lambdas.glue import RunResult, lifecycle_function, wait_budget_s
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep


def run(deps: LifecycleDeps, event: dict[str, Any], context: Any) -> RunResult:  # noqa: ARG001
    summary = asdict(sweep(deps, wait_until=time.monotonic() + wait_budget_s(context, 30.0)))
    return RunResult(summary, "sweep done", summary)


function = lifecycle_function("sweeper", run)
handler = function.handler
