"""The account pool's table: one item per account and region that every experiment's functions read and renew.

The pool table (`topology.POOL_TABLE_NAME`, created once per account and region by `rollouts bootstrap`; in local
mode with the local account) holds ONE item, `POOL/STATE`:

- the settings (`quotas.PoolSettings`: the account's quotas as Service Quotas gave them at bootstrap, or the
  documented defaults, or overrides, and the reserve), written by the pool stack at deploy;
- `members`: one entry per experiment (weight, caps, its lease of each budget, demand, heartbeat, in-flight
  sessions, recent use, throttles), written by the experiment's own renewals (`limits.pool`);
- `backoff`: the factor of each rate budget after AgentCore's last throttle;
- `version`: every renewal and every backoff writes under the condition that nothing changed since its read, so
  a grant is computed from the very state it is written into (`limits.shares.grant`).

The item is read (strongly consistent GetItem) and written (conditional UpdateItem) about once a second per active
experiment, never per rollout. This module keeps the item's typed view and its reads and writes; the rules (fair
shares, what a lease counts for, the backoff's arithmetic) are `limits.shares`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_pipeline.ledger.attributes import item_values
from rollout_pipeline.ledger.pool_schema import pool_key, settings_update
from rollout_pipeline.ledger.retry import retry_conflicts
from rollout_pipeline.ledger.table import LedgerTable
from rollout_pipeline.ports import Clock
from rollout_pipeline.quotas import BUDGETS, AccountQuotas, Budget, PoolSettings

#: A demand of "all it can get" (`math.inf`) is stored as this (DynamoDB numbers are finite).
ALL: Final = -1
#: An entry whose every lease ended and whose last heartbeat is older than this is dropped by the next renewal of
#: any member (a deleted experiment leaves the pool by itself).
FORGET_AFTER_S: Final = 3600.0


@dataclass(frozen=True)
class Lease:
    """What one member holds of one budget: `rate` until `until` (epoch s); `held`, its earlier grants still in use
    as (rate, until) pairs (starts booked under them); `demand`, what it asked for (`math.inf`: all it can get)."""

    rate: float = 0.0
    until: float = 0.0
    held: tuple[tuple[float, float], ...] = ()
    demand: float = 0.0


@dataclass(frozen=True)
class Member:
    """One experiment in the pool."""

    name: str
    weight: float = 1.0
    #: Per budget: the most it may ever use (`session_rate_limit`, `tps_limit`, `max_sessions`); None: no cap.
    caps: Mapping[Budget, float | None] = field(default_factory=dict)
    leases: Mapping[Budget, Lease] = field(default_factory=dict)
    #: The last time it renewed or heartbeated (epoch s), and its sessions holding a slot then.
    heartbeat: float = 0.0
    in_flight: int = 0
    #: New sessions/s it started over its last renewal period; its count of sessions started and data-plane calls
    #: paced, and when they were read (the next renewal measures the rates from them).
    use: float = 0.0
    started: int = 0
    calls: int = 0
    counted_at: float = 0.0
    #: Throttles AgentCore answered it (rate exceeded), in all.
    throttles: int = 0
    #: When a renewal last saw it with a backlog (epoch s): it keeps asking for all it can get a little while.
    backlog_at: float = 0.0
    #: The pool version its entry was written at (its schedule items carry it: `LimitLedger.set_pace_lease`).
    version: int = 0

    def lease(self, budget: Budget) -> Lease:
        return self.leases.get(budget) or Lease()


@dataclass(frozen=True)
class Backoff:
    """The pool's factor on one rate budget: `base` right after the last decrease, at `at` (epoch s)."""

    base: float = 1.0
    at: float = 0.0


