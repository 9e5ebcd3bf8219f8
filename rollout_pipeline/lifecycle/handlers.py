"""Helpers shared by the lifecycle Lambda handlers: settings/deps once per container, metrics flush, budgets."""

from __future__ import annotations

import os
import threading
from typing import Any, Final

from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.metrics import MetricsRecorder

NAMESPACE: Final = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "RolloutPipeline")
#: Time kept back from the Lambda's remaining time: re-sending waiting messages and returning must fit in it.
SAFETY_S: Final = 20.0

_lock = threading.Lock()
_deps: LifecycleDeps | None = None


def get_deps() -> LifecycleDeps:
    """The container's LifecycleDeps, built on first use from the environment (HandlerSettings.from_environ)."""
    global _deps  # noqa: PLW0603 - one instance per container by design
    with _lock:
        if _deps is None:
            from rollout_pipeline.config import HandlerSettings

            _deps = LifecycleDeps.from_settings(HandlerSettings.from_environ())
        return _deps


def set_deps(deps: LifecycleDeps | None) -> None:
    """Use these deps in the handlers of this process (local mode, tests); None forgets them."""
    global _deps  # noqa: PLW0603
    with _lock:
        _deps = deps


def wait_budget_s(context: Any, default_s: float = 60.0) -> float:
    """How long waiting work may wait in this invocation: the remaining time minus a safety margin."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return default_s
    return max(1.0, float(remaining()) / 1000.0 - SAFETY_S)


def flush_metrics(recorder: MetricsRecorder, metrics: Any, experiment: str) -> None:
    """Copy what the logic recorded into a Powertools `Metrics` (flushed by its `log_metrics` decorator)."""
    from aws_lambda_powertools.metrics import MetricUnit

    counts, samples = recorder.drain()
    metrics.add_dimension(name="Experiment", value=experiment)
    for name, value in counts.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    for name, values in samples.items():
        unit = MetricUnit.Milliseconds if name.endswith("Latency") else MetricUnit.Count
        for sample in values[:100]:
            metrics.add_metric(name=name, unit=unit, value=sample)
