"""Fixtures shared by the integration modules that drive the lifecycle: the fake ACR, a movable clock, deps.

A module changes what the fake agent does by overriding `fake_behaviour` (module fixtures override these).
`ROLLOUTS_FAKE_ACR=realistic` runs every lifecycle test against the fake's realistic AgentCore profile (quotas,
cold starts, unreliable stops; `AcrProfile.realistic`), `ROLLOUTS_FAKE_ACR=quotas` with AgentCore's quotas only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, Behaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment
from tests.conftest import REGION
from tests.integration.lifecycle_support import ShiftedClock, make_deps

#: Seconds per long poll of the trainer queue in the SDK's tests.
WAIT = 1


@pytest.fixture
def fake_behaviour() -> Behaviour:
    """What every invocation of `fake` does: succeed (FakeAgentRuntime's default)."""
    return AgentBehaviour()


@pytest.fixture
def fake(resources: ExperimentResources, fake_behaviour: Behaviour) -> Iterator[FakeAgentRuntime]:
    mode = os.environ.get("ROLLOUTS_FAKE_ACR", "")
    profile = {"realistic": AcrProfile.realistic(), "quotas": AcrProfile()}.get(mode)
    runtime = FakeAgentRuntime(behaviour=fake_behaviour, profile=profile)
    yield runtime
    runtime.close()


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock()


@pytest.fixture
def deps(resources: ExperimentResources, fake: FakeAgentRuntime, clock: ShiftedClock) -> LifecycleDeps:
    return make_deps(resources, fake, clock=clock)


@pytest.fixture
def experiment(resources: ExperimentResources) -> Experiment:
    """The SDK attached to the test's experiment (its stack outputs, no DescribeStacks)."""
    return Experiment.from_outputs(resources.stack_outputs(), region=REGION)


def publish(resources: ExperimentResources, *details: Any) -> None:
    """Publish event details on the experiment's bus, as the pipeline does."""
    EventBridgePublisher(resources.bus_name).publish(list(details))


def queue_depth(queue_url: str) -> int:
    """Messages in a queue, visible or in flight."""
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])
