"""SDK logic without AWS: delivery rules of the event stream (over an in-memory queue with SQS semantics),
de-duplication, filters, GRPO groups, advantages, status arithmetic, export rows, CLI progress counting."""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_pipeline.cli import Progress
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import EVENT_SOURCE, DetailType, detail_type_of
from rollout_pipeline.ledger.items import BatchView, GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.sdk.errors import DatasetInvalid
from rollout_pipeline.sdk.events import (
    Delivery,
    Event,
    EventFilter,
    EventStream,
    Group,
    GroupStream,
    SeenIds,
    parse_envelope,
)
from rollout_pipeline.sdk.export import export_rows
from rollout_pipeline.sdk.status import batch_status
from rollout_pipeline.sdk.submission import file_options, validate_payloads
from tests.doubles import ManualClock, MemoryEventQueue
from tests.sdk_events import B1, B2, accepted, batch_done, completed, failed, group_done


def envelope(detail: Any) -> str:
    return json.dumps(
        {
            "source": EVENT_SOURCE,
            "detail-type": str(detail_type_of(detail)),
            "detail": json.loads(detail.model_dump_json()),
        }
    )


def stream_over(queue: MemoryEventQueue, seen: SeenIds | None = None, **kwargs: Any) -> EventStream:
    clock = ManualClock()
    original = queue.receive

    def receive(wait_s: float, max_messages: int = 10) -> list[Delivery]:
        result = original(wait_s, max_messages)
        if not result:
            clock.sleep(max(wait_s, 0.1))  # a long poll that found nothing takes its time
        return result

    queue.receive = receive  # type: ignore[method-assign]
    return EventStream(
        queue,  # type: ignore[arg-type]
        seen or SeenIds(),
        clock=clock,
        sleep=clock.sleep,
        poll_wait_s=1,
        **kwargs,
    )


# ------------------------------------------------------------------------------------------------ delivery


@settings(max_examples=60, deadline=None)
@given(
    copies=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=6),
    crash_after=st.integers(min_value=0, max_value=8),
)
def test_each_event_is_handed_once_and_every_message_ends_deleted(copies: list[int], crash_after: int) -> None:
    details = [completed(B1, f"q{i}", 0, float(i)) for i in range(len(copies))]
    bodies = [envelope(d) for d, n in zip(details, copies, strict=True) for _ in range(n)]
    queue = MemoryEventQueue(bodies)
    seen = SeenIds()
    handed: list[str] = []

    # First consumer "crashes" after `crash_after` events: its last event is not confirmed.
    first = stream_over(queue, seen, timeout=5)
    for count, event in enumerate(first, start=1):
        handed.append(event.event_id)
        if count > crash_after:
            handed.pop()  # the crash happened before the handler finished: it does not count
            first.close()
            break
    queue.timeout_all()  # whatever it held comes back
    handed.extend(e.event_id for e in stream_over(queue, seen, timeout=5))

    assert sorted(handed) == sorted(d.event_id for d in details), "each event handed over exactly once"
    assert queue.messages == {}, "every message, duplicates included, is deleted"


def test_release_on_close_and_ack_on_advance() -> None:
    queue = MemoryEventQueue([envelope(completed(B1, "q1", 0, 1.0)), envelope(completed(B1, "q2", 0, 1.0))])
    stream = stream_over(queue, timeout=5)
    next(stream)
    assert queue.deleted == []
    next(stream)
    assert queue.deleted == [0], "the first message is deleted once the iterator moved past it"
    stream.close()
    assert queue.messages[1]["visible"], "the unconfirmed one is released at once"


def test_filtered_out_messages_are_released_or_consumed() -> None:
    bodies = [envelope(completed(B2, "q1", 0, 1.0)), envelope(accepted(B1)), "garbage"]
    queue = MemoryEventQueue(bodies)
    got = list(stream_over(queue, timeout=3, event_filter=EventFilter(B1, [DetailType.BATCH_ACCEPTED])))
    assert [e.detail_type for e in got] == [DetailType.BATCH_ACCEPTED]
    assert sorted(queue.messages) == [0, 2], "released, never deleted"
    assert all(m["visible"] for m in queue.messages.values()), "visible at once for their consumer"
    assert max(m["receives"] for m in queue.messages.values()) <= 4, "backs off (0.5, 1, 2 s...) instead of spinning"

    queue = MemoryEventQueue(bodies)
    list(stream_over(queue, timeout=3, event_filter=EventFilter(B1), consume_others=True))
    assert queue.messages == {}


