"""The release window on moto, through the real ingestion, dispatcher, completion, sweeper and cancel: a batch larger
than the window completes with every rollout exactly once, released in group (line) order and never more than the
window in flight; a releaser that crashed before sending is recovered by the sweeper; cancel stops the release."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.adapters.sqs import SqsQueue
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.feed import window
from rollout_pipeline.feed.feed import SWEEP_AGE_S, Feed
from rollout_pipeline.feed.window import RELEASE_LEASE_S
from rollout_pipeline.ingest.core import Ingestion, IngestPorts
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.lifecycle.cancel import cancel_batch
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from tests.integration.lifecycle_support import (
    ShiftedClock,
    batch_view,
    by_type,
    complete_once,
    dispatch_once,
    ledger_item,
    make_deps,
    moto_lock,
    trainer_events,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

WINDOW = 4
GROUP_SIZE = 2
ROWS = 9


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    return ExperimentConfig(
        name="test-exp", group_size=GROUP_SIZE, max_attempts=2, tps_limit=50, max_sessions=20, release_window=WINDOW
    )


class RecordingQueue:
    """The SQS adapter, recording every rollout-queue body in the order sent; `fail_next` makes one send raise
    before anything is sent (a releaser crashing between its cursor write and its messages)."""

    def __init__(self, rollout_queue_url: str) -> None:
        self.inner = SqsQueue()
        self.url = rollout_queue_url
        self.sent: list[dict[str, Any]] = []
        self.fail_next = False

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        if queue_url == self.url and self.fail_next:
            self.fail_next = False
            raise ConnectionError("crashed before sending")
        self.inner.send_all(queue_url, bodies, delay_seconds)
        if queue_url == self.url:
            self.sent.extend(json.loads(b) for b in bodies)

    def released(self) -> list[tuple[int, int]]:
        """(line, index) of every first attempt sent, in order."""
        return [(m["line"], m["index"]) for m in self.sent if m["attempt"] == 1]


def ingest(resources: ExperimentResources, queue: RecordingQueue, rows_accepted: int = ROWS) -> str:
    settings = resources.settings()
    ledger = Ledger.open(settings.table_name)
    ingestion = Ingestion(
        IngestPorts(
            store=S3ObjectStore(),
            queue=queue,
            publisher=EventBridgePublisher(settings.bus_name, sleep=lambda _s: None),
            ledger=ledger,
            settings=settings,
            feed=Feed(ledger, queue, settings),
        )
    )
    rows = [{"id": f"row-{i}", "q": i} for i in range(rows_accepted)] + [{"id": "row-0"}, {"_rollout": "not an object"}]
    result = ingestion.submit_rows(rows, name="window")
    assert (result.outcome, result.rows_accepted, result.rows_rejected) == ("accepted", rows_accepted, 2)
    assert result.batch_id is not None
    return result.batch_id


def lifecycle(resources: ExperimentResources, fake: FakeAgentRuntime, queue: RecordingQueue) -> LifecycleDeps:
    return make_deps(resources, fake, clock=ShiftedClock(), queue=queue)


def run_until_quiet(resources: ExperimentResources, deps: LifecycleDeps, queue: RecordingQueue) -> None:
    """Dispatch and complete until both queues are empty; the window never holds more than `WINDOW` in flight."""
    for _ in range(100):
        in_flight = len(queue.released()) - sum(1 for _ in terminal_rollouts(resources))
        assert in_flight <= WINDOW
        d = dispatch_once(resources, deps)
        c = complete_once(resources, deps)
        if not d.outcomes and not d.failures and not c.outcomes and not c.failures:
            return
    raise AssertionError("the queues never emptied")


def terminal_rollouts(resources: ExperimentResources) -> list[dict[str, Any]]:
    from rollout_pipeline.adapters import clients

    ddb = clients.client("dynamodb")
    items = ddb.scan(TableName=resources.table_name)["Items"]
    return [i for i in items if i["sk"]["S"].startswith("R#") and i["state"]["S"] in ("succeeded", "failed")]


def test_a_batch_larger_than_the_window_completes_each_rollout_once_in_group_order(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    queue = RecordingQueue(resources.rollout_queue_url)
    batch_id = ingest(resources, queue)
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)], "ingestion released only the window"
    view = batch_view(resources, batch_id)
    assert view.rollouts_total == ROWS * GROUP_SIZE, "every accepted rollout counts, released or pending"

    deps = lifecycle(resources, fake, queue)
    run_until_quiet(resources, deps, queue)

    lines = [line for line, _index in queue.released()]
    assert lines == sorted(lines), "released in line order"
    assert Counter(queue.released()) == Counter({(line, i): 1 for line in range(1, ROWS + 1) for i in range(2)})
    events = trainer_events(resources)
    completed = by_type(events, "Rollout Completed")
    assert sorted((e["input_id"], e["index"]) for e in completed) == sorted(
        (f"row-{i}", index) for i in range(ROWS) for index in range(GROUP_SIZE)
    ), "every rollout exactly once"
    assert len(by_type(events, "Batch Completed")) == 1
    cursor = ledger_item(resources, keys.release_key(batch_id))
    assert cursor["released"] == ROWS * GROUP_SIZE
    assert keys.DEADLINE_PK not in cursor, "closed: off the sweeper's index"


def test_a_releaser_crashed_before_sending_is_recovered_by_the_sweeper(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    queue = RecordingQueue(resources.rollout_queue_url)
    batch_id = ingest(resources, queue)
    deps = lifecycle(resources, fake, queue)
    queue.fail_next = True  # the completion that finds room first crashes after moving the cursor
    run_until_quiet(resources, deps, queue)
    cursor = ledger_item(resources, keys.release_key(batch_id))
    assert cursor.get("sending"), "the crashed release is recorded as being sent"
    stuck = len(queue.released())
    assert stuck < ROWS * GROUP_SIZE

    assert sweep(deps).released == 0, "its lease still holds: its owner may yet send"
    assert isinstance(deps.clock, ShiftedClock)
    deps.clock.advance(RELEASE_LEASE_S + SWEEP_AGE_S + 1)
    assert sweep(deps).released > 0
    run_until_quiet(resources, deps, queue)
    for _ in range(ROWS):  # a window's room may open only after the last sweep: the next terminal releases it
        if len(by_type(trainer_events(resources), "Batch Completed")):
            break
        deps.clock.advance(SWEEP_AGE_S + 1)
        sweep(deps)
        run_until_quiet(resources, deps, queue)
    assert Counter(queue.released()) == Counter({(line, i): 1 for line in range(1, ROWS + 1) for i in range(2)})
    assert batch_view(resources, batch_id).terminal == ROWS * GROUP_SIZE


def test_cancel_stops_the_release_and_ends_the_unreleased_rollouts(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    queue = RecordingQueue(resources.rollout_queue_url)
    batch_id = ingest(resources, queue)
    deps = lifecycle(resources, fake, queue)
    report = cancel_batch(batch_id, deps)
    assert report.cancelled == ROWS * GROUP_SIZE
    run_until_quiet(resources, deps, queue)
    deps.clock.advance(SWEEP_AGE_S + 1)  # type: ignore[attr-defined]
    sweep(deps)
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)], "nothing released after the cancel"
    view = batch_view(resources, batch_id)
    assert view.terminal == ROWS * GROUP_SIZE
    assert keys.DEADLINE_PK not in ledger_item(resources, keys.release_key(batch_id)), "the cursor is closed"
    failed = by_type(trainer_events(resources), "Rollout Failed")
    assert len(failed) == ROWS * GROUP_SIZE
    assert {e["reason"] for e in failed} == {"cancelled"}


def test_a_file_its_first_release_sends_whole_is_not_released_again_at_its_end(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file within the window: its chunk's release leaves nothing pending, so ingestion does not release again at
    its end only to close the cursor; the first terminal rollout's release closes it (or the sweeper's, below)."""
    releases: list[str] = []
    original = window.ReleaseWindow.release

    def counted(self: window.ReleaseWindow, batch: Any, **kwargs: Any) -> window.ReleaseResult:
        releases.append(batch.batch_id)
        return original(self, batch, **kwargs)

    monkeypatch.setattr(window.ReleaseWindow, "release", counted)
    queue = RecordingQueue(resources.rollout_queue_url)
    batch_id = ingest(resources, queue, rows_accepted=2)
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert releases == [batch_id], "one release: the chunk's (before: a second one at the end)"
    assert keys.DEADLINE_PK in ledger_item(resources, keys.release_key(batch_id)), "still open"

    deps = lifecycle(resources, fake, queue)
    run_until_quiet(resources, deps, queue)
    assert keys.DEADLINE_PK not in ledger_item(resources, keys.release_key(batch_id)), "closed by a terminal rollout"
    assert Counter(queue.released()) == Counter({(line, i): 1 for line in (1, 2) for i in range(2)})
    assert len(by_type(trainer_events(resources), "Batch Completed")) == 1


def test_a_cursor_left_open_by_a_drained_ingestion_is_closed_by_the_sweeper(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If no terminal rollout's release closes the cursor (each one failed, or they all ended before ingestion
    recorded the batch's total), the sweeper's backstop does."""
    queue = RecordingQueue(resources.rollout_queue_url)
    batch_id = ingest(resources, queue, rows_accepted=2)
    deps = lifecycle(resources, fake, queue)
    monkeypatch.setattr(deps.feed, "after_terminal", lambda _batch: None)
    monkeypatch.setattr(deps.feed, "after_dispatch", lambda _batches: None)
    run_until_quiet(resources, deps, queue)
    monkeypatch.undo()
    assert batch_view(resources, batch_id).terminal == 4
    assert keys.DEADLINE_PK in ledger_item(resources, keys.release_key(batch_id)), "still open"
    assert isinstance(deps.clock, ShiftedClock)
    deps.clock.advance(SWEEP_AGE_S + 1)
    sweep(deps)
    assert keys.DEADLINE_PK not in ledger_item(resources, keys.release_key(batch_id)), "closed by the sweeper"
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)], "nothing released twice"
