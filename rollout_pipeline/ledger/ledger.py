"""The ledger of one experiment: its parts, cut by item, over one table.

`batches` (batch items: ingestion, counters, cancel, completion), `groups` (group items), `rollouts` (the rollout
state machine), `outbox` (the rollout items' outbox entries and the stops they wait for), `limits` (the `LIMIT`
partition's admission items: session slots, paced call budgets, the admission board), `experiment` (its budget,
spend, policy version and layout stamp), `release` (the release
window's items: the window item and the pending groups) and `warm` (the warm pool's sessions, claims and pool item)
share one `LedgerTable`: one client, one clock, one TTL rule, one conflict-retry policy. Ingestion, the lifecycle
and the SDK all hold a `Ledger` (built by `wiring.Wiring.ledger`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout_pipeline.ledger.batches import BatchLedger
from rollout_pipeline.ledger.experiment import ExperimentLedger
from rollout_pipeline.ledger.groups import GroupLedger
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.outbox import OutboxLedger
from rollout_pipeline.ledger.release import ReleaseLedger
from rollout_pipeline.ledger.rollouts import RolloutLedger
from rollout_pipeline.ledger.table import LedgerTable
from rollout_pipeline.ledger.warm import WarmLedger
from rollout_pipeline.ports import Clock


@dataclass(frozen=True)
class Ledger:
    """One experiment's ledger table, by item: batches, groups, rollouts and their outbox, limits, the experiment's
    budget and stamps, the release
    window, the warm pool."""

    batches: BatchLedger
    groups: GroupLedger
    rollouts: RolloutLedger
    outbox: OutboxLedger
    limits: LimitLedger
    experiment: ExperimentLedger
    release: ReleaseLedger
    warm: WarmLedger

    @property
    def table(self) -> LedgerTable:
        """The gateway the parts share."""
        return self.batches.table

    @classmethod
    def open(
        cls,
        table_name: str,
        dynamodb_client: Any | None = None,
        *,
        ttl_days: int = 30,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Ledger:
        """The ledger of table `table_name` (the shared boto3 client unless one is given; `clock`: the one the
        lifecycle uses, so both agree on the time; `sleep`: the conflict-retry backoff)."""
        table = LedgerTable(table_name, dynamodb_client, ttl_days=ttl_days, clock=clock, sleep=sleep)
        limits = LimitLedger(table)
        warm = WarmLedger(table, limits)
        return cls(
            batches=BatchLedger(table),
            groups=GroupLedger(table),
            rollouts=RolloutLedger(table, limits, warm),
            outbox=OutboxLedger(table, limits),
            limits=limits,
            experiment=ExperimentLedger(table),
            release=ReleaseLedger(table),
            warm=warm,
        )