@dataclass(frozen=True)
class PoolState:
    """The account pool as one read of its item."""

    settings: PoolSettings = field(default_factory=PoolSettings)
    members: Mapping[str, Member] = field(default_factory=dict)
    backoff: Mapping[Budget, Backoff] = field(default_factory=dict)
    version: int = 0
    #: Whether the item exists (a pool table with no renewal and no settings yet has none).
    exists: bool = False
    #: Whether the settings were written (by the pool stack, or local mode); else the documented defaults.
    configured: bool = False


class PoolMissing(LookupError):
    """The account has no pool table in this region: `rollouts bootstrap` creates it."""


class PoolLedger:
    """Reads and conditional writes of the pool item, through a table gateway of the pool table."""

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

    def read(self) -> PoolState:
        """The pool item (strongly consistent). Raises `PoolMissing` when the table does not exist."""
        try:
            raw = self.table.get(pool_key())
        except self.table.ddb.exceptions.ResourceNotFoundException as exc:
            raise PoolMissing(f"no account pool table {self.table.name!r}: run `rollouts bootstrap`") from exc
        return parse_pool(item_values(raw) if raw else None, region=self.region)

    def write_settings(self, settings: PoolSettings) -> None:
        """Set the pool's settings (creating the item if needed); members and backoff are kept."""
        self.table.ddb.update_item(**settings_update(self.table.name, settings))

    def write_member(self, member: Member, *, version: int, forget: tuple[str, ...] = ()) -> bool:
        """Write `member`'s entry (and drop the `forget` entries) if the pool is still at `version`; the version
        moves on. False when someone wrote in between (read again and recompute)."""
        names = {"#m": member.name, **{f"#f{i}": name for i, name in enumerate(forget)}}
        entry = _member_values(member, version=version + 1)
        if version == 0:
            update = "SET members = :members, backoff = if_not_exists(backoff, :empty), version = :next"
            condition = "attribute_not_exists(version) OR version = :v"
            values: dict[str, Any] = {":members": {member.name: entry}, ":empty": {}, ":next": 1, ":v": 0}
            names = {}
        else:
            update = "SET members.#m = :entry, version = :next"
            if forget:
                update += " REMOVE " + ", ".join(f"members.#f{i}" for i in range(len(forget)))
            condition = "version = :v"
            values = {":entry": entry, ":next": version + 1, ":v": version}
        return self.table.update(pool_key(), update, condition, values, names or None) is not None

    def record_backoff(self, budget: Budget, backoff: Backoff, *, after: Backoff | None) -> tuple[bool, Backoff | None]:
        """Set the backoff of `budget` to `backoff` if it is still `after` (None: none yet), whatever else changed:
        one conditional UpdateItem, so a lessee that AgentCore just throttled records it at once, without reading
        the pool first, and duplicates of one overshoot decrease it once (the second finds `after` changed). The
        version moves on, so a renewal computed before the decrease is computed again. Returns (written, the
        backoff now in the item): when not written, the item's own (ConditionalCheckFailedException's `Item`,
        `ReturnValuesOnConditionCheckFailure`), to decide whether it is already decreased."""
        values: dict[str, Any] = {":backoff": {"base": backoff.base, "at": backoff.at}, ":one": 1}
        names: dict[str, str] = {"#b": budget}
        if after is None:
            condition = "attribute_not_exists(backoff.#b)"
        else:  # every name and value must be used (ValidationException otherwise)
            condition = "backoff.#b.#at = :after"
            values[":after"] = after.at
            names["#at"] = "at"
        op = self.table.update_op(pool_key(), "SET backoff.#b = :backoff ADD version :one", condition, values, names)
        try:
            retry_conflicts(
                self.table.ddb.update_item,
                sleep=self.table.sleep,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **op,
            )
        except self.table.ddb.exceptions.ConditionalCheckFailedException as exc:
            old = item_values(exc.response.get("Item") or {})
            raw = (old.get("backoff") or {}).get(budget)
            current = None if raw is None else Backoff(base=float(raw.get("base", 1.0)), at=float(raw.get("at", 0.0)))
            return False, current
        return True, backoff

    def leave(self, name: str) -> None:
        """Take experiment `name` out of the pool (its stack is being destroyed)."""
        try:
            self.table.update(
                pool_key(),
                "REMOVE members.#m SET version = version + :one",
                "attribute_exists(members.#m)",
                {":one": 1},
                {"#m": name},
            )
        except self.table.ddb.exceptions.ResourceNotFoundException:
            return


