"""What a batch report shows, read through the SDK and reduced to plain series (standard library only).

Sources: the batch's ledger status (`exp.batches.status`), one export row per rollout (`exp.data.export`: ledger
state, attempt, reward, reason, timings, plus the result object) and, when the caller recorded them, the pushed
events (their `notified_at` is the only record of when an event left; the ledger does not keep it). `ReportData`
round-trips through JSON, so a batch can be recorded once and its report rebuilt anywhere.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from rollout_pipeline.contracts import SIGNAL_EPS, DetailType, batch_duration_s, iso, parse_iso, reward_stats

#: Result-object values longer than this are cut in the report's data (model outputs can be long).
MAX_RESULT_TEXT: Final = 300
_ROLLOUT_EVENTS: Final = frozenset({DetailType.ROLLOUT_COMPLETED.value, DetailType.ROLLOUT_FAILED.value})


@dataclass
class ReportData:
    """Everything a report is drawn from (JSON-serialisable: `to_json` / `from_json`)."""

    experiment: str
    batch_id: str
    status: dict[str, Any]
    rows: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    max_sessions: int | None = None
    tps_limit: int | None = None
    generated_at: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> ReportData:
        return cls(**json.loads(text))


def _trim(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_RESULT_TEXT:
        return value[:MAX_RESULT_TEXT] + "..."
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trim(v) for v in value[:50]]
    return value


#: Event detail fields a report keeps (inline result objects and payload references are left out).
EVENT_FIELDS: Final = frozenset(
    {"event_id", "batch_id", "input_id", "index", "rollout_id", "attempt", "reason", "reward", "rewards", "timings"}
)


def _slim(event: Mapping[str, Any]) -> dict[str, Any]:
    detail = event.get("detail") or {}
    return {
        "detail-type": event.get("detail-type"),
        "time": event.get("time"),
        "detail": {k: _trim(v) for k, v in detail.items() if k in EVENT_FIELDS},
    }


def collect(experiment: Any, batch_id: str, events: Iterable[Mapping[str, Any]] = ()) -> ReportData:
    """Read a batch through the SDK (`batches.status`, `data.export`) and keep the events that belong to it.

    `experiment` is an attached `rollout_pipeline.sdk.Experiment` (deployed or local); `events` are EventBridge
    envelopes (as the trainer queue delivers them), e.g. recorded by `rollouts local demo`.
    """
    status = experiment.batches.status(batch_id).as_dict()
    buffer = io.StringIO()
    experiment.data.export(batch_id, buffer, include_results=True)
    rows = [_trim(json.loads(line)) for line in buffer.getvalue().splitlines() if line.strip()]
    kept = [_slim(e) for e in events if (e.get("detail") or {}).get("batch_id") == batch_id]
    config = getattr(experiment, "config", None)
    return ReportData(
        experiment=str(getattr(experiment, "name", "")),
        batch_id=batch_id,
        status=status,
        rows=rows,
        events=kept,
        max_sessions=getattr(config, "max_sessions", None),
        tps_limit=getattr(config, "tps_limit", None),
        generated_at=iso(datetime.now(UTC)),
    )


def read_events(path: Path) -> list[dict[str, Any]]:
    """Event envelopes from a JSON Lines file (one EventBridge event per line; other lines are skipped)."""
    events: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict) and isinstance(value.get("detail"), dict):
                events.append(value)
    return events


# ------------------------------------------------------------------------------------------------- series


def _seconds(value: Any, origin: datetime) -> float | None:
    moment = parse_iso(value)
    return None if moment is None else (moment - origin).total_seconds()


def origin(data: ReportData) -> datetime | None:
    """Time zero of the report: the batch's creation, else the earliest submission."""
    candidates = [parse_iso(data.status.get("created_at"))]
    candidates += [parse_iso(row.get("submitted_at")) for row in data.rows]
    found = [c for c in candidates if c is not None]
    return min(found) if found else None


@dataclass(frozen=True)
class Timeline:
    """Step series over seconds since `origin`: rollouts queued, in flight and done after each change."""

    t: list[float]
    queued: list[int]
    in_flight: list[int]
    done: list[int]


def timeline(data: ReportData) -> Timeline:
    """Queued = submitted and not yet dispatched, in flight = dispatched and not finished, done = finished.

    A retried rollout counts from its last attempt's dispatch (the ledger keeps the current attempt's times)."""
    start = origin(data)
    if start is None:
        return Timeline([], [], [], [])
    changes: list[tuple[float, int, int, int]] = []  # (t, d_queued, d_in_flight, d_done)
    for row in data.rows:
        submitted = _seconds(row.get("submitted_at"), start)
        dispatched = _seconds(row.get("dispatched_at"), start)
        finished = _seconds(row.get("finished_at"), start)
        if submitted is None:
            submitted = 0.0
        changes.append((submitted, 1, 0, 0))
        if dispatched is not None:
            changes.append((dispatched, -1, 1, 0))
            if finished is not None:
                changes.append((finished, 0, -1, 1))
        elif finished is not None:  # ended without a dispatch (cancelled while queued)
            changes.append((finished, -1, 0, 1))
    changes.sort(key=lambda c: (c[0], -c[3]))
    out = Timeline([], [], [], [])
    queued = in_flight = done = 0
    for t, dq, di, dd in changes:
        queued, in_flight, done = queued + dq, in_flight + di, done + dd
        if out.t and out.t[-1] == t:
            out.queued[-1], out.in_flight[-1], out.done[-1] = queued, in_flight, done
        else:
            out.t.append(t)
            out.queued.append(queued)
            out.in_flight.append(in_flight)
            out.done.append(done)
    return out


