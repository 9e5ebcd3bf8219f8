"""A result counts only when it carries its attempt's token (`contracts.attempts`): an agent (compromised, or
simply wrong) cannot end another rollout by writing to its result key, while agents that copy the request into
their result, as ART does, keep working unchanged."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_pipeline import contracts, ids
from rollout_pipeline.adapters import clients
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.lifecycle.completion import Completion
from rollout_pipeline.lifecycle.dispatch import dispatch_records
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import LATE_OR_UNKNOWN
from tests.integration.lifecycle_support import (
    PACED_WAIT_S,
    ShiftedClock,
    by_type,
    complete_once,
    dispatch_once,
    make_deps,
    moto_lock,
    receive_records,
    release,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

BATCH = ids.batch_id_for_upload("in", "datasets/tokens.jsonl", "v1")
KEY = b"k" * 32


@pytest.fixture
def agents() -> Iterator[FakeAgentRuntime]:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"), profile=AcrProfile())
    yield runtime
    runtime.close()


def sid(input_id: str, attempt: int = 1) -> str:
    return ids.session_id("test-exp", BATCH, input_id, 0, attempt)


def write_result(resources: ExperimentResources, input_id: str, session_id: str, body: dict[str, Any]) -> None:
    clients.client("s3").put_object(
        Bucket=resources.results_bucket,
        Key=ids.result_key("test-exp", input_id, session_id),
        Body=json.dumps(body).encode(),
    )


def test_the_dispatcher_sends_each_attempt_its_own_token(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    deps = make_deps(resources, agents, attempt_key=lambda: KEY)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}, group_size=1))
    dispatch_once(resources, deps)
    tokens = {s: agents.payloads[s]["_rollout"]["attempt_token"] for s in (sid("a"), sid("b"))}
    assert tokens == {s: contracts.attempt_token(KEY, "test-exp", s) for s in tokens}
    assert len(set(tokens.values())) == 2


def test_a_result_written_for_another_rollout_is_not_accepted(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    deps = make_deps(resources, agents, attempt_key=lambda: KEY)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}, group_size=1))
    dispatch_once(resources, deps)
    own_request = dict(agents.payloads[sid("a")])  # what the agent of rollout a knows: its own request
    forged = {"rewards": 1.0, "status_code": 200, "stop_reason": "end_turn"}
    guessed = {**own_request, "_rollout": {**own_request["_rollout"], "attempt_token": "0" * 64}}
    for body in (
        {**forged, "payload": own_request},  # a's own token, on b's key
        forged,  # no token at all
        {**forged, "payload": guessed, "attempt_token": "0" * 64},  # a guessed one
    ):
        write_result(resources, "b", sid("b"), body)
        assert list(complete_once(resources, deps).outcomes.values()) == [Completion.FOREIGN]
    assert deps.metrics.drain()[0][LATE_OR_UNKNOWN] == 3
    item = rollout_item(resources, BATCH, "b", 0)
    assert item is not None
    assert item["state"] == "dispatched"  # nothing changed: rollout b still waits for its own agent
    assert by_type(trainer_events(resources), "Rollout Completed") == []
    agents.finish(sid("b"), AgentBehaviour(rewards=0.5))  # b's own agent (ART's result format) completes it
    agents.finish(sid("a"), AgentBehaviour(rewards=1.0))
    assert sorted(complete_once(resources, deps).outcomes.values()) == [Completion.SUCCEEDED] * 2
    completed = {e["input_id"]: e["reward"] for e in by_type(trainer_events(resources), "Rollout Completed")}
    assert completed == {"a": 1.0, "b": 0.5}


def test_an_agent_writing_its_result_itself_passes_the_token_at_the_top_level(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    deps = make_deps(resources, agents, attempt_key=lambda: KEY)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    dispatch_once(resources, deps)
    token = agents.payloads[sid("a")]["_rollout"]["attempt_token"]
    write_result(resources, "a", sid("a"), {"rewards": 0.25, "attempt_token": token})
    assert list(complete_once(resources, deps).outcomes.values()) == [Completion.SUCCEEDED]


def test_a_foreign_result_does_not_keep_an_attempt_from_expiring(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    clock = ShiftedClock()
    deps = make_deps(resources, agents, clock=clock, attempt_key=lambda: KEY)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=2))
    dispatch_once(resources, deps)
    write_result(resources, "a", sid("a"), {"rewards": 1.0})  # no token; its event is lost
    clock.advance(resources.config.rollout_timeout_s + 60)
    report = sweep(deps)
    assert (report.completed_late, report.retried) == (0, 1)  # not taken for the attempt's own late result
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is not None
    assert (item["state"], item["attempt"]) == ("queued", 2)


def test_an_unreadable_attempt_key_changes_nothing_and_the_message_comes_back(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    """The key is read before the dispatch transaction: a Secrets Manager error neither takes a slot nor burns the
    attempt (which would wait out its deadline); the message is redelivered and dispatches once the key reads."""
    readable = {"now": False}

    def key() -> bytes:
        if not readable["now"]:
            raise RuntimeError("GetSecretValue: ThrottlingException")
        return KEY

    deps = make_deps(resources, agents, attempt_key=key)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    records = receive_records(resources.rollout_queue_url)
    result = dispatch_records(records, deps, wait_until=time.monotonic() + PACED_WAIT_S)
    assert list(result.failures) == [records[0]["messageId"]], "the message goes back to the queue"
    assert rollout_item(resources, BATCH, "a", 0) is None, "no dispatch transaction ran"
    assert slots_in_flight(resources) == 0
    assert agents.payloads == {}

    readable["now"] = True
    release(resources.rollout_queue_url, records)  # its visibility timeout runs out
    dispatch_once(resources, deps)
    assert agents.payloads[sid("a")]["_rollout"]["attempt_token"] == contracts.attempt_token(KEY, "test-exp", sid("a"))


def art_result(request: dict[str, Any], **user: Any) -> dict[str, Any]:
    """A result as ART's `save_result` builds it: the user's keys, its own, then the whole request last."""
    return {**user, "status_code": 200, "stop_reason": "end_turn", "input_id": "a", "payload": request}


def test_an_unreadable_result_of_its_own_attempt_fails_invalid_result_at_once(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    """Not JSON, so no token can be read structurally: the token is found as text (ART writes the request last),
    so the rollout fails `invalid_result` now instead of waiting out `rollout_timeout_s` per attempt."""
    deps = make_deps(resources, agents, attempt_key=lambda: KEY)
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1, max_attempts=3))
    dispatch_once(resources, deps)
    text = json.dumps(art_result(agents.payloads[sid("a")], rewards="REWARD"), indent=2)
    clients.client("s3").put_object(
        Bucket=resources.results_bucket,
        Key=ids.result_key("test-exp", "a", sid("a")),
        Body=text.replace('"REWARD"', "1.0.0").encode(),  # a broken number: not JSON
    )
    assert list(complete_once(resources, deps).outcomes.values()) == [Completion.FAILED]
    (failed,) = by_type(trainer_events(resources), "Rollout Failed")
    assert (failed["reason"], failed["attempts_used"]) == ("invalid_result", 1)
    assert "not valid JSON" in failed["error"]


def test_an_oversized_result_is_recognised_by_its_tail(
    resources: ExperimentResources, agents: FakeAgentRuntime
) -> None:
    """Over `result_max_bytes` only the first bytes are read; one ranged GET of the object's last
    `TOKEN_TAIL_BYTES` (S3's suffix Range) finds the token ART writes last."""
    deps = make_deps(resources, agents, attempt_key=lambda: KEY, limits={"result_max_bytes": 2048})
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}, group_size=1))
    dispatch_once(resources, deps)
    trajectory = "step " * 40_000  # 200 KB before the request: the token is far beyond the first 2 KB
    own = art_result(agents.payloads[sid("a")], rewards=1.0, trajectory=trajectory)
    write_result(resources, "a", sid("a"), own)
    foreign = art_result(agents.payloads[sid("a")], rewards=1.0, trajectory=trajectory)  # a's token, b's key
    write_result(resources, "b", sid("b"), foreign)

    outcomes = complete_once(resources, deps).outcomes
    assert sorted(outcomes.values()) == sorted([Completion.FAILED, Completion.FOREIGN])
    (failed,) = by_type(trainer_events(resources), "Rollout Failed")
    assert failed["rollout_id"].startswith("a#")
    assert failed["reason"] == "invalid_result"
    assert "larger than the limit of 2048 bytes" in failed["error"]
    item = rollout_item(resources, BATCH, "b", 0)
    assert item is not None
    assert item["state"] == "dispatched", "another attempt's token changes nothing"


def test_a_token_in_text_must_be_the_attempts_own() -> None:
    token = contracts.attempt_token(KEY, "test-exp", sid("a"))
    other = contracts.attempt_token(KEY, "test-exp", sid("b"))
    tail = f'  "attempt_token": "{token}"\n    }}\n  }}\n}}'.encode()
    assert contracts.text_carries_attempt_token([b"{broken", tail], KEY, "test-exp", sid("a"))
    assert not contracts.text_carries_attempt_token([tail], KEY, "test-exp", sid("b"))
    assert not contracts.text_carries_attempt_token([f'"attempt_token":"{other}"'.encode()], KEY, "test-exp", sid("a"))
    assert not contracts.text_carries_attempt_token([token.encode()], KEY, "test-exp", sid("a")), "as a JSON value"
