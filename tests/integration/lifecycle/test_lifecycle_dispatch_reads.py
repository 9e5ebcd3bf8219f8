"""The dispatcher reads a batch's item once per SQS batch, not once per message, and still honours a cancel
that lands after that read; it reads the experiment's policy version for each dispatch, so a version set mid-batch
stamps every dispatch after it."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.lifecycle.dispatch import BatchReads, Dispatch, dispatch_body, dispatch_records
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import wait_for
from tests.integration.lifecycle_support import (
    ShiftedClock,
    make_deps,
    moto_lock,
    paced_until,
    receive_records,
    seed_batch,
    send,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

BATCH = ids.batch_id_for_upload("in", "datasets/reads.jsonl", "v1")


def test_one_batch_read_per_sqs_batch(resources: ExperimentResources) -> None:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    reads: Counter[str] = Counter()
    original = deps.ledger.batches.read_batch

    def counted(batch_id: str) -> BatchView | None:
        reads[batch_id] += 1
        return original(batch_id)

    deps.ledger.batches.read_batch = counted  # type: ignore[method-assign]
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}, "b": {}}))
    records = receive_records(resources.rollout_queue_url)
    assert len(records) == 4

    outcomes = dispatch_records(records, deps, wait_until=paced_until()).outcomes

    assert set(outcomes.values()) == {Dispatch.INVOKED}
    assert reads == Counter({BATCH: 1})
    runtime.close()


def test_a_cancel_after_the_batch_read_is_still_honoured(resources: ExperimentResources) -> None:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    messages = seed_batch(resources, batch_id=BATCH, inputs={"a": {}})
    reads = BatchReads(deps)
    assert reads.get(BATCH) is not None  # read while the batch is still live
    assert deps.ledger.batches.cancel(BATCH)

    outcome = dispatch_body(messages[0].model_dump_json(), deps, wait_until=time.monotonic() + 2, batches=reads)

    assert outcome is Dispatch.CANCELLED
    assert runtime.running == set(), "no session was started for a cancelled batch"
    runtime.close()


def test_a_policy_version_set_during_an_sqs_batch_stamps_the_dispatches_after_it(
    resources: ExperimentResources,
) -> None:
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    first, second = seed_batch(resources, batch_id=BATCH, inputs={"a": {}})
    reads = BatchReads(deps)  # one SQS batch's reads

    assert dispatch_body(first.model_dump_json(), deps, wait_until=paced_until(), batches=reads) is Dispatch.INVOKED
    deps.ledger.experiment.set_current_policy_version("8", "2026-01-01T00:00:00Z")  # the trainer synced its weights
    assert dispatch_body(second.model_dump_json(), deps, wait_until=paced_until(), batches=reads) is Dispatch.INVOKED

    versions = [deps.ledger.rollouts.get_rollout(BATCH, "a", m.index) for m in (first, second)]
    assert [r.policy_version if r else "missing" for r in versions] == ["v7", "8"]  # the batch's, then the new one
    runtime.close()


@pytest.mark.timing
def test_dispatches_asking_together_share_one_policy_read(resources: ExperimentResources) -> None:
    """Dispatches that began while a policy read was in flight share the next read; one that began before a read
    (the admission gate's poll, or another dispatch's read) takes that one: no request of its own."""
    runtime = FakeAgentRuntime(behaviour=AgentBehaviour(kind="manual"))
    deps = make_deps(resources, runtime, clock=ShiftedClock())
    reads = BatchReads(deps)
    entered = threading.Event()
    release = threading.Event()
    calls: list[str | None] = []

    def slow_read() -> str | None:
        calls.append(None)
        entered.set()
        release.wait(10)
        return "9"

    deps.ledger.experiment.current_policy_version = slow_read  # type: ignore[method-assign]

    def dispatch() -> None:
        reads.begin()
        reads.policy_version(None)

    first = threading.Thread(target=dispatch)
    first.start()
    assert entered.wait(10)
    waiting = [threading.Thread(target=dispatch) for _ in range(5)]
    for thread in waiting:
        thread.start()
    wait_for(lambda: reads._policy_read.locked() and len(calls) == 1, what="the first read in flight")
    time.sleep(0.05)  # the five began after the first read did
    release.set()
    for thread in [first, *waiting]:
        thread.join(10)

    assert len(calls) == 2, "one read in flight when they asked, one more after it for all five"
    assert reads.policy_version("batch's") == "9"
    deps.limits.shards.saw_policy(time.monotonic(), "10")  # a gate poll that began before the next dispatch
    reads.begin()
    assert reads.policy_version(None) == "9"  # a read that began before this dispatch does not serve it
    assert len(calls) == 3
    reads.begin()
    deps.limits.shards.saw_policy(time.monotonic(), "10")  # the gate's poll after this dispatch began
    assert reads.policy_version(None) == "10"
    assert len(calls) == 3, "the poll served: no read of its own"
    runtime.close()
