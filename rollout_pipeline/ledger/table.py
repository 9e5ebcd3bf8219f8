"""The one gateway to the ledger table, shared by every ledger module: one client, one clock, one TTL rule, one
conflict-retry policy (`ledger.retry`), one conditional-update helper (and `ItemChange`, a write's changes as plain
values), one paginated Query."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from rollout_pipeline.contracts import iso
from rollout_pipeline.ledger.attributes import plain_values
from rollout_pipeline.ledger.retry import (
    TRANSACTION_CONFLICT_ATTEMPTS,
    LedgerError,
    backoff_s,
    note_transaction_retry,
    retry_conflicts,
)
from rollout_pipeline.ports import Clock, SystemClock

#: Cancellation reasons of a transaction that are transient: the whole transaction is retried (bounded).
TRANSIENT_CANCEL_CODES: Final = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
CONDITION_FAILED: Final = "ConditionalCheckFailed"


def query_items(ddb: Any, request: Mapping[str, Any], *, max_pages: int | None = None) -> Iterator[dict[str, Any]]:
    """The items (typed) of a DynamoDB Query `request`, page after page; at most `max_pages` pages when given."""
    kwargs = dict(request)
    pages = 0
    while max_pages is None or pages < max_pages:
        resp = ddb.query(**kwargs)
        pages += 1
        yield from resp.get("Items") or []
        last = resp.get("LastEvaluatedKey")
        if not last:
            return
        kwargs["ExclusiveStartKey"] = last


def reason_codes(reasons: Sequence[Mapping[str, Any]]) -> list[str]:
    """The codes of a transaction's cancellation reasons, one per item (`"None"` for an item that did not fail)."""
    return [str(reason.get("Code") or "None") for reason in reasons]


