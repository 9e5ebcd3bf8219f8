"""The experiment-wide `LIMIT` items that are not admission: the budget and its spend, the policy version, the ledger's
layout stamp (docs/ARCHITECTURE.md, "Ledger"). Admission's items are `ledger.limits`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import from_attribute_value, item_values, plain_values
from rollout_pipeline.ledger.items import announced_budget_events
from rollout_pipeline.ledger.limits import count_slot, prefix_query
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import LedgerTable


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


@dataclass(frozen=True, slots=True)
class BudgetState:
    """The experiment's budget item: the budget set at run time (None: the deployed `budget_usd` holds), and the
    budget values whose 80% warning and exhaustion were announced."""

    budget_usd: float | None = None
    warned_for: float | None = None
    exhausted_for: float | None = None
    #: The announced events as published (JSON), by kind ("warned", "exhausted"): what a stream made after them
    #: rebuilds (`sdk.replay`).
    events: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> BudgetState:
        def number(name: str) -> float | None:
            value = item.get(name)
            return None if value is None else float(value)

        return cls(number("budget_usd"), number("warned_for"), number("exhausted_for"), announced_budget_events(item))


class ExperimentLedger:
    """Reads and writes of the experiment's budget, policy version and layout stamp, through the table's gateway."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    def _get(self, key: Mapping[str, Any]) -> dict[str, Any]:
        return item_values(self.table.get(key) or {})

    def slots_and_spend(self) -> tuple[int, float]:
        """Sessions holding a slot and the experiment's spend so far (USD: every ended session's cost), summed
        over the slot counters in one strongly consistent Query: the spend is ADDed there as each slot is freed
        (`LimitLedger.free_slot`), no item or write of its own."""
        counts = [0] * keys.SESSION_SHARDS
        spent = Decimal(0)
        for raw in self.table.query(prefix_query(keys.SESSIONS_SHARD_PREFIX), max_pages=2):
            count_slot(counts, raw)
            if "spent_usd" in raw:
                spent += Decimal(str(from_attribute_value(raw["spent_usd"])))
        return sum(counts), float(spent)

    def budget(self) -> BudgetState:
        """The experiment's budget item (`keys.budget_key`, strongly consistent)."""
        return BudgetState.of(self._get(keys.budget_key()))

    def set_budget(self, budget_usd: float, now_iso: str) -> None:
        """Set the experiment's budget (USD) from now on (it replaces the deployed `budget_usd`)."""
        self.table.ddb.update_item(
            TableName=self.table.name,
            Key=keys.budget_key(),
            UpdateExpression="SET budget_usd = :b, updated_at = :now",
            ExpressionAttributeValues=plain_values({":b": budget_usd, ":now": now_iso}),
        )

    def claim_budget_event(self, kind: str, budget_usd: float, event_json: str) -> bool:
        """Claim the announcement of `kind` ("warned" or "exhausted") for budget `budget_usd`, with the event to
        publish: True for the one caller that records it first (a conditional write), so each is announced once
        per budget value."""
        attribute = f"{kind}_for"
        condition = f"attribute_not_exists({attribute}) OR {attribute} <> :b"
        update = f"SET {attribute} = :b, {kind}_event = :e"
        return self.table.update(keys.budget_key(), update, condition, {":b": budget_usd, ":e": event_json}) is not None

    def unclaim_budget_event(self, kind: str, budget_usd: float) -> None:
        """Give a claim back after its event could not be published (the next check claims it again)."""
        attribute = f"{kind}_for"
        update = f"REMOVE {attribute}, {kind}_event"
        self.table.update(keys.budget_key(), update, f"{attribute} = :b", {":b": budget_usd})

    def layout_version(self) -> int | None:
        """The layout the ledger is stamped with (`keys.LAYOUT_VERSION`), None without a stamp (strongly consistent)."""
        value = self._get(keys.layout_key()).get("version")
        return None if value is None else int(value)

    def require_layout(self, version: int = keys.LAYOUT_VERSION) -> None:
        """Refuse (`LayoutMismatch`) a ledger of another layout than the code's: it never reads or writes items it
        does not know the shape of. A function checks it once per container, before its first message."""
        found = self.layout_version()
        if found != version:
            raise LayoutMismatch(self.table.name, found, version)

    def legacy_slots(self) -> int:
        """Sessions held on the single counter of layout 1 (`keys.LEGACY_SESSIONS_SK`); 0 when there is none."""
        return int(self._get(keys.legacy_sessions_key()).get("in_flight") or 0)

    def current_policy_version(self) -> str | None:
        """The experiment's current policy version (None until a trainer sets one)."""
        value = self._get(keys.policy_key()).get("policy_version")
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
