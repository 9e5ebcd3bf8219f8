"""`rollouts local demo` before and after the run: what a user gets wrong is one line before anything starts (the
setting, or the user's own file and line), and the summary says the batch's own duration and warns when the batch
carries no reward signal."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollout_pipeline.cli import EXIT_ERROR, EXIT_USAGE, main
from rollout_pipeline.cli.base import clipped
from rollout_pipeline.contracts import BatchAccepted, BatchCompleted
from rollout_pipeline.local.demo import DemoResult, prepare_upload, print_summary

STARTED = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the local pipeline is started at all."""
    from rollout_pipeline.local import pipeline

    def refuse(self: object) -> None:
        raise AssertionError("the pipeline was started")

    monkeypatch.setattr(pipeline.LocalPipeline, "_start", refuse)


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["local", "demo", "--model-url", "http://127.0.0.1:9/v1", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("nothing_starts")
def test_a_bad_experiment_name_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _demo(capsys, "--experiment", "Bad_Name")
    assert code == EXIT_ERROR
    assert err.splitlines() == [
        "rollouts: error: invalid experiment configuration: name: String should match pattern "
        "'^[a-z][a-z0-9-]{0,31}$' (got 'Bad_Name')"
    ]
    assert "starting the local pipeline" not in out


@pytest.mark.usefixtures("nothing_starts")
def test_a_negative_group_size_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _demo(capsys, "--group-size", "-2")
    assert code == EXIT_USAGE
    assert "argument --group-size: -2 is below 1" in err
    assert "Traceback" not in err


@pytest.mark.usefixtures("nothing_starts")
def test_a_missing_dataset_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    code, _out, err = _demo(capsys, "--dataset", str(missing))
    assert code == EXIT_ERROR
    assert err.splitlines() == [f"rollouts: error: {missing}: no such file"]


@pytest.mark.usefixtures("nothing_starts")
def test_a_broken_dataset_names_the_users_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dataset = tmp_path / "mine.jsonl"
    dataset.write_text('{"id": "a", "question": "1 + 1", "answer": "2"}\n\n{"id": "b", "question": \n')
    code, out, err = _demo(capsys, "--dataset", str(dataset), "--rows", "2")
    assert code == EXIT_ERROR
    (line,) = err.splitlines()
    assert line.startswith(f"rollouts: error: {dataset}:3: "), line  # the user's file and line, not a copy's
    assert "starting the local pipeline" not in out


def test_the_rows_taken_are_a_prefix_of_the_users_file(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    rows = [json.dumps({"id": f"r{n}", "question": f"{n} + 1", "answer": str(n + 1)}) for n in range(4)]
    dataset.write_text(f"{rows[0]}\n\n{rows[1]}\n{rows[2]}\n{rows[3]}\n")
    (tmp_path / "copy").mkdir()
    upload = prepare_upload(dataset, 2, tmp_path / "copy")
    assert upload.name == dataset.name
    assert upload.read_text() == f"{rows[0]}\n\n{rows[1]}\n"  # line numbers are the user's
    assert prepare_upload(dataset, None, tmp_path / "copy") == dataset


def _completed(rewards_std: float, mean: float = 0.0) -> BatchCompleted:
    return BatchCompleted(
        event_id="e",
        exp_id="local-demo",
        batch_id="b-1",
        rollouts_total=4,
        succeeded=4,
        failed=0,
        failed_by_reason={},
        reward_mean=mean,
        reward_std=rewards_std,
        reward_count=4,
        started_at=STARTED,
        completed_at=STARTED + timedelta(seconds=44),
        duration_s=44.0,
    )


def test_the_summary_gives_the_batchs_duration_and_the_whole_runs_apart() -> None:
    out = io.StringIO()
    print_summary(DemoResult(batch_id="b-1", completed=_completed(0.5, 0.5), elapsed_s=50.1), out)
    assert "batch b-1: COMPLETED in 44.0 s (the whole run, start-up included: 50.1 s)" in out.getvalue()
    assert "WARNING" not in out.getvalue()


def test_the_summary_warns_when_the_batch_has_no_reward_signal() -> None:
    out = io.StringIO()
    print_summary(DemoResult(batch_id="b-1", completed=_completed(0.0), elapsed_s=50.1), out)
    assert "WARNING no reward signal in batch b-1: all 4 rewards are 0" in out.getvalue()


def test_an_interrupted_run_prints_what_it_saw() -> None:
    accepted = BatchAccepted(
        event_id="a",
        exp_id="local-demo",
        batch_id="b-1",
        rows_accepted=6,
        rows_rejected=0,
        rollouts_enqueued=24,
        group_size=4,
    )
    report = DemoResult(
        batch_id="b-1", accepted=accepted, rollouts_ok=9, rollouts_failed={"timeout": 1}, interrupted=True
    )
    report.elapsed_s = 12.3
    out = io.StringIO()
    print_summary(report, out)
    text = out.getvalue()
    assert "batch b-1: INTERRUPTED after 12.3 s (the local pipeline was stopped)" in text
    assert "rollouts ended so far: 10 of 24: 9 succeeded, 1 failed {'timeout': 1}" in text


def test_a_batch_where_no_rollout_succeeded_is_a_failed_demo() -> None:
    accepted = BatchAccepted(
        event_id="a",
        exp_id="local-demo",
        batch_id="b-1",
        rows_accepted=1,
        rollouts_enqueued=4,
        rows_rejected=0,
        group_size=4,
    )
    report = DemoResult(
        batch_id="b-1", accepted=accepted, completed=_completed(0.0), rollouts_failed={"agent_error": 4}
    )
    assert not report.ok
    out = io.StringIO()
    print_summary(report, out)
    assert "FAILED no rollout succeeded" in out.getvalue()
    report.rollouts_ok, report.rollouts_failed = 1, {"agent_error": 3}
    assert report.ok


def test_an_error_line_is_cut_at_a_word_not_mid_word() -> None:
    error = "status_code 500: Connection error. (openai.APIConnectionError: Connection error.) " * 4
    line = clipped(error, 60)
    assert len(line) <= 60
    assert line.endswith("...")
    assert error.startswith(line[:-3])
    assert error[len(line) - 3] == " "  # the next character of the text is a space: no word was cut
    assert clipped("short\nerror") == "short error"
