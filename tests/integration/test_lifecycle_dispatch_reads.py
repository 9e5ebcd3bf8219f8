"""The dispatcher reads a batch's item once per SQS batch, not once per message, and still honours a cancel
that lands after that read."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.lifecycle.dispatch import BatchReads, Dispatch, dispatch_body, dispatch_records
from rollout_pipeline.local.resources import ExperimentResources
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
