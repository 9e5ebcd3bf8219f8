"""The fake ACR writes what an ART agent writes, where ART writes it, and stops like ACR."""

from __future__ import annotations

import json
import time

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.contracts import parse_result
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ports import RuntimeRejected, RuntimeThrottled

SID = "batch-0123456789ab-0-1-0123456789abcdef"


def payload(resources: ExperimentResources) -> dict[str, object]:
    return {"prompt": "p", "_rollout": {"exp_id": "test-exp", "input_id": "q1", "s3_bucket": resources.results_bucket}}


def read(resources: ExperimentResources, key: str) -> bytes:
    body: bytes = clients.client("s3").get_object(Bucket=resources.results_bucket, Key=key)["Body"].read()
    return body


def test_success_body_is_art_shaped(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    fake.behaviour = AgentBehaviour(rewards=[0.1, 0.9], extra={"answer": "42"})
    fake.invoke(SID, payload(resources))
    key = f"test-exp/q1/{SID}.json"
    assert fake.written == {SID: key}
    body = json.loads(read(resources, key))
    assert body["rewards"] == [0.1, 0.9]
    assert body["answer"] == "42"
    assert (body["status_code"], body["stop_reason"]) == (200, "end_turn")
    assert (body["input_id"], body["s3_bucket"], body["result_key"]) == ("q1", resources.results_bucket, key)
    assert body["payload"] == payload(resources)
    assert parse_result(read(resources, key)).reward == 0.9


def test_agent_error_body(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    fake.behaviour = AgentBehaviour(kind="agent_error", error="KeyError: 'x'")
    fake.invoke(SID, payload(resources))
    body = json.loads(read(resources, f"test-exp/q1/{SID}.json"))
    assert body["status_code"] == 500
    assert body["stop_reason"] == "KeyError: 'x'"
    assert "Traceback" in body["traceback"]


def test_stop_before_the_agent_finishes_means_no_result(resources: ExperimentResources) -> None:
    # The profile-less fake whatever ROLLOUTS_FAKE_ACR says: every stop works, an unknown session is no error.
    fake = FakeAgentRuntime(behaviour=AgentBehaviour(delay_s=0.3))
    fake.invoke(SID, payload(resources))
    assert fake.running == {SID}
    fake.stop(SID)
    time.sleep(0.5)
    assert fake.written == {}
    assert fake.running == set()
    assert SID in fake.stopped
    fake.stop("never-started-session-000000000000000")
    assert [c.outcome for c in fake.stops()] == ["stopped", "unknown"]
    fake.close()


def test_slow_answer_throttle_reject_and_no_trio(resources: ExperimentResources, fake: FakeAgentRuntime) -> None:
    fake.behaviour = AgentBehaviour(kind="hang", invoke_latency_s=0.2)
    started = time.monotonic()
    fake.invoke(SID, payload(resources))
    assert time.monotonic() - started >= 0.2
    fake.behaviour = AgentBehaviour(kind="throttle")
    with pytest.raises(RuntimeThrottled):
        fake.invoke("s2-000000000000000000000000000000000", payload(resources))
    fake.behaviour = AgentBehaviour(kind="reject")
    with pytest.raises(RuntimeRejected):
        fake.invoke("s3-000000000000000000000000000000000", payload(resources))
    fake.behaviour = AgentBehaviour()
    fake.invoke("s4-000000000000000000000000000000000", {"prompt": "no _rollout trio: ART saves nothing"})
    assert fake.written == {}
    assert [c.outcome for c in fake.invocations()] == ["started", "throttled", "rejected", "started"]
    assert fake.max_running == 2
