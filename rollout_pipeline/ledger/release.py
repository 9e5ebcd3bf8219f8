"""The release window's ledger items: the experiment's window and each batch's groups waiting for release.

`RELEASE` / `WINDOW` (one per experiment, the window item): `version` (every write adds one and is conditional on
the version read, so concurrent releases never both advance), one attribute per batch the window holds work of,
`B#{batch}` (a map, `WindowEntry`: `created` the batch's creation time, `released` rollouts released, `line` the line
of the last group released, `added` the last line handed to the window, `chunk` the pending item holding the next
group, `terminal` the batch's terminal rollouts as last counted, `total` its rollouts once ingestion ended), and,
while a release is being sent, `sending` (JSON `[[batch, [input ids]], ...]`) with `lease_until` (epoch s): a
release whose sender crashed is recovered from these once the lease has expired.

`B#{batch}` / `P#{first line}`: groups `[input_id, line, group_size]` in line order that were not released when
ingestion handed them over (`groups`, JSON), written once (a resumed chunk writes the same groups again: a look
ahead skips lines it has already given).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import item_values
from rollout_pipeline.ledger.table import LedgerTable

#: The window item's key.
WINDOW_KEY: Final = {keys.PK: {"S": "RELEASE"}, keys.SK: {"S": "WINDOW"}}
#: The window item's attribute of one batch is this prefix and the batch id.
ENTRY_PREFIX: Final = keys.BATCH_PK_PREFIX
#: The last pending item's sort key is below this one (lines are zero-padded digits).
_PENDING_END: Final = f"{keys.PENDING_PREFIX}~"
#: Groups per pending item at most (an input id is at most 128 characters: ~150 bytes a group, 400 KB an item).
PENDING_ITEM_GROUPS: Final = 1000
#: Pages (of two pending items, up to 1000 groups each) one look ahead reads at most.
_PENDING_PAGES: Final = 8


def pending_sk(first_line: int) -> str:
    """The sort key of the pending item whose first group is on `first_line`."""
    return f"{keys.PENDING_PREFIX}{first_line:012d}"


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """One accepted group handed to the window."""

    input_id: str
    line: int
    group_size: int


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One batch's place in the window (see the module doc)."""

    #: The batch's creation (ISO-8601): batches release in this order, and their messages carry it.
    created: str
    released: int = 0
    line: int = 0
    added: int = 0
    chunk: str = pending_sk(0)
    terminal: int = 0
    total: int | None = None

    @property
    def in_flight(self) -> int:
        """Rollouts released and not yet terminal, as last counted."""
        return max(0, self.released - self.terminal)

    @property
    def pending(self) -> bool:
        """Groups handed to the window are left to release."""
        return self.added > self.line

    @property
    def done(self) -> bool:
        """Ingestion ended, every rollout released and terminal: the batch leaves the window."""
        return self.total is not None and self.released >= self.total and self.terminal >= self.released

    def _values(self) -> dict[str, Any]:
        """The entry as the window item stores it."""
        stored: dict[str, Any] = {
            "created": self.created,
            "released": self.released,
            "line": self.line,
            "added": self.added,
            "chunk": self.chunk,
            "terminal": self.terminal,
        }
        if self.total is not None:
            stored["total"] = self.total
        return stored

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> WindowEntry:
        total = stored.get("total")
        return cls(
            created=str(stored.get("created") or ""),
            released=int(stored.get("released") or 0),
            line=int(stored.get("line") or 0),
            added=int(stored.get("added") or 0),
            chunk=str(stored.get("chunk") or pending_sk(0)),
            terminal=int(stored.get("terminal") or 0),
            total=None if total is None else int(total),
        )


#: Groups being sent, by batch (input ids in line order).
Sending = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class WindowState:
    """The window item as read (or as this process last wrote it)."""

    version: int = 0
    entries: Mapping[str, WindowEntry] = field(default_factory=dict)
    sending: Sending = ()
    lease_until: int = 0
    #: The item exists (its first write creates it).
    exists: bool = False

    @property
    def in_flight(self) -> int:
        """Rollouts of every batch released and not yet terminal, as last counted."""
        return sum(entry.in_flight for entry in self.entries.values())

    def in_order(self) -> list[tuple[str, WindowEntry]]:
        """The entries in release order: the batches' creation, then their ids."""
        return sorted(self.entries.items(), key=lambda pair: (pair[1].created, pair[0]))

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> WindowState:
        if not raw:
            return cls()
        item = item_values(raw)
        sending = item.get("sending")
        return cls(
            version=int(item.get("version") or 0),
            entries={
                name.removeprefix(ENTRY_PREFIX): WindowEntry.of(value)
                for name, value in item.items()
                if name.startswith(ENTRY_PREFIX) and isinstance(value, Mapping)
            },
            sending=tuple((str(b), tuple(str(i) for i in ids)) for b, ids in json.loads(sending)) if sending else (),
            lease_until=int(item.get("lease_until") or 0),
            exists=True,
        )


