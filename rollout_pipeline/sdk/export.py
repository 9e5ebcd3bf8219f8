"""Export a batch's results as JSON Lines, from the ledger (authoritative, complete) plus the result objects.

Why the ledger and not consumed events: events are handed to whichever consumer took them (and only once), while
the ledger holds every rollout's terminal state until its TTL (`ledger_ttl_days`), so an export is complete and
repeatable from any machine. One line per rollout, groups in input-id order, indices ascending.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import IO, Any

from rollout_pipeline import ids
from rollout_pipeline.contracts import iso
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.details import recorded_cost
from rollout_pipeline.ledger.items import GroupItem, RolloutRecord


def rollout_fields(rec: RolloutRecord | None, prices: PriceBook | None = None) -> dict[str, Any]:
    """What an export line carries of a rollout item (bookkeeping such as outbox and index keys is left out); a
    rollout without an item was never dispatched: `queued`. `cost`: what its event said it cost (with `prices`)."""

    def at(value: datetime | None) -> str | None:
        return iso(value) if value is not None else None

    if rec is None:
        return dict.fromkeys(ROLLOUT_FIELDS) | {"state": "queued"}
    return {
        "state": rec.state.value,
        "attempt": rec.attempt,
        "session_id": rec.session_id,
        "reward": rec.reward,
        "reason": rec.reason,
        "error": rec.error,
        "result_uri": rec.result_uri,
        "submitted_at": at(rec.submitted_at),
        "dispatched_at": at(rec.dispatched_at),
        "finished_at": at(rec.finished_at),
        "session_warmed_at": None
        if rec.session_warmed_at is None
        else at(datetime.fromtimestamp(rec.session_warmed_at, UTC)),
        "cost": _cost(rec, prices),
    }


#: The rollout fields of an export line, in order.
ROLLOUT_FIELDS = (
    "state",
    "attempt",
    "session_id",
    "reward",
    "reason",
    "error",
    "result_uri",
    "submitted_at",
    "dispatched_at",
    "finished_at",
    "session_warmed_at",
    "cost",
)


def _cost(rec: RolloutRecord, prices: PriceBook | None) -> dict[str, Any] | None:
    cost = None if prices is None else recorded_cost(rec, prices)
    return None if cost is None else cost.model_dump()


def export_rows(
    *,
    groups: Iterable[GroupItem],
    rollouts: Iterable[RolloutRecord],
    prices: PriceBook | None = None,
    fetch_result: Callable[[str], dict[str, Any] | None] | None,
    include_payload: bool = False,
) -> Iterator[dict[str, Any]]:
    """Join groups and rollout items into export rows.

    A rollout without a rollout item was never dispatched: its state is `queued`. With `fetch_result`, each row
    with a `result_uri` gets the result object under `result` (None if it cannot be read).
    """
    by_key = {(rec.input_id, rec.index): rec for rec in rollouts}
    for group in groups:
        for index in range(group.group_size):
            row: dict[str, Any] = {
                "exp_id": group.exp_id,
                "batch_id": group.batch_id,
                "input_id": group.input_id,
                "index": index,
                "rollout_id": ids.rollout_id(group.input_id, index),
                "line": group.line,
            }
            row.update(rollout_fields(by_key.get((group.input_id, index)), prices))
            if include_payload:
                row["payload"] = dict(group.payload) if group.payload is not None else None
                if group.payload_ref:
                    row["payload_ref"] = group.payload_ref
            if fetch_result is not None:
                uri = row.get("result_uri")
                row["result"] = fetch_result(str(uri)) if uri else None
            yield row


def write_jsonl(rows: Iterator[dict[str, Any]], out: IO[str]) -> int:
    """Write rows as JSON Lines; return how many."""
    count = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str))
        out.write("\n")
        count += 1
    return count
