"""Events an async trainer can trust: every rollout event carries the policy version the rollout was dispatched
with (the experiment's current one, which the trainer advances), and the batch's when different."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.contracts import DetailType, GroupCompleted, RolloutCompleted
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment="policy",
        group_size=2,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=8,
        sweep_interval_s=5.0,
        runtime_factory=lambda resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=AgentBehaviour()),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def _events(pipeline: LocalPipeline, batch_id: str) -> list[Any]:
    """The batch's rollout, group and batch-completed events (the bus does not order them: wait for all)."""
    got = []
    wanted = {DetailType.ROLLOUT_COMPLETED: 2, DetailType.GROUP_COMPLETED: 1, DetailType.BATCH_COMPLETED: 1}
    for event in pipeline.experiment.events(batch_id=batch_id, timeout=30, poll_wait_s=1):
        got.append(event.detail)
        if event.detail_type in wanted:
            wanted[event.detail_type] -= 1
        if not any(wanted.values()):
            break
    return got


def test_rollouts_carry_the_version_they_were_dispatched_with(pipeline: LocalPipeline) -> None:
    experiment = pipeline.experiment
    before = _events(pipeline, experiment.submit([{"id": "a", "q": 1}], policy_version="3"))
    rollouts = [d for d in before if isinstance(d, RolloutCompleted)]
    assert len(rollouts) == 2
    assert {(r.policy_version, r.batch_policy_version) for r in rollouts} == {("3", None)}

    experiment.set_policy_version("5")  # the trainer synced new weights
    after = _events(pipeline, experiment.submit([{"id": "b", "q": 1}], policy_version="3"))
    rollouts = [d for d in after if isinstance(d, RolloutCompleted)]
    assert len(rollouts) == 2
    assert {(r.policy_version, r.batch_policy_version) for r in rollouts} == {("5", "3")}
    (group,) = [d for d in after if isinstance(d, GroupCompleted)]
    assert [m.policy_version for m in group.members] == ["5", "5"]
    assert group.policy_version == "3"  # the batch's

    experiment.set_policy_version(None)
    cleared = _events(pipeline, experiment.submit([{"id": "c", "q": 1}], policy_version="4"))
    assert {(d.policy_version, d.batch_policy_version) for d in cleared if isinstance(d, RolloutCompleted)} == {
        ("4", None)
    }
