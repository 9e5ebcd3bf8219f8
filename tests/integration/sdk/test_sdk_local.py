"""Local mode wiring: the SDK and the CLI talk to a loopback moto server through `endpoint_url` (no in-process
mock): submit, events, status over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.moto_server import moto_server
from rollout_pipeline.local.resources import ExperimentResources, create_resources
from rollout_pipeline.sdk import Experiment
from tests.sdk_events import completed

REGION = "us-east-1"


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ExperimentResources]]:
    import boto3

    for key, value in {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto_server() as endpoint:

        def client(service: str) -> Any:
            return boto3.client(service, endpoint_url=endpoint, region_name=REGION)

        resources = create_resources(ExperimentConfig(name="test-exp", group_size=2), region=REGION, client=client)
        yield endpoint, resources


def test_sdk_and_cli_against_a_loopback_endpoint(
    local: tuple[str, ExperimentResources], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import boto3

    endpoint, resources = local
    experiment = Experiment.local(endpoint, outputs=resources.stack_outputs())
    batch_id = experiment.submit([{"id": "q1", "prompt": "hi"}])
    assert experiment.status(batch_id).rollouts_total == 2

    # The batch's stream: its own subscription (the event published after it started) and, before it, what the
    # batch published already, from the ledger (its Batch Accepted).
    stream = experiment.events(batch_id=batch_id, timeout=5, poll_wait_s=1, max_events=2)
    events = boto3.client("events", endpoint_url=endpoint, region_name=REGION)
    EventBridgePublisher(resources.bus_name, events).publish([completed(batch_id, "q1", 0, 1.0)])
    got = list(stream)
    assert sorted(e.detail_type for e in got) == [DetailType.BATCH_ACCEPTED, DetailType.ROLLOUT_COMPLETED]

    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(resources.stack_outputs()))
    argv = ["status", "--outputs-file", str(outputs), "--endpoint-url", endpoint, "--batch", batch_id, "--json"]
    assert main(argv) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["queued"] == 2


def test_closing_the_experiment_removes_the_subscriptions_of_streams_left_open(
    local: tuple[str, ExperimentResources],
) -> None:
    """A loop that breaks out of `events(batch_id=...)` leaves its stream open until it is collected, which may be
    after the endpoint is gone; `close()` (and a local pipeline's stop, before its server) removes them now."""
    import boto3

    endpoint, resources = local
    experiment = Experiment.local(endpoint, outputs=resources.stack_outputs())
    batch_id = experiment.submit([{"id": "q1", "prompt": "hi"}])
    left_open = experiment.events(batch_id=batch_id, timeout=5, poll_wait_s=0)
    for _ in left_open:
        break
    done_with = experiment.events(batch_id=batch_id, timeout=0, poll_wait_s=0)
    with done_with:
        pass
    events = boto3.client("events", endpoint_url=endpoint, region_name=REGION)

    def tap_rules() -> list[str]:
        rules = events.list_rules(EventBusName=resources.bus_name)["Rules"]
        return [rule["Name"] for rule in rules if rule["Name"] == left_open.subscription[0]]

    assert tap_rules() == [left_open.subscription[0]]
    experiment.close()
    assert left_open.closed
    assert tap_rules() == []
