"""The one factory of rollout-queue messages (`contracts.RolloutMessage`).

Every message starts from a `QueuedGroup`: one accepted group as queued (experiment, batch, input, line, group
size, its payload inline or by reference, the row's overrides, its submission time). Ingestion makes one from the
row it just accepted, the release window and a retry from the group item they read (`QueuedGroup.of_item`).
`bodies` fans a group out into its rollouts' message bodies: the message is encoded once per group and the index
written into each body, so a big payload is serialised once, not `group_size` times.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rollout_pipeline.contracts import RolloutMessage
from rollout_pipeline.ledger.items import GroupItem


@dataclass(frozen=True, slots=True)
class QueuedGroup:
    """One group as the rollout queue carries it (what every message of its rollouts shares)."""

    exp_id: str
    batch_id: str
    input_id: str
    #: The group's line in its file (its submission order in the batch; None: unknown, sorts first).
    line: int | None
    group_size: int
    #: When the group was submitted: the batch's creation, so all of a batch ranks together in admission order.
    submitted_at: datetime
    #: The row minus reserved keys when inline, else None and `payload_ref` names the claim check.
    payload: Mapping[str, Any] | None = None
    payload_ref: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of_item(cls, group: GroupItem, *, exp_id: str, submitted_at: datetime) -> QueuedGroup:
        """The group as its ledger item records it (`exp_id` when the item has none)."""
        return cls(
            exp_id=group.exp_id or exp_id,
            batch_id=group.batch_id,
            input_id=group.input_id,
            line=group.line or None,
            group_size=group.group_size,
            submitted_at=submitted_at,
            payload=group.payload,
            payload_ref=group.payload_ref,
            overrides=group.overrides,
        )

    def message(self, index: int, attempt: int = 1) -> RolloutMessage:
        """The message of attempt `attempt` of rollout `index`."""
        return RolloutMessage(
            exp_id=self.exp_id,
            batch_id=self.batch_id,
            input_id=self.input_id,
            index=index,
            attempt=attempt,
            group_size=self.group_size,
            submitted_at=self.submitted_at,
            line=self.line,
            payload=dict(self.payload) if self.payload is not None else None,
            payload_ref=self.payload_ref,
            rollout_overrides=dict(self.overrides),
        )

    def bodies(self, indexes: Iterable[int] | None = None, *, attempt: int = 1) -> list[str]:
        """The message bodies of rollouts `indexes` (every index of the group when None) at `attempt`, the message
        validated and encoded once."""
        chosen = range(self.group_size) if indexes is None else list(indexes)
        if not chosen:
            return []
        shared = self.message(chosen[0], attempt).model_dump_json(exclude={"index"})
        return [f'{{"index":{index:d},{shared[1:]}' for index in chosen]


def bodies_of(groups: Iterable[QueuedGroup]) -> list[str]:
    """Every rollout message of `groups` (attempt 1), group by group in the order given."""
    return [body for group in groups for body in group.bodies()]
