"""The experiment-wide `LIMIT` items: session slots, paced call budgets, the admission board, the policy version.

Every dispatcher and completer in every process shares them (docs/ARCHITECTURE.md, "Ledger" and "Limits"); the
lifecycle's `limits` module keeps the rules, this module the reads and writes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import from_attribute_value, item_values, plain_values
from rollout_pipeline.ledger.table import LedgerError, LedgerTable

#: A paced budget's schedule item lives this long after its last write (TTL).
PACE_TTL_S: Final = 3600


@dataclass(frozen=True)
class LimitsView:
    """What one Query of the `LIMIT` partition shows (`LimitLedger.limits_view`): the session-slot counters, the
    admission board's entries and the call budgets' schedules by budget."""

    counts: list[int]
    board: list[tuple[str, int, list[str]]] = field(default_factory=list)
    paces: dict[str, PaceView] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PaceView:
    """One paced budget's schedule item: `tat` (the earliest start of its next call, epoch us; 0: never used), and
    for a budget leased from the account pool its spacing `interval_us`, `lease_until_us` (no start may be booked
    after it) and the pool version that set them; `booked` counts the starts ever reserved, `last_start_us` is the
    latest one."""

    tat_us: int = 0
    last_start_us: int = 0
    interval_us: int = 0
    lease_until_us: int = 0
    lease_version: int = 0
    booked: int = 0
    #: The active sessions granted with the lease (the data-plane schedule carries it), 0 when none was.
    active: int = 0

    @classmethod
    def of(cls, item: Mapping[str, Any] | None) -> PaceView:
        item = item or {}
        return cls(
            tat_us=int(item.get("tat") or 0),
            last_start_us=int(item.get("last_start") or 0),
            interval_us=int(item.get("interval_us") or 0),
            lease_until_us=int(item.get("lease_until") or 0),
            lease_version=int(item.get("lease_version") or 0),
            booked=int(item.get("n") or 0),
            active=int(item.get("active") or 0),
        )


@dataclass(frozen=True)
class LeasedSlot:
    """A reservation on a leased schedule: the start (epoch us; None: none in the window asked, or no lease) and the
    schedule as it is now."""

    slot_us: int | None
    pace: PaceView

    def lacks_lease(self, not_before_us: int) -> bool:
        """No slot because no lease covers the next start at or after `not_before_us` (renew it and try again),
        rather than because the schedule is booked beyond the window asked for."""
        pace = self.pace
        return self.slot_us is None and (not pace.interval_us or pace.lease_until_us < max(not_before_us, pace.tat_us))


class LayoutMismatch(LedgerError):
    """The ledger's layout stamp is not the one this code reads and writes (`keys.LAYOUT_VERSION`)."""

    def __init__(self, table: str, found: int | None, needed: int) -> None:
        self.table, self.found, self.needed = table, found, needed
        stamp = "no layout stamp (LIMIT/LAYOUT)" if found is None else f"layout {found}"
        super().__init__(
            f"ledger {table} has {stamp} but this code reads and writes layout {needed}: it refuses to touch it. The "
            "stack stamps its layout before it updates the functions, so code and table are out of step: deploy "
            "the stack again, drained (docs/deploy.md, 'Upgrades')"
        )


def shard_cap(max_sessions: int, shard: int) -> int:
    """The cap of session-slot counter `shard`: `max_sessions` spread over `keys.SESSION_SHARDS` counters (the
    first `max_sessions % SESSION_SHARDS` get one more; with fewer sessions than counters, some get none)."""
    base, extra = divmod(max_sessions, keys.SESSION_SHARDS)
    return base + (1 if shard < extra else 0)


def free_shard(holder: str) -> int:
    """The counter a slot is given back on: spread by its holder's name, so slots given back spread as taken ones."""
    return zlib.crc32(holder.encode()) % keys.SESSION_SHARDS


@dataclass(frozen=True, slots=True)
class BudgetState:
    """The experiment's budget item: the budget set at run time (None: the deployed `budget_usd` holds), and the
    budget values whose 80% warning and exhaustion were announced."""

    budget_usd: float | None = None
    warned_for: float | None = None
    exhausted_for: float | None = None

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> BudgetState:
        def number(name: str) -> float | None:
            value = item.get(name)
            return None if value is None else float(value)

        return cls(number("budget_usd"), number("warned_for"), number("exhausted_for"))


