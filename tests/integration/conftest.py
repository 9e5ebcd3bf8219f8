"""Fixtures shared by the integration modules that drive the lifecycle: the fake ACR, a movable clock, deps.

A module changes what the fake agent does by overriding `fake_behaviour` (module fixtures override these).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rollout_pipeline.adapters.fake_acr import AgentBehaviour, Behaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from tests.integration.lifecycle_support import ShiftedClock, make_deps


@pytest.fixture
def fake_behaviour() -> Behaviour:
    """What every invocation of `fake` does: succeed (FakeAgentRuntime's default)."""
    return AgentBehaviour()


@pytest.fixture
def fake(resources: ExperimentResources, fake_behaviour: Behaviour) -> Iterator[FakeAgentRuntime]:
    runtime = FakeAgentRuntime(behaviour=fake_behaviour)
    yield runtime
    runtime.close()


@pytest.fixture
def clock() -> ShiftedClock:
    return ShiftedClock()


@pytest.fixture
def deps(resources: ExperimentResources, fake: FakeAgentRuntime, clock: ShiftedClock) -> LifecycleDeps:
    return make_deps(resources, fake, clock=clock)
