"""Batch and group items of the ledger: creation, the ingest lease and checkpoints, transactional group creation,
acceptance, and the completion details other stages publish.

Item shapes and attribute names follow docs/ARCHITECTURE.md ("Ledger"). Every item carries the TTL `expires_at`.
Every read and conditional write returns a typed view (`items.BatchView`, `items.GroupItem`), parsed here from the
low-level client's typed form.

The batch's counters live on its `COUNT#` shards and its cancel flag on its control item (`keys.BATCH_SK`); readers
get them merged into one batch view (`merge_batch_items`). Ingest bookkeeping on the batch item: `cursor` (last
fully processed line), `lease_owner`/`lease_expires` (epoch seconds), `rollouts_enqueued` (rollout messages sent so
far; copied to `rollouts_total` when ingestion ends) and `errors_listed` (detailed entries in the errors object).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from rollout_pipeline.contracts import (
    FileOptions,
)
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import number_text
from rollout_pipeline.ledger.items import COST_COUNTERS, BatchView, GroupItem
from rollout_pipeline.ledger.table import CONDITION_FAILED, LedgerError, LedgerTable, reason_codes

STATUS_INGESTING: Final = "ingesting"
STATUS_ACCEPTED: Final = "accepted"
STATUS_REJECTED: Final = "rejected"
STATUS_CANCELLED: Final = "cancelled"

#: DynamoDB TransactWriteItems accepts at most 100 items and 4 MB; stay below both.
TRANSACTION_MAX_ITEMS: Final = 100
TRANSACTION_MAX_BYTES: Final = 3_500_000
#: BatchGetItem reads at most 100 keys per call.
_BATCH_GET_MAX: Final = 100
_BATCH_GET_ROUNDS: Final = 8

#: Expression attribute names used by the updates below (several are DynamoDB reserved words).
_NAMES: Final = {
    "#status": "status",
    "#cursor": "cursor",
    "#owner": "lease_owner",
    "#lease": "lease_expires",
}


class LedgerConflict(LedgerError):
    """A conditional write lost: another worker owns the ingest lease or moved the cursor."""


@dataclass(frozen=True, slots=True)
class IngestProgress:
    """Counters of an ingestion up to `cursor` (the last fully processed line / position)."""

    cursor: int = 0
    rows_accepted: int = 0
    rows_rejected: int = 0
    rollouts_enqueued: int = 0
    errors_listed: int = 0

    @classmethod
    def of(cls, batch: BatchView) -> IngestProgress:
        """Read the checkpointed progress of a batch."""
        return cls(
            cursor=batch.cursor,
            rows_accepted=batch.rows_accepted,
            rows_rejected=batch.rows_rejected,
            rollouts_enqueued=batch.rollouts_enqueued,
            errors_listed=batch.errors_listed,
        )


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group item to create: one accepted row. Exactly one of `payload_json` and `payload_ref` is set."""

    input_id: str
    line: int
    group_size: int
    payload_json: str | None = None
    payload_ref: str | None = None
    overrides_json: str = "{}"
    #: With oversample: the valid rollouts the group needs (`group_size` is then the rollouts it runs).
    target: int | None = None


@dataclass(slots=True)
class GroupWriteResult:
    """Outcome of `BatchLedger.create_groups`.

    `created`: written now. `resumed`: already there with the same line, i.e. written by an earlier attempt of
    this same ingestion (its messages must still be (re)sent). `duplicates`: the id is taken by another row;
    each entry is (the rejected group, the line that holds the id).
    """

    created: list[GroupSpec] = field(default_factory=list)
    resumed: list[GroupSpec] = field(default_factory=list)
    duplicates: list[tuple[GroupSpec, int]] = field(default_factory=list)

    @property
    def accepted(self) -> list[GroupSpec]:
        """Groups whose rollouts belong to this ingestion, in line order."""
        return sorted([*self.created, *self.resumed], key=lambda g: g.line)


def _n(value: int | float) -> dict[str, str]:
    return {"N": str(value)}


def _s(value: str) -> dict[str, str]:
    return {"S": value}


# ------------------------------------------------------------------------------------------------ the batch view

#: Counters of a batch. They live on its `COUNT#{shard}` items (`keys.COUNT_PREFIX`), with `failed_{reason}`;
#: counts found on the batch item itself (written before the shards existed) are added too.
COUNTERS: Final = ("terminal", "succeeded", "failed", "reward_sum", "reward_sumsq", "reward_count", *COST_COUNTERS)
FAILED_PREFIX: Final = "failed_"