def _tat_of(item: Mapping[str, Any]) -> int:
    """A schedule item's `tat` (raw attributes, as a failed write answers them); 0 when it has none."""
    raw = item.get("tat")
    return int(from_attribute_value(raw)) if raw is not None else 0


class LimitLedger:
    """Reads and conditional writes of the `LIMIT` partition, through the table's gateway."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    def _get(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        item = self.table.get(key)
        return {name: from_attribute_value(value) for name, value in item.items()} if item else None

    def take_slot(self, max_sessions: int, shard: int, count: int = 1) -> dict[str, Any]:
        """A transaction item that takes `count` session slots on counter `shard` if it stays within its cap
        (`shard_cap`): the caps sum to `max_sessions` and no counter ever exceeds its cap, so the sum of the
        counters (the sessions in flight) never exceeds `max_sessions`. A counter not yet written counts 0: the
        caller asks for at most its cap there (`SlotShards` and the warm pool choose by the caps)."""
        return {
            "Update": self.table.update_op(
                keys.session_shard_key(shard),
                "ADD in_flight :d",
                "attribute_not_exists(in_flight) OR in_flight <= :room",
                {":d": count, ":room": shard_cap(max_sessions, shard) - count},
            )
        }

    def free_slot(self, holder: str, count: int = 1, *, spent_usd: float = 0.0) -> dict[str, Any]:
        """A transaction item that gives `count` session slots back, on the counter `free_shard(holder)` (`holder`:
        any text naming the slot's holder, e.g. its session id). A slot may be given back on any counter: a
        counter then below zero only lets more takes through up to its cap, so the sum stays exact and bounded.

        `spent_usd`: the session's cost, ADDed to the experiment's spend on the same counter item (`spent_usd`):
        the spend lives on the 32 slot counters, written by the release every session makes anyway, and is summed
        by the same Query that sums the slots (`slots_and_spend`): no item of its own, no write of its own."""
        key = keys.session_shard_key(free_shard(holder))
        if spent_usd > 0:
            return {
                "Update": self.table.update_op(
                    key, "ADD in_flight :d, spent_usd :usd", None, {":d": -count, ":usd": round(spent_usd, 10)}
                )
            }
        return {"Update": self.table.update_op(key, "ADD in_flight :d", None, {":d": -count})}

    def slots_and_spend(self) -> tuple[int, float]:
        """Sessions holding a slot and the experiment's spend so far (USD: every released session's cost), summed
        over the slot counters in one strongly consistent Query."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": plain_values({":pk": keys.LIMIT_PK, ":prefix": keys.SESSIONS_SHARD_PREFIX}),
            "ConsistentRead": True,
        }
        counts = [0] * keys.SESSION_SHARDS
        spent = Decimal(0)
        for raw in self.table.query(request, max_pages=2):
            _count_slot(counts, raw)
            if "spent_usd" in raw:
                spent += Decimal(str(from_attribute_value(raw["spent_usd"])))
        return sum(counts), float(spent)

    def budget(self) -> BudgetState:
        """The experiment's budget item (`keys.budget_key`): the budget set at run time, and which budget values
        the warning and the exhaustion were announced for (strongly consistent)."""
        item = self._get(keys.budget_key()) or {}
        return BudgetState.of(item)

    def set_budget(self, budget_usd: float, now_iso: str) -> None:
        """Set the experiment's budget (USD) from now on (it replaces the deployed `budget_usd`)."""
        self.table.ddb.update_item(
            TableName=self.table.name,
            Key=keys.budget_key(),
            UpdateExpression="SET budget_usd = :b, updated_at = :now",
            ExpressionAttributeValues=plain_values({":b": budget_usd, ":now": now_iso}),
        )

    def claim_budget_event(self, kind: str, budget_usd: float) -> bool:
        """Claim the announcement of `kind` ("warned" or "exhausted") for budget `budget_usd`: True for the one
        caller that records it first (a conditional write), so each is announced once per budget value."""
        attribute = f"{kind}_for"
        return (
            self.table.update(
                keys.budget_key(),
                f"SET {attribute} = :b",
                f"attribute_not_exists({attribute}) OR {attribute} <> :b",
                {":b": budget_usd},
            )
            is not None
        )

    def unclaim_budget_event(self, kind: str, budget_usd: float) -> None:
        """Give a claim back after its event could not be published (the next check claims it again)."""
        attribute = f"{kind}_for"
        self.table.update(keys.budget_key(), f"REMOVE {attribute}", f"{attribute} = :b", {":b": budget_usd})

    def slot_counts(self) -> list[int]:
        """Every session-slot counter's value, by shard (one strongly consistent Query)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": plain_values({":pk": keys.LIMIT_PK, ":prefix": keys.SESSIONS_SHARD_PREFIX}),
            "ConsistentRead": True,
        }
        counts = [0] * keys.SESSION_SHARDS
        for raw in self.table.query(request, max_pages=2):
            _count_slot(counts, raw)
        return counts

    def slots_and_board(self) -> tuple[list[int], list[tuple[str, int, list[str]]]]:
        """The session-slot counters (`slot_counts`) AND the admission board (`waiting_board`) in ONE strongly
        consistent Query: both live in the `LIMIT` partition, the counters' sort keys (`SESSIONS#`) just before
        the board's (`WAIT#`), so a slot gate's poll that needs both costs one request, not two."""
        view = self.limits_view(with_paces=False)
        return view.counts, view.board

    def limits_view(self, *, with_paces: bool = True) -> LimitsView:
        """`slots_and_board`, and with `with_paces` the call budgets' schedules too (`pace`, every `PACE#` item:
        their sort keys come before the counters'), in the same one strongly consistent Query: a slot gate's poll
        that also needs the session budget's room costs one request, not two."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :from AND :to",
            "ExpressionAttributeValues": plain_values(
                {
                    ":pk": keys.LIMIT_PK,
                    ":from": keys.PACE_PREFIX if with_paces else keys.SESSIONS_SHARD_PREFIX,
                    ":to": keys.WAIT_PREFIX[:-1] + chr(ord(keys.WAIT_PREFIX[-1]) + 1),  # past every WAIT#...
                }
            ),
            "ConsistentRead": True,
        }
        view = LimitsView(counts=[0] * keys.SESSION_SHARDS)
        for raw in self.table.query(request, max_pages=10):
            sk = str(from_attribute_value(raw["sk"]))
            if sk.startswith(keys.SESSIONS_SHARD_PREFIX):
                _count_slot(view.counts, raw)
            elif sk.startswith(keys.WAIT_PREFIX):
                view.board.append(_board_entry(raw))
            elif sk.startswith(keys.PACE_PREFIX):
                view.paces[sk.removeprefix(keys.PACE_PREFIX)] = PaceView.of(item_values(raw))
        return view

    def in_flight(self) -> int:
        """Sessions holding a slot: the sum of the counters (strongly consistent)."""
        return sum(self.slot_counts())

    def reserve_pace(
        self,
        budget: str,
        *,
        not_before_us: int,
        latest_us: int,
        interval_us: int,
        busy_first: bool = False,
        count: int = 1,
    ) -> tuple[int | None, int]:
        """Reserve the next start time of a paced budget (GCRA: `tat` = the earliest time the next call may start,
        in epoch microseconds) in [not_before_us, latest_us]. Returns (slot_us, tat_us): `slot_us` the reserved
        start, or None when the schedule is already beyond `latest_us` (then `tat_us` says when it is free). Time
        before `not_before_us` that nobody took stays unused. Two conditional writes, one per case (free at
        `not_before`, or busy: the next free time); the one the caller expects (`busy_first`: it last saw the
        schedule ahead of `not_before`) goes first, so a reservation costs one write when the guess is right. A write
        whose condition fails answers the schedule as it was (`ReturnValuesOnConditionCheckFailure`), which decides
        the next step: the other case, or no slot in time (no read, and no second write that cannot succeed).
        `count`: that many consecutive starts, `interval_us` apart, in the one write (the first is returned)."""
        key = keys.pace_key(budget)
        expires = not_before_us // 1_000_000 + 3600
        span = interval_us * count

        def take_free() -> tuple[tuple[int, int] | None, int]:
            free, seen = self.table.update_or_current(
                key,
                "SET tat = :next, expires_at = :exp",
                "attribute_not_exists(tat) OR tat <= :nb",
                {":next": not_before_us + span, ":nb": not_before_us, ":exp": expires},
                return_values="UPDATED_NEW",
            )
            if free is None:
                return None, _tat_of(seen)
            return (not_before_us, not_before_us + span), 0

        def take_next() -> tuple[tuple[int, int] | None, int]:
            busy, seen = self.table.update_or_current(
                key,
                "ADD tat :interval SET expires_at = :exp",
                "tat > :nb AND tat <= :latest",
                {":interval": span, ":nb": not_before_us, ":latest": latest_us, ":exp": expires},
                return_values="UPDATED_NEW",
            )
            if busy is None:
                return None, _tat_of(seen)
            tat = int(from_attribute_value(busy["tat"]))
            return (tat - span, tat), 0

        busy = busy_first
        for _ in range(12):
            reserved, tat = (take_next if busy else take_free)()
            if reserved is not None:
                return reserved
            if tat > latest_us:
                return None, tat
            busy = tat > not_before_us  # the schedule as the failed write found it
        raise LedgerError(f"pace budget {budget} kept changing under us")

    def reserve_leased(
        self,
        budget: str,
        *,
        not_before_us: int,
        latest_us: int,
        busy_first: bool = False,
        count: int = 1,
        interval_us: int = 0,
    ) -> LeasedSlot:
        """`reserve_pace` on a schedule leased from the account pool (`set_pace_lease`): the spacing is the item's
        own `interval_us`, and no start is booked after its `lease_until`, both checked by the conditional write
        itself, so every process books at the rate the pool granted and none past the lease. Returns the slot, or
        None with the schedule (`LeasedSlot.lacks_lease` when the lease, not the window, is what is missing). A
        failed write answers the schedule as it was, as in `reserve_pace`.
        `count` > 1: that many consecutive starts in the one write (the first is returned), spaced by
        `interval_us`, the spacing the caller last saw, which the write checks is still the item's (DynamoDB's
        expressions cannot multiply), and only while the lease covers the last of them at the latest."""
        if count > 1:
            return self._reserve_leased_block(
                budget,
                not_before_us=not_before_us,
                latest_us=latest_us,
                count=count,
                interval_us=interval_us,
                busy_first=busy_first,
            )
        key = keys.pace_key(budget)
        expires = not_before_us // 1_000_000 + PACE_TTL_S

        def take_free() -> tuple[LeasedSlot | None, PaceView]:
            return self._leased_write(
                key,
                "SET last_start = :nb, tat = :nb + interval_us, expires_at = :exp ADD n :one",
                "(attribute_not_exists(tat) OR tat <= :nb) AND lease_until >= :nb",
                {":nb": not_before_us, ":exp": expires, ":one": 1},
                first_start=lambda _pace: not_before_us,
            )

        def take_next() -> tuple[LeasedSlot | None, PaceView]:
            return self._leased_write(
                key,
                "SET last_start = tat, tat = tat + interval_us, expires_at = :exp ADD n :one",
                "tat > :nb AND tat <= :latest AND lease_until >= tat",
                {":nb": not_before_us, ":latest": latest_us, ":exp": expires, ":one": 1},
                first_start=lambda pace: pace.tat_us - pace.interval_us,
            )

        busy = busy_first
        for _ in range(12):
            reserved, pace = (take_next if busy else take_free)()
            if reserved is not None:
                return reserved
            if pace.tat_us > latest_us or pace.lease_until_us < max(not_before_us, pace.tat_us) or not pace.interval_us:
                return LeasedSlot(None, pace)
            busy = pace.tat_us > not_before_us
        raise LedgerError(f"pace budget {budget} kept changing under us")

    def _reserve_leased_block(
        self, budget: str, *, not_before_us: int, latest_us: int, count: int, interval_us: int, busy_first: bool
    ) -> LeasedSlot:
        """`reserve_leased` of `count` starts: one attempt each way (free at `not_before`, else the next free time;
        `busy_first`: the latter first, as the caller last saw the schedule), no retry; the caller reserves one at a
        time when this gives nothing. A failed write answers the schedule as it was: no read, and the other way is
        not tried when that answer says it cannot succeed."""
        key = keys.pace_key(budget)
        span, last = interval_us * count, interval_us * (count - 1)
        values = {":iv": interval_us, ":exp": not_before_us // 1_000_000 + PACE_TTL_S, ":k": count}

        def take_free() -> tuple[LeasedSlot | None, PaceView]:
            return self._leased_write(
                key,
                "SET last_start = :last, tat = :end, expires_at = :exp ADD n :k",
                "(attribute_not_exists(tat) OR tat <= :nb) AND lease_until >= :last AND interval_us = :iv",
                {**values, ":nb": not_before_us, ":last": not_before_us + last, ":end": not_before_us + span},
                first_start=lambda _pace: not_before_us,
            )

        def take_next() -> tuple[LeasedSlot | None, PaceView]:
            return self._leased_write(
                key,
                "SET last_start = tat + :last, tat = tat + :span, expires_at = :exp ADD n :k",
                "tat > :nb AND tat <= :latest AND lease_until >= :bound AND interval_us = :iv",
                {
                    **values,
                    ":nb": not_before_us,
                    ":latest": latest_us,
                    ":bound": latest_us + last,  # tat <= latest: the last start is within the lease
                    ":last": last,
                    ":span": span,
                },
                first_start=lambda pace: pace.tat_us - span,
            )

        first, second = (take_next, take_free) if busy_first else (take_free, take_next)
        reserved, pace = first()
        if reserved is not None:
            return reserved
        # The other way can succeed only if the schedule, as the failed write found it, is on that side of
        # `not_before` with the spacing the block assumed (a lease too short fails either way: tried once more).
        other_side = pace.tat_us <= not_before_us if busy_first else not_before_us < pace.tat_us <= latest_us
        if pace.interval_us != interval_us or not other_side:
            return LeasedSlot(None, pace)
        reserved, pace = second()
        return reserved if reserved is not None else LeasedSlot(None, pace)

    def _leased_write(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str,
        values: Mapping[str, Any],
        *,
        first_start: Callable[[PaceView], int],
    ) -> tuple[LeasedSlot | None, PaceView]:
        """One conditional write of a leased schedule: (the slot, its first start read off the written item by
        `first_start`, and an empty view), or (None, the schedule as the refused write found it)."""
        written, seen = self.table.update_or_current(key, update, condition, values)
        if written is None:
            return None, PaceView.of(item_values(seen))
        pace = PaceView.of(item_values(written))
        return LeasedSlot(first_start(pace), pace), PaceView()

    def pace(self, budget: str) -> PaceView:
        """A paced budget's schedule item (strongly consistent)."""
        return PaceView.of(self._get(keys.pace_key(budget)))

    def paces(self, budgets: Sequence[str]) -> dict[str, PaceView]:
        """Several paced budgets' schedule items in one strongly consistent BatchGetItem."""
        wanted = {str(keys.pace_key(budget)[keys.SK]["S"]): budget for budget in budgets}
        resp = self.table.ddb.batch_get_item(
            RequestItems={
                self.table.name: {"Keys": [keys.pace_key(budget) for budget in budgets], "ConsistentRead": True}
            }
        )
        out = {budget: PaceView() for budget in budgets}
        for raw in (resp.get("Responses") or {}).get(self.table.name, []):
            item = item_values(raw)
            out[wanted[str(item["sk"])]] = PaceView.of(item)
        return out

    def set_pace_lease(
        self,
        budget: str,
        *,
        interval_us: int,
        lease_until_us: int,
        version: int,
        booked_until_us: int,
        active: int | None = None,
    ) -> bool:
        """Give a paced budget the spacing and lease the pool granted at `version`: only if no later grant was
        written (`lease_version`) and no start was booked after `booked_until_us` (the pool counted the old grant
        until then). False when the schedule was booked further: read it again and redo the grant."""
        return (
            self.table.update(
                keys.pace_key(budget),
                "SET interval_us = :iv, lease_until = :lu, lease_version = :v, expires_at = :exp"
                + ("" if active is None else ", active = :active"),
                "(attribute_not_exists(lease_version) OR lease_version < :v) "
                "AND (attribute_not_exists(last_start) OR last_start <= :booked)",
                {
                    ":iv": max(1, interval_us),
                    ":lu": lease_until_us,
                    ":v": version,
                    ":booked": booked_until_us,
                    ":exp": lease_until_us // 1_000_000 + PACE_TTL_S,
                    **({} if active is None else {":active": active}),
                },
            )
            is not None
        )

    def pace_tat(self, budget: str) -> int:
        """A paced budget's schedule (`tat`, epoch microseconds: the earliest time its next call may start); 0 when
        it was never used. Strongly consistent."""
        return self.pace(budget).tat_us

    def put_waiting(self, process: str, waiting: Sequence[str], *, now_us: int) -> None:
        """Publish one dispatcher process's waiting admission keys on the admission board, stamped `now_us`."""
        self.table.ddb.put_item(
            TableName=self.table.name,
            Item={
                **keys.waiting_key(process),
                "waiting": {"L": [{"S": k} for k in waiting]},
                "heartbeat_us": {"N": str(now_us)},
                keys.TTL_ATTRIBUTE: {"N": str(now_us // 1_000_000 + 3600)},
            },
        )

    def clear_waiting(self, process: str) -> None:
        """Take a process off the admission board (it has no waiters left)."""
        self.table.ddb.delete_item(TableName=self.table.name, Key=keys.waiting_key(process))

    def waiting_board(self) -> list[tuple[str, int, list[str]]]:
        """The admission board: (process, heartbeat_us, waiting keys) per process (strongly consistent)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": plain_values({":pk": keys.LIMIT_PK, ":prefix": keys.WAIT_PREFIX}),
            "ConsistentRead": True,
        }
        return [_board_entry(raw) for raw in self.table.query(request, max_pages=10)]

    def layout_version(self) -> int | None:
        """The layout the ledger is stamped with (`keys.LAYOUT_VERSION`), None without a stamp (strongly consistent)."""
        value = (self._get(keys.layout_key()) or {}).get("version")
        return None if value is None else int(value)

    def require_layout(self, version: int = keys.LAYOUT_VERSION) -> None:
        """Refuse (`LayoutMismatch`) a ledger of another layout than the code's: it never reads or writes items it
        does not know the shape of. A function checks it once per container, before its first message."""
        found = self.layout_version()
        if found != version:
            raise LayoutMismatch(self.table.name, found, version)

    def legacy_slots(self) -> int:
        """Sessions held on the single counter of layout 1 (`keys.LEGACY_SESSIONS_SK`); 0 when there is none."""
        item = self._get(keys.legacy_sessions_key())
        return int((item or {}).get("in_flight") or 0)

    def current_policy_version(self) -> str | None:
        """The experiment's current policy version (None until a trainer sets one)."""
        item = self._get(keys.policy_key())
        value = (item or {}).get("policy_version")
        return None if value is None else str(value)

    def set_current_policy_version(self, version: str | None, now_iso: str) -> None:
        """Set (None: clear) the version that rollouts dispatched from now on are stamped with."""
        if version is None:
            self.table.ddb.delete_item(TableName=self.table.name, Key=keys.policy_key())
            return
        self.table.ddb.put_item(
            TableName=self.table.name,
            Item={**keys.policy_key(), "policy_version": {"S": version}, "updated_at": {"S": now_iso}},
        )


def _count_slot(counts: list[int], raw: Mapping[str, Any]) -> None:
    """Put one session-slot counter item's value (raw attribute values) into `counts`, by its shard."""
    shard = int(str(from_attribute_value(raw["sk"])).removeprefix(keys.SESSIONS_SHARD_PREFIX))
    if 0 <= shard < keys.SESSION_SHARDS:
        counts[shard] = int(from_attribute_value(raw.get("in_flight", {"N": "0"})) or 0)


def _board_entry(raw: Mapping[str, Any]) -> tuple[str, int, list[str]]:
    """One admission-board item (raw attribute values) as (process, heartbeat_us, waiting keys)."""
    item = {name: from_attribute_value(value) for name, value in raw.items()}
    return (
        str(item["sk"]).removeprefix(keys.WAIT_PREFIX),
        int(item.get("heartbeat_us") or 0),
        [str(k) for k in item.get("waiting") or []],
    )