def test_max_events_and_timeout_bound_the_stream() -> None:
    queue = MemoryEventQueue([envelope(completed(B1, f"q{i}", 0, 1.0)) for i in range(5)])
    assert len(list(stream_over(queue, timeout=10, max_events=2))) == 2
    assert len(queue.messages) == 3
    empty = stream_over(MemoryEventQueue([]), timeout=2.5)
    assert list(empty) == []
    assert empty.expired()


def test_seen_ids_is_a_bounded_lru() -> None:
    seen = SeenIds(max_size=2)
    seen.add("a")
    seen.add("b")
    assert "a" in seen  # refreshes a
    seen.add("c")
    assert "b" not in seen
    assert "a" in seen
    assert "c" in seen
    assert len(seen) == 2
    with pytest.raises(ValueError):
        SeenIds(0)


def test_parse_envelope_rejects_what_is_not_a_pipeline_event() -> None:
    assert parse_envelope("nope")[1] is None
    assert parse_envelope('{"source": "aws.s3"}')[1] is None
    assert parse_envelope(json.dumps({"source": EVENT_SOURCE, "detail-type": "Other", "detail": {}}))[1] is None
    broken = json.dumps({"source": EVENT_SOURCE, "detail-type": "Rollout Completed", "detail": {"event_id": "x"}})
    assert parse_envelope(broken)[1] is None
    event = parse_envelope(envelope(accepted(B1)))[1]
    assert isinstance(event, Event)
    assert (event.detail_type, event.batch_id, event.exp_id) == (DetailType.BATCH_ACCEPTED, B1, "test-exp")


# -------------------------------------------------------------------------------------------------- groups


def group_stream(bodies: list[str], **kwargs: Any) -> tuple[MemoryEventQueue, GroupStream]:
    queue = MemoryEventQueue(bodies)
    stream = stream_over(queue, timeout=30, event_filter=EventFilter(B1))
    return queue, GroupStream(stream, clock=stream._clock, **kwargs)


def test_groups_arrive_complete_in_any_order_and_stop_after_batch_completed() -> None:
    bodies = [
        envelope(batch_done(B1, 4)),  # first: events are not ordered
        envelope(group_done(B1, "q2", [0.0, 1.0])),
        envelope(completed(B1, "q1", 1, 1.0)),
        envelope(completed(B1, "q2", 0, 0.0)),
        envelope(completed(B1, "q2", 1, 1.0)),
        envelope(completed(B1, "q1", 0, 3.0)),
        envelope(group_done(B1, "q1", [3.0, 1.0])),
    ]
    queue, stream = group_stream(bodies, grace_s=5)
    groups = list(stream)
    assert [g.input_id for g in groups] == ["q2", "q1"]
    assert all(g.missing == [] for g in groups)
    assert queue.messages == {}


def test_duplicate_of_a_parked_group_is_dropped_not_spun_on() -> None:
    done = group_done(B1, "q1", [1.0, 0.0])
    queue, stream = group_stream([envelope(done), envelope(done), envelope(completed(B1, "q1", 0, 1.0))], grace_s=3)
    group = next(stream)
    assert group.missing == [1]
    stream.close(ack_current=True)
    assert queue.messages == {}
    assert queue.receipts == 3, "each message received once"


def test_group_is_yielded_after_grace_when_rollout_events_are_lost() -> None:
    queue, stream = group_stream([envelope(group_done(B1, "q1", [1.0, None]))], grace_s=2)
    group = next(stream)
    assert group.missing == [0, 1]
    assert group.rewards == [1.0, None]
    stream.close(ack_current=True)
    assert queue.messages == {}


def test_buffered_rollouts_are_bounded() -> None:
    bodies = [envelope(completed(B1, f"q{i}", 0, 1.0)) for i in range(5)] + [envelope(group_done(B1, "q4", [1.0]))]
    _queue, stream = group_stream(bodies, grace_s=0, max_buffered_rollouts=2)
    group = next(stream)
    assert group.input_id == "q4"
    assert sorted(group.rollouts) == [0]
    assert stream._buffered <= 2


