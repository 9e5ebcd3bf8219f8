"""Oversampled groups: `group_size + oversample` rollouts run, and the group the trainer gets is the first
`group_size` of them to end with a reward; the rest are surplus.

A successful rollout of such a group is let into it by one conditional write on the group item
(`GroupLedger.claim_kept`) before its event is published, so its `Rollout Completed` already says whether it is
surplus. Once the group is full, every rollout of it that has not ended is cancelled through the cancel path
(`lifecycle.outbox.cancel_surplus`, reason `surplus`): a queued one is never dispatched (its dispatch finds it
ended), a running one has its session stopped. The claim and the cancels run in the outbox drain of the rollout that
filled the group, and again in the drain of any success that found it full, so a crash between them leaves nothing
running.
"""

from __future__ import annotations

from rollout_pipeline.ledger.items import GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.lifecycle.deps import LifecycleDeps


def claim(rec: RolloutRecord, group: GroupItem | None, deps: LifecycleDeps) -> GroupItem | None:
    """The group after `rec`'s claim: a success of an oversampled group is let in while it is not full. Returns
    `group` unchanged (no write) for any other rollout."""
    if group is None or group.target is None or rec.state is not RolloutState.SUCCEEDED or rec.index in group.kept:
        return group
    deps.ledger.groups.claim_kept(rec.batch_id, rec.input_id, rec.index, group.target)
    return deps.ledger.groups.read_group(rec.batch_id, rec.input_id) or group


def settle(group: GroupItem, deps: LifecycleDeps) -> GroupItem:
    """A complete oversampled group with every success claimed, before its `Group Completed` is built: the rollout
    that completed the group may publish before the drains of other successes claimed them, so the publisher claims
    them on their behalf, first ended first (idempotent: each rollout's own claim later finds the same answer)."""
    if group.target is None or not group.complete:
        return group
    unclaimed = [i for i in group.rewards if i not in group.kept]
    if not unclaimed or group.full:
        return group
    records = {rec.index: rec for rec in deps.ledger.rollouts.iter_rollouts(group.batch_id, group.input_id)}

    def ended(index: int) -> tuple[float, int]:
        finished = records[index].finished_at if index in records else None
        return (finished.timestamp() if finished is not None else float("inf"), index)

    for index in sorted(unclaimed, key=ended):
        deps.ledger.groups.claim_kept(group.batch_id, group.input_id, index, group.target)
    return deps.ledger.groups.read_group(group.batch_id, group.input_id) or group
