"""The rollout lifecycle end to end over moto: queue -> dispatcher -> fake ACR -> results bucket -> completion
queue -> completion -> events on the trainer queue (Rollout Completed, Group Completed, Batch Completed)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from lambdas import glue
from rollout_pipeline import ids
from rollout_pipeline.contracts import (
    BatchCompleted,
    GroupCompleted,
    RolloutCompleted,
    parse_detail,
)
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.ledger import keys
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.metric_names import NOTIFICATION_LATENCY
from tests.integration.lifecycle_support import (
    PACED_WAIT_S,
    ack,
    by_type,
    drive,
    moto_lock,
    receive_records,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

B_HAPPY = ids.batch_id_for_upload("in", "datasets/happy.jsonl", "v1")
B_CLAIM = ids.batch_id_for_upload("in", "datasets/claim.jsonl", "v1")
B_MODELS = ids.batch_id_for_upload("in", "datasets/models.jsonl", "v1")
B_FAST = ids.batch_id_for_upload("in", "datasets/fast.jsonl", "v1")


def lambda_context(remaining_ms: int = 60_000) -> Any:
    return SimpleNamespace(
        function_name="fn",
        memory_limit_in_mb=512,
        invoked_function_arn="arn:aws:lambda:us-east-1:123456789012:function:fn",
        aws_request_id="req-1",
        get_remaining_time_in_millis=lambda: remaining_ms,
    )


def rewards_by_index(inv: FakeInvocation) -> AgentBehaviour:
    rollout = inv.payload["_rollout"]
    index = rollout["index"]
    if rollout["input_id"] == "q1":
        return AgentBehaviour(rewards=[0.0, float(index)])  # per-turn rewards: the last one is the reward
    return AgentBehaviour(rewards=0.5 * index)


def test_happy_path_through_the_lambda_handlers(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lambdas import completion as completion_lambda
    from lambdas import dispatch as dispatch_lambda

    fake.behaviour = rewards_by_index
    monkeypatch.setattr(glue, "SAFETY_S", 0.0)
    dispatch_handler, completion_handler = dispatch_lambda.function.bind(deps), completion_lambda.function.bind(deps)
    send(resources, seed_batch(resources, batch_id=B_HAPPY))
    records = receive_records(resources.rollout_queue_url)
    assert len(records) == 4
    response = dispatch_handler({"Records": records}, lambda_context(int(PACED_WAIT_S * 1000)))
    assert response == {"batchItemFailures": []}
    ack(resources.rollout_queue_url, records, [])

    # The fake agent wrote 4 results; S3 -> EventBridge -> completion queue.
    completions = receive_records(resources.completion_queue_url)
    assert len(completions) == 4
    response = completion_handler({"Records": completions}, lambda_context())
    assert response == {"batchItemFailures": []}
    ack(resources.completion_queue_url, completions, [])

    events = trainer_events(resources)
    completed = [RolloutCompleted.model_validate(d) for d in by_type(events, "Rollout Completed")]
    assert sorted((c.input_id, c.index, c.reward) for c in completed) == [
        ("q1", 0, 0.0),
        ("q1", 1, 1.0),
        ("q2", 0, 0.0),
        ("q2", 1, 0.5),
    ]
    q1_1 = next(c for c in completed if (c.input_id, c.index) == ("q1", 1))
    assert q1_1.rewards == [0.0, 1.0]
    assert q1_1.attempt == 1
    assert q1_1.policy_version == "v7"
    assert q1_1.session_id == ids.session_id("test-exp", B_HAPPY, "q1", 1, 1)
    assert q1_1.result_uri == f"s3://{resources.results_bucket}/test-exp/q1/{q1_1.session_id}.json"
    assert q1_1.result is not None
    assert q1_1.result["status_code"] == 200
    t = q1_1.timings
    assert t.submitted_at
    assert t.dispatched_at
    assert t.finished_at
    assert t.notified_at
    assert t.submitted_at <= t.dispatched_at <= t.notified_at
    assert q1_1.event_id == ids.event_id("Rollout Completed", "test-exp", B_HAPPY, "q1", 1)

    groups = {g.input_id: g for g in (GroupCompleted.model_validate(d) for d in by_type(events, "Group Completed"))}
    assert set(groups) == {"q1", "q2"}
    assert groups["q2"].rewards == [0.0, 0.5]
    assert groups["q2"].reward_mean == pytest.approx(0.25)
    assert groups["q2"].reward_std == pytest.approx(0.25)
    assert groups["q2"].succeeded == 2
    assert groups["q2"].failed == 0
    assert groups["q2"].policy_version == "v7"

    (batch,) = [BatchCompleted.model_validate(d) for d in by_type(events, "Batch Completed")]
    assert (batch.rollouts_total, batch.succeeded, batch.failed, batch.reward_count) == (4, 4, 0, 4)
    assert batch.reward_mean == pytest.approx(1.5 / 4)
    assert len(events) == 4 + 2 + 1

    # ART-compatible payload; sessions stopped; slots freed; nothing left pending.
    payload = fake.payloads[q1_1.session_id]
    assert payload["prompt"] == "one"
    rollout = payload["_rollout"]
    assert (rollout["exp_id"], rollout["input_id"], rollout["s3_bucket"]) == (
        "test-exp",
        "q1",
        resources.results_bucket,
    )
    assert rollout["attempt"] == 1
    assert rollout["group_size"] == 2
    assert rollout["policy_version"] == "v7"
    assert fake.running == set()
    assert len(fake.stopped) == 4
    assert slots_in_flight(resources) == 0
    item = rollout_item(resources, B_HAPPY, "q1", 1)
    assert item is not None
    assert item["state"] == "succeeded"
    assert item["invoked_at"]
    assert not {"outbox", keys.OUTBOX_PK, keys.DEADLINE_PK} & set(item)
    assert receive_records(resources.rollout_queue_url) == []


def test_drive_helper_with_payload_claim_check_and_latency_metric(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    from rollout_pipeline.adapters import clients

    clients.client("s3").put_object(
        Bucket=resources.input_bucket, Key=f"claims/{B_CLAIM}/big.json", Body=json.dumps({"prompt": "x" * 40_000})
    )
    ref = f"s3://{resources.input_bucket}/claims/{B_CLAIM}/big.json"
    msgs = seed_batch(resources, batch_id=B_CLAIM, inputs={"big": {}}, group_size=1, payload_refs={"big": ref})
    assert msgs[0].payload is None
    assert msgs[0].payload_ref == ref
    send(resources, msgs)
    drive(resources, deps)
    (sid,) = fake.payloads
    assert fake.payloads[sid]["prompt"] == "x" * 40_000
    events = trainer_events(resources)
    assert [e["detail-type"] for e in events].count("Rollout Completed") == 1
    _counts, samples = deps.metrics.drain()
    assert len(samples[NOTIFICATION_LATENCY]) == 1
    assert 0 <= samples[NOTIFICATION_LATENCY][0] < 60_000


def test_events_parse_with_the_public_models(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    send(resources, seed_batch(resources, batch_id=B_MODELS, inputs={"a": {"p": 1}}, group_size=1))
    drive(resources, deps)
    events = trainer_events(resources)
    assert {e["detail-type"] for e in events} == {"Rollout Completed", "Group Completed", "Batch Completed"}
    for event in events:
        assert event["source"] == "rollout.pipeline"
        parse_detail(event["detail-type"], event["detail"])


def test_result_before_invoke_is_recorded_is_accepted(
    resources: ExperimentResources, fake: FakeAgentRuntime, deps: LifecycleDeps
) -> None:
    """The fake writes the result during invoke, i.e. before `invoked_at`: completion must still accept it."""
    send(resources, seed_batch(resources, batch_id=B_FAST, inputs={"a": {}}, group_size=1))
    drive(resources, deps)
    item = rollout_item(resources, B_FAST, "a", 0)
    assert item is not None
    assert item["state"] == "succeeded"
    assert len(by_type(trainer_events(resources), "Rollout Completed")) == 1
    time.sleep(0)  # nothing pending