def _is_counter(name: str) -> bool:
    return name in COUNTERS or name.startswith(FAILED_PREFIX)


def merge_batch_items(items: Iterable[Mapping[str, Any]]) -> BatchView | None:
    """The batch as its readers see it, from the typed items of one `begins_with(sk, "BATCH")` query: the batch
    item, `cancelled_at` from its control item, and every counter summed over its shards (exactly, as decimals;
    0 when none counted yet). None when the batch item does not exist.

    Counters only grow and each rollout's are ADDed to one shard in one transaction, so a view whose `terminal`
    reaches `rollouts_total` holds every rollout's counts, although the query is not a snapshot."""
    base: dict[str, Any] | None = None
    control: Mapping[str, Any] = {}
    sums: dict[str, Decimal] = dict.fromkeys(COUNTERS, Decimal(0))
    for item in items:
        sk = item[keys.SK]["S"]
        if sk == keys.BATCH_SK:
            base = dict(item)
        elif sk == keys.CONTROL_SK:
            control = item
        elif not sk.startswith(keys.COUNT_PREFIX):
            continue
        for name, value in item.items():
            if sk != keys.CONTROL_SK and _is_counter(name) and "N" in value:
                sums[name] = sums.get(name, Decimal(0)) + Decimal(value["N"])
    if base is None:
        return None
    for name, total in sums.items():
        base[name] = {"N": number_text(total)}
    if "cancelled_at" in control and "cancelled_at" not in base:
        base["cancelled_at"] = control["cancelled_at"]
    return BatchView.of(base)


# -------------------------------------------------------------------------------------------------- the ledger


