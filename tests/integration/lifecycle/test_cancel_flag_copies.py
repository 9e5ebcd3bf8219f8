"""The dispatch transaction checks one of `keys.CONTROL_SHARDS` copies of the batch's cancel flag: a committed cancel
writes every copy, so no rollout of the batch, whichever copy it checks, is dispatched after it."""

from __future__ import annotations

from rollout_pipeline.adapters import clients
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.rollouts import DispatchStart
from rollout_pipeline.local.resources import ExperimentResources


def _dispatch(ledger: Ledger, batch: str, input_id: str, index: int) -> DispatchStart:
    return ledger.rollouts.begin_dispatch(
        exp_id="e",
        batch_id=batch,
        input_id=input_id,
        index=index,
        attempt=1,
        session_id=f"s-{input_id}-{index}",
        submitted_at="2026-01-01T00:00:00Z",
        deadline=1_767_229_201,
        max_sessions=1000,
        policy_version=None,
        slot_shard=index % keys.SESSION_SHARDS,
    )


def test_no_rollout_is_dispatched_after_a_cancel_whichever_copy_it_checks(resources: ExperimentResources) -> None:
    ledger, batch = Ledger.open(resources.table_name), "copies"
    clients.client("dynamodb").put_item(
        TableName=resources.table_name, Item={**keys.batch_key(batch), "status": {"S": "accepted"}}
    )
    rollouts = [(f"q{g}", i) for g in range(12) for i in range(8)]
    copies = {keys.control_shard_key(batch, input_id, index)["sk"]["S"] for input_id, index in rollouts}
    assert len(copies) == keys.CONTROL_SHARDS  # the rollouts below check every copy
    assert _dispatch(ledger, batch, "q-before", 0) is DispatchStart.STARTED
    assert ledger.batches.cancel(batch)
    assert [_dispatch(ledger, batch, input_id, index) for input_id, index in rollouts] == [
        DispatchStart.CANCELLED
    ] * len(rollouts)
    assert ledger.limits.in_flight() == 1  # only the rollout dispatched before the cancel holds a slot
