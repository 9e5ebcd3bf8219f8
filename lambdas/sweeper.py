"""Sweeper Lambda (schedule): time out rollouts past their deadline (retry or fail), drain the outbox, and manage
the warm pool (`lifecycle.warm_pool`: fill, keep alive, trim, stop; ticking for up to `warm_loop_s` while it is on)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from lambdas.glue import RunResult, lifecycle_function, wait_budget_s
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.lifecycle.warm_pool import run_pool


def run(deps: LifecycleDeps, event: dict[str, Any], context: Any) -> RunResult:  # noqa: ARG001
    started = time.monotonic()
    budget_s = wait_budget_s(context, 30.0)
    summary = asdict(sweep(deps, wait_until=started + budget_s))
    ticks = run_pool(deps, until=started + min(budget_s, max(0.0, deps.warm_loop_s)))
    last = ticks[-1] if ticks else None
    if last is not None and last.ran:
        summary["warm_pool"] = {
            "ticks": len(ticks),
            "target": last.target,
            "idle": last.idle,
            "warmed": sum(t.warmed for t in ticks),
            "stopped": sum(t.stopped for t in ticks),
            "halted": last.halted,
        }
    return RunResult(summary, "sweep done", summary)


function = lifecycle_function("sweeper", run)
handler = function.handler
