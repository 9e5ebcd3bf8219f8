"""A session invoked after its rollout ended (cancelled, timed out or ended elsewhere while the invoke was in
flight) is stopped as every other session: one ResourceNotFound is no proof that it is gone, and a Conflict or a
throttled stop is tried again, so no session outlives its rollout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle import stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ports import RuntimeSessionNotFound, RuntimeThrottled
from tests.integration.lifecycle_support import (
    ShiftedClock,
    moto_lock,
    paced_until,
    receive_records,
    rollout_item,
    seed_batch,
    send,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__)]

BATCH = ids.batch_id_for_upload("in", "datasets/late-invoke.jsonl", "v1")
SID = ids.session_id("test-exp", BATCH, "a", 0, 1)


def fail_first_stop(fake: FakeAgentRuntime, error: Callable[[str], Exception]) -> list[str]:
    """The fake's first stop answers `error` and leaves the session running (AgentCore has answered
    ResourceNotFound, Conflict and throttling while the session kept running); later stops go through."""
    answered: list[str] = []
    real_stop = fake.stop

    def stop(session_id: str) -> None:
        answered.append(session_id)
        if len(answered) == 1:
            raise error(session_id)
        real_stop(session_id)

    fake.stop = stop  # type: ignore[method-assign]
    return answered


@pytest.mark.parametrize(
    "error",
    [
        lambda sid: RuntimeSessionNotFound(f"ResourceNotFoundException: session {sid}"),
        lambda sid: RuntimeThrottled(f"ConflictException: session {sid} is busy"),
    ],
    ids=["not_found_while_running", "conflict"],
)
def test_session_invoked_after_its_rollout_ended_is_stopped_despite_a_failed_first_stop(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    monkeypatch: pytest.MonkeyPatch,
    error: Callable[[str], Exception],
) -> None:
    fake.behaviour = AgentBehaviour(kind="manual")
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=1))
    records = receive_records(resources.rollout_queue_url)
    answered = fail_first_stop(fake, error)

    def ended_meanwhile(*_: Any, **__: Any) -> bool:
        return False  # the rollout ended while InvokeAgentRuntime was in flight

    monkeypatch.setattr(deps.ledger.rollouts, "mark_invoked", ended_meanwhile)
    result = dispatch_records(records, deps, wait_until=paced_until())
    assert list(result.outcomes.values()) == [Dispatch.STOPPED_LATE]
    assert answered[0] == SID
    assert SID in fake.stopped
    assert fake.running_sessions() == set()


def test_a_late_session_whose_stops_keep_failing_is_filed_in_the_outbox_and_stopped_by_the_sweeper(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    clock: ShiftedClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.behaviour = AgentBehaviour(kind="manual")
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {"q": 1}}, group_size=1))
    records = receive_records(resources.rollout_queue_url)
    real_stop = fake.stop
    conflicts = {"left": 1 + len(stops.PROMPT_RETRY_S)}  # every call of the dispatcher's pass

    def stop(session_id: str) -> None:
        if conflicts["left"] > 0:
            conflicts["left"] -= 1
            raise RuntimeThrottled(f"ConflictException: session {session_id} is busy")
        real_stop(session_id)

    fake.stop = stop  # type: ignore[method-assign]
    monkeypatch.setattr(deps.ledger.rollouts, "mark_invoked", lambda *_, **__: False)
    result = dispatch_records(records, deps, wait_until=paced_until())
    assert list(result.outcomes.values()) == [Dispatch.STOPPED_LATE]
    assert fake.running_sessions() == {SID}
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert set(item["stop_sessions"]) == {SID}
    assert "stop" in set(item["outbox"])
    clock.advance(deps.outbox_age_s + 5)
    sweep(deps, wait_until=paced_until())
    assert fake.running_sessions() == set()
    assert SID in fake.stopped
    after = rollout_item(resources, BATCH, "a", 0)
    assert after is not None
    assert not after.get("stop_sessions")
