"""`rollouts watch --events FILE` after the batch's end: the last two rollouts of a batch can end together, and the
one that publishes `Batch Completed` may publish before the other publishes its own event; the file still gets that
rollout's event, and the counts are not changed by it."""

from __future__ import annotations

import io
import json
from typing import Any

from rollout_pipeline.cli.watch import EventLog, Progress, _drain
from rollout_pipeline.sdk.replay import ledger_event
from rollout_pipeline.sdk.transport import Delivery
from tests.sdk_events import B1, batch_done, completed


class LateEventStream:
    """A stream whose one event arrives only while the caller waits for it (it was published after the batch's)."""

    def __init__(self, detail: Any) -> None:
        self.late = [Delivery("receipt", ledger_event(detail))]
        self.budgets: list[float | None] = []
        self.acked: list[Delivery] = []

    def next_delivery(self, budget_s: float | None) -> Delivery | None:
        self.budgets.append(budget_s)
        return self.late.pop() if self.late and budget_s else None

    def ack(self, delivery: Delivery) -> None:
        self.acked.append(delivery)

    def remaining(self) -> float | None:
        return 60.0


def ended_batch() -> Progress:
    progress = Progress(B1)
    progress.apply(completed(B1, "q1", 0, 1.0))
    progress.apply(batch_done(B1, 2))  # q1/1 ended too, but its own event has not come yet
    assert progress.done
    return progress


def test_the_events_file_gets_a_rollouts_event_that_comes_after_the_batchs() -> None:
    progress, handle = ended_batch(), io.StringIO()
    stream = LateEventStream(completed(B1, "q1", 1, 1.0))
    _drain(stream, EventLog(handle), progress)
    written = [json.loads(line)["detail"] for line in handle.getvalue().splitlines()]
    assert [(d["input_id"], d["index"]) for d in written] == [("q1", 1)]
    assert len(stream.acked) == 1
    assert (progress.succeeded, progress.failed) == (2, 0), "the batch's counts stand: the late event is not counted"
    assert stream.budgets[-1] == 0.0, "once every rollout's event is in, nothing more is waited for"


def test_without_an_events_file_the_watch_does_not_wait_after_the_batchs_end() -> None:
    stream = LateEventStream(completed(B1, "q1", 1, 1.0))
    _drain(stream, EventLog(None), ended_batch())
    assert stream.budgets == [0.0]