class BatchLedger:
    """Batch and group items of one ledger table, through its gateway (`table.LedgerTable`): creation, the ingest
    lease and checkpoints, transactional group creation, acceptance, cancel and the completion-event claims."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table
        self.table_name = table.name

    # ------------------------------------------------------------------------------------------------- reads

    def read_batch(self, batch_id: str) -> BatchView | None:
        """The batch view (`merge_batch_items`: the batch item with its counters summed), with one strongly
        consistent Query, or None."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :b)",
            "ExpressionAttributeValues": {":pk": _s(keys.batch_pk(batch_id)), ":b": _s(keys.BATCH_SK)},
            "ConsistentRead": True,
        }
        return merge_batch_items(self.table.query(request))

    def read_group(self, batch_id: str, input_id: str) -> GroupItem | None:
        """The group (strongly consistent), or None."""
        item = self.table.get(keys.group_key(batch_id, input_id))
        return GroupItem.of(item) if item else None

    def groups(self, batch_id: str) -> Iterator[GroupItem]:
        """Every group of a batch, in input-id order (a paged Query, never a scan; strongly consistent)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :g)",
            "ExpressionAttributeValues": {":pk": _s(keys.batch_pk(batch_id)), ":g": _s(keys.GROUP_PREFIX)},
            "ConsistentRead": True,
        }
        for item in self.table.query(request):
            yield GroupItem.of(item)

    def read_groups(self, batch_id: str, input_ids: Sequence[str]) -> dict[str, GroupItem]:
        """The group items of `input_ids` (BatchGetItem, strongly consistent; unprocessed keys retried, bounded)."""
        found: dict[str, GroupItem] = {}
        wanted = list(dict.fromkeys(input_ids))
        for start in range(0, len(wanted), _BATCH_GET_MAX):
            request: dict[str, Any] = {
                self.table.name: {
                    "Keys": [keys.group_key(batch_id, i) for i in wanted[start : start + _BATCH_GET_MAX]],
                    "ConsistentRead": True,
                }
            }
            for attempt in range(_BATCH_GET_ROUNDS):
                resp = self.table.ddb.batch_get_item(RequestItems=request)
                for raw in (resp.get("Responses") or {}).get(self.table.name, []):
                    group = GroupItem.of(raw)
                    found[group.input_id] = group
                request = resp.get("UnprocessedKeys") or {}
                if not request:
                    break
                self.table.sleep(min(1.0, 0.05 * 2**attempt))
        return found

    def set_budget(self, batch_id: str, budget_usd: float) -> bool:
        """Set a batch's own budget (USD), replacing the one it was submitted with; False for an unknown batch."""
        return (
            self.table.update(
                keys.batch_key(batch_id),
                "SET budget_usd = :b",
                "attribute_exists(pk)",
                {":b": budget_usd},
            )
            is not None
        )

    def claim_budget_event(self, batch_id: str, kind: str, budget_usd: float) -> bool:
        """Claim the announcement of `kind` ("warned" or "exhausted") of the batch's budget `budget_usd`: True for
        the one caller that records it first (once per batch and budget value; the batch item is in no
        per-rollout transaction)."""
        attribute = f"budget_{kind}_for"
        return (
            self.table.update(
                keys.batch_key(batch_id),
                f"SET {attribute} = :b",
                f"attribute_exists(pk) AND (attribute_not_exists({attribute}) OR {attribute} <> :b)",
                {":b": budget_usd},
            )
            is not None
        )

    def unclaim_budget_event(self, batch_id: str, kind: str, budget_usd: float) -> None:
        """Give a claim back after its event could not be published."""
        attribute = f"budget_{kind}_for"
        self.table.update(keys.batch_key(batch_id), f"REMOVE {attribute}", f"{attribute} = :b", {":b": budget_usd})

    def recent_batch_ids(self, limit: int = 20) -> list[str]:
        """The ids of the experiment's newest batches (newest first, at most `limit`): one Query page of the batch
        listing (`_listing`)."""
        found = [
            keys.batch_id_of(str(item[keys.PK]["S"]))
            for item in self.table.query(self._listing(newest_first=True, limit=max(1, min(limit, 1000))), max_pages=1)
        ]
        return found[:limit]

    def batch_ids(self) -> Iterator[str]:
        """Every batch's id, oldest first: a paged Query of the batch listing (`_listing`), never a Scan (the
        trainer's policy grants the Query on that index, not a Scan of the table)."""
        for item in self.table.query(self._listing(newest_first=False)):
            yield keys.batch_id_of(str(item[keys.PK]["S"]))

    @staticmethod
    def _listing(*, newest_first: bool, limit: int | None = None) -> dict[str, Any]:
        """A Query of the batch items' partition of the `deadline` index (`keys.BATCHES_INDEX_PK`, sort key their
        creation in epoch ms; batches created before it existed are not listed). Eventually consistent, as every
        index read."""
        request: dict[str, Any] = {
            "IndexName": keys.DEADLINE_INDEX,
            "KeyConditionExpression": "#p = :p",
            "ExpressionAttributeNames": {"#p": keys.DEADLINE_PK},
            "ExpressionAttributeValues": {":p": _s(keys.BATCHES_INDEX_PK)},
            "ScanIndexForward": not newest_first,
        }
        if limit is not None:
            request["Limit"] = limit
        return request

    # ------------------------------------------------------------------------------------------------ batch

    def create_batch(
        self,
        *,
        exp_id: str,
        batch_id: str,
        options: FileOptions,
        source: str,
        lease_owner: str | None = None,
        lease_seconds: int = 900,
    ) -> BatchView | None:
        """Create a batch in status `ingesting` (with the ingest lease when `lease_owner` is given).

        Returns the new item, or None when the batch already exists (nothing is changed then).
        """
        item = self._new_batch_item(exp_id=exp_id, batch_id=batch_id, options=options, source=source)
        item.update({"status": _s(STATUS_INGESTING), "cursor": _n(0)})
        for counter in ("rows_accepted", "rows_rejected", "rollouts_enqueued", "errors_listed"):
            item[counter] = _n(0)
        if lease_owner is not None:
            item["lease_owner"] = _s(lease_owner)
            item["lease_expires"] = _n(self.table.epoch() + lease_seconds)
        return BatchView.of(item) if self.table.put_new(item) else None

    def create_rejected_batch(
        self,
        *,
        exp_id: str,
        batch_id: str,
        options: FileOptions | None,
        source: str,
        error: str,
        errors_uri: str | None,
        group_size: int,
    ) -> BatchView:
        """Record a file rejected as a whole (e.g. bad metadata): status `rejected`, zero rows, complete at once.

        Idempotent: if the batch already exists, the stored item is returned unchanged.
        """
        now = self.table.now_iso()
        item = self._new_batch_item(exp_id=exp_id, batch_id=batch_id, options=options, source=source)
        item.update(
            {
                "status": _s(STATUS_REJECTED),
                "error": _s(error),
                "group_size": _n(group_size),
                "accepted_at": _s(now),
                "completed_at": _s(now),
                "rollouts_total": _n(0),
                "cursor": _n(0),
            }
        )
        for counter in ("rows_accepted", "rows_rejected", "rollouts_enqueued", "errors_listed"):
            item[counter] = _n(0)
        if errors_uri:
            item["errors_uri"] = _s(errors_uri)
        if self.table.put_new(item):
            return BatchView.of(item)
        existing = self.read_batch(batch_id)
        assert existing is not None  # the conditional put failed because it exists
        return existing

    def _new_batch_item(
        self, *, exp_id: str, batch_id: str, options: FileOptions | None, source: str
    ) -> dict[str, Any]:
        item: dict[str, Any] = {
            **keys.batch_key(batch_id),
            "exp_id": _s(exp_id),
            "batch_id": _s(batch_id),
            "source": _s(source),
            "created_at": _s(self.table.now_iso()),
            keys.TTL_ATTRIBUTE: _n(self.table.expires_at()),
            # the experiment's batches, newest first, without a scan (`recent_batch_ids`)
            keys.DEADLINE_PK: _s(keys.BATCHES_INDEX_PK),
            keys.DEADLINE_SK: _n(round(self.table.clock.now().timestamp() * 1000)),  # epoch ms: newest first
        }
        if options is not None:
            item["options"] = _s(options.model_dump_json())
        return item

    def acquire_lease(self, batch_id: str, owner: str, lease_seconds: int) -> BatchView | None:
        """Take the ingest lease of an unfinished batch (`ingesting`, or `cancelled` before ingestion ended) when
        the lease is free, expired or already ours.

        Returns the updated item, or None when another worker holds an unexpired lease or ingestion has ended.
        """
        now = self.table.epoch()
        item = self.table.update(
            keys.batch_key(batch_id),
            "SET #owner = :me, #lease = :until",
            "#status IN (:ingesting, :cancelled) AND attribute_not_exists(rollouts_total)"
            " AND (attribute_not_exists(#owner) OR #owner = :me OR #lease < :now)",
            {
                ":me": owner,
                ":until": now + lease_seconds,
                ":now": now,
                ":ingesting": STATUS_INGESTING,
                ":cancelled": STATUS_CANCELLED,
            },
            {k: _NAMES[k] for k in ("#status", "#owner", "#lease")},
            return_values="ALL_NEW",
        )
        return BatchView.of(item) if item is not None else None

    def checkpoint(
        self,
        batch_id: str,
        *,
        owner: str,
        previous_cursor: int,
        progress: IngestProgress,
        lease_seconds: int,
        give_up_lease: bool = False,
    ) -> BatchView:
        """Record progress up to `progress.cursor`; conditional on our lease and the previous cursor.

        Renews the lease (or gives it up with `give_up_lease=True`, so a continuation can take over at once).
        Returns the updated batch item (without its counters): its `status` tells whether someone cancelled the
        batch meanwhile.
        Raises `LedgerConflict` when the lease or the cursor moved (another worker took over).
        """
        values = self._progress_values(progress)
        values.update({":me": owner, ":prev": previous_cursor})
        values[":until"] = 0 if give_up_lease else self.table.epoch() + lease_seconds
        item = self.table.update(
            keys.batch_key(batch_id),
            _PROGRESS_SET + ", #lease = :until",
            "#owner = :me AND #cursor = :prev",
            values,
            {k: _NAMES[k] for k in ("#cursor", "#owner", "#lease")},
            return_values="ALL_NEW",
        )
        if item is None:
            raise LedgerConflict(f"batch {batch_id}: lease lost or cursor moved (expected cursor {previous_cursor})")
        return BatchView.of(item)

    def finish_ingest(
        self,
        batch_id: str,
        *,
        owner: str,
        previous_cursor: int,
        progress: IngestProgress,
        errors_uri: str | None,
    ) -> BatchView:
        """End an ingestion: `rollouts_total` = rollouts enqueued, `accepted_at`, lease removed.

        An `ingesting` batch becomes `accepted`; a `cancelled` one keeps its status (its completion accounting
        still needs `rollouts_total`). Returns the batch view after the update (with its counters). Raises
        `LedgerConflict` if we lost the lease.
        """
        values = self._progress_values(progress)
        values.update(
            {
                ":me": owner,
                ":prev": previous_cursor,
                ":total": progress.rollouts_enqueued,
                ":at": self.table.now_iso(),
            }
        )
        update = _PROGRESS_SET + ", rollouts_total = :total, accepted_at = :at"
        if errors_uri:
            update += ", errors_uri = :errors"
            values[":errors"] = errors_uri
        base_condition = "#owner = :me AND #cursor = :prev AND attribute_not_exists(rollouts_total)"
        names = {k: _NAMES[k] for k in ("#cursor", "#owner", "#lease", "#status")}
        for status_now, status_after in ((STATUS_INGESTING, STATUS_ACCEPTED), (STATUS_CANCELLED, STATUS_CANCELLED)):
            item = self.table.update(
                keys.batch_key(batch_id),
                update + ", #status = :after REMOVE #owner, #lease",
                base_condition + " AND #status = :before",
                {**values, ":before": status_now, ":after": status_after},
                names,
                return_values="ALL_NEW",
            )
            if item is None:
                continue
            view = self.read_batch(batch_id)  # with its counters: the batch may be complete already
            return view if view is not None else BatchView.of(item)
        raise LedgerConflict(f"batch {batch_id}: cannot finish ingestion (lease lost, cursor moved or finished)")

    def reject_ingesting(
        self, batch_id: str, *, owner: str, previous_cursor: int, error: str, errors_uri: str | None
    ) -> BatchView:
        """End an ingestion that found no row: status `rejected` with `error`, zero rollouts, complete at once.

        Conditional on our lease and cursor, like `finish_ingest`. Raises `LedgerConflict` if we lost the lease."""
        values: dict[str, Any] = {
            ":me": owner,
            ":prev": previous_cursor,
            ":ingesting": STATUS_INGESTING,
            ":rejected": STATUS_REJECTED,
            ":error": error,
            ":zero": 0,
            ":at": self.table.now_iso(),
        }
        update = "SET #status = :rejected, #err = :error, rollouts_total = :zero, accepted_at = :at, completed_at = :at"
        if errors_uri:
            update += ", errors_uri = :errors"
            values[":errors"] = errors_uri
        item = self.table.update(
            keys.batch_key(batch_id),
            update + " REMOVE #owner, #lease",
            "#owner = :me AND #cursor = :prev AND #status = :ingesting",
            values,
            {**{k: _NAMES[k] for k in ("#cursor", "#owner", "#lease", "#status")}, "#err": "error"},
            return_values="ALL_NEW",
        )
        if item is None:
            raise LedgerConflict(f"batch {batch_id}: cannot reject (lease lost, cursor moved or not ingesting)")
        return BatchView.of(item)

    def mark_completed(self, batch_id: str) -> BatchView:
        """Stamp `completed_at` once (first writer wins) and return the batch view; used before `Batch Completed`."""
        item = self.table.update(
            keys.batch_key(batch_id),
            "SET completed_at = if_not_exists(completed_at, :at)",
            "attribute_exists(pk)",
            {":at": self.table.now_iso()},
            return_values="ALL_NEW",
        )
        if item is None:
            raise LedgerError(f"batch {batch_id} does not exist")
        view = self.read_batch(batch_id)
        return view if view is not None else BatchView.of(item)

    @staticmethod
    def _progress_values(progress: IngestProgress) -> dict[str, Any]:
        return {
            ":cursor": progress.cursor,
            ":accepted": progress.rows_accepted,
            ":rejected": progress.rows_rejected,
            ":enqueued": progress.rollouts_enqueued,
            ":listed": progress.errors_listed,
        }

    # ----------------------------------------------------------------------------------------------- groups

    def _group_item(self, *, exp_id: str, batch_id: str, group: GroupSpec) -> dict[str, Any]:
        """The DynamoDB item of a new group (counters empty)."""
        item: dict[str, Any] = {
            **keys.group_key(batch_id, group.input_id),
            "exp_id": _s(exp_id),
            "batch_id": _s(batch_id),
            "input_id": _s(group.input_id),
            "line": _n(group.line),
            "group_size": _n(group.group_size),
            "overrides": _s(group.overrides_json),
            "terminal": _n(0),
            "rewards": {"M": {}},
            "failures": {"M": {}},
            "created_at": _s(self.table.now_iso()),
            keys.TTL_ATTRIBUTE: _n(self.table.expires_at()),
        }
        if group.payload_ref is not None:
            item["payload_ref"] = _s(group.payload_ref)
        else:
            item["payload"] = _s(group.payload_json if group.payload_json is not None else "{}")
        if group.target is not None:
            item["target"] = _n(group.target)
            item["kept"] = {"M": {}}
        return item

    def create_groups(self, *, exp_id: str, batch_id: str, groups: Sequence[GroupSpec]) -> GroupWriteResult:
        """Create group items with conditional puts in transactions (<= 100 distinct items each).

        Exact duplicate-id detection with bounded memory: the ledger itself is the set of ids seen. A conflict
        whose stored `line` equals the new group's line is a resumed write of this same ingestion; any other
        conflict (or a repeat within `groups`) is a duplicate id. Groups are expected in line order.
        """
        result = GroupWriteResult()
        first_line: dict[str, int] = {}
        distinct: list[GroupSpec] = []
        for group in groups:
            if group.input_id in first_line:
                result.duplicates.append((group, first_line[group.input_id]))
            else:
                first_line[group.input_id] = group.line
                distinct.append(group)
        for chunk in self._transaction_chunks(exp_id, batch_id, distinct):
            self._write_group_chunk(batch_id, chunk, result)
        return result

    def _transaction_chunks(
        self, exp_id: str, batch_id: str, groups: Sequence[GroupSpec]
    ) -> Iterator[list[tuple[GroupSpec, dict[str, Any]]]]:
        chunk: list[tuple[GroupSpec, dict[str, Any]]] = []
        size = 0
        for group in groups:
            item = self._group_item(exp_id=exp_id, batch_id=batch_id, group=group)
            # DynamoDB counts UTF-8 bytes (a non-ASCII character is 2-4 of them), not characters.
            item_size = len((group.payload_json or "").encode()) + len(group.overrides_json.encode()) + 512
            if chunk and (len(chunk) >= TRANSACTION_MAX_ITEMS or size + item_size > TRANSACTION_MAX_BYTES):
                yield chunk
                chunk, size = [], 0
            chunk.append((group, item))
            size += item_size
        if chunk:
            yield chunk

    def _write_group_chunk(
        self, batch_id: str, chunk: list[tuple[GroupSpec, dict[str, Any]]], result: GroupWriteResult
    ) -> None:
        """Write one chunk; puts whose id is taken are settled (`_settle_conflicts`) and the rest written again.
        Transient cancellations are retried by the table's policy (`LedgerTable.transact`)."""
        pending = list(chunk)
        while pending:
            reasons = self.table.transact(
                [
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": item,
                            "ConditionExpression": "attribute_not_exists(pk)",
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    }
                    for _, item in pending
                ]
            )
            if reasons is None:
                result.created.extend(group for group, _ in pending)
                return
            conflicts = [
                (index, reason) for index, reason in enumerate(reasons) if reason.get("Code") == CONDITION_FAILED
            ]
            settled = self._settle_conflicts(batch_id, pending, conflicts, result) if conflicts else pending
            if len(settled) == len(pending):
                raise LedgerConflict(f"batch {batch_id}: group transaction cancelled: {reasons}")
            pending = settled

    def _settle_conflicts(
        self,
        batch_id: str,
        pending: list[tuple[GroupSpec, dict[str, Any]]],
        conflicts: Sequence[tuple[int, Mapping[str, Any]]],
        result: GroupWriteResult,
    ) -> list[tuple[GroupSpec, dict[str, Any]]]:
        """Classify the conflicting puts (resumed or duplicate); return the puts still to write."""
        settled: set[int] = set()
        for index, reason in conflicts:
            if index >= len(pending):
                continue
            group = pending[index][0]
            returned = reason.get("Item")
            existing = GroupItem.of(returned) if returned else self.read_group(batch_id, group.input_id)
            existing_line = existing.line if existing is not None else 0
            if existing_line == group.line:
                result.resumed.append(group)
            else:
                result.duplicates.append((group, existing_line))
            settled.add(index)
        return [entry for index, entry in enumerate(pending) if index not in settled]

    # ------------------------------------------------------------------------------- cancel and completion claims

    def cancel(self, batch_id: str) -> bool:
        """Mark the batch cancelled (idempotent): its status, its control item and every copy of the cancel flag
        that the dispatch transactions check, in one transaction (34 items of the 100 a transaction may hold).
        False if the batch does not exist or was rejected as a whole."""
        values = {":cancelled": "cancelled", ":now": self.table.now_iso()}
        batch = self.table.update_op(
            keys.batch_key(batch_id),
            "SET #status = :cancelled, cancelled_at = if_not_exists(cancelled_at, :now)",
            "attribute_exists(pk) AND #status <> :rejected",
            {**values, ":rejected": "rejected"},
            {"#status": "status"},
        )
        control_write: tuple[str, None, dict[str, Any], dict[str, str]] = (
            "SET #status = :cancelled, cancelled_at = if_not_exists(cancelled_at, :now), #ttl = :ttl",
            None,
            {**values, ":ttl": self.table.expires_at()},
            {"#status": "status", "#ttl": keys.TTL_ATTRIBUTE},
        )
        # The control item (the batch view's `cancelled_at`) and every copy the dispatch transactions check.
        control = self.table.update_op(keys.batch_control_key(batch_id), *control_write)
        copies = [
            {"Update": self.table.update_op(keys.control_shard_key_of(batch_id, shard), *control_write)}
            for shard in range(keys.CONTROL_SHARDS)
        ]
        reasons = self.table.transact([{"Update": batch}, {"Update": control}, *copies])
        if reasons is None:
            return True
        if reason_codes(reasons)[0] == CONDITION_FAILED:
            return False
        raise LedgerError(f"cancel transaction of {batch_id} cancelled: {reasons}")

    def claim_group_event(self, batch_id: str, input_id: str, claimant: str) -> bool:
        """Let one rollout (`claimant`) publish `Group Completed`: the first claimer, or the same one again (its
        outbox retried), gets True. The claimer's outbox entry stays until its publish succeeded, so the event is
        not lost; concurrent last rollouts do not both publish it."""
        return (
            self.table.update(
                keys.group_key(batch_id, input_id),
                "SET completed_event_by = :me",
                "attribute_exists(pk) AND (attribute_not_exists(completed_event_by) OR completed_event_by = :me)",
                {":me": claimant},
            )
            is not None
        )

    def claim_kept(self, batch_id: str, input_id: str, index: int, target: int) -> bool:
        """Let a successful rollout of an oversampled group into the group: True while fewer than `target` were
        kept before it (its index is added to `kept`), or when it already is kept (its outbox retried); False when
        the group was full: the rollout is surplus. One conditional write; concurrent rollouts never overfill it."""
        key = keys.group_key(batch_id, input_id)
        names = {"#i": str(index)}
        taken = self.table.update(
            key,
            "SET kept.#i = :one ADD kept_count :one",
            "attribute_exists(kept) AND attribute_not_exists(kept.#i) "
            "AND (attribute_not_exists(kept_count) OR kept_count < :target)",
            {":one": 1, ":target": target},
            names,
        )
        if taken is not None:
            return True
        group = self.read_group(batch_id, input_id)
        return group is not None and index in group.kept

    def claim_batch_completed(self, batch_id: str, claimant: str) -> BatchView | None:
        """Like `claim_group_event` for `Batch Completed`; also stamps `completed_at` once. Returns the batch view
        (`batches.merge_batch_items`) when `claimant` may publish, else None."""
        item = self.table.update(
            keys.batch_key(batch_id),
            "SET completed_at = if_not_exists(completed_at, :now), completed_event_by = :me",
            "attribute_exists(pk) AND (attribute_not_exists(completed_event_by) OR completed_event_by = :me)",
            {":now": self.table.now_iso(), ":me": claimant},
            return_values="ALL_NEW",
        )
        if item is None:
            return None
        view = self.read_batch(batch_id)
        return view if view is not None else BatchView.of(item)


_PROGRESS_SET: Final = (
    "SET #cursor = :cursor, rows_accepted = :accepted, rows_rejected = :rejected, "
    "rollouts_enqueued = :enqueued, errors_listed = :listed"
)


# ------------------------------------------------------------------------------------------- event details


def batch_options(batch: BatchView | None) -> FileOptions | None:
    """The effective per-file options stored on a batch; None for no batch, a file rejected before they were
    known, or an unreadable value (callers then use the experiment's defaults)."""
    return batch.options if batch is not None else None
