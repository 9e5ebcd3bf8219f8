"""A thread-safe counter sink the logic writes to; handlers flush it to Powertools Metrics. The names are
`rollout_pipeline.metric_names`' (re-exported here for the stages)."""

from __future__ import annotations

import threading
from collections import Counter

from rollout_pipeline.metric_names import (
    ACCOUNT_SESSIONS_PERCENT,
    ACR_THROTTLED,
    BUDGET_HELD,
    BUDGET_USED_PERCENT,
    CANCELLED,
    COLD_START_RETRIED,
    DISPATCHED,
    ESTIMATED_COST,
    FAILED,
    IN_FLIGHT,
    LATE_OR_UNKNOWN,
    LIMIT_BACKLOG,
    LIMIT_WAITS,
    NEW_SESSIONS,
    NOTIFICATION_LATENCY,
    RETRIED,
    REWARD,
    SESSIONS_OVERDUE,
    STOP_FAILED,
    STOPS_PENDING,
    SUBMITTED,
    SUCCEEDED,
    SWEEP_ERRORS,
    TIMED_OUT,
    WARM_DROPPED,
    WARM_KEEPALIVES,
    WARM_POOL_SIZE,
    WARM_STARTS,
    WARM_STOPPED_UNUSED,
    WARMED,
    failed_metric,
)

__all__ = [
    "ACCOUNT_SESSIONS_PERCENT",
    "ACR_THROTTLED",
    "BUDGET_HELD",
    "BUDGET_USED_PERCENT",
    "CANCELLED",
    "COLD_START_RETRIED",
    "DISPATCHED",
    "ESTIMATED_COST",
    "FAILED",
    "IN_FLIGHT",
    "LATE_OR_UNKNOWN",
    "LIMIT_BACKLOG",
    "LIMIT_WAITS",
    "NEW_SESSIONS",
    "NOTIFICATION_LATENCY",
    "RETRIED",
    "REWARD",
    "SESSIONS_OVERDUE",
    "STOPS_PENDING",
    "STOP_FAILED",
    "SUBMITTED",
    "SUCCEEDED",
    "SWEEP_ERRORS",
    "TIMED_OUT",
    "WARMED",
    "WARM_DROPPED",
    "WARM_KEEPALIVES",
    "WARM_POOL_SIZE",
    "WARM_STARTS",
    "WARM_STOPPED_UNUSED",
    "MetricsRecorder",
    "failed_metric",
]


class MetricsRecorder:
    """Counts (summed), totals (summed amounts, e.g. USD) and samples (e.g. latencies in ms, gauges) collected
    during one invocation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.totals: dict[str, float] = {}
        self.samples: dict[str, list[float]] = {}

    def count(self, name: str, value: int = 1) -> None:
        """Add `value` to count `name` (a zero records nothing)."""
        if not value:
            return
        with self._lock:
            self.counts[name] += value

    def add(self, name: str, amount: float) -> None:
        """Add `amount` to the invocation's total of `name` (flushed once, as the sum)."""
        with self._lock:
            self.totals[name] = self.totals.get(name, 0.0) + amount

    def sample(self, name: str, value: float) -> None:
        with self._lock:
            self.samples.setdefault(name, []).append(value)

    def drain(self) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Return and reset everything recorded so far: counts and totals (by name), samples."""
        with self._lock:
            counts: dict[str, float] = {**self.counts, **self.totals}
            samples = {k: list(v) for k, v in self.samples.items()}
            self.counts.clear()
            self.totals.clear()
            self.samples.clear()
        return counts, samples