def batch_duration(data: ReportData) -> float | None:
    """The batch's duration as `Batch Completed` and the CLI give it (`contracts.batch_duration_s`: creation to
    completion), None while the batch runs."""
    return batch_duration_s(parse_iso(data.status.get("created_at")), parse_iso(data.status.get("completed_at")))


def durations_s(data: ReportData) -> list[float]:
    """Seconds from dispatch to result of every finished rollout that was dispatched."""
    values = []
    for row in data.rows:
        start, end = parse_iso(row.get("dispatched_at")), parse_iso(row.get("finished_at"))
        if start is not None and end is not None:
            values.append(max(0.0, (end - start).total_seconds()))
    return values


def notify_latencies_ms(data: ReportData) -> list[float]:
    """Milliseconds from result written (`finished_at`) to event published (`notified_at`), per rollout event."""
    values = []
    seen: set[str] = set()
    for event in data.events:
        if event.get("detail-type") not in _ROLLOUT_EVENTS:
            continue
        detail = event.get("detail") or {}
        key = str(detail.get("event_id") or detail.get("rollout_id"))
        if key in seen:
            continue
        seen.add(key)
        timings = detail.get("timings") or {}
        finished, notified = parse_iso(timings.get("finished_at")), parse_iso(timings.get("notified_at"))
        if finished is not None and notified is not None:
            values.append(max(0.0, (notified - finished).total_seconds() * 1000))
    return values


def rewards_by_group(data: ReportData) -> dict[str, list[float]]:
    """Scalar rewards of the succeeded rollouts, by input id (groups in input-id order)."""
    groups: dict[str, list[float]] = {}
    for row in data.rows:
        groups.setdefault(str(row.get("input_id")), [])
        if row.get("state") == "succeeded" and isinstance(row.get("reward"), int | float):
            groups[str(row["input_id"])].append(float(row["reward"]))
    return dict(sorted(groups.items()))


def has_signal(rewards: Sequence[float | None]) -> bool:
    """True when a group's rewards differ, so its GRPO advantages are not all zero (it carries gradient)."""
    _, std = reward_stats([r for r in rewards if r is not None])
    return std is not None and std > SIGNAL_EPS


def groups_with_signal(groups: Mapping[str, Sequence[float]]) -> tuple[int, int]:
    """(groups whose rewards differ, i.e. non-zero GRPO advantages; groups with at least one reward)."""
    scored = [values for values in groups.values() if values]
    return sum(1 for values in scored if has_signal(values)), len(scored)


def failures_by_reason(data: ReportData) -> dict[str, int]:
    """Failed rollouts by reason, from the ledger rows (the status counters as a fallback)."""
    counts = Counter(str(row.get("reason") or "unknown") for row in data.rows if row.get("state") == "failed")
    return dict(counts) if counts else {k: int(v) for k, v in (data.status.get("failed_by_reason") or {}).items()}


def model_warnings(data: ReportData) -> int:
    """Rollouts whose result was computed from model replies the agent host saw cut short, empty or failed (their
    `warning`)."""
    return sum(1 for row in data.rows if row.get("warning"))


def attempts(data: ReportData) -> dict[int, int]:
    """How many rollouts ended on attempt 1, 2, ... (attempt > 1 = retried after a timeout; 0 = never started,
    e.g. cancelled while queued)."""
    counts = Counter(int(row.get("attempt") or 0) for row in data.rows if row.get("state") in {"succeeded", "failed"})
    return dict(sorted(counts.items()))


def warm_starts(data: ReportData) -> int:
    """Rollouts whose (last) attempt started in a warm session of the warm pool (`session_warmed_at`)."""
    return sum(1 for row in data.rows if row.get("session_warmed_at"))


@dataclass(frozen=True)
class Costs:
    """The batch's rollouts' costs as published (`cost` of each export row), in the order they ended: cumulative
    sums by part over seconds since `origin`."""

    t: list[float]
    memory: list[float]
    cpu: list[float]
    pipeline: list[float]
    per_rollout: list[float]
    cpu_measured: int
    priced_as: str

    @property
    def total(self) -> float:
        return (self.memory[-1] + self.cpu[-1] + self.pipeline[-1]) if self.t else 0.0


def costs(data: ReportData) -> Costs:
    """Cumulative cost over time from the export rows' `cost` (rows without one, e.g. older rollouts, are left out)."""
    start = origin(data)
    priced = []
    for row in data.rows:
        cost = row.get("cost")
        if not isinstance(cost, dict) or start is None:
            continue
        ended = _seconds(row.get("finished_at"), start)
        priced.append((0.0 if ended is None else ended, cost))
    priced.sort(key=lambda pair: pair[0])
    out = Costs([], [], [], [], [], 0, "")
    memory = cpu = pipeline = 0.0
    for ended, cost in priced:
        memory += float(cost.get("agentcore_memory_usd") or 0.0)
        cpu += float(cost.get("agentcore_cpu_usd") or 0.0)
        pipeline += float(cost.get("pipeline_usd") or 0.0)
        out.t.append(ended)
        out.memory.append(memory)
        out.cpu.append(cpu)
        out.pipeline.append(pipeline)
        out.per_rollout.append(float(cost.get("usd") or 0.0))
    measured = sum(1 for _ended, cost in priced if cost.get("cpu") == "measured")
    label = str(priced[0][1].get("priced_as") or "") if priced else ""
    return Costs(out.t, out.memory, out.cpu, out.pipeline, out.per_rollout, measured, label)


def throttled(data: ReportData) -> int:
    """Rollouts that failed because ACR kept throttling their start."""
    return sum(1 for row in data.rows if row.get("state") == "failed" and row.get("reason") == "throttled")
