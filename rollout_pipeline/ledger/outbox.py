"""The rollout item's outbox: side effects a transition decided that still have to happen (publish its events, stop
its sessions, enqueue its retry), and the sessions that keep their slot until their stop is confirmed (see
docs/lifecycle.md, "Outbox").

A transition that decides side effects writes a new entry with them (`new_entry`: its `outbox` index keys, its id
and its writer's lease); whoever drains it (the completing worker, a redelivery, the sweeper's outbox scan) takes its
finished actions out, and the last one clears it, each write conditional on the entry's id, so a newer entry is
never cleared by a worker draining an older one. A stop confirmed (or given up on once AgentCore has ended the
session) frees the session's slot in the same write.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import RolloutRecord, epoch_ms, span_attribute
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.table import LedgerTable

#: Outbox actions: side effects decided by a transition that still have to happen.
OUTBOX_PUBLISH: Final = "publish"
OUTBOX_STOP: Final = "stop"
OUTBOX_ENQUEUE: Final = "enqueue"

#: The drainer that made a transition holds the lease of its outbox entry this long; others claim the entry only
#: after that (or once the holder gave it back after a failure), so concurrent duplicates do not publish the same
#: events again.
OUTBOX_LEASE_S: Final = 60

#: The attributes of an outbox entry (`clear_outbox` removes them all; `#obpk`/`#obsk`: the outbox index keys).
_OUTBOX_ATTRIBUTES: Final = "outbox, outbox_id, outbox_lease, stop_sessions, stop_tries, stop_not_found, #obpk, #obsk"


def new_entry(ref: AttemptRef, now_epoch: int) -> dict[str, str | int]:
    """The expression values of a new outbox entry of `ref`'s rollout written at `now_epoch`: its index keys
    (`:obpk`, `:obsk`), its id (`:obid`) and its writer's lease (`:oblease`, `OUTBOX_LEASE_S`)."""
    return {
        ":obpk": keys.outbox_pk(ref.batch_id, ref.input_id, ref.index),
        ":obsk": now_epoch,
        ":obid": secrets.token_hex(8),
        ":oblease": now_epoch + OUTBOX_LEASE_S,
    }