class BlockingQueue(MemoryEventQueue):
    """A queue whose receive blocks like a long poll until `answer` is set, then answers what it holds."""

    def __init__(self, bodies: list[str]) -> None:
        super().__init__(bodies)
        self.polling = threading.Event()
        self.answer = threading.Event()

    def receive(self, wait_s: float, max_messages: int = 10) -> list[Delivery]:
        self.polling.set()
        self.answer.wait(30)
        return super().receive(wait_s, max_messages)


@pytest.mark.timing
@pytest.mark.parametrize("kind", ["events", "groups"])
def test_close_from_another_thread_returns_while_the_stream_waits(kind: str) -> None:
    queue = BlockingQueue([envelope(completed(B1, "q1", 0, 1.0))])
    events = EventStream(queue, SeenIds(), timeout=60, poll_wait_s=20)  # type: ignore[arg-type]
    stream: EventStream | GroupStream = events if kind == "events" else GroupStream(events)
    consumer = threading.Thread(target=lambda: list(stream), daemon=True)
    consumer.start()
    assert queue.polling.wait(10)

    closer = threading.Thread(target=stream.close)
    closer.start()
    closer.join(10)

    assert not closer.is_alive(), "close() waited for the stream's long poll"
    queue.answer.set()  # the long poll ends: what it brought is released, and the consumer stops
    consumer.join(10)
    assert not consumer.is_alive()
    assert queue.deleted == []
    assert all(message["visible"] for message in queue.messages.values())


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        ([1.0, 0.0], [1.0, -1.0]),
        ([1.0, 1.0], [0.0, 0.0]),
        ([None, 2.0, 0.0], [None, 1.0, -1.0]),
        ([None, None], [None, None]),
    ],
)
def test_advantages(rewards: list[float | None], expected: list[float | None]) -> None:
    group = Group(completed=group_done(B1, "q", rewards))
    assert group.advantages(eps=0.0 if len({r for r in rewards if r is not None}) > 1 else 1e-6) == pytest.approx(
        expected
    )


# -------------------------------------------------------------------------------------- submission, status


def test_file_options_merge_sampling_params_and_name_bad_values() -> None:
    config = ExperimentConfig(name="x", sampling_params={"temperature": 1.0, "top_p": 0.9})
    options = file_options(config, sampling_params={"temperature": 0.2}, group_size=4)
    assert options.sampling_params.model_dump(exclude_none=True) == {"temperature": 0.2, "top_p": 0.9}
    assert options.group_size == 4
    with pytest.raises(ValueError, match=r"max_attempts: .*less than or equal to 10"):
        file_options(config, max_attempts=11)


def test_validate_payloads_reports_index_and_reason() -> None:
    rows = validate_payloads([{"id": 7, "q": 1}, {"q": 2}])
    assert [(r.input_id, r.payload) for r in rows] == [("7", {"q": 1}), ("line-2", {"q": 2})]
    with pytest.raises(DatasetInvalid) as info:
        validate_payloads([{"id": "a"}, {"id": "a"}, "x"])  # type: ignore[list-item]
    assert str(info.value) == "payloads:#1: duplicate_id: id 'a' is already used by #0 (and 1 more invalid row(s))"


def test_batch_status_arithmetic() -> None:
    item = {
        "batch_id": {"S": B1},
        "status": {"S": "accepted"},
        "rollouts_total": {"N": "10"},
        "succeeded": {"N": "4"},
        "failed": {"N": "2"},
        "failed_timeout": {"N": "1"},
        "failed_agent_error": {"N": "1"},
        "reward_sum": {"N": "2"},
        "reward_sumsq": {"N": "2"},
        "reward_count": {"N": "4"},
    }
    status = batch_status(BatchView.of(item), Counter({"dispatched": 3, "succeeded": 4, "failed": 2}))
    assert (status.queued, status.running, status.terminal, status.done) == (1, 3, 6, False)
    assert status.failed_by_reason == {"timeout": 1, "agent_error": 1}
    assert status.reward_mean == pytest.approx(0.5)
    assert status.reward_std == pytest.approx(0.5)
    ingesting = batch_status(BatchView.of({"batch_id": {"S": B1}, "status": {"S": "ingesting"}}), Counter())
    assert (ingesting.rollouts_total, ingesting.queued, ingesting.done) == (None, None, False)
    assert status.status == "accepted", "rollouts still to run"


