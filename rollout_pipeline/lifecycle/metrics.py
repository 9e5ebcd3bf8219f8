"""Metric names and a thread-safe counter sink the logic writes to; handlers flush it to Powertools Metrics."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final

DISPATCHED: Final = "Dispatched"
#: AgentCore refused a call for now (ThrottlingException, ServiceQuotaExceeded, a conflict, 429/5xx, not
#: reachable): counted once per answer, by `limits.LimitedRuntime`.
ACR_THROTTLED: Final = "AcrThrottled"
#: The pipeline's own backlog: a call found no slot of its `tps`/session budget before its wait ended (no call was
#: made; AgentCore was not asked). Counted once per such call, by `limits.LimitedRuntime`.
LIMIT_BACKLOG: Final = "LimitBacklog"
#: A rollout or outbox entry the sweeper could not handle (an exception; it is tried again on the next sweep).
SWEEP_ERRORS: Final = "SweepErrors"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
TIMED_OUT: Final = "TimedOut"
LATE_OR_UNKNOWN: Final = "LateOrUnknownResult"
IN_FLIGHT: Final = "InFlight"
NOTIFICATION_LATENCY: Final = "NotificationLatency"
LIMIT_WAITS: Final = "LimitWaitRequeued"
RETRIED: Final = "Retried"
CANCELLED: Final = "Cancelled"
NEW_SESSIONS: Final = "NewSessions"
COLD_START_RETRIED: Final = "ColdStartRetried"
STOP_FAILED: Final = "StopFailed"
STOPS_PENDING: Final = "StopsPending"
SUBMITTED: Final = "Submitted"
REWARD: Final = "Reward"


def failed_metric(reason: str) -> str:
    """The per-reason failure metric, e.g. `Failed_timeout` (alongside the total `Failed`)."""
    return f"{FAILED}_{reason}"


class MetricsRecorder:
    """Counts (summed) and samples (e.g. latencies in ms, gauges) collected during one invocation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, list[float]] = {}

    def count(self, name: str, value: int = 1) -> None:
        with self._lock:
            self.counts[name] += value

    def sample(self, name: str, value: float) -> None:
        with self._lock:
            self.samples.setdefault(name, []).append(value)

    def drain(self) -> tuple[dict[str, int], dict[str, list[float]]]:
        """Return and reset everything recorded so far."""
        with self._lock:
            counts, samples = dict(self.counts), {k: list(v) for k, v in self.samples.items()}
            self.counts.clear()
            self.samples.clear()
        return counts, samples
