"""Metrics the dashboard reads that the lifecycle emits: Reward per successful rollout (completion)."""

from __future__ import annotations

import pytest

from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import REWARD, SUCCEEDED
from tests.integration.lifecycle_support import complete_once, dispatch_once, moto_lock, seed_batch, send

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return AgentBehaviour(rewards=0.75)


def test_completion_samples_the_reward_of_each_success(resources: ExperimentResources, deps: LifecycleDeps) -> None:
    send(resources, seed_batch(resources, inputs={"a": {"q": 1}}, group_size=2))
    dispatch_once(resources, deps)
    complete_once(resources, deps)
    counts, samples = deps.metrics.drain()
    assert counts[SUCCEEDED] == 2
    assert samples[REWARD] == [0.75, 0.75]