class ReleaseLedger:
    """The release window's items of one ledger table, through its gateway (`table.LedgerTable`)."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    def epoch(self) -> int:
        """The ledger's clock, in epoch seconds."""
        return self.table.epoch()

    # ----------------------------------------------------------------------------------------------- reads

    def read_window(self) -> WindowState:
        """The window item (strongly consistent); an empty state before its first write."""
        return WindowState.of(self.table.get(WINDOW_KEY))

    def next_groups(
        self, batch_id: str, entry: WindowEntry, *, max_groups: int = 1000
    ) -> Iterator[tuple[str, PendingGroup]]:
        """The pending groups after the entry's last released line, in line order, each with the sort key of its
        pending item (pending items from `entry.chunk` on, paged, bounded; a line given once is never given
        again, so overlapping items written by a resumed chunk release nothing twice)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :from AND :to",
            "ExpressionAttributeValues": {
                ":pk": {"S": keys.batch_pk(batch_id)},
                ":from": {"S": entry.chunk},
                ":to": {"S": _PENDING_END},
            },
            "ConsistentRead": True,
            "Limit": 2,
        }
        given, last_line = 0, entry.line
        for item in self.table.query(request, max_pages=_PENDING_PAGES):
            for input_id, line, group_size in json.loads(item["groups"]["S"]):
                if int(line) <= last_line:
                    continue
                last_line = int(line)
                yield item[keys.SK]["S"], PendingGroup(str(input_id), int(line), int(group_size))
                given += 1
                if given >= max_groups:
                    return

    # ---------------------------------------------------------------------------------------------- writes

    def put_pending(self, batch_id: str, groups: Sequence[PendingGroup]) -> str:
        """Record groups (line order) as pending; returns the sort key of the first pending item written."""
        ordered = sorted(groups, key=lambda g: g.line)
        for start in range(0, len(ordered), PENDING_ITEM_GROUPS):  # well under DynamoDB's 400 KB per item
            part = ordered[start : start + PENDING_ITEM_GROUPS]
            self.table.ddb.put_item(
                TableName=self.table.name,
                Item={
                    keys.PK: {"S": keys.batch_pk(batch_id)},
                    keys.SK: {"S": pending_sk(part[0].line)},
                    "groups": {"S": json.dumps([[g.input_id, g.line, g.group_size] for g in part])},
                    keys.TTL_ATTRIBUTE: {"N": str(self.table.expires_at())},
                },
            )
        return pending_sk(ordered[0].line)

    def write_window(
        self,
        read: WindowState,
        *,
        entries: Mapping[str, WindowEntry] | None = None,
        removed: Sequence[str] = (),
        sending: Sending = (),
        lease_s: int = 0,
        lease_until: int | None = None,
    ) -> WindowState | None:
        """Write the window as it follows from `read`: `entries` set (each whole), `removed` dropped, `sending`
        recorded with a lease of `lease_s` from now (or until `lease_until`, to keep one) or cleared, the version
        moved on; conditional on `read`'s version. Returns the state written, or None when another release wrote
        first (read again)."""
        if sending and lease_until is None:
            lease_until = self.table.epoch() + lease_s
        entries = dict(entries or {})
        values: dict[str, Any] = {":next": read.version + 1}
        names: dict[str, str] = {"#v": "version"}
        sets = ["#v = :next"]
        for number, (batch_id, entry) in enumerate(entries.items()):
            names[f"#e{number}"] = f"{ENTRY_PREFIX}{batch_id}"
            values[f":e{number}"] = entry._values()
            sets.append(f"#e{number} = :e{number}")
        removes = []
        for number, batch_id in enumerate(removed):
            names[f"#r{number}"] = f"{ENTRY_PREFIX}{batch_id}"
            removes.append(f"#r{number}")
        if sending:
            values[":sending"] = json.dumps([[batch_id, list(ids)] for batch_id, ids in sending])
            values[":lease"] = lease_until
            sets += ["sending = :sending", "lease_until = :lease"]
        else:
            removes += ["sending", "lease_until"]
        condition = "attribute_not_exists(#v)"
        if read.exists:
            condition = "#v = :read"
            values[":read"] = read.version
        update = f"SET {', '.join(sets)}" + (f" REMOVE {', '.join(removes)}" if removes else "")
        if self.table.update(WINDOW_KEY, update, condition, values, names) is None:
            return None
        after = {k: v for k, v in read.entries.items() if k not in removed} | entries
        return WindowState(read.version + 1, after, sending, (lease_until or 0) if sending else 0, exists=True)

    def confirm(self, written: WindowState) -> bool:
        """The release recorded in `written` was sent: forget it, conditional on its lease (writes that kept the
        record in between do not stop it; a release that took it over, with a lease of its own, does)."""
        done = self.table.update(
            WINDOW_KEY,
            "SET #v = #v + :one REMOVE sending, lease_until",
            "lease_until = :lease",
            {":one": 1, ":lease": written.lease_until},
            {"#v": "version"},
        )
        return done is not None
