"""HTTP sinks in local mode: events of the bus reach a trainer's HTTP seam as the deployed API destination sends
them (URL with path parameters, body from the template), retried through an outage until it recovers, nothing lost;
an answer EventBridge does not retry, or retries that run out, land in the sink's dead-letter queue; surplus
rollouts and (with drop_zero_variance) zero-variance groups are never sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.local.sinks import SinkConsumer, create_sink_resources
from tests.conftest import wait_for
from tests.doubles import HttpEndpoint
from tests.integration.conftest import publish
from tests.integration.lifecycle_support import moto_lock  # noqa: F401 - a fixture
from tests.sdk_events import B1, completed, failed, group_done

pytestmark = pytest.mark.timing

VERL_BODIES: dict[str, Any] = {
    "Rollout Completed": {"reward_info": {"reward": "$.detail.reward", "excluded": False, "id": "$.detail.rollout_id"}},
    "Rollout Failed": {"reward_info": {"reward": None, "excluded": True, "reason": "$.detail.reason"}},
}


@pytest.fixture
def endpoint() -> Iterator[HttpEndpoint]:
    with HttpEndpoint(fail_first=6, failing_status=503) as server:
        yield server


@pytest.fixture
def experiment_config(endpoint: HttpEndpoint) -> ExperimentConfig:
    sinks = [
        {
            "name": "gateway",
            "url": endpoint.url + "/sessions/{$.detail.input_id}/complete",
            "events": ["Rollout Completed", "Rollout Failed"],
            "bodies": VERL_BODIES,
        },
        {"name": "groups", "url": endpoint.url + "/groups", "events": ["Group Completed"]},
    ]
    return ExperimentConfig(name="test-exp", group_size=2, sinks=sinks, drop_zero_variance=True)


def _consumers(resources: ExperimentResources) -> list[SinkConsumer]:
    made = create_sink_resources(resources.config, resources.bus_name, clients.client)
    return [SinkConsumer(queues, clients.client, retry_base_s=0.05).start() for queues in made]


@pytest.mark.usefixtures("moto_lock")
def test_every_event_is_delivered_once_the_endpoint_recovers(
    resources: ExperimentResources, endpoint: HttpEndpoint
) -> None:
    consumers = _consumers(resources)
    try:
        rollouts = [completed(B1, f"s-{i}", 0, float(i % 2)) for i in range(6)]
        cut = completed(B1, "s-cut", 0, 1.0).model_copy(update={"surplus": True})
        failure = failed(B1, "s-fail", 0, FailureReason.TIMEOUT)
        flat = group_done(B1, "flat", [1.0, 1.0]).model_copy(update={"zero_variance": True})
        signal = group_done(B1, "signal", [0.0, 1.0])
        publish(resources, *rollouts, cut, failure, flat, signal)

        expected = {f"/sessions/s-{i}/complete" for i in range(6)} | {"/sessions/s-fail/complete", "/groups"}
        wait_for(lambda: {r.path for r in endpoint.delivered()} >= expected, timeout_s=60, what="every delivery")
    finally:
        for consumer in consumers:
            consumer.stop()

    delivered = {r.path: r.body for r in endpoint.delivered()}
    assert set(delivered) == expected  # no surplus rollout, no zero-variance group
    assert delivered["/sessions/s-3/complete"] == {"reward_info": {"reward": 1.0, "excluded": False, "id": "s-3#0"}}
    assert delivered["/sessions/s-fail/complete"] == {
        "reward_info": {"reward": None, "excluded": True, "reason": "timeout"}
    }
    assert delivered["/groups"]["input_id"] == "signal"  # the default body: the event's detail
    assert sum(r.status == 503 for r in endpoint.requests) == 6
    assert sum(c.stats.retried for c in consumers) == 6
    assert sum(c.stats.dead_lettered for c in consumers) == 0
    assert all(_depth(q) == 0 for c in consumers for q in (c.queues.queue_url, c.queues.dlq_url))


def _depth(url: str) -> int:
    attrs = clients.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(attrs["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.usefixtures("moto_lock")
def test_an_answer_not_retried_goes_to_the_dead_letter_queue_with_the_reason(
    resources: ExperimentResources, endpoint: HttpEndpoint
) -> None:
    endpoint.fail_first, endpoint.status = 0, 404  # verl's gateway answers 404 for a session it does not know
    consumers = _consumers(resources)
    try:
        publish(resources, completed(B1, "gone", 0, 1.0))
        wait_for(lambda: sum(c.stats.dead_lettered for c in consumers) == 1, timeout_s=30, what="the dead letter")
    finally:
        for consumer in consumers:
            consumer.stop()
    (gateway,) = [c for c in consumers if c.sink.name == "gateway"]
    (message,) = clients.client("sqs").receive_message(
        QueueUrl=gateway.queues.dlq_url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert message["MessageAttributes"]["ERROR_CODE"]["StringValue"] == "404"
    assert message["MessageAttributes"]["RETRY_ATTEMPTS"]["StringValue"] == "0"
    assert json.loads(message["Body"])["detail"]["input_id"] == "gone"
    assert len(endpoint.requests) == 1
