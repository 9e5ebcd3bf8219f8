"""The outbox drain of the lifecycle's stages: `publishing.drain`, and after a success's events are published, the
surplus of its oversampled group cancelled (`lifecycle.oversample`). Completion, dispatch and the sweeper drain
through here; cancel drains with `publishing.drain` itself (a cancelled rollout is never a success).
"""

from __future__ import annotations

import logging
from typing import Any

from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.ledger.items import BatchView, GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.lifecycle import publishing
from rollout_pipeline.lifecycle.cancel import cancel_rollout
from rollout_pipeline.lifecycle.deps import LifecycleDeps

log = logging.getLogger(__name__)

#: The error of a rollout cancelled as surplus.
SURPLUS_ERROR = "its group already had the valid rollouts it needed (oversample)"


def drain(rec: RolloutRecord, deps: LifecycleDeps, **options: Any) -> bool:
    """`publishing.drain` (same options and answer), cancelling a full oversampled group's surplus once the success
    that filled it is published."""

    def published(group: GroupItem | None, batch: BatchView | None) -> None:
        if (  # `target` first: a group not oversampled asks nothing more (the result walk stays short)
            group is not None
            and group.target is not None
            and rec.state is RolloutState.SUCCEEDED
            and group.full
            and not group.complete
        ):
            cancel_surplus(
                group, deps, policy_version=batch.options.policy_version if batch and batch.options else None
            )

    return publishing.drain(rec, deps, on_published=published, **options)


def cancel_surplus(group: GroupItem, deps: LifecycleDeps, *, policy_version: str | None = None) -> int:
    """Once a success that found its oversampled group full is published: cancel, as `surplus`, every rollout of the
    group that has not ended (idempotent). Returns how many this call ended."""
    existing = {rec.index: rec for rec in deps.ledger.rollouts.iter_rollouts(group.batch_id, group.input_id)}
    ended = 0
    for index in range(group.group_size):
        found = existing.get(index)
        if found is not None and found.terminal:
            continue
        outcome = cancel_rollout(
            exp_id=group.exp_id or deps.config.name,
            batch_id=group.batch_id,
            input_id=group.input_id,
            index=index,
            deps=deps,
            rec=found,
            known=True,
            policy_version=policy_version,
            reason=FailureReason.SURPLUS,
            error=SURPLUS_ERROR,
        )
        ended += outcome == "cancelled"
    if ended:
        log.info("group %s/%s full: %d surplus rollout(s) cancelled", group.batch_id, group.input_id, ended)
    return ended
