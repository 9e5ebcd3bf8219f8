"""The report's series from ledger rows and events: timeline counts, durations, latencies, group signal."""

from __future__ import annotations

import pytest

from rollout_pipeline.report.data import (
    ReportData,
    attempts,
    durations_s,
    failures_by_reason,
    groups_with_signal,
    has_signal,
    notify_latencies_ms,
    rewards_by_group,
    throttled,
    timeline,
)

T0 = "2026-01-01T00:00:00+00:00"


def at(seconds: float) -> str:
    return f"2026-01-01T00:00:{seconds:06.3f}+00:00"


def row(input_id: str, index: int, state: str, **extra: object) -> dict[str, object]:
    return {"input_id": input_id, "index": index, "state": state, "submitted_at": T0, **extra}


DATA = ReportData(
    experiment="x",
    batch_id="b-1",
    status={"created_at": T0, "failed_by_reason": {"timeout": 1}},
    rows=[
        row("a", 0, "succeeded", dispatched_at=at(1), finished_at=at(4), reward=1.0, attempt=1),
        row("a", 1, "succeeded", dispatched_at=at(2), finished_at=at(3), reward=0.0, attempt=1),
        row("b", 0, "failed", dispatched_at=at(2), finished_at=at(9), reason="timeout", attempt=2),
        row("b", 1, "failed", finished_at=at(5), reason="cancelled", attempt=0),  # cancelled while queued
        row("c", 0, "queued"),
    ],
    events=[
        {
            "detail-type": "Rollout Completed",
            "detail": {"event_id": "e1", "timings": {"finished_at": at(3), "notified_at": at(3.25)}},
        },
        {
            "detail-type": "Rollout Completed",
            "detail": {"event_id": "e1", "timings": {"finished_at": at(3), "notified_at": at(3.25)}},
        },
        {"detail-type": "Group Completed", "detail": {"event_id": "g1"}},
    ],
    max_sessions=2,
)


def test_timeline_counts_queued_in_flight_done_at_each_change() -> None:
    line = timeline(DATA)
    assert line.t == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0]
    assert line.queued == [5, 4, 2, 2, 2, 1, 1]
    assert line.in_flight == [0, 1, 3, 2, 1, 1, 0]
    assert line.done == [0, 0, 0, 1, 2, 3, 4]
    for q, f, d in zip(line.queued, line.in_flight, line.done, strict=True):
        assert q + f + d == len(DATA.rows)


def test_durations_latencies_and_counts() -> None:
    assert durations_s(DATA) == [3.0, 1.0, 7.0]
    assert notify_latencies_ms(DATA) == [250.0]  # the duplicate delivery counted once
    assert rewards_by_group(DATA) == {"a": [1.0, 0.0], "b": [], "c": []}
    assert failures_by_reason(DATA) == {"timeout": 1, "cancelled": 1}
    assert attempts(DATA) == {0: 1, 1: 2, 2: 1}
    assert throttled(DATA) == 0


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [([1.0, 0.0], True), ([0.1, 0.1, 0.1], False), ([0.5, None, 0.5], False), ([None, None], False), ([], False)],
)
def test_has_signal(rewards: list[float | None], expected: bool) -> None:
    assert has_signal(rewards) is expected


def test_groups_with_signal_counts_only_scored_groups() -> None:
    assert groups_with_signal({"a": [1.0, 0.0], "b": [0.3, 0.3], "c": []}) == (1, 2)


def test_report_data_round_trips_through_json() -> None:
    assert ReportData.from_json(DATA.to_json()) == DATA
