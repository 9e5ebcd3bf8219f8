"""Subscriptions left by killed processes do not outlive them: a trainer streaming a batch (`events(batch_id=...)`)
and a tap, killed with SIGKILL mid-batch, leave their rules and queues on the bus; the next sweep removes them (their
owner's process is gone from this host), as does the next subscription opened on the host. Elsewhere (a Lambda's
sweeper), a subscription is gone once its owner's heartbeat is `STALE_S` old; one made without a heartbeat is left to
`rollouts subscriptions prune`. A bus at EventBridge's rule quota is one line naming that command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from rollout_pipeline import bus_subscriptions
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.adapters.subscriptions import EventBridgeSubscriptions
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment, SdkError
from rollout_pipeline.sdk import subscription as subs
from tests.conftest import wait_for
from tests.integration.lifecycle_support import make_deps

ROOT = Path(__file__).resolve().parents[3]
PATTERN = {"source": ["rollout.pipeline"]}

TRAINER = textwrap.dedent(
    """
    import json, sys, time
    from rollout_pipeline.sdk import Experiment

    outputs, endpoint, batch_id, log_path = sys.argv[1:5]
    experiment = Experiment.from_outputs(json.load(open(outputs)), endpoint_url=endpoint)
    with experiment.tap(poll_wait_s=1):  # what `rollouts watch` reads
        for event in experiment.events(batch_id=batch_id, poll_wait_s=1):
            with open(log_path, "a") as log:
                log.write(f"{event.detail_type}\\n")
            time.sleep(3600)  # killed here with SIGKILL, mid-batch
    """
)


def _pipeline(tmp_path: Path, sweep_interval_s: float) -> LocalPipeline:
    return LocalPipeline(
        LocalSettings(
            experiment="reaper",
            group_size=2,
            model_url="http://127.0.0.1:9/v1",
            max_sessions=4,
            sweep_interval_s=sweep_interval_s,
            runtime_factory=lambda resources: FakeAgentRuntime(
                store=S3ObjectStore(), behaviour=AgentBehaviour(delay_s=2.0)
            ),
            work_dir=tmp_path / "work",
        )
    )


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    with _pipeline(tmp_path, sweep_interval_s=1.0) as running:
        yield running


@pytest.fixture
def unswept(tmp_path: Path) -> Iterator[LocalPipeline]:
    """A pipeline whose sweeper does not run during the test."""
    with _pipeline(tmp_path, sweep_interval_s=3600.0) as running:
        yield running


def _subscriptions(experiment: Experiment) -> list[str]:
    return [s.name for s in experiment.list_subscriptions()]


def _killed_trainer(pipeline: LocalPipeline, tmp_path: Path) -> tuple[str, list[str]]:
    """A trainer process streaming a batch through a stream and a tap of its own, killed with SIGKILL mid-batch:
    the batch and the subscriptions it left."""
    experiment = pipeline.experiment
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(pipeline.resources.stack_outputs()))
    batch_id = experiment.submit([{"id": f"q{i}", "q": i} for i in range(4)])
    log = tmp_path / "trainer.log"
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(outputs), pipeline.endpoint_url, batch_id, str(log)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    try:
        wait_for(lambda: log.exists() and log.read_text(), timeout_s=60, what="the trainer's first event")
        left = _subscriptions(experiment)
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert experiment.status(batch_id).terminal < 8, "killed mid-batch"
    return batch_id, left


@pytest.mark.timing
def test_a_streaming_trainer_killed_with_sigkill_leaves_no_subscription_after_the_next_sweep(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    _batch, left = _killed_trainer(pipeline, tmp_path)
    assert sorted(name.split("-")[2] for name in left) == ["sdk", "tap"]

    wait_for(lambda: not _subscriptions(pipeline.experiment), timeout_s=30, what="the sweeper to remove them")
    events = pipeline.experiment.client("events")
    rules = events.list_rules(EventBusName=pipeline.experiment.bus_name)["Rules"]
    assert not [r["Name"] for r in rules if r["Name"] in left], "no rule left on the bus"


@pytest.mark.timing
def test_the_next_subscription_opened_on_the_host_removes_those_of_killed_processes(
    unswept: LocalPipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subs, "_pruned_at", {})
    batch_id, left = _killed_trainer(unswept, tmp_path)
    assert len(left) == 2
    assert sorted(_subscriptions(unswept.experiment)) == sorted(left)

    with unswept.experiment.events(batch_id=batch_id, poll_wait_s=0, timeout=0) as stream:
        assert isinstance(stream, subs.SubscribedStream)
        assert _subscriptions(unswept.experiment) == [stream.subscription[0]]


# ------------------------------------------------------------------ the sweeper in a Lambda: by the heartbeat


def _rule(experiment: Experiment, suffix: str, owner: str, created: float, heartbeat: int | None) -> tuple[str, str]:
    """A subscription as a process elsewhere made it (another host's owner), created `created`."""
    name, url = experiment.open_subscription(PATTERN, suffix=suffix)
    subs._HEARTBEAT.discard(url)
    events = experiment.client("events")
    rule = events.describe_rule(Name=name, EventBusName=experiment.bus_name)
    description = bus_subscriptions.description(
        suffix.split("-", maxsplit=1)[0], owner, subs.iso_now(created), heartbeat
    )
    events.put_rule(
        Name=name, EventBusName=experiment.bus_name, EventPattern=rule["EventPattern"], Description=description
    )
    experiment.client("sqs").tag_queue(QueueUrl=url, Tags={subs.TAG_SEEN: subs.iso_now(created)})
    return name, url


def test_the_sweeper_removes_what_a_heartbeat_no_longer_refreshes(
    resources: ExperimentResources, fake: FakeAgentRuntime, experiment: Experiment
) -> None:
    elsewhere = "trainer@another-host:4242"
    long_ago = time.time() - 2 * bus_subscriptions.STALE_S
    stale = _rule(experiment, "sdk-00000001", elsewhere, long_ago, 60)
    beating = _rule(experiment, "sdk-00000002", elsewhere, long_ago, 60)
    experiment.touch_subscription(beating[1])  # its owner's heartbeat, a moment ago
    unbeating = _rule(experiment, "art-00000003", elsewhere, long_ago, None)  # made without a heartbeat
    young = _rule(experiment, "tap-00000004", elsewhere, time.time(), 60)
    deps: LifecycleDeps = make_deps(resources, fake, subscriptions=_bus_subscriptions(experiment))

    result = sweep(deps)

    assert result.subscriptions_removed == [stale[0]]
    assert sorted(_subscriptions(experiment)) == sorted(name for name, _url in (beating, unbeating, young))
    assert sweep(deps).subscriptions_removed == []


def _bus_subscriptions(experiment: Experiment) -> EventBridgeSubscriptions:
    bus = experiment.bus_name
    return EventBridgeSubscriptions(
        experiment.client("events"),
        experiment.client("sqs"),
        bus,
        prefixes=[f"{bus}-{kind}-" for kind in bus_subscriptions.BUS_KINDS],
        seen_tag=bus_subscriptions.TAG_SEEN,
        target_id=bus_subscriptions.TARGET_ID,
    )


def test_a_subscription_carries_its_heartbeat_and_its_experiments_cost_tag(experiment: Experiment) -> None:
    name, url = experiment.open_subscription(PATTERN, suffix="sdk-0badcafe")
    try:
        rule = experiment.client("events").describe_rule(Name=name, EventBusName=experiment.bus_name)
        facts = bus_subscriptions.parse_description(rule["Description"])
        assert facts is not None
        assert (facts.kind, facts.owner, facts.heartbeat_s) == ("sdk", subs.default_owner(), 60)
        assert facts.pid_namespace == bus_subscriptions.pid_namespace()
        assert url in subs._HEARTBEAT.open_urls()
        tags = experiment.client("sqs").list_queue_tags(QueueUrl=url)["Tags"]
        assert tags["rollouts:experiment"] == experiment.name
        rule_tags = experiment.client("events").list_tags_for_resource(ResourceARN=rule["Arn"])["Tags"]
        assert {"Key": "rollouts:experiment", "Value": experiment.name} in rule_tags
    finally:
        experiment.close_subscription(name, url)
    assert url not in subs._HEARTBEAT.open_urls()


# --------------------------------------------------------------------------------------- heartbeat, quota


@pytest.mark.timing
def test_the_heartbeat_refreshes_every_open_subscription_until_it_closes() -> None:
    touched: list[str] = []
    gone = {"q-gone"}

    def touch(_aws: Any, url: str) -> bool:
        touched.append(url)
        return url not in gone

    heartbeat = subs._Heartbeat(touch=touch, interval_s=lambda: 0.01)
    aws: Any = object()
    heartbeat.add(aws, "q-1")
    heartbeat.add(aws, "q-gone")
    wait_for(lambda: touched.count("q-1") >= 3, timeout_s=10, what="three beats")
    assert heartbeat.open_urls() == ["q-1"], "a queue found gone is no longer beaten"
    heartbeat.discard("q-1")
    wait_for(lambda: heartbeat._thread is None, timeout_s=10, what="the thread to end with the last subscription")


def test_a_bus_at_the_rule_quota_says_how_to_prune() -> None:
    class Events:
        def put_rule(self, **_rule: Any) -> Any:
            raise ClientError({"Error": {"Code": "LimitExceededException", "Message": "limit"}}, "PutRule")

    with pytest.raises(SdkError) as raised:
        subs._put_rule(Events(), "rollouts-exp", {"Name": "rollouts-exp-sdk-1"}, [])
    assert "rollouts subscriptions prune -e exp" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_queue_read_right_after_its_creation_is_retried() -> None:
    answers: list[Any] = [
        ClientError({"Error": {"Code": "AWS.SimpleQueueService.NonExistentQueue"}}, "GetQueueAttributes"),
        {"Attributes": {"QueueArn": "arn:aws:sqs:us-east-1:1:q"}},
    ]
    lock = threading.Lock()

    class Sqs:
        def get_queue_attributes(self, **_args: Any) -> Any:
            with lock:
                answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    pauses: list[float] = []
    assert subs._queue_arn(Sqs(), "https://q", sleep=pauses.append) == "arn:aws:sqs:us-east-1:1:q"
    assert pauses == [0.25]
