"""The CLI and SDK trainers on one experiment never starve each other: after two batches submitted from
the shell (whose events nobody reads), two trainers, each following its own batch with `groups()`, get all their
groups at once; none of them receives another batch's event, so nothing is worn out into the trainer queue's
dead-letter queue, and the shell batches' events wait, untouched, in the trainer queue for its one consumer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.sdk import Experiment

pytestmark = pytest.mark.slow

EXPERIMENT = "two-consumers"
GROUP_SIZE = 2


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    return AgentBehaviour(rewards=float(inv.payload["_rollout"]["index"]), delay_s=0.2)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment=EXPERIMENT,
        group_size=GROUP_SIZE,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=8,
        sweep_interval_s=2.0,
        runtime_factory=lambda resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def _rows(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"{prefix}-{i}", "question": f"{i} + 1?"}) + "\n" for i in range(count)))
    return path


def _wait_done(experiment: Experiment, batch_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not experiment.status(batch_id).done:
        assert time.monotonic() < deadline, f"batch {batch_id} did not finish in {timeout_s} s"
        time.sleep(0.2)


def _drain(experiment: Experiment, queue_url: str) -> list[tuple[str, int]]:
    """(batch id, receive count) of every message left in a queue, deleting them."""
    sqs = experiment.client("sqs")
    left: list[tuple[str, int]] = []
    for _ in range(100):
        messages = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        if not messages:
            break
        for message in messages:
            batch_id = json.loads(message["Body"])["detail"]["batch_id"]
            left.append((batch_id, int(message["Attributes"]["ApproximateReceiveCount"])))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return left


def test_two_trainers_and_the_shell_on_one_experiment(
    pipeline: LocalPipeline, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = pipeline.endpoint_url
    watcher = pipeline.experiment
    # From the shell: two batches, attached by name at the local endpoint; nobody reads their events.
    shell_batches = []
    for name in ("shell-a", "shell-b"):
        argv = ["submit", str(_rows(tmp_path / f"{name}.jsonl", name, 6)), "-e", EXPERIMENT, "--endpoint-url", endpoint]
        assert main(argv) == EXIT_OK
        shell_batches.append(capsys.readouterr().out.strip())
    for batch_id in shell_batches:
        _wait_done(watcher, batch_id)

    results: dict[str, Any] = {}

    def trainer(name: str) -> None:
        try:
            experiment = Experiment.local(endpoint, name=EXPERIMENT)  # its own process's view: its own seen ids
            batch_id = experiment.submit_file(_rows(tmp_path / f"{name}.jsonl", name, 2), group_size=GROUP_SIZE)
            started = time.monotonic()
            groups = {group.input_id: group.rewards for group in experiment.groups(batch_id, timeout=60)}
            results[name] = (groups, time.monotonic() - started)
        except BaseException as exc:  # surfaced below
            results[name] = exc

    threads = [threading.Thread(target=trainer, args=(name,)) for name in ("trainer-a", "trainer-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    for name in ("trainer-a", "trainer-b"):
        outcome = results.get(name)
        assert isinstance(outcome, tuple), f"{name}: {outcome!r}"
        groups, elapsed = outcome
        assert groups == {f"{name}-0": [0.0, 1.0], f"{name}-1": [0.0, 1.0]}, name
        assert elapsed < 30, f"{name} waited {elapsed:.1f} s for a 4-rollout batch"

    dead = pipeline.dead_letters()
    assert dead["trainer"] == 0, f"events worn out into the trainer DLQ: {dead}"
    left = _drain(watcher, watcher.trainer_queue_url)
    shell_left = [(batch, count) for batch, count in left if batch in shell_batches]
    # Every event of the shell batches: 6 rows x 2 rollouts + 6 groups + accepted + completed, per batch.
    assert len(shell_left) == 2 * (6 * GROUP_SIZE + 6 + 2)
    assert {count for _batch, count in shell_left} == {1}, "no trainer ever received another batch's event"
