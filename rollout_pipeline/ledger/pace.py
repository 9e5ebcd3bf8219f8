"""Schedule items: one paced budget each (GCRA), reserved by ONE conditional write per start (or block of starts).

An item holds `tat` (the next free start, epoch us), `last_start`, `n` (starts booked) and, when the ITEM spaces
itself (an experiment's share, the account's schedule), `interval_us`. A reservation is one of two conditional
writes, free (`tat <= not_before`) or busy (`not_before < tat <= latest`), the caller's guess first; a failed write
answers the item as it was (`ReturnValuesOnConditionCheckFailure`), which decides the next step without a read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from rollout_pipeline.ledger.attributes import item_values
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import LedgerTable

#: A schedule item lives this long after its last reservation (TTL).
PACE_TTL_S: Final = 3600
#: Writes of one reservation before it gives up (the schedule kept moving under it).
MAX_WRITES: Final = 12


@dataclass(frozen=True, slots=True)
class PaceView:
    """One schedule item as read or written (epoch us; `interval_us` 0: spaced by its callers); for an experiment's
    session schedule, when its share was last set (`renewed_us`) and the active sessions it allows (`active`)."""

    tat_us: int = 0
    interval_us: int = 0
    booked: int = 0
    renewed_us: int = 0
    active: int = 0

    @classmethod
    def of(cls, item: Mapping[str, Any] | None) -> PaceView:
        item = item or {}
        return cls(
            tat_us=int(item.get("tat") or 0),
            interval_us=int(item.get("interval_us") or 0),
            booked=int(item.get("n") or 0),
            renewed_us=int(item.get("renewed_us") or 0),
            active=int(item.get("active") or 0),
        )


class ScheduleItem(NamedTuple):
    """A schedule item as read or written (plain values; empty when there is none)."""

    values: Mapping[str, Any]


class Reserved(NamedTuple):
    """A reservation's first start (epoch us; None: none in the window, or no spacing yet) and the item as left."""

    values: Mapping[str, Any]
    slot_us: int | None = None


def reserve(
    table: LedgerTable,
    key: Mapping[str, Any],
    *,
    not_before_us: int,
    latest_us: int,
    busy_first: bool = False,
    count: int = 1,
    interval_us: int = 0,
    item_spacing: bool = False,
) -> Reserved:
    """Reserve `count` consecutive starts in [not_before_us, latest_us] (the first is returned), spaced by the
    caller's `interval_us`, or with `item_spacing` by the item's own (a block checks it is still `interval_us`:
    DynamoDB's expressions cannot multiply)."""
    step = "interval_us" if item_spacing and count == 1 else ":span"
    guard = ""
    if item_spacing:
        guard = " AND interval_us = :iv" if count > 1 else " AND attribute_exists(interval_us)"
    values: dict[str, Any] = {":exp": not_before_us // 1_000_000 + PACE_TTL_S, ":k": count, ":nb": not_before_us}
    if step == ":span":
        values[":span"] = interval_us * count
        values[":last"] = interval_us * (count - 1)
    if item_spacing and count > 1:
        values[":iv"] = interval_us
    last_free = ":nb + :last" if step == ":span" else ":nb"
    last_busy = "tat + :last" if step == ":span" else "tat"

    def take_free() -> tuple[Reserved | None, Mapping[str, Any]]:
        return _write(
            table,
            key,
            f"SET last_start = {last_free}, tat = :nb + {step}, expires_at = :exp ADD n :k",
            f"(attribute_not_exists(tat) OR tat <= :nb){guard}",
            values,
            first=lambda _item: not_before_us,
        )

    def take_next() -> tuple[Reserved | None, Mapping[str, Any]]:
        span = (lambda item: int(item["interval_us"])) if step == "interval_us" else (lambda _item: values[":span"])
        return _write(
            table,
            key,
            f"SET last_start = {last_busy}, tat = tat + {step}, expires_at = :exp ADD n :k",
            f"tat > :nb AND tat <= :latest{guard}",
            {**values, ":latest": latest_us},
            first=lambda item: int(item["tat"]) - span(item),
        )

    busy = busy_first
    for _ in range(MAX_WRITES):
        reserved, seen = (take_next if busy else take_free)()
        if reserved is not None:
            return reserved
        pace = PaceView.of(seen)
        spaced_wrong = item_spacing and (not pace.interval_us or (count > 1 and pace.interval_us != interval_us))
        if pace.tat_us > latest_us or spaced_wrong:
            return Reserved(seen)
        if count > 1 and busy != busy_first:  # a block tries each way once: the caller reserves one at a time then
            return Reserved(seen)
        busy = pace.tat_us > not_before_us
    raise LedgerError(f"schedule {dict(key)} kept changing under us")


def _write(
    table: LedgerTable,
    key: Mapping[str, Any],
    update: str,
    condition: str,
    values: Mapping[str, Any],
    *,
    first: Callable[[Mapping[str, Any]], int],
) -> tuple[Reserved | None, Mapping[str, Any]]:
    """One conditional write: (the reservation, {}) or (None, the item as the refused write found it)."""
    written, seen = table.update_or_current(key, update, condition, values)
    if written is None:
        return None, item_values(seen)
    item = item_values(written)
    return Reserved(item, first(item)), {}


def set_spacing(
    table: LedgerTable,
    key: Mapping[str, Any],
    interval_us: int,
    *,
    condition: str | None = None,
    values: Mapping[str, Any] | None = None,
    also: Mapping[str, Any] | None = None,
    pause_us: int = 0,
) -> ScheduleItem | None:
    """Give a schedule item its own spacing (and `also`) if `condition` holds, its next start at its last one plus the
    new spacing (a start booked at a wider one holds none back) plus `pause_us`; the item as written, else None."""
    extra = {"interval_us": max(1, interval_us), **(also or {})}
    sets = ["tat = if_not_exists(last_start, :zero) + :gap", *(f"{name} = :set_{name}" for name in extra)]
    merged = {":zero": 0, ":gap": extra["interval_us"] + pause_us, **{f":set_{name}": v for name, v in extra.items()}}
    written = table.update(
        key, "SET " + ", ".join(sets), condition, {**merged, **(values or {})}, return_values="ALL_NEW"
    )
    return None if written is None else ScheduleItem(item_values(written))


class PaceSchedule:
    """One schedule item: where it lives and who spaces it (the item itself, or its callers)."""

    def __init__(self, table: LedgerTable, key: Mapping[str, Any], *, item_spacing: bool = False) -> None:
        self.table = table
        self.key = key
        self.item_spacing = item_spacing

    def reserve(self, **window: Any) -> Reserved:
        """`reserve` on this item (`not_before_us`, `latest_us`, `busy_first`, `count`, `interval_us`)."""
        return reserve(self.table, self.key, item_spacing=self.item_spacing, **window)

    def read(self) -> ScheduleItem:
        """The item, strongly consistent (empty when there is none)."""
        raw = self.table.get(self.key)
        return ScheduleItem(item_values(raw) if raw else {})
