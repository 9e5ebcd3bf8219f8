"""The `LIMIT` items of admission: session slots, paced call budgets, the admission board (docs/lifecycle.md,
"Limits"); the rules are the `limits` area's. The budget, policy and layout items are `ledger.experiment`'s."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_pipeline.ledger import keys, pace
from rollout_pipeline.ledger.attributes import from_attribute_value, item_values, plain_values
from rollout_pipeline.ledger.table import LedgerTable


@dataclass
class LimitsView:
    """One Query of the `LIMIT` partition: the slot counters, the admission board, the schedules, the policy version."""

    counts: list[int]
    board: list[tuple[str, int, list[str]]] = field(default_factory=list)
    paces: dict[str, dict[str, Any]] = field(default_factory=dict)
    policy_version: str | None = None


def shard_cap(max_sessions: int, shard: int) -> int:
    """The cap of session-slot counter `shard`: `max_sessions` spread over the counters (they sum to it)."""
    base, extra = divmod(max_sessions, keys.SESSION_SHARDS)
    return base + (1 if shard < extra else 0)


def free_shard(holder: str) -> int:
    """The counter a slot is given back on: spread by its holder's name, so slots given back spread as taken ones."""
    return zlib.crc32(holder.encode()) % keys.SESSION_SHARDS


def prefix_query(prefix: str) -> dict[str, Any]:
    """A strongly consistent Query of the `LIMIT` items whose sort key begins with `prefix`."""
    return {
        "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
        "ExpressionAttributeValues": plain_values({":pk": keys.LIMIT_PK, ":prefix": prefix}),
        "ConsistentRead": True,
    }


class LimitLedger:
    """Reads and conditional writes of the `LIMIT` partition, through the table's gateway."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    def take_slot(self, max_sessions: int, shard: int, count: int = 1) -> dict[str, Any]:
        """A transaction item that takes `count` session slots on counter `shard` if it stays within its cap: the caps
        sum to `max_sessions`, so the sessions in flight never exceed it."""
        return {
            "Update": self.table.update_op(
                keys.session_shard_key(shard),
                "ADD in_flight :d",
                "attribute_not_exists(in_flight) OR in_flight <= :room",
                {":d": count, ":room": shard_cap(max_sessions, shard) - count},
            )
        }

    def free_slot(self, holder: str, count: int = 1, *, spent_usd: float = 0.0) -> dict[str, Any]:
        """A transaction item that gives `count` session slots back on counter `free_shard(holder)` (any counter keeps
        the sum exact) and ADDs `spent_usd` to the experiment's spend there (`ExperimentLedger.slots_and_spend`)."""
        values: dict[str, float] = {":d": -count}
        if spent_usd > 0:
            values[":usd"] = round(spent_usd, 10)
        update = "ADD in_flight :d, spent_usd :usd" if spent_usd > 0 else "ADD in_flight :d"
        return {"Update": self.table.update_op(keys.session_shard_key(free_shard(holder)), update, None, values)}

    def slot_counts(self) -> list[int]:
        """Every session-slot counter's value, by shard (one strongly consistent Query of the counters alone: the
        board's items are up to 1 KB a dispatcher process, read units this read does not need)."""
        counts = [0] * keys.SESSION_SHARDS
        for raw in self.table.query(prefix_query(keys.SESSIONS_SHARD_PREFIX), max_pages=2):
            count_slot(counts, raw)
        return counts

    def limits_view(self) -> LimitsView:
        """The session-slot counters, the admission board, the schedules and the policy version in ONE strongly
        consistent Query (neighbouring keys)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :from AND :to",
            "ExpressionAttributeValues": plain_values(
                {
                    ":pk": keys.LIMIT_PK,
                    ":from": keys.PACE_PREFIX,
                    ":to": keys.WAIT_PREFIX[:-1] + chr(ord(keys.WAIT_PREFIX[-1]) + 1),  # past every WAIT#...
                }
            ),
            "ConsistentRead": True,
        }
        view = LimitsView(counts=[0] * keys.SESSION_SHARDS)
        for raw in self.table.query(request, max_pages=10):
            sk = str(from_attribute_value(raw["sk"]))
            if sk.startswith(keys.SESSIONS_SHARD_PREFIX):
                count_slot(view.counts, raw)
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
        """The schedule item of paced budget `budget` (`LIMIT/PACE#{budget}`), spaced by its callers or itself."""
        return pace.PaceSchedule(self.table, keys.pace_key(budget), item_spacing=item_spacing)

    def set_share(self, budget: str, interval_us: int, *, active: int, renewed_us: int, after_us: int) -> bool:
        """Give schedule `budget` the share and active sessions, if no renewal wrote it since `after_us`."""
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
        return [_board_entry(raw) for raw in self.table.query(prefix_query(keys.WAIT_PREFIX), max_pages=10)]


def count_slot(counts: list[int], raw: Mapping[str, Any]) -> None:
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
