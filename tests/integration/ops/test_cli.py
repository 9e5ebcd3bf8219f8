"""The `rollouts` command through its entry point (`main([...])`) against moto: submit, status, cancel, export,
watch (from pushed events, via a tap queue or the trainer queue), `--help`, the `local` group hook, and error paths
(one clear line on stderr, non-zero exit, no traceback)."""

from __future__ import annotations

import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment
from rollout_pipeline.sdk.batches import Batches
from rollout_pipeline.sdk.events import Events
from tests.conftest import REGION, receive_all
from tests.integration.lifecycle_support import make_deps, moto_lock  # noqa: F401 - fixture
from tests.integration.sdk.test_sdk_client import Pipeline
from tests.integration.sdk.test_sdk_submit import _deploy_stack, write_jsonl

E = ["-e", "test-exp", "--region", REGION]


@pytest.fixture
def deployed(resources: ExperimentResources) -> ExperimentResources:
    _deploy_stack(resources.stack_outputs())
    return resources


@pytest.fixture
def experiment(deployed: ExperimentResources) -> Experiment:
    return Experiment.attach("test-exp", region=REGION)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("rollouts: error: ")
    return lines[0]


# ------------------------------------------------------------------------------------------------------ help


def test_help_reads_well(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    for command in ("submit", "watch", "status", "cancel", "export"):
        assert command in out
    assert "examples:" in out
    assert main(["submit", "--help"]) == EXIT_OK
    sub = capsys.readouterr().out
    assert "--group-size N" in sub
    assert "--sampling-params JSON" in sub
    assert "--experiment NAME" in sub


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == EXIT_USAGE
    assert main(["status", *E]) == EXIT_USAGE  # --batch is required
    assert "--batch" in capsys.readouterr().err


def test_local_group_is_registered_when_local_mode_provides_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.ModuleType("rollout_pipeline.local.cli")
    calls: list[str] = []

    def register(subparsers: object, common: object) -> None:
        local = subparsers.add_parser("local", help="run the pipeline on this machine")  # type: ignore[attr-defined]

        def handler(args: object, out: object) -> int:
            calls.append("local")
            return 0

        local.set_defaults(handler=handler)

    module.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rollout_pipeline.local.cli", module)
    assert main(["--help"]) == EXIT_OK
    assert "run the pipeline on this machine" in capsys.readouterr().out
    assert main(["local"]) == EXIT_OK
    assert calls == ["local"]


# ---------------------------------------------------------------------------------------------------- submit


def test_submit_prints_the_batch_id(
    deployed: ExperimentResources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    code = main(["submit", str(path), *E, "--group-size", "4", "--sampling-params", '{"temperature": 0.2}'])
    assert code == EXIT_OK
    captured = capsys.readouterr()
    batch_id = captured.out.strip()
    assert batch_id.startswith("train-")
    # The hint carries the options the command ran with (here the region), so it works where the command did.
    assert f"follow it with: rollouts watch -e test-exp --region {REGION} --batch {batch_id}" in captured.err
    head = clients.client("s3").head_object(Bucket=deployed.input_bucket, Key="datasets/train.jsonl")
    assert head["Metadata"]["group-size"] == "4"
    assert json.loads(head["Metadata"]["sampling-params"]) == {"temperature": 0.2}
    assert len(receive_all(deployed.ingest_queue_url)) == 1


@pytest.mark.timing
@pytest.mark.usefixtures("moto_lock")
def test_submit_and_watch(
    deployed: ExperimentResources,
    deps: LifecycleDeps,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from tests.integration.sdk.test_sdk_submit import ingest_pending

    experiment = Experiment.attach("test-exp", region=REGION)
    stop = threading.Event()

    def ingest() -> None:
        while not stop.wait(0.2):
            ingest_pending(experiment)

    worker = threading.Thread(target=ingest, daemon=True)
    worker.start()
    path = write_jsonl(tmp_path / "w.jsonl", [{"prompt": "a"}])
    try:
        with Pipeline(deployed, deps):
            code = main(
                ["submit", str(path), *E, "--group-size", "2", "--timeout", "60", "--watch", "--poll-wait", "0"]
            )
    finally:
        stop.set()
        worker.join(10)
    assert code == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("w-")
    assert out[-1] == f"batch {out[0]}: 2/2 done: 2 succeeded, 0 failed, 0 running, 0 queued, reward mean 1.0000"


def test_submit_invalid_file_is_one_clear_line(
    deployed: ExperimentResources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "a"}', '{"prompt": '])
    assert main(["submit", str(path), *E]) == EXIT_ERROR
    line = one_error_line(capsys.readouterr().err)
    assert f"{path}:2: invalid_json: invalid JSON" in line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--sampling-params", "{oops"], "--sampling-params is not valid JSON"),
        (["--sampling-params", "[1]"], "--sampling-params must be a JSON object"),
        (["--group-size", "0"], "invalid option group_size"),
    ],
)
def test_submit_bad_options(
    deployed: ExperimentResources,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    expected: str,
) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "a"}])
    assert main(["submit", str(path), *E, *argv]) == EXIT_ERROR
    assert expected in one_error_line(capsys.readouterr().err)


