"""A stream that catches up (moto, the real lifecycle over the fake ACR): a stream of a batch (its own private
subscription) first yields the batch's events rebuilt from the ledger, with the `event_id`s the bus carried, then the
live ones, each event once. `from_start` sets where it starts: by default where this process is (the events no
stream of the process handed over yet), with `from_start=True` at the batch's first event (every event once for this
stream, whatever the process handed over). A consumer attaching after the batch completed gets every event of it
once; one attaching midway gets the earlier ones, then the live ones, with no duplicate `event_id`; an event that is
both rebuilt and delivered live (published after the stream's subscription was made, before its first read) is
handed over once."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from rollout_pipeline import ids
from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, main
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Event, EventStream, Experiment
from tests.conftest import REGION
from tests.integration.conftest import WAIT
from tests.integration.lifecycle_support import drive, moto_lock  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("moto_lock")

#: q1 and q2 finish at once; q3 waits for the test (`manual`): a batch the test can stop midway.
FAST = ("q1", "q2")
SLOW = ("q3",)
GROUP_SIZE = 2


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    q, index = inv.payload["q"], inv.payload["_rollout"]["index"]
    if q in SLOW:
        return AgentBehaviour(kind="manual", rewards=float(index))
    if (q, index) == ("q2", 1):
        return AgentBehaviour(kind="agent_error", error="tool exploded")
    return AgentBehaviour(rewards=float(index))


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return behaviour


def expected_ids(exp_id: str, batch_id: str, inputs: Iterable[str], *, batch_done: bool) -> set[str]:
    """The event ids the pipeline publishes for `inputs` of the batch (and its batch-level events)."""
    found = {ids.event_id(DetailType.BATCH_ACCEPTED, exp_id, batch_id)}
    if batch_done:
        found.add(ids.event_id(DetailType.BATCH_COMPLETED, exp_id, batch_id))
    for q in inputs:
        found.add(ids.event_id(DetailType.GROUP_COMPLETED, exp_id, batch_id, q))
        for i in range(GROUP_SIZE):
            kind = DetailType.ROLLOUT_FAILED if (q, i) == ("q2", 1) else DetailType.ROLLOUT_COMPLETED
            found.add(ids.event_id(kind, exp_id, batch_id, q, i))
    return found


def read_until(stream: EventStream, wanted: set[str], got: list[Event], timeout_s: float = 30.0) -> None:
    """Read `stream` into `got` until every id of `wanted` was handed over (or fail after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not wanted <= {e.event_id for e in got}:
        assert time.monotonic() < deadline, f"missing {wanted - {e.event_id for e in got}}"
        delivery = stream.next_delivery(1.0)
        if delivery is not None and delivery.event is not None:
            got.append(delivery.event)
            stream.ack(delivery)


def finish_slow(fake: FakeAgentRuntime) -> None:
    for call in fake.invocations("started"):
        fake.finish(call.session_id)


def no_duplicates(got: list[Event]) -> None:
    twice = [event_id for event_id, n in Counter(e.event_id for e in got).items() if n > 1]
    assert twice == [], f"handed over more than once: {twice}"


def test_a_consumer_attaching_after_the_batch_completed_gets_every_event_once(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    batch_id = experiment.submit([{"id": q, "q": q} for q in (*FAST, *SLOW)], group_size=GROUP_SIZE)
    drive(resources, deps)
    finish_slow(fake)
    drive(resources, deps)
    assert experiment.status(batch_id).done
    invocations = len(fake.invocations())

    wanted = expected_ids(experiment.name, batch_id, (*FAST, *SLOW), batch_done=True)
    trainer = [e.event_id for e in experiment.events(batch_id, timeout=30, max_events=len(wanted), poll_wait_s=WAIT)]
    assert sorted(trainer) == sorted(wanted), "the trainer of this process consumed every event already, once"
    again_here = [e.event_id for e in experiment.events(batch_id, timeout=2, poll_wait_s=WAIT)]
    assert again_here == [], "a stream starts where this process is (by default): nothing is left"
    got: list[Event] = []
    with experiment.events(batch_id, from_start=True, timeout=30, poll_wait_s=WAIT) as stream:
        read_until(stream, wanted, got)
        extra = stream.next_delivery(1.5)  # nothing more comes: not a second copy of anything
        assert extra is None or extra.event is None or extra.event.event_id not in wanted
    no_duplicates(got)
    assert {e.event_id for e in got} == wanted
    by_type = Counter(e.detail_type for e in got)
    assert by_type[DetailType.ROLLOUT_FAILED] == 1
    assert by_type[DetailType.GROUP_COMPLETED] == 3
    assert len(fake.invocations()) == invocations, "nothing was re-run"

    # A second consumer in the same process sees the whole batch too.
    again: list[Event] = []
    with experiment.events(batch_id, from_start=True, timeout=30, poll_wait_s=WAIT) as stream:
        read_until(stream, wanted, again)
    no_duplicates(again)

    # What a stream from the start hands over counts for no other stream: another process's view (its own seen
    # ids), after one, still gets the whole batch by default.
    other = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    with other.events(batch_id, from_start=True, timeout=30, poll_wait_s=WAIT) as stream:
        read_until(stream, wanted, [])
    by_default = other.events(batch_id, timeout=30, max_events=len(wanted), poll_wait_s=WAIT)
    assert sorted(e.event_id for e in by_default) == sorted(wanted)


def test_a_consumer_attaching_midway_gets_the_earlier_events_then_the_live_ones_once(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    batch_id = experiment.submit([{"id": q, "q": q} for q in (*FAST, *SLOW)], group_size=GROUP_SIZE)
    drive(resources, deps)  # q1, q2 complete; q3 is running
    assert not experiment.status(batch_id).done
    earlier = expected_ids(experiment.name, batch_id, FAST, batch_done=False)
    everything = expected_ids(experiment.name, batch_id, (*FAST, *SLOW), batch_done=True)

    got: list[Event] = []
    with experiment.events(batch_id, from_start=True, timeout=60, poll_wait_s=WAIT) as stream:
        read_until(stream, earlier, got)
        assert {e.event_id for e in got} == earlier, "only what was published before it attached"
        finish_slow(fake)
        drive(resources, deps)  # q3 completes, then the batch: published live
        read_until(stream, everything, got)
        extra = stream.next_delivery(1.5)
        assert extra is None or extra.event is None or extra.event.event_id not in everything
    no_duplicates(got)
    assert {e.event_id for e in got[: len(earlier)]} == earlier, "the earlier events came first"


def test_an_event_both_rebuilt_and_delivered_live_is_handed_over_once(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    """The seam: the stream exists (its events arrive from now on) before it first reads the ledger, and the
    batch runs in between, so every event is both in the ledger and on its way live."""
    batch_id = experiment.submit([{"id": q, "q": q} for q in (*FAST, *SLOW)], group_size=GROUP_SIZE)
    everything = expected_ids(experiment.name, batch_id, (*FAST, *SLOW), batch_done=True)
    got: list[Event] = []
    with experiment.events(batch_id, from_start=True, timeout=60, poll_wait_s=WAIT) as stream:
        drive(resources, deps)
        finish_slow(fake)
        drive(resources, deps)
        assert experiment.status(batch_id).done
        read_until(stream, everything, got)
        for _ in range(3):  # the live copies still to come are dropped, never handed over
            extra = stream.next_delivery(1.0)
            assert extra is None or extra.event is None or extra.event.event_id not in everything
    no_duplicates(got)
    assert {e.event_id for e in got} == everything


def test_from_start_needs_a_stream_of_the_batch_s_own(experiment: Experiment) -> None:
    from rollout_pipeline.sdk import SdkError

    with pytest.raises(SdkError, match="from_start needs the batch"):
        experiment.events(from_start=True)
    for trainer_queue in ({"from_trainer_queue": True}, {"consume_others": True}):
        with pytest.raises(SdkError, match="from_start reads a stream of the batch's own"):
            experiment.events("b-1", from_start=True, **trainer_queue)


def test_watch_from_start_logs_every_event_of_a_finished_batch_once(
    experiment: Experiment,
    resources: ExperimentResources,
    deps: LifecycleDeps,
    fake: FakeAgentRuntime,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    batch_id = experiment.submit([{"id": q, "q": q} for q in (*FAST, *SLOW)], group_size=GROUP_SIZE)
    drive(resources, deps)
    finish_slow(fake)
    drive(resources, deps)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(resources.stack_outputs()))
    cli = ["--outputs-file", str(outputs), "--region", REGION]

    assert main(["watch", *cli, "--batch", batch_id, "--from-start", "--timeout", "30", "--poll-wait", "1"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    events = [line for line in lines if line.endswith("(from the ledger)")]
    assert len(events) == len(expected_ids(experiment.name, batch_id, (*FAST, *SLOW), batch_done=True))
    assert events[0].startswith("Batch Accepted")
    assert events[-1].startswith("Batch Completed")
    assert sum(line.startswith("Rollout Failed") and "tool exploded" in line for line in events) == 1
    summary = f"batch {batch_id}: 6/6 done: 5 succeeded, 1 failed (agent_error 1), 0 running, 0 queued"
    assert lines[-1].startswith(summary)

    assert main(["watch", *cli, "--from-start"]) == EXIT_ERROR
    assert "--from-start needs --batch" in capsys.readouterr().err
    assert main(["watch", *cli, "--batch", batch_id, "--from-start", "--from-trainer-queue"]) == EXIT_ERROR
    assert "not with --from-trainer-queue" in capsys.readouterr().err
