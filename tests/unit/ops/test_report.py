"""The batch report built from a recorded local batch (`tests/data/report_batch.json`: a real `rollouts local demo`
run with SmolLM2, recorded once with `collect`). Every chart must be drawn from the batch's data."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from rollout_pipeline.report.data import ReportData

pytest.importorskip("matplotlib")

from rollout_pipeline.report import render

RECORDED = Path(__file__).parent.parent.parent / "data" / "report_batch.json"
CHARTS = ("timeline", "sessions", "rewards", "groups", "duration", "latency", "failures", "retries", "cost")


@pytest.fixture(scope="module")
def data() -> ReportData:
    return ReportData.from_json(RECORDED.read_text())


@pytest.fixture(scope="module")
def sections(data: ReportData) -> dict[str, tuple[int, str]]:
    page = render(data)
    pattern = r'<section class="chart[^"]*" id="chart-([a-z]+)" data-points="(\d+)">(.*?)</section>'
    found = {m[1]: (int(m[2]), m[3]) for m in re.finditer(pattern, page, re.S)}
    assert tuple(found) == CHARTS
    return found


def test_the_recording_is_a_real_finished_batch(data: ReportData) -> None:
    assert data.status["done"] is True
    assert len(data.rows) == data.status["rollouts_total"] > 0
    assert any(e["detail-type"] == "Batch Completed" for e in data.events)


def test_every_chart_is_drawn_from_the_batch(data: ReportData, sections: dict[str, tuple[int, str]]) -> None:
    for name, (points, body) in sections.items():
        assert points > 0, f"chart {name} is empty"
        assert "<svg" in body, name
    finished = [r for r in data.rows if r["state"] in {"succeeded", "failed"}]
    succeeded = [r for r in data.rows if r["state"] == "succeeded"]
    # each rollout enters, is dispatched and finishes: the timeline has a point per distinct change time
    assert sections["timeline"][0] >= 2
    assert sections["sessions"][0] == sections["timeline"][0]
    assert f"limit ({data.max_sessions})" in sections["sessions"][1]
    assert sections["rewards"][0] == sections["groups"][0] == len(succeeded)
    assert sections["duration"][0] == len([r for r in finished if r.get("dispatched_at")])
    rollout_events = {
        e["detail"]["event_id"] for e in data.events if e["detail-type"] in {"Rollout Completed", "Rollout Failed"}
    }
    assert sections["latency"][0] == len(rollout_events)
    assert sections["retries"][0] == len(finished)
    for attempt, count in Counter(r["attempt"] for r in finished).items():
        label = f"ended on attempt {attempt}" if attempt else "never started"
        assert re.search(rf">{label}<.*?>{count}<", sections["retries"][1], re.S), (label, count)
    priced = [r["cost"] for r in data.rows if r.get("cost")]
    assert sections["cost"][0] == len(priced) == len(data.rows)
    total = sum(c["usd"] for c in priced)
    assert f"${total:.6f} for {len(priced)} rollouts" in sections["cost"][1]
    assert "local run priced as on AgentCore" in sections["cost"][1]
    failed = Counter(r["reason"] for r in data.rows if r["state"] == "failed")
    assert sections["failures"][0] == sum(failed.values())
    for reason in failed:
        assert f">{reason}<" in sections["failures"][1]


def test_every_group_is_on_the_group_chart(data: ReportData, sections: dict[str, tuple[int, str]]) -> None:
    for input_id in {r["input_id"] for r in data.rows}:
        assert f">{input_id}<" in sections["groups"][1]


def test_the_page_is_self_contained_and_small(data: ReportData) -> None:
    page = render(data)
    assert not re.search(r"<script|<link|<img|(src|href)=\"https?:|url\((?!#)", page), "nothing to fetch"
    assert data.batch_id in page
    assert len(page) < 600_000


def test_the_plotting_library_is_an_extra_never_in_the_lambda_bundle() -> None:
    from stacks.locks import LAMBDA_LOCK, lambda_requirements, read_pins

    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert any(r.startswith("matplotlib") for r in pyproject["project"]["optional-dependencies"]["report"])
    assert not any("matplotlib" in r for r in lambda_requirements())
    assert not any(pin.name == "matplotlib" for pin in read_pins(LAMBDA_LOCK))


def test_the_batch_duration_is_the_one_batch_completed_and_the_cli_give(data: ReportData) -> None:
    """One definition (`contracts.batch_duration_s`, the ledger's creation to completion, as `details.py` fills
    `Batch Completed.duration_s`, which `rollouts local demo` prints): not the span of the rollouts."""
    from rollout_pipeline.contracts import batch_duration_s, parse_iso
    from rollout_pipeline.report.data import timeline

    duration = batch_duration_s(parse_iso(data.status["created_at"]), parse_iso(data.status["completed_at"]))
    assert duration is not None
    assert round(duration, 1) != round(timeline(data).t[-1], 1)  # the recording tells the two apart
    assert f"<b>{duration:.1f} s</b><span>batch duration</span>" in render(data)


def test_the_sessions_chart_says_how_many_rollouts_started_warm(data: ReportData) -> None:
    rows = [dict(r) for r in data.rows]
    for row in rows[:3]:
        row["session_warmed_at"] = "2026-11-22T17:24:00+00:00"
    warm = ReportData.from_json(data.to_json())
    warm.rows = rows
    page = render(warm)
    assert f"3 of {len(rows)} rollouts started in a warm session of the warm pool." in page
    assert "started in a warm session" not in render(data)  # the recording ran without a warm pool


def test_first_attempts_are_green_retries_orange_and_captions_plain(data: ReportData) -> None:
    """The healthy bar ("ended on attempt 1") in the colour of done work, a retry orange, and no markdown backtick
    in a caption (HTML shows it as it is)."""
    from dataclasses import replace

    from rollout_pipeline.report.html import PALETTE, RETRIED

    rows = [dict(r) for r in data.rows]
    rows[0]["attempt"] = 2
    page = render(replace(data, rows=rows))
    retries = re.search(r'id="chart-retries".*?</section>', page, re.S)
    assert retries is not None
    fills = re.findall(r"fill:\s*(#[0-9a-f]{6})", retries[0])
    assert PALETTE["done"] in fills
    assert RETRIED in fills
    for caption in re.findall(r"<h2>[^<]*</h2><p>([^<]*)</p>", page):
        assert "`" not in caption, caption


def test_the_report_counts_rollouts_whose_model_replies_were_cut(data: ReportData) -> None:
    from dataclasses import replace

    rows = [dict(r) for r in data.rows]
    rows[0]["warning"] = "model replies: 1 cut short of 1 call(s)"
    page = render(replace(data, rows=rows))
    assert "<b>1</b><span>model replies cut, empty or failed</span>" in page
    assert "<b>0</b><span>model replies cut, empty or failed</span>" in render(data)
