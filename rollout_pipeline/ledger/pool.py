"""The account pool's table (`topology.POOL_TABLE_NAME`, one per account and region): `POOL/STATE`, the account's
new-session schedule with its settings, backoff and learned active-session cap, and `POOL/MEMBER#{experiment}`, one
entry per experiment (docs/lifecycle.md, "Limits"). The rules are the `limits` area's."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from rollout_pipeline.ledger import pace
from rollout_pipeline.ledger.attributes import item_values, plain_values, view_of
from rollout_pipeline.ledger.keys import PK, SK
from rollout_pipeline.ledger.pool_schema import POOL_PK, POOL_SK, member_key, pool_key, settings_update
from rollout_pipeline.ledger.table import LedgerTable
from rollout_pipeline.ports import Clock
from rollout_pipeline.quotas import RESERVE_KEY, PoolSettings, pool_settings

#: A demand of "all it can get" (`math.inf`) is stored as this (DynamoDB numbers are finite).
ALL: Final = -1
#: Member entries live this long after their last renewal (TTL): a deleted experiment leaves the pool by itself.
MEMBER_TTL_S: Final = 3600


@dataclass(frozen=True)
class AccountView:
    """The account's schedule item: settings, the schedule, the backoff (the factor right after the last decrease,
    and when: 0 never), the active-session cap learned from AgentCore (0: the quota), climbing back to at most
    `active_ceiling`, and when an experiment last started or stopped asking for new sessions (`moved_us`, `moved_by`);
    `configured`: settings were written (else the documented defaults)."""

    settings: PoolSettings = field(default_factory=PoolSettings)
    pace: pace.PaceView = field(default_factory=pace.PaceView)
    factor: float = 1.0
    factor_at: float = 0.0
    active_cap: int = 0
    active_cap_at: float = 0.0
    active_ceiling: int = 0
    moved_us: int = 0
    moved_by: str = ""
    configured: bool = False

    @classmethod
    def of(cls, item: Mapping[str, Any] | None, *, region: str | None = None) -> AccountView:
        item = item or {}
        settings = pool_settings({**item, RESERVE_KEY: item.get("reserve")}, region)  # as `settings_update` wrote it
        configured = "new_session_quota" in item
        return view_of(cls, item, settings=settings, pace=pace.PaceView.of(item), configured=configured)


@dataclass(frozen=True)
class MemberEntry:
    """One experiment in the pool, as its last renewal wrote it: its weight, caps (`sessions_cap`: new sessions/s,
    None: none), demand (new sessions/s; `math.inf`: all it can get), sessions in flight by its counters, the new
    sessions it had booked, its shares then (shown by `rollouts capacity`) and the throttles of its new sessions."""

    name: str
    weight: float = 1.0
    sessions_cap: float | None = None
    max_sessions: int = 0
    demand: float = 0.0
    in_flight: int = 0
    renewed_at: float = 0.0
    booked: int = 0
    share: float = 0.0
    active_share: int = 0
    throttles: int = 0

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> MemberEntry:
        demand = float(item.get("demand", 0.0))
        return view_of(cls, item, demand=math.inf if demand == ALL else demand)

    def _stored(self) -> dict[str, Any]:
        stored = {name: value for name, value in asdict(self).items() if value is not None}
        return {**stored, "demand": ALL if math.isinf(self.demand) else self.demand}


class PoolMissing(LookupError):
    """The account has no pool table in this region: `rollouts bootstrap` creates it."""


class PoolLedger:
    """Reads and writes of the pool table, through a table gateway of its own."""

    def __init__(self, table: LedgerTable, *, region: str | None = None) -> None:
        self.table = table
        self.region = region

    @classmethod
    def open(
        cls,
        table_name: str,
        dynamodb_client: Any | None = None,
        *,
        clock: Clock | None = None,
        region: str | None = None,
    ) -> PoolLedger:
        return cls(LedgerTable(table_name, dynamodb_client, clock=clock), region=region)

    def account(self, item: Mapping[str, Any] | None = None) -> AccountView:
        """The account's schedule item (`item`: as a write just answered it, else read). Raises `PoolMissing`."""
        if item is None:
            try:
                item = self.schedule().read().values
            except self.table.ddb.exceptions.ResourceNotFoundException as exc:
                raise PoolMissing(f"no account pool table {self.table.name!r}: run `rollouts bootstrap`") from exc
        return AccountView.of(item, region=self.region)

    def write_settings(self, settings: PoolSettings) -> None:
        """Set the pool's settings (`pool_schema.settings_update`)."""
        self.table.ddb.update_item(**settings_update(self.table.name, settings))

    def schedule(self) -> pace.PaceSchedule:
        """The account's new-session schedule (spaced by the item)."""
        return pace.PaceSchedule(self.table, pool_key(), item_spacing=True)

    def set_spacing(
        self, interval_us: int, *, factor: float, factor_at: float, after_at: float, pause_us: int = 0
    ) -> AccountView | None:
        """Space the account's schedule at `interval_us` with the backoff (its next start `pause_us` later), if its
        `factor_at` is still `after_at`."""
        written = pace.set_spacing(
            self.table,
            pool_key(),
            interval_us,
            condition="attribute_not_exists(factor_at) OR factor_at = :after",
            values={":after": after_at},
            also={"factor": factor, "factor_at": factor_at},
            pause_us=pause_us,
        )
        return None if written is None else self.account(written.values)

    def shares_moved(self, by: str, at_us: int) -> None:
        """Experiment `by` started or stopped asking for new sessions: the others renew at their next start."""
        self.table.update(pool_key(), "SET moved_us = :at, moved_by = :by", None, {":at": at_us, ":by": by})

    def learn_active_cap(self, cap: int, ceiling: int, *, at: float, after_at: float) -> bool:
        """Record the learned active-session cap (and its `ceiling`), if its `active_cap_at` is still `after_at`."""
        update = "SET active_cap = :cap, active_ceiling = :ceiling, active_cap_at = :at"
        values = {":cap": max(1, cap), ":ceiling": max(1, ceiling), ":at": at, ":after": after_at}
        condition = "attribute_not_exists(active_cap_at) OR active_cap_at = :after"
        return self.table.update(pool_key(), update, condition, values) is not None

    def put_member(self, entry: MemberEntry, *, now: float) -> None:
        """Write an experiment's entry (its renewal), unless a renewal stamped later wrote it first."""
        stored = {**entry._stored(), "expires_at": int(now) + MEMBER_TTL_S}
        with contextlib.suppress(self.table.ddb.exceptions.ConditionalCheckFailedException):
            self.table.ddb.put_item(
                TableName=self.table.name,
                Item={**member_key(entry.name), **plain_values(stored)},
                ConditionExpression="attribute_not_exists(renewed_at) OR renewed_at <= :at",
                ExpressionAttributeValues=plain_values({":at": entry.renewed_at}),
            )

    def snapshot(self) -> tuple[AccountView, list[MemberEntry]]:
        """The account's item and every experiment's entry, in ONE strongly consistent Query of the partition."""
        request: dict[str, Any] = {
            "KeyConditionExpression": f"{PK} = :pk",
            "ExpressionAttributeValues": plain_values({":pk": POOL_PK}),
            "ConsistentRead": True,
        }
        account: dict[str, Any] = {}
        members = []
        for raw in self.table.query(request, max_pages=10):
            item = item_values(raw)
            if str(item.get(SK, "")).startswith("MEMBER#"):
                members.append(MemberEntry.of(item))
            elif item.get(SK) == POOL_SK:
                account = item
        return self.account(account), members

    def leave(self, name: str) -> None:
        """Take experiment `name` out of the pool (its stack is being destroyed)."""
        try:
            self.table.ddb.delete_item(TableName=self.table.name, Key=member_key(name))
        except self.table.ddb.exceptions.ResourceNotFoundException:
            return
