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

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from rollout_pipeline.contracts import (
    FileOptions,
)
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import int_value, number_text, text_value
from rollout_pipeline.ledger.items import COST_COUNTERS, BatchView
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import LedgerTable

STATUS_INGESTING: Final = "ingesting"
STATUS_ACCEPTED: Final = "accepted"
STATUS_REJECTED: Final = "rejected"
STATUS_CANCELLED: Final = "cancelled"

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
            "ExpressionAttributeValues": {":pk": text_value(keys.batch_pk(batch_id)), ":b": text_value(keys.BATCH_SK)},
            "ConsistentRead": True,
        }
        return merge_batch_items(self.table.query_all(request))

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

    def claim_budget_event(self, batch_id: str, kind: str, budget_usd: float, event_json: str) -> bool:
        """Claim the announcement of `kind` ("warned" or "exhausted") of the batch's budget `budget_usd`, with the
        event to publish: True for the one caller that records it first (once per batch and budget value; the
        batch item is in no per-rollout transaction)."""
        attribute = f"budget_{kind}_for"
        return (
            self.table.update(
                keys.batch_key(batch_id),
                f"SET {attribute} = :b, budget_{kind}_event = :e",
                f"attribute_exists(pk) AND (attribute_not_exists({attribute}) OR {attribute} <> :b)",
                {":b": budget_usd, ":e": event_json},
            )
            is not None
        )

    def unclaim_budget_event(self, batch_id: str, kind: str, budget_usd: float) -> None:
        """Give a claim back after its event could not be published."""
        attribute = f"budget_{kind}_for"
        update = f"REMOVE {attribute}, budget_{kind}_event"
        self.table.update(keys.batch_key(batch_id), update, f"{attribute} = :b", {":b": budget_usd})

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
            "ExpressionAttributeValues": {":p": text_value(keys.BATCHES_INDEX_PK)},
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
        item.update({"status": text_value(STATUS_INGESTING), "cursor": int_value(0)})
        for counter in ("rows_accepted", "rows_rejected", "rollouts_enqueued", "errors_listed"):
            item[counter] = int_value(0)
        if lease_owner is not None:
            item["lease_owner"] = text_value(lease_owner)
            item["lease_expires"] = int_value(self.table.epoch() + lease_seconds)
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
                "status": text_value(STATUS_REJECTED),
                "error": text_value(error),
                "group_size": int_value(group_size),
                "accepted_at": text_value(now),
                "completed_at": text_value(now),
                "rollouts_total": int_value(0),
                "cursor": int_value(0),
            }
        )
        for counter in ("rows_accepted", "rows_rejected", "rollouts_enqueued", "errors_listed"):
            item[counter] = int_value(0)
        if errors_uri:
            item["errors_uri"] = text_value(errors_uri)
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
            "exp_id": text_value(exp_id),
            "batch_id": text_value(batch_id),
            "source": text_value(source),
            "created_at": text_value(self.table.now_iso()),
            keys.TTL_ATTRIBUTE: int_value(self.table.expires_at()),
            # the experiment's batches, newest first, without a scan (`recent_batch_ids`)
            keys.DEADLINE_PK: text_value(keys.BATCHES_INDEX_PK),
            keys.DEADLINE_SK: int_value(round(self.table.clock.now().timestamp() * 1000)),  # epoch ms: newest first
        }
        if options is not None:
            item["options"] = text_value(options.model_dump_json())
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
        return self.table.transact_guarded(
            [{"Update": batch}, {"Update": control}, *copies], f"cancel transaction of {batch_id}"
        )

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
