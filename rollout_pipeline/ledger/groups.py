"""Group items of the ledger: one per accepted row, created transactionally at ingestion (the ledger itself is the
set of input ids seen: a duplicate id is found by its conditional put), read by the drain, the feed and the SDK, and
claimed by the rollout that publishes `Group Completed` and, in an oversampled group, by each success it lets in.

Item shapes and attribute names follow docs/ARCHITECTURE.md ("Ledger"). Every item carries the TTL `expires_at`;
every read returns a typed view (`items.GroupItem`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import int_value, text_value
from rollout_pipeline.ledger.items import GroupItem
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import CONDITION_FAILED, LedgerTable

#: DynamoDB TransactWriteItems accepts at most 100 items and 4 MB; stay below both.
TRANSACTION_MAX_ITEMS: Final = 100
TRANSACTION_MAX_BYTES: Final = 3_500_000
#: BatchGetItem reads at most 100 keys per call.
_BATCH_GET_MAX: Final = 100
_BATCH_GET_ROUNDS: Final = 8


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
    """Outcome of `GroupLedger.create_groups`.

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


class GroupLedger:
    """Group items of one ledger table, through its gateway (`table.LedgerTable`)."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    # ------------------------------------------------------------------------------------------------- reads

    def read_group(self, batch_id: str, input_id: str) -> GroupItem | None:
        """The group (strongly consistent), or None."""
        item = self.table.get(keys.group_key(batch_id, input_id))
        return GroupItem.of(item) if item else None

    def batch_groups(self, batch_id: str) -> Iterator[GroupItem]:
        """Every group of a batch, in input-id order (a paged Query, never a scan; strongly consistent)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :g)",
            "ExpressionAttributeValues": {
                ":pk": text_value(keys.batch_pk(batch_id)),
                ":g": text_value(keys.GROUP_PREFIX),
            },
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

    # ----------------------------------------------------------------------------------------------- writes

    def _group_item(self, *, exp_id: str, batch_id: str, group: GroupSpec) -> dict[str, Any]:
        """The DynamoDB item of a new group (counters empty)."""
        item: dict[str, Any] = {
            **keys.group_key(batch_id, group.input_id),
            "exp_id": text_value(exp_id),
            "batch_id": text_value(batch_id),
            "input_id": text_value(group.input_id),
            "line": int_value(group.line),
            "group_size": int_value(group.group_size),
            "overrides": text_value(group.overrides_json),
            "terminal": int_value(0),
            "rewards": {"M": {}},
            "failures": {"M": {}},
            "created_at": text_value(self.table.now_iso()),
            keys.TTL_ATTRIBUTE: int_value(self.table.expires_at()),
        }
        if group.payload_ref is not None:
            item["payload_ref"] = text_value(group.payload_ref)
        else:
            item["payload"] = text_value(group.payload_json if group.payload_json is not None else "{}")
        if group.target is not None:
            item["target"] = int_value(group.target)
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
                            "TableName": self.table.name,
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
                raise LedgerError(f"batch {batch_id}: group transaction cancelled: {reasons}")
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

    # ------------------------------------------------------------------------------------------------ claims

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