def test_experiment_not_deployed(resources: ExperimentResources, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "-e", "other", "--region", REGION, "--batch", "b"]) == EXIT_ERROR
    line = one_error_line(capsys.readouterr().err)
    assert "experiment 'other' is not deployed in us-east-1" in line
    assert "rollouts deploy -e other" in line


def test_no_experiment_given(
    resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ROLLOUTS_EXPERIMENT", raising=False)
    assert main(["status", "--batch", "b"]) == EXIT_ERROR
    assert "no experiment: pass -e/--experiment NAME" in one_error_line(capsys.readouterr().err)


@pytest.mark.usefixtures("no_aws_credentials")
def test_no_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    # A real (non-loopback) endpoint: loopback endpoints are local mode, which needs no credentials.
    code = main(["status", *E, "--batch", "b", "--endpoint-url", "https://cloudformation.example.invalid"])
    assert code == EXIT_ERROR
    assert "no AWS credentials found" in one_error_line(capsys.readouterr().err)


def test_outputs_file_instead_of_cloudformation(
    resources: ExperimentResources, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"Rollouts-test-exp": resources.stack_outputs()}))
    batch_id = Experiment.from_outputs(resources.stack_outputs()).submit([{"id": "q1"}])
    assert main(["status", "--outputs-file", str(outputs), "--batch", batch_id, "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["rollouts_total"] == 2
    outputs.write_text("{not json")
    assert main(["status", "--outputs-file", str(outputs), "--batch", batch_id]) == EXIT_ERROR
    assert "cannot read outputs file" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------ status, cancel, export


def test_status_cancel_export(experiment: Experiment, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch_id = experiment.submit([{"id": "q1", "p": 1}, {"id": "q2", "p": 2}], group_size=2)
    assert main(["status", *E, "--batch", batch_id]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"batch      {batch_id} (accepted)" in out  # rollouts to run
    assert "4 total: 4 queued, 0 running, 0 succeeded, 0 failed" in out

    assert main(["cancel", *E, "--batch", batch_id]) == EXIT_OK
    assert "4 rollout(s) ended as cancelled, 0 had finished before" in capsys.readouterr().out
    assert main(["status", *E, "--batch", batch_id, "--json"]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert (status["status"], status["done"], status["failed_by_reason"]) == ("cancelled", True, {"cancelled": 4})

    target = tmp_path / "out.jsonl"
    assert main(["export", *E, "--batch", batch_id, "-o", str(target), "--with-payload"]) == EXIT_OK
    assert "exported 4 rollout(s)" in capsys.readouterr().err
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert {(r["input_id"], r["index"], r["state"], r["reason"]) for r in rows} == {
        (i, n, "failed", "cancelled") for i in ("q1", "q2") for n in (0, 1)
    }
    assert {r["input_id"]: r["payload"] for r in rows} == {"q1": {"p": 1}, "q2": {"p": 2}}

    assert main(["export", *E, "--batch", batch_id, "--no-results"]) == EXIT_OK
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_unknown_batch(deployed: ExperimentResources, capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("status", "cancel", "export"):
        assert main([command, *E, "--batch", "nope-000000000000"]) == EXIT_ERROR
        assert "no batch 'nope-000000000000'" in one_error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------------------------------- watch


@pytest.mark.timing
@pytest.mark.usefixtures("moto_lock")
@pytest.mark.parametrize("source", [[], ["--from-trainer-queue"]], ids=["tap", "trainer-queue"])
def test_watch_follows_a_batch_to_completion_from_pushed_events(
    experiment: Experiment,
    deployed: ExperimentResources,
    deps: LifecycleDeps,
    capsys: pytest.CaptureFixture[str],
    source: list[str],
    tmp_path: Path,
) -> None:
    from rollout_pipeline.report.data import read_events

    batch_id = experiment.submit([{"id": "q1"}, {"id": "q2"}], group_size=2)
    events_file = tmp_path / "events" / "batch.jsonl"
    argv = ["watch", *E, "--batch", batch_id, "--timeout", "60", "--poll-wait", "0", "--events", str(events_file)]
    with Pipeline(deployed, deps):
        code = main([*argv, *source])
    assert code == EXIT_OK
    out = capsys.readouterr().out
    assert f"batch {batch_id}: 4/4 done: 4 succeeded, 0 failed, 0 running, 0 queued, reward mean 1.0000" in out
    # --events: what `rollouts report --events` reads, one line per event seen (redeliveries written once).
    events = read_events(events_file)
    ids_seen = [event["detail"]["event_id"] for event in events]
    assert len(ids_seen) == len(set(ids_seen))
    kinds = {event["detail-type"] for event in events}
    assert {"Rollout Completed", "Batch Completed"} <= kinds
    assert sum(event["detail-type"] == "Rollout Completed" for event in events) == 4
    if not source:
        names = clients.client("sqs").list_queues().get("QueueUrls", [])
        assert not [n for n in names if "-tap-" in n], "the tap queue is removed afterwards"
        rules = clients.client("events").list_rules(EventBusName=deployed.bus_name)["Rules"]
        assert not [r for r in rules if "-tap-" in r["Name"]], "the tap rule is removed afterwards"


@pytest.mark.usefixtures("moto_lock")
def test_watch_draws_a_progress_bar_on_a_terminal(
    experiment: Experiment,
    deployed: ExperimentResources,
    deps: LifecycleDeps,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats stderr as a terminal
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    batch_id = experiment.submit([{"id": "q1"}], group_size=2)
    with Pipeline(deployed, deps):
        code = main(["watch", *E, "--batch", batch_id, "--timeout", "60", "--poll-wait", "0"])
    assert code == EXIT_OK
    err = capsys.readouterr().err
    assert batch_id in err
    assert "2/2" in err
    assert "2 ok" in err
    assert "reward 1.000" in err


def test_watch_times_out_with_non_zero_exit(experiment: Experiment, capsys: pytest.CaptureFixture[str]) -> None:
    batch_id = experiment.submit([{"id": "q1"}], group_size=1)
    assert main(["watch", *E, "--batch", batch_id, "--timeout", "1.5", "--poll-wait", "0"]) == EXIT_ERROR
    assert f"batch {batch_id}: 0/1 done" in capsys.readouterr().out


def test_watch_of_a_batch_that_does_not_exist_fails_with_the_closest_one(
    experiment: Experiment, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_pipeline.cli import watch

    monkeypatch.setattr(watch, "MISSING_BATCH_GRACE_S", 0.5)
    batch_id = experiment.submit([{"id": "q1"}], group_size=1)
    started = time.monotonic()
    code = main(["watch", *E, "--batch", batch_id[:-1] + "x", "--poll-wait", "0"])
    assert code == EXIT_ERROR
    assert time.monotonic() - started < 30, "fails fast instead of waiting for events that never come"
    err = capsys.readouterr().err
    assert f"no batch '{batch_id[:-1]}x' in experiment" in err
    assert f"did you mean {batch_id}?" in err


@pytest.mark.timing
@pytest.mark.usefixtures("moto_lock")
def test_watch_all_batches_logs_events(
    experiment: Experiment, deployed: ExperimentResources, deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import threading
    from contextlib import contextmanager

    def tap_subscribed() -> bool:
        rules = clients.client("events").list_rules(EventBusName=deployed.bus_name)["Rules"]
        return any("-tap-" in rule["Name"] for rule in rules)

    def later() -> None:
        # Submit once the watch's tap is subscribed (a fixed delay raced the tap's set-up on a loaded machine).
        deadline = time.monotonic() + 30
        while not tap_subscribed() and time.monotonic() < deadline:
            time.sleep(0.1)
        batch_id = experiment.submit([{"id": "q1"}], group_size=2)
        submitted.append(batch_id)

    def expected_lines() -> list[str]:
        (batch_id,) = submitted
        return [
            f"{batch_id} accepted: 1 rows (0 rejected), 2 rollouts",
            f"{batch_id} group q1: 2/2 succeeded, reward mean 1.0000",
            f"{batch_id} completed: 2 succeeded, 0 failed, reward mean 1.0000",
        ]

    def all_logged() -> bool:
        return len(submitted) == 1 and all(line in out.getvalue() for line in expected_lines())

    # The watch of every batch runs until its --timeout: the tap's timeout is up once every line this test looks
    # for is logged (an injected end; --timeout stays a bound for a stuck pipeline), not after a fixed 15 s.
    real_tap = Events.tap

    @contextmanager
    def tap_ending_once_logged(self: Events, *args: object, **kwargs: object) -> Iterator[Any]:
        with real_tap(self, *args, **kwargs) as stream:
            expired = stream.expired
            monkeypatch.setattr(stream, "expired", lambda: all_logged() or expired())
            yield stream

    monkeypatch.setattr(Events, "tap", tap_ending_once_logged)
    out = io.StringIO()
    submitted: list[str] = []
    submitter = threading.Thread(target=later)
    submitter.start()
    with Pipeline(deployed, deps):
        assert main(["watch", *E, "--timeout", "60", "--poll-wait", "0"], out=out) == EXIT_OK
    submitter.join()
    for line in expected_lines():
        assert line in out.getvalue()


def test_cancel_says_which_sessions_are_left_to_the_sweeper(
    experiment: Experiment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout_pipeline.lifecycle.cancel import CancelResult

    batch_id = experiment.submit([{"id": "q1", "p": 1}], group_size=2)
    real_cancel = Batches.cancel

    def cancel_with_failed_stops(self: Batches, batch: str, runtime: object = None) -> CancelResult:
        real_cancel(self, batch)
        return CancelResult(batch_id=batch, cancelled=2, sessions_stopped=0, stops_pending=2)

    monkeypatch.setattr(Batches, "cancel", cancel_with_failed_stops)
    assert main(["cancel", *E, "--batch", batch_id]) == EXIT_OK
    out = capsys.readouterr().out
    assert "2 rollout(s) ended as cancelled, 0 had finished before (0 succeeded, 0 failed)" in out
    assert "running sessions: 0 stopped, 2 not stopped yet: the pipeline's sweeper retries their stops" in out


# ------------------------------------------------------------------------------------------------------ cost


def test_cost_prints_the_per_batch_and_per_experiment_sums(
    experiment: Experiment, resources: ExperimentResources, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.sdk.cost import usd
    from tests.integration.lifecycle_support import drive

    usage = {"_rollout_usage": {"cpu_s": 2.0, "rollouts": 1}}
    deps = make_deps(resources, FakeAgentRuntime(behaviour=AgentBehaviour(extra=usage)))
    first = experiment.submit([{"id": "q1", "p": 1}, {"id": "q2", "p": 2}], group_size=2)
    second = experiment.submit([{"id": "q3", "p": 3}], group_size=2)
    drive(resources, deps)
    assert main(["cost", *E, "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    batches = {b["batch_id"]: b for b in report["batches"]}
    assert set(batches) == {first, second}
    assert [b["batch_id"] for b in report["batches"]] == [second, first], "newest first"
    assert (batches[first]["now"]["rollouts"], batches[second]["now"]["rollouts"]) == (4, 2)
    for batch in batches.values():
        assert batch["published"]["usd"] > 0
        assert batch["now"]["cpu_measured"] == batch["now"]["rollouts"]
        assert batch["stops_pending"] == 0  # every stop confirmed: `now` is exact
    total = sum(b["now"]["usd"] for b in batches.values())
    assert report["spent_usd"] == pytest.approx(total, rel=1e-6), "the spend is the sessions' cost to their stops"
    assert report["priced_as"].startswith("local run priced as on AgentCore us-east-1")

    assert main(["cost", *E]) == EXIT_OK
    text = capsys.readouterr().out
    assert text.startswith(f"experiment test-exp: spent {usd(report['spent_usd'])}")
    assert f"batch {first} (completed, 4/4 ended): now $" in text
    assert "4 measured / 0 bounded" in text
    assert main(["cost", *E, "--batch", second]) == EXIT_OK
    assert first not in capsys.readouterr().out

    assert main(["budget", "set", *E, "12.5"]) == EXIT_OK
    assert "budget $12.50" in capsys.readouterr().out
    assert experiment.budget() == 12.5
    assert main(["budget", "show", *E]) == EXIT_OK
    assert "budget $12.50, spent $" in capsys.readouterr().out
    assert main(["budget", "set", *E, "0.0008"]) == EXIT_OK  # a local run's budget: not shown as $0.00
    assert "budget $0.000800, spent $" in capsys.readouterr().out
    assert main(["cost", *E]) == EXIT_OK
    assert "of a $0.000800 budget (" in capsys.readouterr().out
    assert main(["budget", "set", *E, "-3"]) == EXIT_ERROR
    assert "positive" in one_error_line(capsys.readouterr().err)
    assert main(["cost", *E, "--batch", "nope-000000000000"]) == EXIT_ERROR
    assert "no batch 'nope-000000000000'" in one_error_line(capsys.readouterr().err)
