"""Trainer-ready groups: an oversampled batch runs group_size + oversample rollouts per group, delivers the first
group_size that end with a reward as the group, cancels the rest as surplus (sessions stopped), and never charges a
surplus rollout to the trainer: no member, reward, failure or valid-size count of the group holds one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.contracts import DetailType, FailureReason, GroupCompleted, RolloutCompleted, RolloutFailed
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from tests.conftest import wait_for
from tests.doubles import HttpEndpoint

pytestmark = pytest.mark.timing

GROUP_SIZE = 3
OVERSAMPLE = 2


def behaviour(held: dict[int, str]) -> Callable[[FakeInvocation], AgentBehaviour]:
    """Group `mixed`: index 1 fails at once (excluded), 0/2/3 succeed when the test finishes them (their sessions in
    `held`, by index: after index 1's failure is recorded, whatever the machine's load), 4 never answers (it is still
    running when the group fills). Group `fast`: every rollout succeeds at once (surplus successes may race the
    cancel)."""

    def decide(invocation: FakeInvocation) -> AgentBehaviour:
        rollout = invocation.payload.get("_rollout") or {}
        index, input_id = int(rollout.get("index", 0)), str(rollout.get("input_id"))
        if input_id == "fast":
            return AgentBehaviour(rewards=float(index))
        if index == 1:
            return AgentBehaviour(kind="agent_error")
        if index == 4:
            return AgentBehaviour(kind="hang")
        held[index] = invocation.session_id
        return AgentBehaviour(kind="manual", rewards=float(index % 2))

    return decide


@pytest.fixture
def held() -> dict[int, str]:
    return {}


@pytest.fixture
def sink() -> Iterator[HttpEndpoint]:
    with HttpEndpoint() as endpoint:
        yield endpoint


@pytest.fixture
def pipeline(tmp_path: Path, sink: HttpEndpoint, held: dict[int, str]) -> Iterator[LocalPipeline]:
    runtime: dict[str, FakeAgentRuntime] = {}
    sinks = [
        {
            "name": "trainer",
            "url": sink.url + "/{$.detail-type}",
            "events": ["Rollout Completed", "Rollout Failed", "Group Completed"],
        }
    ]

    def factory(_resources: Any) -> FakeAgentRuntime:
        runtime["acr"] = FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour(held))
        return runtime["acr"]

    settings = LocalSettings(
        experiment="oversample",
        group_size=GROUP_SIZE,
        max_attempts=1,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=12,
        sweep_interval_s=5.0,
        runtime_factory=factory,
        experiment_settings={"oversample": OVERSAMPLE, "sinks": sinks},
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def test_an_oversampled_batch_charges_no_surplus_rollout_to_the_trainer(
    pipeline: LocalPipeline, sink: HttpEndpoint, held: dict[int, str]
) -> None:
    experiment = pipeline.experiment
    batch = experiment.submit([{"id": "mixed", "q": 1}, {"id": "fast", "q": 2}])
    assert experiment.status(batch).rollouts_total == 2 * (GROUP_SIZE + OVERSAMPLE)
    # `mixed`'s failure is recorded before its successes end (else, on a loaded machine, its three successes could
    # fill the group first and the failure be cut as surplus: a correct run, but not the one this test pins).
    failed = FailureReason.AGENT_ERROR.value  # the only agent error of the batch; `fast`'s surplus fail as surplus
    wait_for(lambda: experiment.status(batch).failed_by_reason.get(failed), timeout_s=60, what="mixed's 1 to fail")
    wait_for(lambda: len(held) == 3, timeout_s=60, what="mixed's three successes to start")
    for session_id in held.values():
        assert pipeline.runtime.finish(session_id) is not None

    rollout_events: dict[tuple[str, int], RolloutCompleted | RolloutFailed] = {}
    groups = {group.input_id: group for group in experiment.groups(batch, timeout=60)}
    assert set(groups) == {"mixed", "fast"}
    rollout_types = [DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED]
    # Every rollout's event, surplus ones too (from the start: the group stream above already took them once).
    for event in experiment.events(batch_id=batch, detail_types=rollout_types, from_start=True, max_events=10):
        assert isinstance(event.detail, RolloutCompleted | RolloutFailed)
        rollout_events[(event.detail.input_id, event.detail.index)] = event.detail

    mixed = groups["mixed"].completed
    assert isinstance(mixed, GroupCompleted)
    assert (mixed.group_size, mixed.target_size, mixed.valid_size, mixed.succeeded) == (5, 3, 3, 3)
    assert mixed.surplus == [4]
    assert mixed.failures == {"1": FailureReason.AGENT_ERROR}
    assert [m.index for m in mixed.members] == [0, 1, 2, 3]
    assert [m.excluded for m in mixed.members] == [False, True, False, False]
    assert mixed.rewards == [0.0, None, 0.0, 1.0, None]
    assert 4 not in groups["mixed"].rollouts
    assert groups["mixed"].excluded == [1]
    cut = rollout_events[("mixed", 4)]
    assert isinstance(cut, RolloutFailed)
    assert cut.reason is FailureReason.SURPLUS
    assert cut.surplus

    fast = groups["fast"].completed
    assert (fast.valid_size, fast.failed, len(fast.surplus)) == (3, 0, 2)
    assert len(fast.members) == 3
    assert not set(fast.surplus) & {m.index for m in fast.members}
    assert all(fast.rewards[i] is None for i in fast.surplus)
    for index in range(GROUP_SIZE + OVERSAMPLE):  # a surplus success says so; a surplus cancel is reason surplus
        event = rollout_events[("fast", index)]
        assert event.surplus == (index in fast.surplus)
        assert isinstance(event, RolloutCompleted) or event.reason is FailureReason.SURPLUS

    # The trainer's HTTP sink got both groups and every member's event, never a surplus rollout's.
    members = 4 + 3
    wait_for(lambda: len(sink.delivered()) >= members + 2, timeout_s=30, what="the sink's deliveries")
    delivered = [r.body for r in sink.delivered()]
    assert not any(body["surplus"] for body in delivered if "rollout_id" in body)  # rollout events: a bool
    assert sorted(b["input_id"] for b in delivered if "valid_size" in b) == ["fast", "mixed"]
    assert len(delivered) == members + 2

    # No surplus session is left running: the one that never answered was stopped by the cancel.
    wait_for(lambda: not pipeline.active_sessions(), timeout_s=30, what="no session left running")
    assert cut.session_id in pipeline.runtime.stopped
