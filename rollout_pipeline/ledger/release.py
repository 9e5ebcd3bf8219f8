"""The release window's ledger items: a batch's groups waiting for release, in line order, and its release cursor.

`B#{batch}` / `P#{first line}` (one per ingest chunk): the chunk's accepted groups as `[input_id, line, group_size]`
in line order (`groups`, JSON). Written once by ingestion (a resumed chunk writes the same content again).
`B#{batch}` / `BATCH#RELEASE` (the cursor): `window` (rollouts released and not yet terminal, at most), `released`
(rollouts released so far), `released_line` (the line of the last group released), `chunk_sk` (the pending item
holding the next group), `version` (every advance adds one: the condition of the next), and while a release is
being sent `sending` (its groups' input ids, JSON) with `lease_until` (epoch s): a releaser that crashed before
sending is recovered from these once the lease has expired. While the batch still has groups to release, the
cursor sits on the `deadline` index under partition `REL` (its sort key: the epoch of its last write), which the
sweeper queries; the deadline sweep only reads partitions `DL#{shard}`, so it never sees a cursor.

Every write is conditional on `version`, so concurrent releasers advance the cursor once; ingestion creates it with
`if_not_exists`, so a resumed ingestion never moves it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import item_values
from rollout_pipeline.ledger.table import LedgerTable

#: The `deadline` index partition of cursors with groups still to release (`keys.DEADLINE_PK`).
RELEASE_INDEX_PK: Final = "REL"
#: The last pending item's sort key is below this one (lines are zero-padded digits).
_PENDING_END: Final = f"{keys.PENDING_PREFIX}~"
#: Groups per pending item at most (an input id is at most 128 characters: ~150 bytes a group, 400 KB an item).
PENDING_ITEM_GROUPS: Final = 1000
#: Pages (of two pending items, up to 100 groups each) one look ahead reads at most.
_PENDING_PAGES: Final = 8


def pending_sk(first_line: int) -> str:
    """The sort key of the pending item whose first group is on `first_line`."""
    return f"{keys.PENDING_PREFIX}{first_line:012d}"


@dataclass(frozen=True, slots=True)
class PendingGroup:
    """One accepted group waiting for release."""

    input_id: str
    line: int
    group_size: int


@dataclass(frozen=True, slots=True)
class ReleaseCursor:
    """A batch's release cursor (see the module doc)."""

    window: int
    released: int = 0
    released_line: int = 0
    chunk_sk: str = pending_sk(0)
    version: int = 0
    sending: tuple[str, ...] = ()
    lease_until: int = 0
    #: Still on the sweeper's index (groups left to release, or not yet known to be none).
    open: bool = True

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> ReleaseCursor:
        item = item_values(raw)
        sending = item.get("sending")
        return cls(
            window=int(item.get("window") or 0),
            released=int(item.get("released") or 0),
            released_line=int(item.get("released_line") or 0),
            chunk_sk=str(item.get("chunk_sk") or pending_sk(0)),
            version=int(item.get("version") or 0),
            sending=tuple(json.loads(sending)) if sending else (),
            lease_until=int(item.get("lease_until") or 0),
            open=keys.DEADLINE_PK in item,
        )


