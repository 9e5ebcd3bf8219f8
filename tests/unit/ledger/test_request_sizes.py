"""Request size guards count what AWS counts: UTF-8 bytes (DynamoDB transactions, PutEvents calls)."""

from __future__ import annotations

import json

from rollout_pipeline.adapters.eventbridge import PUT_EVENTS_MAX_BYTES, entry_size, put_events_batches
from rollout_pipeline.ledger.groups import TRANSACTION_MAX_BYTES, GroupSpec
from rollout_pipeline.ledger.ledger import Ledger


def test_group_transactions_stay_under_the_limit_in_utf8_bytes() -> None:
    payload = json.dumps({"text": "€" * 30_000}, ensure_ascii=False)  # 30k characters, 90k bytes
    groups = [GroupSpec(f"g{i}", i + 1, 1, payload_json=payload) for i in range(100)]
    chunks = list(Ledger.open("t").groups._transaction_chunks("exp", "batch", groups))
    assert len(chunks) > 1
    for chunk in chunks:
        assert sum(len((g.payload_json or "").encode()) for g, _ in chunk) <= TRANSACTION_MAX_BYTES
    assert sum(len(chunk) for chunk in chunks) == 100


def _entry(detail_bytes: int, char: str = "x") -> dict[str, object]:
    detail = json.dumps({"blob": char * (detail_bytes // len(char.encode()))}, ensure_ascii=False)
    return {"Source": "rollouts", "DetailType": "Rollout Completed", "Detail": detail, "Resources": []}


def test_put_events_calls_stay_under_one_megabyte_and_ten_entries() -> None:
    entries = [_entry(200_000, "é") for _ in range(10)] + [_entry(100) for _ in range(15)]
    batches = put_events_batches(entries)
    assert [e for batch in batches for e in batch] == entries  # order kept, nothing lost
    for batch in batches:
        assert len(batch) <= 10
        assert sum(entry_size(e) for e in batch) <= PUT_EVENTS_MAX_BYTES
    assert len(batches) >= 4


def test_entry_size_counts_utf8_bytes() -> None:
    entry = {"Source": "s", "DetailType": "d", "Detail": "é" * 10, "Time": "now", "Resources": ["r"]}
    assert entry_size(entry) == 14 + 1 + 1 + 20 + 1
