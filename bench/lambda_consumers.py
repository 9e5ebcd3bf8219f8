"""The Lambdas' own handlers behind local mode's queue consumers, for the benchmarks (no loop of their own).

`lambda_consumer` polls a queue the way Lambda's event source does (`local.lambda_runtime.QueueConsumer`: batches
of 10, partial batch failures made visible again) and hands each batch to a handler such as
`lambdas.dispatch.function.bind(deps)`. `quiet_handlers` keeps the handlers' Powertools output out of the
figures; `KeptMetrics` keeps what the handlers drain after each invocation, for the report.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from rollout_pipeline.metric_names import MetricsRecorder

if TYPE_CHECKING:
    from rollout_pipeline.local.lambda_runtime import QueueConsumer


class KeptMetrics(MetricsRecorder):
    """A recorder whose drains (one per handler invocation) are also kept: `kept_counts`, `kept_samples`."""

    def __init__(self) -> None:
        super().__init__()
        self.kept_counts: Counter[str] = Counter()
        self.kept_samples: dict[str, list[float]] = {}

    def drain(self) -> tuple[dict[str, int], dict[str, list[float]]]:
        counts, samples = super().drain()
        self.kept_counts.update(counts)
        for name, values in samples.items():
            self.kept_samples.setdefault(name, []).extend(values)
        return counts, samples


class _NoMetrics:
    """Powertools `Metrics` that publishes nothing (its overflow flush prints even when metrics are disabled)."""

    def log_metrics(self, **_options: Any) -> Any:
        return lambda handler: handler

    def add_dimension(self, **_dimension: Any) -> None:
        pass

    def add_metric(self, **_metric: Any) -> None:
        pass


def quiet_handlers() -> None:
    """The pipeline functions log warnings only and emit no EMF lines (call before binding their handlers)."""
    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"
    import lambdas.completion
    import lambdas.dispatch
    import lambdas.sweeper

    for module in (lambdas.dispatch, lambdas.completion, lambdas.sweeper):
        module.function.metrics = _NoMetrics()  # type: ignore[assignment]


def lambda_consumer(
    name: str, queue_url: str, handler: Any, *, workers: int, wait_budget_s: float, idle_s: float = 0.1
) -> QueueConsumer:
    """`workers` pollers of `queue_url` running `handler`, each invocation given `wait_budget_s` to wait in (the
    glue's `wait_budget_s`: the Lambda's remaining time minus its safety margin). Short polls, `idle_s` apart on an
    empty queue: a long poll would hold the lock that makes every moto request atomic
    (`bench_lifecycle._atomic_moto`)."""
    from lambdas.glue import SAFETY_S
    from rollout_pipeline.local.lambda_runtime import QueueConsumer

    return QueueConsumer(
        name,
        queue_url,
        handler,
        region="us-east-1",
        max_concurrency=workers,
        timeout_s=SAFETY_S + wait_budget_s,
        wait_time_s=0,
        idle_s=idle_s,
    )
