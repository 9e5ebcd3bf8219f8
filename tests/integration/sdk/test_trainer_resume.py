"""Resume after a trainer crash, across a real process kill: a trainer subprocess consuming the experiment's
trainer queue is killed with SIGKILL mid-handling; a re-attached consumer of the trainer queue gets every event the
dead one had not finished handling (and none it had), a new stream of the batch (a private subscription) gets every
event of the batch from the ledger, and `Experiment.completed_groups` returns the groups that completed while it
was down, from the ledger and the results bucket, without re-running a rollout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline import ids
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.contracts import DetailType, RolloutCompleted
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.sdk import Experiment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
GROUPS = {"q0": 0.0, "q1": 1.0, "q2": 0.5, "q3": 0.25}
GROUP_SIZE = 2
HANDLED_BEFORE_CRASH = 3

TRAINER = textwrap.dedent(
    """
    import json, sys, time
    from rollout_pipeline.sdk import Experiment

    outputs, endpoint, batch_id, log_path, handled_before_crash = sys.argv[1:6]
    experiment = Experiment.from_outputs(json.load(open(outputs)), endpoint_url=endpoint)
    log = open(log_path, "a")
    count = 0
    for event in experiment.events(batch_id=batch_id, poll_wait_s=1, visibility_s=2, from_trainer_queue=True):
        count += 1
        if count > int(handled_before_crash):
            log.write(f"crash-while-handling {event.event_id}\\n"); log.flush()
            time.sleep(3600)  # killed here with SIGKILL, mid-handling
        log.write(f"done {event.event_id}\\n"); log.flush()
    """
)


FAILING = ("q3", 1)  # this member's agent raises: its group completes with a typed failure, never a reward


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    # Staggered, so that some groups complete while the trainer is down.
    delay = 0.3 + 0.4 * int(inv.payload["q"][1:])
    if (inv.payload["q"], inv.payload["_rollout"]["index"]) == FAILING:
        return AgentBehaviour(kind="agent_error", error="tool exploded", delay_s=delay)
    return AgentBehaviour(rewards=GROUPS[inv.payload["q"]], delay_s=delay)


def member_ok(q: str, i: int) -> bool:
    return (q, i) != FAILING


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment="resume",
        group_size=GROUP_SIZE,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=8,
        sweep_interval_s=2.0,
        runtime_factory=lambda resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def _wait_for(path: Path, marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and marker in path.read_text():
            return
        time.sleep(0.1)
    raise AssertionError(f"{marker!r} not in {path} after {timeout_s}s: {path.read_text() if path.exists() else ''}")


def test_reattach_after_sigkill_gets_every_unfinished_event_and_the_groups_completed_meanwhile(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    experiment = pipeline.experiment
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(pipeline.resources.stack_outputs()))
    batch_id = experiment.submit([{"id": q, "q": q} for q in GROUPS], group_size=GROUP_SIZE)

    log = tmp_path / "trainer.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(outputs), pipeline.endpoint_url, batch_id, str(log),
         str(HANDLED_BEFORE_CRASH)],
        env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        _wait_for(log, "crash-while-handling", 60)
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    lines = log.read_text().split()
    done = {lines[i + 1] for i in range(0, len(lines), 2) if lines[i] == "done"}
    assert len(done) == HANDLED_BEFORE_CRASH

    # The trainer is down; the pipeline goes on. Wait for the batch to end (ledger), then re-attach.
    deadline = time.monotonic() + 60
    while experiment.status(batch_id).terminal < len(GROUPS) * GROUP_SIZE and time.monotonic() < deadline:
        time.sleep(0.2)
    invocations = len(pipeline.runtime.invocations())
    assert invocations == len(GROUPS) * GROUP_SIZE

    exp_id = experiment.name
    expected = {ids.event_id(DetailType.BATCH_ACCEPTED, exp_id, batch_id)}
    expected |= {ids.event_id(DetailType.BATCH_COMPLETED, exp_id, batch_id)}
    for q in GROUPS:
        expected.add(ids.event_id(DetailType.GROUP_COMPLETED, exp_id, batch_id, q))
        for i in range(GROUP_SIZE):
            kind = DetailType.ROLLOUT_COMPLETED if member_ok(q, i) else DetailType.ROLLOUT_FAILED
            expected.add(ids.event_id(kind, exp_id, batch_id, q, i))

    redelivered: set[str] = set()
    for event in experiment.events(batch_id=batch_id, timeout=15, poll_wait_s=1, from_trainer_queue=True):
        redelivered.add(event.event_id)
        if expected <= done | redelivered:
            break
    assert expected - done <= redelivered, "every event the killed trainer had not finished handling came back"
    assert not (done & redelivered), "an event whose handling finished is not handed over again"

    # A stream of the batch in a fresh process (its own subscription, made after the batch ended) starts from the
    # ledger: every event of the batch, with the ids published (the trainer skips those its checkpoint holds).
    fresh = Experiment.from_outputs(outputs, endpoint_url=pipeline.endpoint_url)
    replayed = [
        event.event_id for event in fresh.events(batch_id=batch_id, timeout=15, poll_wait_s=1, max_events=len(expected))
    ]
    assert sorted(replayed) == sorted(expected)

    # One call: the groups that completed while the trainer was down, from the ledger + results bucket.
    handled_groups = {q for q in GROUPS if ids.event_id(DetailType.GROUP_COMPLETED, exp_id, batch_id, q) in done}
    groups = experiment.completed_groups(batch_id, skip=handled_groups)
    assert {g.input_id for g in groups} == set(GROUPS) - handled_groups
    for group in groups:
        q = group.input_id
        assert group.rewards == [GROUPS[q] if member_ok(q, i) else None for i in range(GROUP_SIZE)]
        statuses = [(m.status, m.reason) for m in group.completed.members]
        assert statuses == [("succeeded", None) if member_ok(q, i) else ("failed", "agent_error") for i in range(2)]
        assert group.missing == []
        for index, rollout in group.rollouts.items():
            if not member_ok(q, index):
                assert "tool exploded" in (group.completed.members[index].error or "")
                continue
            assert isinstance(rollout, RolloutCompleted)
            assert rollout.result is not None
            assert rollout.result["rewards"] == GROUPS[q]
    assert len(experiment.completed_groups(batch_id)) == len(GROUPS)
    assert len(pipeline.runtime.invocations()) == invocations, "nothing was re-run"