@pytest.mark.parametrize(("stored", "shown"), [("accepted", "completed"), ("cancelled", "cancelled")])
def test_a_finished_batch_says_completed_or_cancelled(stored: str, shown: str) -> None:
    item = {"batch_id": {"S": B1}, "status": {"S": stored}, "rollouts_total": {"N": "4"}, "succeeded": {"N": "3"}}
    item["failed"] = {"N": "1"}
    status = batch_status(BatchView.of(item), Counter({"succeeded": 3, "failed": 1}))
    assert (status.status, status.done, status.as_dict()["status"]) == (shown, True, shown)


def test_export_rows_join_groups_and_rollouts() -> None:
    groups = [GroupItem(exp_id="e", batch_id=B1, input_id="q1", line=3, group_size=2, payload={"p": 1})]
    rollouts = [
        RolloutRecord(
            batch_id=B1,
            input_id="q1",
            index=1,
            state=RolloutState.SUCCEEDED,
            attempt=2,
            reward=0.5,
            result_uri="s3://b/k",
            finished_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
    ]
    rows = list(
        export_rows(groups=groups, rollouts=rollouts, fetch_result=lambda uri: {"uri": uri}, include_payload=True)
    )
    assert [(r["rollout_id"], r["state"], r["reward"], r["result"]) for r in rows] == [
        ("q1#0", "queued", None, None),
        ("q1#1", "succeeded", 0.5, {"uri": "s3://b/k"}),
    ]
    assert rows[1]["attempt"] == 2
    assert rows[1]["finished_at"] == "2026-01-01T00:00:00+00:00", "times as the ledger stores them"
    assert rows[0]["payload"] == {"p": 1}


# ------------------------------------------------------------------------------------------- CLI progress


def test_cli_progress_counts_each_rollout_once() -> None:
    progress = Progress(B1)
    progress.apply(accepted(B1))
    assert progress.total == 2
    progress.counted.add(("q1", 0))  # already terminal in the ledger baseline
    progress.succeeded = 1
    progress.reward_sum, progress.reward_count = 1.0, 1
    progress.apply(completed(B1, "q1", 0, 1.0))  # its event arrives later: not counted twice
    progress.apply(failed(B1, "q1", 1))
    progress.apply(failed(B1, "q1", 1))  # duplicate
    assert (progress.succeeded, progress.failed, progress.pending) == (1, 1, 0)
    assert progress.line() == "2/2 done: 1 succeeded, 1 failed (agent_error 1), 0 running, 0 queued, reward mean 1.0000"
    assert not progress.done
    progress.apply(batch_done(B1, 2))
    assert progress.done


@pytest.mark.usefixtures("no_aws_credentials")
def test_local_endpoint_needs_no_aws_credentials() -> None:
    from rollout_pipeline.sdk._aws import AwsClients, is_loopback

    assert is_loopback("http://127.0.0.1:4566")
    assert is_loopback("http://localhost:1")
    assert not is_loopback("https://sqs.us-east-1.amazonaws.com")

    local = AwsClients(endpoint_url="http://127.0.0.1:4566").client("sqs")
    assert local._request_signer._credentials.access_key == "local"
    remote = AwsClients(endpoint_url="https://example.com", region="us-east-1").client("sqs")
    assert remote._request_signer._credentials is None, "a remote endpoint still needs real credentials"


@given(st.lists(st.from_regex(r"[a-z0-9][a-z0-9-]{0,47}", fullmatch=True), min_size=1, max_size=400, unique=True))
@settings(max_examples=40, deadline=None)
def test_a_stream_pattern_fits_and_matches_every_batch_it_names(batch_ids: list[str]) -> None:
    from rollout_pipeline.sdk.subscription import MAX_PATTERN_CHARS, stream_pattern

    pattern = stream_pattern(batch_ids, [DetailType.ROLLOUT_COMPLETED])
    assert len(json.dumps(pattern)) <= MAX_PATTERN_CHARS
    matchers = pattern.get("detail", {}).get("batch_id")
    if matchers is None:
        return  # every batch (the stream filters)
    assert "" in matchers  # the experiment-wide events

    def matched(batch: str) -> bool:
        return any(m == batch or (isinstance(m, dict) and batch.startswith(m["prefix"])) for m in matchers)

    assert all(matched(batch) for batch in batch_ids)
    if len(json.dumps(sorted(batch_ids))) < MAX_PATTERN_CHARS // 2:
        assert sorted(matchers) == sorted({*batch_ids, ""}), "a short list is matched exactly"
