"""Export a batch's results as JSON Lines, from the ledger (authoritative, complete) plus the result objects.

Why the ledger and not consumed events: events are handed to whichever consumer took them (and only once), while
the ledger holds every rollout's terminal state until its TTL (`ledger_ttl_days`), so an export is complete and
repeatable from any machine. One line per rollout, groups in input-id order, indices ascending.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, Final

from rollout_pipeline import ids
from rollout_pipeline.ledger.batches import as_group, group_payload
from rollout_pipeline.ledger.items import GroupItem, plain_item

#: Rollout item attributes copied into an export line (bookkeeping such as outbox and index keys is left out).
ROLLOUT_FIELDS: Final = (
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
)


def export_rows(
    *,
    groups: Iterator[GroupItem | Mapping[str, Any]],
    rollouts: Iterator[Mapping[str, Any]],
    fetch_result: Callable[[str], dict[str, Any] | None] | None,
    include_payload: bool = False,
) -> Iterator[dict[str, Any]]:
    """Join groups and rollout items (raw ledger items, typed or plain) into export rows.

    A rollout without a rollout item was never dispatched: its state is `queued`. With `fetch_result`, each row
    with a `result_uri` gets the result object under `result` (None if it cannot be read).
    """
    by_key: dict[tuple[str, int], dict[str, Any]] = {}
    for raw in rollouts:
        parsed = plain_item(raw)
        by_key[(str(parsed.get("input_id")), int(parsed.get("index") or 0))] = parsed
    for raw_group in groups:
        group = as_group(raw_group)
        payload, payload_ref = group_payload(group) if include_payload else (None, None)
        for index in range(group.group_size):
            item = by_key.get((group.input_id, index), {})
            row: dict[str, Any] = {
                "exp_id": group.exp_id,
                "batch_id": group.batch_id,
                "input_id": group.input_id,
                "index": index,
                "rollout_id": ids.rollout_id(group.input_id, index),
                "line": group.line,
            }
            for name in ROLLOUT_FIELDS:
                row[name] = item.get(name)
            if row["state"] is None:
                row["state"] = "queued"
            if include_payload:
                row["payload"] = payload
                if payload_ref:
                    row["payload_ref"] = payload_ref
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