class OutboxLedger:
    """The outbox entries of one ledger table's rollout items and the stops they wait for, through the table's
    gateway (`table.LedgerTable`); a stop that frees a held slot puts `limits`' slot item into its write."""

    def __init__(self, table: LedgerTable, limits: LimitLedger) -> None:
        self.table = table
        self.limits = limits

    def free_stopped(
        self,
        rec: RolloutRecord,
        session_id: str,
        *,
        clear_entry: bool = False,
        confirmed: bool = True,
        spent_usd: float = 0.0,
        at: datetime | None = None,
    ) -> bool:
        """A session's stop is confirmed (`confirmed`), or the pipeline stops waiting for one (AgentCore has ended it
        by now): forget it, record when (`at`, default now: its attempt's `stop` or `closed` time) and, if it still
        held a slot, free the slot with `spent_usd` (the session's cost, `costs.price_span`) ADDed to the
        experiment's spend on the same counter, atomically and once. False if someone else did it first.

        `clear_entry`: this was the entry's last pending action (the caller holds the entry and has done the
        others): the same write also removes the entry (`clear_outbox`), conditional on `outbox_id`. If the entry
        has moved on meanwhile (a later transition set a new one) or the slot was freed already, the session is
        forgotten, its slot freed and the entry cleared as by separate writes (the newer entry stays)."""
        ended = self._session_end(rec, session_id, confirmed, at)
        if clear_entry and rec.outbox_id is not None and self._free_and_clear(rec, session_id, spent_usd, ended):
            return True
        ended_names, ended_values = ended
        key = keys.rollout_key(rec.batch_id, rec.input_id, rec.index)
        set_end = "SET #send = :send " if ended_names else ""
        values = {":s": {session_id}, **ended_values}
        if session_id not in rec.held_slots:
            self.table.update(
                key, set_end + "DELETE stop_sessions :s, stop_not_found :s", None, values, ended_names or None
            )
            freed = True
        else:
            update = self.table.update_op(
                key,
                set_end + "DELETE held_slots :s, stop_sessions :s, stop_not_found :s",
                "contains(held_slots, :sid)",
                {**values, ":sid": session_id},
                ended_names or None,
            )
            freed = (
                self.table.transact([{"Update": update}, self.limits.free_slot(session_id, spent_usd=spent_usd)])
                is None
            )
        if clear_entry:  # the combined write's condition failed: clear the entry if it is still the one read
            self.clear_outbox(rec)
        return freed

    def _session_end(
        self, rec: RolloutRecord, session_id: str, confirmed: bool, at: datetime | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """The expression names and values that record when (`at`, default now) `session_id`'s session ended (its
        attempt's `stop` when confirmed, else `closed`, epoch ms: `RolloutRecord.attempt_of`, a warm session's
        too); none for a session no attempt of `rec` can be told to have run in."""
        attempt = rec.attempt_of(session_id)
        if attempt is None:
            return {}, {}
        part = "stop" if confirmed else "closed"
        return {"#send": span_attribute(attempt, part)}, {":send": epoch_ms(at or self.table.clock.now())}

    def _free_and_clear(
        self,
        rec: RolloutRecord,
        session_id: str,
        spent_usd: float,
        ended: tuple[dict[str, str], dict[str, Any]],
    ) -> bool:
        """`free_stopped` and `clear_outbox` in one write (`ended`: `_session_end`'s names and values): False
        (nothing written) when the entry is not the one read or, with a held slot, the slot is no longer held."""
        key = keys.rollout_key(rec.batch_id, rec.input_id, rec.index)
        held = session_id in rec.held_slots
        values: dict[str, Any] = {":obid": rec.outbox_id}
        condition = "outbox_id = :obid"
        update = f"REMOVE {_OUTBOX_ATTRIBUTES}"
        if held:
            update = f"DELETE held_slots :s {update}"
            condition += " AND contains(held_slots, :sid)"
            values |= {":s": {session_id}, ":sid": session_id}
        names = {"#obpk": keys.OUTBOX_PK, "#obsk": keys.OUTBOX_SK}
        ended_names, ended_values = ended
        if ended_names:
            update = f"SET #send = :send {update}"
            names |= ended_names
            values |= ended_values
        if not held:
            return self.table.update(key, update, condition, values, names) is not None
        op = self.table.update_op(key, update, condition, values, names)
        return self.table.transact_guarded(
            [{"Update": op}, self.limits.free_slot(session_id, spent_usd=spent_usd)],
            f"freeing the slot of {session_id}",
        )

    def note_stop_failed(
        self,
        rec: RolloutRecord,
        *,
        next_epoch: int,
        not_found: Sequence[str] = (),
        overdue: Sequence[str] = (),
    ) -> None:
        """Stops of this entry failed: count the try, remember first NotFound answers and sessions found overdue
        (alive past their deadline plus the grace), take the entry's finished actions out of it (every action but
        `stop`: the caller did them before the stops), and come back to the entry at `next_epoch` (the outbox index
        sort key) with its lease given back."""
        names = {"#obsk": keys.OUTBOX_SK}
        values: dict[str, Any] = {":one": 1, ":next": next_epoch, ":obid": rec.outbox_id}
        adds = "stop_tries :one"
        if not_found:
            adds += ", stop_not_found :nf"
            values[":nf"] = set(not_found)
        if overdue:
            adds += ", overdue_sessions :od"
            values[":od"] = set(overdue)
        update = f"SET #obsk = :next ADD {adds} REMOVE outbox_lease"
        finished = rec.outbox - {OUTBOX_STOP}
        if finished:
            update += " DELETE outbox :done"
            values[":done"] = set(finished)
        self.table.update(  # a failed condition: the entry has moved on, nothing to do
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            update,
            "outbox_id = :obid",
            values,
            names,
        )

    def file_stop(self, ref: AttemptRef, session_id: str) -> None:
        """Put a session whose stop is not confirmed into the rollout's outbox (`stop`, `stop_sessions`), whatever
        state the rollout is in, so the sweeper's outbox scan stops it (`stops.finish_stops`). A new entry id: a
        worker draining an older entry cannot clear this session with it."""
        entry = new_entry(ref, self.table.epoch())
        self.table.update(
            keys.rollout_key(ref.batch_id, ref.input_id, ref.index),
            "SET #obpk = :obpk, #obsk = :obsk, outbox_id = :obid REMOVE outbox_lease "
            "ADD outbox :stop, stop_sessions :s",
            "attribute_exists(pk)",
            {":obpk": entry[":obpk"], ":obsk": entry[":obsk"], ":obid": entry[":obid"], ":stop": {OUTBOX_STOP}}
            | {":s": {session_id}},
            {"#obpk": keys.OUTBOX_PK, "#obsk": keys.OUTBOX_SK},
        )

    def outbox_done(self, rec: RolloutRecord, actions: frozenset[str]) -> None:
        """Take finished actions (publish, enqueue) out of the outbox while others (stop) are still pending."""
        if not actions or rec.outbox_id is None:
            return
        self.table.update(  # a failed condition: the entry has moved on, nothing to do
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            "DELETE outbox :done",
            "outbox_id = :obid",
            {":done": set(actions), ":obid": rec.outbox_id},
        )

    def clear_outbox(self, rec: RolloutRecord) -> bool:
        """Remove the outbox entry once its side effects are done (only the entry that was read: `outbox_id`)."""
        if rec.outbox_id is None:
            return True
        return (
            self.table.update(
                keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
                f"REMOVE {_OUTBOX_ATTRIBUTES}",
                "outbox_id = :obid",
                {":obid": rec.outbox_id},
                {"#obpk": keys.OUTBOX_PK, "#obsk": keys.OUTBOX_SK},
            )
            is not None
        )

    def claim_outbox(self, rec: RolloutRecord, lease_s: int = OUTBOX_LEASE_S) -> bool:
        """Take over an outbox entry nobody holds (lease absent or expired); False if someone else holds it."""
        if rec.outbox_id is None:
            return False
        now_epoch = self.table.epoch()
        return (
            self.table.update(
                keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
                "SET outbox_lease = :until",
                "outbox_id = :obid AND (attribute_not_exists(outbox_lease) OR outbox_lease < :now)",
                {":obid": rec.outbox_id, ":until": now_epoch + lease_s, ":now": now_epoch},
            )
            is not None
        )

    def return_outbox(self, rec: RolloutRecord, done: frozenset[str] = frozenset()) -> None:
        """Give an outbox entry back after a failed side effect, so a redelivery may drain it at once; `done`: the
        entry's actions that were performed before the failure, taken out of it in the same write."""
        if rec.outbox_id is None:
            return
        values: dict[str, Any] = {":obid": rec.outbox_id}
        update = "REMOVE outbox_lease"
        if done & rec.outbox:
            update += " DELETE outbox :done"
            values[":done"] = set(done & rec.outbox)
        self.table.update(  # a failed condition: the entry has moved on, nothing to do
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            update,
            "outbox_id = :obid",
            values,
        )