def _member_values(member: Member, *, version: int) -> dict[str, Any]:
    """A member as the item stores it (plain values)."""
    return {
        "weight": member.weight,
        "caps": {budget: cap for budget, cap in member.caps.items() if cap is not None},
        "leases": {
            budget: {
                "rate": lease.rate,
                "until": lease.until,
                "held": [[rate, until] for rate, until in lease.held],
                "demand": ALL if math.isinf(lease.demand) else lease.demand,
            }
            for budget, lease in member.leases.items()
        },
        "heartbeat": member.heartbeat,
        "in_flight": member.in_flight,
        "use": member.use,
        "started": member.started,
        "calls": member.calls,
        "counted_at": member.counted_at,
        "throttles": member.throttles,
        "backlog_at": member.backlog_at,
        "version": version,
    }


def parse_pool(item: Mapping[str, Any] | None, *, region: str | None = None) -> PoolState:
    """The typed view of a pool item (plain values; None: no item yet, the documented defaults)."""
    if item is None:
        return PoolState(settings=PoolSettings(AccountQuotas.defaults(region)))
    defaults = AccountQuotas.defaults(region)
    configured = "new_session_quota" in item
    quotas = AccountQuotas(
        new_sessions_per_s=float(item.get("new_session_quota", defaults.new_sessions_per_s)),
        data_plane_per_s=float(item.get("data_plane_quota", defaults.data_plane_per_s)),
        active_sessions=int(item.get("active_session_quota", defaults.active_sessions)),
        new_session_scope="endpoint" if item.get("new_session_scope") == "endpoint" else "account",
        source=str(item.get("quota_source", defaults.source)),
    )
    settings = PoolSettings(quotas, reserve=float(item.get("reserve", PoolSettings().reserve)))
    members = {name: _member(name, raw) for name, raw in (item.get("members") or {}).items()}
    backoff = {
        budget: Backoff(base=float(raw.get("base", 1.0)), at=float(raw.get("at", 0.0)))
        for budget, raw in (item.get("backoff") or {}).items()
        if budget in BUDGETS
    }
    return PoolState(
        settings=settings,
        members=members,
        backoff=backoff,
        version=int(item.get("version") or 0),
        exists=True,
        configured=configured,
    )


def _member(name: str, raw: Mapping[str, Any]) -> Member:
    leases = {}
    for budget, lease in (raw.get("leases") or {}).items():
        if budget not in BUDGETS:
            continue
        demand = float(lease.get("demand", 0.0))
        leases[budget] = Lease(
            rate=float(lease.get("rate", 0.0)),
            until=float(lease.get("until", 0.0)),
            held=tuple((float(rate), float(until)) for rate, until in lease.get("held") or []),
            demand=math.inf if demand == ALL else demand,
        )
    caps = {budget: float(cap) for budget, cap in (raw.get("caps") or {}).items() if budget in BUDGETS}
    return Member(
        name=name,
        weight=float(raw.get("weight", 1.0)),
        caps=caps,
        leases=leases,
        heartbeat=float(raw.get("heartbeat", 0.0)),
        in_flight=int(raw.get("in_flight", 0)),
        use=float(raw.get("use", 0.0)),
        started=int(raw.get("started", 0)),
        calls=int(raw.get("calls", 0)),
        counted_at=float(raw.get("counted_at", 0.0)),
        throttles=int(raw.get("throttles", 0)),
        backlog_at=float(raw.get("backlog_at", 0.0)),
        version=int(raw.get("version", 0)),
    )