@dataclass(frozen=True, slots=True)
class ItemChange:
    """One write's changes to an item, as plain values: attributes set, string sets added to, attributes removed.
    The update expression (`expression`) and the item after the write (`applied`) both come from it, so what a
    writer returns for the item cannot drift from what a read of it gives."""

    sets: Mapping[str, Any]
    adds: Mapping[str, frozenset[str]] = field(default_factory=dict)
    removes: tuple[str, ...] = ()

    def expression(self) -> tuple[str, dict[str, str], dict[str, Any]]:
        """The UpdateExpression, its names and its (plain) values; every attribute by a name placeholder `#c{n}`
        and every value by `:c{n}` (a condition's own placeholders must use other names)."""
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        parts: dict[str, list[str]] = {"SET": [], "ADD": [], "REMOVE": []}
        for clause, changes in (("SET", self.sets), ("ADD", self.adds)):
            for attribute, value in changes.items():
                number = len(names)
                names[f"#c{number}"], values[f":c{number}"] = attribute, value
                parts[clause].append(f"#c{number} = :c{number}" if clause == "SET" else f"#c{number} :c{number}")
        for attribute in self.removes:
            number = len(names)
            names[f"#c{number}"] = attribute
            parts["REMOVE"].append(f"#c{number}")
        update = " ".join(f"{clause} {', '.join(items)}" for clause, items in parts.items() if items)
        return update, names, values

    def applied(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """`item` (plain values, as read) as this change leaves it."""
        after = {name: value for name, value in item.items() if name not in self.removes}
        after.update(self.sets)
        for name, members in self.adds.items():
            after[name] = set(after.get(name) or ()) | set(members)
        return after


class LedgerTable:
    """One ledger table: its low-level boto3 DynamoDB client (created lazily), its clock (the lifecycle's own, so
    the ledger and the stages never disagree on the time) and its TTL rule.

    Every item a ledger module writes expires `ttl_days` after its write (`expires_at`, epoch seconds). Plain
    writes and transactions meeting a transaction are retried by `ledger.retry`'s one policy.
    """

    def __init__(
        self,
        table_name: str,
        dynamodb_client: Any | None = None,
        *,
        ttl_days: int = 30,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = table_name
        self._client = dynamodb_client
        self.ttl_days = ttl_days
        self.clock: Clock = clock if clock is not None else SystemClock()
        #: The backoff of conflict retries: real time, whatever the clock.
        self.sleep = sleep

    @property
    def ddb(self) -> Any:
        """The DynamoDB client (the shared one of `adapters.clients` unless one was given)."""
        if self._client is None:
            from rollout_pipeline.adapters.clients import client

            self._client = client("dynamodb")
        return self._client

    # ------------------------------------------------------------------------------------------ clock and TTL

    @property
    def ttl_s(self) -> int:
        """How long an item lives after its write, in seconds."""
        return self.ttl_days * 86_400

    def now(self) -> datetime:
        """The clock."""
        return self.clock.now()

    def now_iso(self) -> str:
        """The clock, as the ledger stores times (`contracts.iso`)."""
        return iso(self.clock.now())

    def epoch(self) -> int:
        """The clock, in epoch seconds."""
        return int(self.clock.now().timestamp())

    def expires_at(self) -> int:
        """The TTL (`expires_at`, epoch seconds) of an item written now."""
        return self.epoch() + self.ttl_s

    # ------------------------------------------------------------------------------------------------ reads

    def get(self, key: Mapping[str, Any], *, consistent: bool = True) -> dict[str, Any] | None:
        """One item (typed; strongly consistent by default), or None."""
        resp = self.ddb.get_item(TableName=self.name, Key=dict(key), ConsistentRead=consistent)
        item: dict[str, Any] | None = resp.get("Item")
        return item

    def query(self, request: Mapping[str, Any], *, max_pages: int | None = None) -> Iterator[dict[str, Any]]:
        """The items (typed) of a Query on this table (`query_items`)."""
        yield from query_items(self.ddb, {"TableName": self.name, **request}, max_pages=max_pages)

    def query_all(self, request: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every item (typed) of a Query on a small partition, read before it returns (a batch's items)."""
        return list(self.query(request))

    # ----------------------------------------------------------------------------------------------- writes

    def update_op(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str | None = None,
        values: Mapping[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The parameters of one UpdateItem (also a transaction's `Update`); `values` are plain Python values."""
        op: dict[str, Any] = {"TableName": self.name, "Key": dict(key), "UpdateExpression": update}
        if condition:
            op["ConditionExpression"] = condition
        if values:
            op["ExpressionAttributeValues"] = plain_values(values)
        if names:
            op["ExpressionAttributeNames"] = dict(names)
        return op

    def update(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str | None = None,
        values: Mapping[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
        *,
        return_values: str | None = None,
    ) -> dict[str, Any] | None:
        """The one conditional update: UpdateItem, conflicts retried. Returns the returned attributes (typed; `{}`
        without `return_values`), or None when `condition` failed."""
        op = self.update_op(key, update, condition, values, names)
        if return_values:
            op["ReturnValues"] = return_values
        try:
            resp = retry_conflicts(self.ddb.update_item, sleep=self.sleep, **op)
        except self.ddb.exceptions.ConditionalCheckFailedException:
            return None
        attributes: dict[str, Any] = resp.get("Attributes") or {}
        return attributes

    def update_or_current(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str,
        values: Mapping[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
        *,
        return_values: str = "ALL_NEW",
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """`update`, and when `condition` failed the item as it was (`ReturnValuesOnConditionCheckFailure`
        ALL_OLD: the failed write answers it, no read): (the returned attributes, {}) when it was written, else
        (None, the item's attributes, typed; {} when there is no item)."""
        op = self.update_op(key, update, condition, values, names)
        op["ReturnValues"] = return_values
        op["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        try:
            resp = retry_conflicts(self.ddb.update_item, sleep=self.sleep, **op)
        except self.ddb.exceptions.ConditionalCheckFailedException as exc:
            return None, dict(exc.response.get("Item") or {})
        return dict(resp.get("Attributes") or {}), {}

    def put_new(self, item: Mapping[str, Any]) -> bool:
        """Put a (typed) item that must not exist yet, conflicts retried; False when it exists."""
        try:
            retry_conflicts(
                self.ddb.put_item,
                sleep=self.sleep,
                TableName=self.name,
                Item=dict(item),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except self.ddb.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def transact(
        self, items: Sequence[Mapping[str, Any]], *, attempts: int = TRANSACTION_CONFLICT_ATTEMPTS
    ) -> list[dict[str, Any]] | None:
        """Run a TransactWriteItems. None when it committed; else its cancellation reasons (one per item, with
        `Item` when asked for `ALL_OLD`), once a condition failed or a reason is not transient.

        A cancellation whose reasons are all transient (`TRANSIENT_CANCEL_CODES`) and a
        `TransactionConflictException` are retried with `ledger.retry`'s backoff, `attempts` times in all; then
        `LedgerError`."""
        for attempt in range(attempts):
            try:
                self.ddb.transact_write_items(TransactItems=list(items))
            except self.ddb.exceptions.TransactionCanceledException as exc:
                reasons: list[dict[str, Any]] = list(exc.response.get("CancellationReasons") or [])
                codes = set(reason_codes(reasons)) - {"None"}
                if not codes or not codes <= TRANSIENT_CANCEL_CODES:
                    return reasons or [{"Code": "Unknown"}]
            except self.ddb.exceptions.TransactionConflictException:
                pass
            else:
                return None
            note_transaction_retry()
            self.sleep(backoff_s(attempt))
        raise LedgerError(f"transaction kept conflicting after {attempts} attempts")

    def transact_guarded(self, items: Sequence[Mapping[str, Any]], what: str) -> bool:
        """Run a transaction whose first item carries the condition that decides it: True when it committed, False
        when that condition failed (someone else did it first); any other cancellation raises `LedgerError`
        naming `what`."""
        reasons = self.transact(items)
        if reasons is None:
            return True
        codes = reason_codes(reasons)
        if codes[0] == CONDITION_FAILED:
            return False
        raise LedgerError(f"{what} cancelled: {codes}")
