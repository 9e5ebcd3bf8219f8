"""The pipeline's metric names: what the handlers emit (`lambdas/glue.flush_metrics`) and the stack's alarms and
dashboard read (`stacks/monitoring.py`), and the thread-safe sink the logic counts them in (`MetricsRecorder`). One home
for both sides: a name changed here changes on both."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Final

#: CloudWatch namespace of every pipeline metric (Powertools `POWERTOOLS_METRICS_NAMESPACE`).
METRICS_NAMESPACE: Final = "RolloutPipeline"

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
#: Ingestion's own counts per invocation (`ingest.core.IngestRecordsResult.counts`).
ROWS_ACCEPTED: Final = "RowsAccepted"
ROWS_REJECTED: Final = "RowsRejected"
ROLLOUTS_ENQUEUED: Final = "RolloutsEnqueued"
REWARD: Final = "Reward"
#: The warm pool (`lifecycle.warm_pool`, `lifecycle.warm`): rollouts started in a warm session, warm sessions found
#: dead at dispatch (the rollout took a new session), sessions warmed, kept alive, stopped unused, the pool's size
#: (a gauge) and its idle memory (GB-seconds of warm sessions that ran no rollout).
WARM_STARTS: Final = "WarmStarts"
WARM_DROPPED: Final = "WarmDropped"
WARMED: Final = "WarmSessionsStarted"
WARM_KEEPALIVES: Final = "WarmKeepAlives"
WARM_STOPPED_UNUSED: Final = "WarmStoppedUnused"
WARM_POOL_SIZE: Final = "WarmPoolSize"
#: USD: the cost of each rollout that ended (the estimate its event carries, `costs`), summed per invocation.
ESTIMATED_COST: Final = "EstimatedCost"
#: Sessions found alive past their attempt's deadline plus `session_grace_s` (their stop failed or came late):
#: counted once per session by the sweeper, which keeps stopping them.
SESSIONS_OVERDUE: Final = "SessionsOverdue"
#: The experiment's spend as a percentage of its budget (sampled when a budget is set): the alarm fires at 80.
BUDGET_USED_PERCENT: Final = "BudgetUsedPercent"
#: Rollouts held back because the budget (the experiment's or their batch's) is spent: re-sent later, not failed.
BUDGET_HELD: Final = "BudgetHeld"
#: The sessions every experiment of the account holds (their in-flight counts on the account pool, live members
#: only) as a percentage of the account's active-session quota: the sweeper samples it every minute.
ACCOUNT_SESSIONS_PERCENT: Final = "AccountSessionsPercent"

#: Metrics in US dollars (flushed without a unit).
USD_METRICS: Final = frozenset({ESTIMATED_COST})


def failed_metric(reason: str) -> str:
    """The per-reason failure metric, e.g. `Failed_timeout` (alongside the total `Failed`)."""
    return f"{FAILED}_{reason}"


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
