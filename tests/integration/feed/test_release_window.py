"""The release window on moto, through the real ingestion, dispatcher, completion, sweeper and cancel: a batch larger
than the window completes with every rollout exactly once, released in group (line) order and never more than the
window in flight; a release that crashed before sending is recovered by the sweeper; cancel stops the release; two
batches share one window."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.adapters.sqs import SqsQueue
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.feed import window
from rollout_pipeline.feed.feed import Feed
from rollout_pipeline.feed.window import RELEASE_LEASE_S
from rollout_pipeline.ingest.core import Ingestion, IngestPorts
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.release import ENTRY_PREFIX, WINDOW_KEY
from rollout_pipeline.lifecycle.cancel import cancel_batch
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.sweeper import sweep
from rollout_pipeline.local.resources import ExperimentResources
from tests.doubles import RecordingQueue
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


def recording_queue(resources: ExperimentResources) -> RecordingQueue:
    """The SQS adapter, recording every rollout-queue body in the order sent."""
    return RecordingQueue(SqsQueue(), only=resources.rollout_queue_url)


def window_item(resources: ExperimentResources) -> dict[str, Any]:
    return ledger_item(resources, WINDOW_KEY)


def in_window(resources: ExperimentResources, batch_id: str) -> bool:
    """The batch still has a place in the experiment's window."""
    return f"{ENTRY_PREFIX}{batch_id}" in window_item(resources)


def ingest(
    resources: ExperimentResources, queue: RecordingQueue, rows_accepted: int = ROWS, name: str = "window"
) -> str:
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
    result = ingestion.submit_rows(rows, name=name)
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
    queue = recording_queue(resources)
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
    assert not in_window(resources, batch_id), "every rollout released and terminal: the batch left the window"


def test_a_releaser_crashed_before_sending_is_recovered_by_the_sweeper(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    queue = recording_queue(resources)
    batch_id = ingest(resources, queue)
    deps = lifecycle(resources, fake, queue)
    queue.fail_next = True  # the completion that finds room first crashes after moving the window
    run_until_quiet(resources, deps, queue)
    assert window_item(resources).get("sending"), "the crashed release is recorded as being sent"
    stuck = len(queue.released())
    assert stuck < ROWS * GROUP_SIZE

    assert sweep(deps).released == 0, "its lease still holds: its owner may yet send"
    assert isinstance(deps.clock, ShiftedClock)
    deps.clock.advance(RELEASE_LEASE_S + 1)
    assert sweep(deps).released > 0
    run_until_quiet(resources, deps, queue)
    for _ in range(ROWS):  # a window's room may open only after the last sweep: the next terminal releases it
        if len(by_type(trainer_events(resources), "Batch Completed")):
            break
        sweep(deps)
        run_until_quiet(resources, deps, queue)
    assert Counter(queue.released()) == Counter({(line, i): 1 for line in range(1, ROWS + 1) for i in range(2)})
    assert batch_view(resources, batch_id).terminal == ROWS * GROUP_SIZE


def test_cancel_stops_the_release_and_ends_the_unreleased_rollouts(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    queue = recording_queue(resources)
    batch_id = ingest(resources, queue)
    deps = lifecycle(resources, fake, queue)
    report = cancel_batch(batch_id, deps)
    assert report.cancelled == ROWS * GROUP_SIZE
    run_until_quiet(resources, deps, queue)
    sweep(deps)
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)], "nothing released after the cancel"
    view = batch_view(resources, batch_id)
    assert view.terminal == ROWS * GROUP_SIZE
    assert not in_window(resources, batch_id), "the cancelled batch left the window"
    failed = by_type(trainer_events(resources), "Rollout Failed")
    assert len(failed) == ROWS * GROUP_SIZE
    assert {e["reason"] for e in failed} == {"cancelled"}


def test_a_file_its_first_release_sends_whole_is_not_released_again_at_its_end(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file within the window: its chunk's release leaves nothing pending, so ingestion does not release again at
    its end; the batch leaves the window with its last terminal rollout's release (or the sweeper's, below)."""
    releases: list[str] = []
    original = window.ReleaseWindow.release

    def counted(self: window.ReleaseWindow, views: Any = (), **kwargs: Any) -> window.ReleaseResult:
        releases.append(kwargs["submitted"].batch_id if kwargs.get("submitted") else "after")
        return original(self, views, **kwargs)

    monkeypatch.setattr(window.ReleaseWindow, "release", counted)
    queue = recording_queue(resources)
    batch_id = ingest(resources, queue, rows_accepted=2)
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert releases == [batch_id], "one release: the chunk's (no second one at the end)"
    assert in_window(resources, batch_id), "its rollouts are in flight"

    deps = lifecycle(resources, fake, queue)
    run_until_quiet(resources, deps, queue)
    assert not in_window(resources, batch_id), "left the window with its last terminal rollout"
    assert Counter(queue.released()) == Counter({(line, i): 1 for line in (1, 2) for i in range(2)})
    assert len(by_type(trainer_events(resources), "Batch Completed")) == 1


def test_a_batch_no_release_saw_end_leaves_the_window_by_the_sweeper(
    resources: ExperimentResources, fake: FakeAgentRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If no terminal rollout's release records the batch's end (each one failed, or they all ended before ingestion
    recorded the batch's total), the sweeper's backstop does."""
    queue = recording_queue(resources)
    batch_id = ingest(resources, queue, rows_accepted=2)
    deps = lifecycle(resources, fake, queue)
    monkeypatch.setattr(deps.feed, "after_terminal", lambda _batch: None)
    monkeypatch.setattr(deps.feed, "after_dispatch", lambda _batches: None)
    run_until_quiet(resources, deps, queue)
    monkeypatch.undo()
    assert batch_view(resources, batch_id).terminal == 4
    assert in_window(resources, batch_id), "no release saw its end"
    sweep(deps)
    assert not in_window(resources, batch_id), "the sweeper counted it again"
    assert queue.released() == [(1, 0), (1, 1), (2, 0), (2, 1)], "nothing released twice"


def test_two_batches_share_one_window_the_older_released_first(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    """Many batches at once do not each release a window: the experiment's one window holds them all, the older
    batch's groups first, so what waits in the queue stays within the window whatever the number of batches."""
    queue = recording_queue(resources)
    first = ingest(resources, queue, name="first")
    second = ingest(resources, queue, name="second")
    assert [m["batch_id"] for m in queue.sent] == [first] * WINDOW, "the second batch waits: the window is full"
    deps = lifecycle(resources, fake, queue)
    run_until_quiet(resources, deps, queue)
    batches = [m["batch_id"] for m in queue.sent if m["attempt"] == 1]
    assert batches == [first] * ROWS * GROUP_SIZE + [second] * ROWS * GROUP_SIZE, "the older batch first"
    assert not in_window(resources, first)
    assert not in_window(resources, second)
