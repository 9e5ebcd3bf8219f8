"""The SDK consumes pushed events from the trainer queue (moto): each event_id handed to user code once, a message
deleted only after user code is done with it, filters, complete GRPO groups, asyncio variants."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.contracts import (
    DetailType,
    RolloutCompleted,
    RolloutFailed,
)
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Event, Experiment
from tests.conftest import REGION, receive_all
from tests.integration.conftest import WAIT, publish, queue_depth
from tests.sdk_events import B1, B2, accepted, batch_done, completed, failed, group_done

# ---------------------------------------------------------------------------------------------------- events


def test_events_are_parsed_handed_over_and_deleted(experiment: Experiment, resources: ExperimentResources) -> None:
    publish(resources, accepted(B1), completed(B1, "q1", 0, 1.0), failed(B1, "q1", 1))
    got = list(experiment.events(timeout=3, poll_wait_s=WAIT, max_events=3))
    assert sorted(e.detail_type for e in got) == sorted(
        [DetailType.BATCH_ACCEPTED, DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED]
    )
    by_type = {e.detail_type: e for e in got}
    rollout = by_type[DetailType.ROLLOUT_COMPLETED]
    assert isinstance(rollout.detail, RolloutCompleted)
    assert rollout.detail.reward == 1.0
    assert rollout.batch_id == B1
    assert rollout.envelope["source"] == "rollout.pipeline"
    assert rollout.receive_count == 1
    assert isinstance(by_type[DetailType.ROLLOUT_FAILED].detail, RolloutFailed)
    assert queue_depth(resources.trainer_queue_url) == 0


def test_duplicated_event_is_handed_over_once(experiment: Experiment, resources: ExperimentResources) -> None:
    detail = completed(B1, "q1", 0, 0.5)
    publish(resources, detail)
    publish(resources, detail)  # at-least-once: the same logical event twice
    assert queue_depth(resources.trainer_queue_url) == 2
    got = list(experiment.events(timeout=2.5, poll_wait_s=WAIT))
    assert [e.event_id for e in got] == [detail.event_id]
    assert queue_depth(resources.trainer_queue_url) == 0, "the duplicate message is deleted too"


def test_redelivered_event_after_ack_is_not_handed_again(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    detail = completed(B1, "q1", 0, 0.5)
    publish(resources, detail)
    assert [e.event_id for e in experiment.events(timeout=2, poll_wait_s=WAIT)] == [detail.event_id]
    publish(resources, detail)  # redelivered later (e.g. the publisher retried after a crash)
    assert list(experiment.events(timeout=1.5, poll_wait_s=WAIT)) == []
    assert queue_depth(resources.trainer_queue_url) == 0


def test_handler_that_raises_leaves_the_message_for_redelivery(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    detail = completed(B1, "q1", 0, 0.5)
    publish(resources, detail)
    calls: list[str] = []

    def crashing(event: Event) -> None:
        calls.append(event.event_id)
        raise RuntimeError("trainer crashed")

    with pytest.raises(RuntimeError, match="trainer crashed"):
        experiment.subscribe(crashing, timeout=2, poll_wait_s=WAIT)
    assert queue_depth(resources.trainer_queue_url) == 1, "not deleted"

    handled = experiment.subscribe(lambda e: calls.append(e.event_id), timeout=2, poll_wait_s=WAIT)
    assert handled == 1, "redelivered at once (released, not left invisible)"
    assert calls == [detail.event_id, detail.event_id]
    assert queue_depth(resources.trainer_queue_url) == 0


def test_with_block_acks_the_last_event_but_a_bare_close_does_not(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    publish(resources, completed(B1, "q1", 0, 0.5))
    stream = experiment.events(timeout=2, poll_wait_s=WAIT)
    first = next(stream)
    stream.close()  # like a crash or a `break` outside `with`: the event was not confirmed
    assert queue_depth(resources.trainer_queue_url) == 1

    with experiment.events(timeout=2, poll_wait_s=WAIT) as again:
        for event in again:
            assert event.event_id == first.event_id
            break  # leaving the `with` normally confirms it
    assert queue_depth(resources.trainer_queue_url) == 0


def test_a_fresh_process_gets_unconfirmed_events_again(resources: ExperimentResources) -> None:
    publish(resources, completed(B1, "q1", 0, 0.5))
    first = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    stream = first.events(timeout=2, poll_wait_s=WAIT)
    event = next(stream)
    stream.close()  # crashed before confirming
    second = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    assert [e.event_id for e in second.events(timeout=2, poll_wait_s=WAIT)] == [event.event_id]


def test_filters_leave_other_events_for_other_consumers(experiment: Experiment, resources: ExperimentResources) -> None:
    publish(resources, completed(B1, "q1", 0, 1.0), completed(B2, "q1", 0, 0.0), accepted(B1))
    got = list(
        experiment.events(
            batch_id=B1, detail_types=["Rollout Completed"], timeout=1, poll_wait_s=WAIT, from_trainer_queue=True
        )
    )
    assert [(e.batch_id, e.detail_type) for e in got] == [(B1, DetailType.ROLLOUT_COMPLETED)]
    left = receive_all(resources.trainer_queue_url)
    assert sorted((b["detail"]["batch_id"], b["detail-type"]) for b in left) == sorted(
        [(B1, "Batch Accepted"), (B2, "Rollout Completed")]
    )


def test_consume_others_deletes_filtered_out_events(experiment: Experiment, resources: ExperimentResources) -> None:
    """Waits on conditions, not on a 2 s stream: under load the stream could end before it had received B2's
    message (failed at load average 8). A B2 message released instead of deleted stays visible: the loop then
    reads it again until the deadline (or until its receives move it to the dead-letter queue) and the last
    assertions fail."""
    publish(resources, completed(B1, "q1", 0, 1.0), completed(B2, "q1", 0, 0.0))
    deadline = time.monotonic() + 30
    with experiment.events(batch_id=B1, timeout=60, poll_wait_s=WAIT, consume_others=True) as stream:
        first = stream.next_delivery(30)
        assert first is not None
        assert first.event is not None
        assert first.event.batch_id == B1
        stream.ack(first)
        while queue_depth(resources.trainer_queue_url) and time.monotonic() < deadline:
            assert stream.next_delivery(1.0) is None, "only B1's event is handed over"
    assert queue_depth(resources.trainer_queue_url) == 0
    assert queue_depth(resources.dlq_urls["trainer"]) == 0, "deleted, not worn out into the dead-letter queue"


def test_foreign_messages_are_not_handed_over(experiment: Experiment, resources: ExperimentResources) -> None:
    sqs = clients.client("sqs")
    sqs.send_message(QueueUrl=resources.trainer_queue_url, MessageBody="not json")
    sqs.send_message(QueueUrl=resources.trainer_queue_url, MessageBody='{"source": "someone.else", "detail": {}}')
    publish(resources, accepted(B1))
    got = list(experiment.events(timeout=1, poll_wait_s=WAIT))
    assert [e.detail_type for e in got] == [DetailType.BATCH_ACCEPTED]
    assert queue_depth(resources.trainer_queue_url) == 2, "left for the queue's DLQ / their owner"


def test_timeout_bounds_an_empty_stream(experiment: Experiment) -> None:
    import time

    start = time.monotonic()
    assert list(experiment.events(timeout=1.2, poll_wait_s=WAIT)) == []
    elapsed = time.monotonic() - start
    # The stream ends by its timeout, not earlier; the upper bound only guards against a hang (how long past the
    # timeout the last receive returns depends on the machine's load, so it is not asserted closely).
    assert 1.2 <= elapsed < 60


# ---------------------------------------------------------------------------------------------------- groups


def test_groups_collect_rollouts_and_stop_at_batch_completed(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    publish(
        resources,
        completed(B1, "q1", 0, 1.0),
        completed(B1, "q1", 1, 0.0),
        group_done(B1, "q1", [1.0, 0.0]),
        failed(B1, "q2", 0),
        completed(B1, "q2", 1, 0.5),
        group_done(B1, "q2", [None, 0.5]),
        batch_done(B1, 4),
    )
    groups = list(experiment.groups(B1, timeout=10, poll_wait_s=WAIT, grace_s=1, from_trainer_queue=True))
    assert sorted(g.input_id for g in groups) == ["q1", "q2"]
    by_id = {g.input_id: g for g in groups}
    q1 = by_id["q1"]
    assert q1.missing == []
    assert sorted(q1.rollouts) == [0, 1]
    assert q1.advantages(eps=0.0) == pytest.approx([1.0, -1.0])
    q2 = by_id["q2"]
    assert q2.rewards == [None, 0.5]
    assert q2.advantages() == [None, pytest.approx(0.0)]
    assert isinstance(q2.rollouts[0], RolloutFailed)
    assert queue_depth(resources.trainer_queue_url) == 0


def test_group_waits_for_late_rollout_events_within_grace(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    publish(resources, group_done(B1, "q1", [1.0, 0.0]), completed(B1, "q1", 0, 1.0))
    stream = experiment.groups(B1, timeout=8, poll_wait_s=WAIT, grace_s=6, from_trainer_queue=True)

    import threading

    threading.Timer(1.0, lambda: publish(resources, completed(B1, "q1", 1, 0.0))).start()
    group = next(stream)
    assert group.missing == [], "the late rollout event arrived within the grace period"
    stream.close(ack_current=True)
    assert queue_depth(resources.trainer_queue_url) == 0


def test_group_without_its_rollout_events_is_yielded_after_grace(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    publish(resources, group_done(B1, "q1", [1.0, 0.0]))
    with experiment.groups(B1, timeout=5, poll_wait_s=WAIT, grace_s=0.5, from_trainer_queue=True) as stream:
        group = next(stream)
    assert group.missing == [0, 1]
    assert group.advantages(eps=0.0) == pytest.approx([1.0, -1.0])
    assert queue_depth(resources.trainer_queue_url) == 0


def test_unconfirmed_group_is_redelivered(experiment: Experiment, resources: ExperimentResources) -> None:
    publish(resources, group_done(B1, "q1", [1.0, 0.0]))
    stream = experiment.groups(B1, timeout=3, poll_wait_s=WAIT, grace_s=0, from_trainer_queue=True)
    next(stream)
    stream.close()  # crash before the trainer used the group
    again = list(experiment.groups(B1, timeout=2, poll_wait_s=WAIT, grace_s=0, from_trainer_queue=True))
    assert [g.input_id for g in again] == ["q1"]


# ----------------------------------------------------------------------------------------------------- async


def test_async_events_and_groups(experiment: Experiment, resources: ExperimentResources) -> None:
    publish(resources, completed(B1, "q1", 0, 1.0), group_done(B1, "q1", [1.0]), batch_done(B1, 1))

    async def consume() -> tuple[list[str], list[str]]:
        kinds = []
        async with experiment.aevents(detail_types=["Rollout Completed"], timeout=2, poll_wait_s=WAIT) as stream:
            async for event in stream:
                kinds.append(str(event.detail_type))
        inputs = [
            group.input_id
            async for group in experiment.agroups(B1, timeout=3, poll_wait_s=WAIT, from_trainer_queue=True)
        ]
        return kinds, inputs

    kinds, inputs = asyncio.run(consume())
    assert kinds == ["Rollout Completed"]
    assert inputs == ["q1"]


def test_a_private_subscription_queue_is_encrypted_and_tls_only(experiment: Experiment) -> None:
    """The per-process queues the ART backend and `tap` create follow the stack's rules: SSE and TLS-only."""
    name, queue_url = experiment.open_subscription({"source": ["rollout.pipeline"]}, suffix="test-private")
    try:
        attrs = experiment.client("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
        assert attrs["SqsManagedSseEnabled"] == "true"
        statements = json.loads(attrs["Policy"])["Statement"]
        denies = [s for s in statements if s["Effect"] == "Deny"]
        assert denies == [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "sqs:*",
                "Resource": attrs["QueueArn"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ]
    finally:
        experiment.close_subscription(name, queue_url)


def test_a_stream_of_many_batches_fits_eventbridges_pattern_size(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    """150 batch ids do not fit in an event pattern (2,048 characters by default): the stream's rule matches them by
    prefixes, and the stream hands over its own batches' events only."""
    from rollout_pipeline.sdk import subscription

    many = [B1, *(f"test-{n:012d}" for n in range(150))]
    assert len(json.dumps(sorted(many))) > subscription.MAX_PATTERN_CHARS
    with experiment.events(batch_id=many, timeout=5, poll_wait_s=WAIT) as stream:
        assert isinstance(stream, subscription.SubscribedStream)
        rule = experiment.client("events").describe_rule(Name=stream.subscription[0], EventBusName=resources.bus_name)
        assert len(rule["EventPattern"]) <= subscription.MAX_PATTERN_CHARS
        publish(resources, completed(B2, "q1", 0, 0.0), completed(B1, "q1", 0, 1.0))
        event = next(stream)
    assert (event.batch_id, event.detail_type) == (B1, DetailType.ROLLOUT_COMPLETED)