class ReleaseLedger:
    """The release items of one ledger table, through its gateway (`table.LedgerTable`)."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table
        self.table_name = table.name

    def epoch(self) -> int:
        """The ledger's clock, in epoch seconds."""
        return self.table.epoch()

    # ------------------------------------------------------------------------------------------- ingestion

    def add_pending(self, batch_id: str, groups: Sequence[PendingGroup], *, window: int) -> None:
        """Record one ingest chunk's accepted groups (line order) as pending, and create the cursor if absent."""
        if not groups:
            return
        now = self.table.epoch()
        ordered = sorted(groups, key=lambda g: g.line)
        for start in range(0, len(ordered), PENDING_ITEM_GROUPS):  # well under DynamoDB's 400 KB per item
            part = ordered[start : start + PENDING_ITEM_GROUPS]
            self.table.ddb.put_item(
                TableName=self.table_name,
                Item={
                    keys.PK: {"S": keys.batch_pk(batch_id)},
                    keys.SK: {"S": pending_sk(part[0].line)},
                    "groups": {"S": json.dumps([[g.input_id, g.line, g.group_size] for g in part])},
                    keys.TTL_ATTRIBUTE: {"N": str(self.table.expires_at())},
                },
            )
        self.table.update(
            keys.release_key(batch_id),
            "SET #w = if_not_exists(#w, :w), released = if_not_exists(released, :zero), "
            "released_line = if_not_exists(released_line, :zero), chunk_sk = if_not_exists(chunk_sk, :first), "
            "version = if_not_exists(version, :zero), #ip = if_not_exists(#ip, :rel), "
            "#is = if_not_exists(#is, :now), #ttl = :ttl",
            None,
            {
                ":w": window,
                ":zero": 0,
                ":first": pending_sk(0),
                ":rel": RELEASE_INDEX_PK,
                ":now": now,
                ":ttl": self.table.expires_at(),
            },
            {"#w": "window", "#ip": keys.DEADLINE_PK, "#is": keys.DEADLINE_SK, "#ttl": keys.TTL_ATTRIBUTE},
        )

    # ----------------------------------------------------------------------------------------------- reads

    def cursor(self, batch_id: str) -> ReleaseCursor | None:
        """The cursor (strongly consistent), or None for a batch released all at once (no window)."""
        item = self.table.get(keys.release_key(batch_id))
        return ReleaseCursor.of(item) if item else None

    def next_groups(
        self, batch_id: str, cursor: ReleaseCursor, *, max_groups: int = 1000
    ) -> Iterator[tuple[str, PendingGroup]]:
        """The groups after the cursor in line order, each with the sort key of its pending item (pending items
        from `chunk_sk` on, paged, bounded)."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :from AND :to",
            "ExpressionAttributeValues": {
                ":pk": {"S": keys.batch_pk(batch_id)},
                ":from": {"S": cursor.chunk_sk},
                ":to": {"S": _PENDING_END},
            },
            "ConsistentRead": True,
            "Limit": 2,
        }
        given = 0
        for item in self.table.query(request, max_pages=_PENDING_PAGES):
            for input_id, line, group_size in json.loads(item["groups"]["S"]):
                if int(line) <= cursor.released_line:
                    continue
                yield item[keys.SK]["S"], PendingGroup(str(input_id), int(line), int(group_size))
                given += 1
                if given >= max_groups:
                    return

    def due(self, before_epoch: int, *, limit: int = 50, max_pages: int = 4) -> list[str]:
        """Batch ids whose cursor is open and was last written before `before_epoch` (the sweeper's backstop)."""
        request: dict[str, Any] = {
            "IndexName": keys.DEADLINE_INDEX,
            "KeyConditionExpression": "#p = :p AND #s < :s",
            "ExpressionAttributeNames": {"#p": keys.DEADLINE_PK, "#s": keys.DEADLINE_SK},
            "ExpressionAttributeValues": {":p": {"S": RELEASE_INDEX_PK}, ":s": {"N": str(before_epoch)}},
            "Limit": limit,
        }
        return [
            keys.batch_id_of(item[keys.PK]["S"])
            for item in self.table.query(request, max_pages=max_pages)
            if item[keys.SK]["S"] == keys.RELEASE_SK
        ]

    # ---------------------------------------------------------------------------------------------- writes

    def advance(
        self, batch_id: str, cursor: ReleaseCursor, groups: Sequence[PendingGroup], *, chunk_sk: str, lease_s: int
    ) -> ReleaseCursor | None:
        """Move the cursor past `groups` (line order) and record them as being sent; conditional on the cursor's
        version (None: another releaser moved it first)."""
        now = self.table.epoch()
        sending = tuple(g.input_id for g in groups)
        after = ReleaseCursor(
            window=cursor.window,
            released=cursor.released + sum(g.group_size for g in groups),
            released_line=max(cursor.released_line, *(g.line for g in groups)),
            chunk_sk=chunk_sk,
            version=cursor.version + 1,
            sending=sending,
            lease_until=now + lease_s,
        )
        done = self.table.update(
            keys.release_key(batch_id),
            "SET released = :released, released_line = :line, chunk_sk = :chunk, version = :next, "
            "sending = :sending, lease_until = :lease, #is = :now",
            "version = :version",
            {
                ":released": after.released,
                ":line": after.released_line,
                ":chunk": chunk_sk,
                ":next": after.version,
                ":sending": json.dumps(list(sending)),
                ":lease": after.lease_until,
                ":now": now,
                ":version": cursor.version,
            },
            {"#is": keys.DEADLINE_SK},
        )
        return None if done is None else after

    def retake(self, batch_id: str, cursor: ReleaseCursor, *, lease_s: int) -> ReleaseCursor | None:
        """Take over an unconfirmed release whose lease has expired (its releaser crashed or stalled before its
        messages were confirmed sent): renew the lease under a new version; None if someone else did."""
        now = self.table.epoch()
        done = self.table.update(
            keys.release_key(batch_id),
            "SET version = :next, lease_until = :lease, #is = :now",
            "version = :version AND lease_until < :now",
            {":next": cursor.version + 1, ":lease": now + lease_s, ":now": now, ":version": cursor.version},
            {"#is": keys.DEADLINE_SK},
        )
        if done is None:
            return None
        return ReleaseCursor(
            window=cursor.window,
            released=cursor.released,
            released_line=cursor.released_line,
            chunk_sk=cursor.chunk_sk,
            version=cursor.version + 1,
            sending=cursor.sending,
            lease_until=now + lease_s,
            open=cursor.open,
        )

    def confirm(self, batch_id: str, cursor: ReleaseCursor) -> bool:
        """The release of `cursor.sending` was sent: forget it (conditional on the version)."""
        done = self.table.update(
            keys.release_key(batch_id),
            "REMOVE sending, lease_until",
            "version = :version",
            {":version": cursor.version},
        )
        return done is not None

    def close(self, batch_id: str, cursor: ReleaseCursor) -> bool:
        """Nothing is left to release (every group released, or the batch cancelled): leave the sweeper's index."""
        done = self.table.update(
            keys.release_key(batch_id),
            "SET version = :next REMOVE #ip, #is",
            "version = :version",
            {":next": cursor.version + 1, ":version": cursor.version},
            {"#ip": keys.DEADLINE_PK, "#is": keys.DEADLINE_SK},
        )
        return done is not None
