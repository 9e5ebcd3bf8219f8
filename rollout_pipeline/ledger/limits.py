"""The experiment-wide `LIMIT` items: session slots, paced call budgets, the admission board, the policy version.

Every dispatcher and completer in every process shares them (docs/ARCHITECTURE.md, "Ledger" and "Limits"); the
lifecycle's `limits` module keeps the rules, this module the reads and writes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rollout_pipeline.ledger import keys, pace
from rollout_pipeline.ledger.attributes import from_attribute_value, item_values, plain_values
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import LedgerTable


@dataclass
class LimitsView:
    """What one Query of the `LIMIT` partition shows (`LimitLedger.limits_view`): the session-slot counters, the
    admission board's entries, the call budgets' schedules by budget and the experiment's policy version (its item
    sorts between the schedules and the counters)."""

    counts: list[int]
    board: list[tuple[str, int, list[str]]] = field(default_factory=list)
    paces: dict[str, dict[str, Any]] = field(default_factory=dict)
    policy_version: str | None = None


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
        """Sessions holding a slot and the experiment's spend so far (USD: every ended session's cost), summed
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
                view.paces[sk.removeprefix(keys.PACE_PREFIX)] = item_values(raw)
            elif sk == keys.POLICY_SK:
                view.policy_version = str(from_attribute_value(raw["policy_version"]))
        return view

    def in_flight(self) -> int:
        """Sessions holding a slot: the sum of the counters (strongly consistent)."""
        return sum(self.slot_counts())

    def schedule(self, budget: str, *, item_spacing: bool = False) -> pace.PaceSchedule:
        """The schedule item of paced budget `budget` (`LIMIT/PACE#{budget}`, `ledger.pace`): spaced by its callers,
        or (`item_spacing`) by its own `interval_us` (the experiment's share of the account's new sessions)."""
        return pace.PaceSchedule(self.table, keys.pace_key(budget), item_spacing=item_spacing)

    def set_share(self, budget: str, interval_us: int, *, active: int, renewed_us: int, after_us: int) -> bool:
        """Give the schedule `budget` the spacing of the experiment's share and the active sessions it may hold, if
        no renewal wrote it since `after_us` (one renewal a period, whichever process wins)."""
        written = pace.set_spacing(
            self.table,
            keys.pace_key(budget),
            interval_us,
            condition="attribute_not_exists(renewed_us) OR renewed_us <= :after",
            values={":after": after_us},
            also={"active": active, "renewed_us": renewed_us, "expires_at": renewed_us // 1_000_000 + pace.PACE_TTL_S},
        )
        return written is not None

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
