"""The rollout state machine: rollout items and their conditional transitions (see docs/lifecycle.md).

Every transition is one conditional write or one DynamoDB transaction keyed on the rollout's `(state, attempt)`:
a duplicated or stale delivery fails the condition and changes nothing. The transactions that end a rollout also
free its session slot (when it held one), bump the group and batch counters and write a new outbox entry
(`ledger.outbox`), so the side effects (publish, stop session, enqueue the retry) can always be finished later by
whoever finds them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from enum import StrEnum
from typing import Any, Final

from rollout_pipeline.contracts import iso
from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import plain_values
from rollout_pipeline.ledger.items import (
    RolloutRecord,
    RolloutState,
    RolloutSummary,
    Terminal,
    epoch_ms,
    span_attribute,
)
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.outbox import OUTBOX_ENQUEUE, OUTBOX_LEASE_S, OUTBOX_PUBLISH, OUTBOX_STOP, new_entry
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import ItemChange, LedgerTable, reason_codes
from rollout_pipeline.ledger.warm import WarmLedger

QUEUED: Final = RolloutState.QUEUED
DISPATCHED: Final = RolloutState.DISPATCHED
SUCCEEDED: Final = RolloutState.SUCCEEDED
FAILED: Final = RolloutState.FAILED

#: Upper bound on the (1 MB) pages of one read of a batch's rollouts for the SDK and the CLI (bounded work).
MAX_READ_PAGES: Final = 2_000


def slot_holder(ref: AttemptRef) -> str:
    """The name a rollout attempt's session slot is given back under (`LimitLedger.free_slot` spreads the
    slots it gives back over the counters by it)."""
    return f"{ref.batch_id}/{ref.input_id}#{ref.index}@{ref.attempt}"


def _cost_adds(outcome: Terminal) -> dict[str, float]:
    """The cost sums a terminal transition ADDs to its group item and its batch's counter shard
    (`items.COST_COUNTERS`); none without a cost."""
    cost = outcome.cost
    if cost is None:
        return {}
    return {
        "cost_usd": cost.usd,
        "cost_memory_usd": cost.agentcore_memory_usd,
        "cost_cpu_usd": cost.agentcore_cpu_usd,
        "cost_pipeline_usd": cost.pipeline_usd,
        "cost_rollouts": 1,
        "cost_cpu_measured": 1 if cost.cpu == "measured" else 0,
    }


class DispatchStart(StrEnum):
    """Outcome of `begin_dispatch`."""

    STARTED = "started"  # slot acquired and the rollout is dispatched(attempt n)
    NO_SLOT = "no_slot"  # every session slot is taken: wait and try again
    CANCELLED = "cancelled"  # the batch is cancelled (or unknown)
    NOT_DISPATCHABLE = "not_dispatchable"  # the rollout is not queued for this attempt: read it and decide
    WARM_TAKEN = "warm_taken"  # the warm session asked for is no longer idle (another dispatch took it, or stopped)


def _dispatch_refused(reasons: Sequence[str], *, warm: bool) -> DispatchStart:
    """Why a dispatch transaction was cancelled, from its reasons (the cancel-flag copy first, the session's
    items next, the rollout last)."""
    batch_r, session_r, rollout_r = reasons[0], reasons[1], reasons[-1]
    if rollout_r == "ConditionalCheckFailed":
        return DispatchStart.NOT_DISPATCHABLE
    if batch_r == "ConditionalCheckFailed":
        return DispatchStart.CANCELLED
    if session_r == "ConditionalCheckFailed":
        return DispatchStart.WARM_TAKEN if warm else DispatchStart.NO_SLOT
    raise LedgerError(f"dispatch transaction cancelled: {reasons}")


# ------------------------------------------------------------------------------------------------- the ledger


class RolloutLedger:
    """The rollout state machine and its outbox: the rollout items of one ledger table and their conditional
    transitions, through the table's gateway (`table.LedgerTable`). The transitions that take or give back a
    session slot put `limits`' slot items into their transactions; a dispatch into a warm session puts `warm`'s
    claim into its transaction instead."""

    def __init__(self, table: LedgerTable, limits: LimitLedger, warm: WarmLedger | None = None) -> None:
        self.table = table
        self.table_name = table.name
        self.limits = limits
        self.warm = warm if warm is not None else WarmLedger(table, limits)

    # ---------------------------------------------------------------------------------------------- reads

    def get_rollout(self, batch_id: str, input_id: str, index: int) -> RolloutRecord | None:
        """The rollout item, typed (strongly consistent), or None (never dispatched nor ended)."""
        item = self.table.get(keys.rollout_key(batch_id, input_id, index))
        return RolloutRecord.of(item) if item else None

    def _iter_prefix(
        self,
        batch_id: str,
        prefix: str,
        page_size: int | None = 100,
        *,
        attributes: Sequence[str] = (),
        max_pages: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The (typed) rollout items of one batch partition whose sort key starts with `prefix` (`R#...`); only
        `attributes` when given; `page_size` items a page (None: DynamoDB's 1 MB pages), at most `max_pages`
        pages when given."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": plain_values({":pk": keys.batch_pk(batch_id), ":prefix": prefix}),
            "ConsistentRead": True,
        }
        if page_size is not None:
            request["Limit"] = page_size
        if attributes:  # names, not values: several attribute names are DynamoDB reserved words (`state`)
            names = {f"#p{i}": name for i, name in enumerate(attributes)}
            request["ProjectionExpression"] = ", ".join(names)
            request["ExpressionAttributeNames"] = names
        yield from self.table.query(request, max_pages=max_pages)

    def _batch_rollout_items(self, batch_id: str, *, attributes: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
        """Every rollout item of a batch (never-dispatched rollouts have none), at most `MAX_READ_PAGES` pages of
        1 MB: bounded work whatever the batch size."""
        return self._iter_prefix(batch_id, keys.ROLLOUT_PREFIX, None, attributes=attributes, max_pages=MAX_READ_PAGES)

    def batch_rollouts(self, batch_id: str) -> Iterator[RolloutRecord]:
        """Every dispatched rollout of a batch, whole and typed (bounded work: `MAX_READ_PAGES`)."""
        for item in self._batch_rollout_items(batch_id):
            yield RolloutRecord.of(item)

    def rollout_summaries(self, batch_id: str, *, states_only: bool = False) -> Iterator[RolloutSummary]:
        """Every dispatched rollout of a batch, typed (`items.RolloutSummary`); `states_only` reads the state alone."""
        for item in self._batch_rollout_items(batch_id, attributes=("state",) if states_only else ()):
            yield RolloutSummary.of(item)

    def iter_rollouts(self, batch_id: str, input_id: str) -> Iterator[RolloutRecord]:
        """Every rollout item of one group."""
        for item in self._iter_prefix(batch_id, f"{keys.ROLLOUT_PREFIX}{input_id}#"):
            yield RolloutRecord.of(item)

    def query_due(
        self, index_name: str, shard: int, before_epoch: int, *, limit: int = 50, max_pages: int = 4
    ) -> list[RolloutRecord]:
        """Rollouts in a sparse GSI shard whose sort key (epoch) is below `before_epoch`; bounded pages."""
        pk_attr, sk_attr, prefix = (
            (keys.DEADLINE_PK, keys.DEADLINE_SK, "DL#")
            if index_name == keys.DEADLINE_INDEX
            else (keys.OUTBOX_PK, keys.OUTBOX_SK, "OB#")
        )
        request: dict[str, Any] = {
            "IndexName": index_name,
            "KeyConditionExpression": "#p = :p AND #s < :s",
            "ExpressionAttributeNames": {"#p": pk_attr, "#s": sk_attr},
            "ExpressionAttributeValues": plain_values({":p": f"{prefix}{shard}", ":s": before_epoch}),
            "Limit": limit,
        }
        return [RolloutRecord.of(item) for item in self.table.query(request, max_pages=max_pages)]

    # ---------------------------------------------------------------------------------------- transitions

    def begin_dispatch(
        self,
        *,
        exp_id: str,
        batch_id: str,
        input_id: str,
        index: int,
        attempt: int,
        session_id: str,
        submitted_at: str,
        deadline: int,
        max_sessions: int,
        policy_version: str | None,
        batch_policy_version: str | None = None,
        slot_shard: int = 0,
        warmed_at: float | None = None,
    ) -> DispatchStart:
        """Acquire a session slot and move the rollout to dispatched(attempt), in one transaction.

        Conditions: the batch is not cancelled (the rollout's copy of its cancel flag, `keys.control_shard_key`);
        slot counter `slot_shard` is below its cap (`LimitLedger.take_slot`); the rollout has no item yet (attempt
        1) or is queued for exactly this attempt, so a redelivered message never starts a second session.
        `batch_policy_version` (the batch's) is kept only when it differs from `policy_version`.
        `warmed_at` (epoch s): `session_id` is a warm session of the pool, started then: the transaction takes it
        instead of a slot (`WarmLedger.claim_ops`: it must still be idle, and keeps its slot), and the rollout
        records when its session started (`session_warmed_at`).
        """
        keep_batch_pv = batch_policy_version is not None and batch_policy_version != policy_version
        rollout_cond = "(#st = :queued AND attempt = :attempt)"
        if attempt == 1:
            rollout_cond = f"attribute_not_exists(pk) OR {rollout_cond}"
        batch_check = {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": keys.control_shard_key(batch_id, input_id, index),
                "ConditionExpression": "attribute_not_exists(cancelled_at)",
            }
        }
        rollout_update = self.table.update_op(
            keys.rollout_key(batch_id, input_id, index),
            "SET #st = :dispatched, attempt = :attempt, session_id = :sid, exp_id = :exp, batch_id = :batch, "
            "input_id = :input, #ix = :index, submitted_at = if_not_exists(submitted_at, :submitted), "
            "dispatched_at = :now, deadline = :deadline, #dlpk = :dlpk, #dlsk = :deadline, expires_at = :ttl, "
            "policy_version = :pv"
            + (", batch_policy_version = :bpv" if keep_batch_pv else "")
            + (", session_warmed_at = :warmed" if warmed_at is not None else "")
            + " REMOVE invoked_at"
            + ("" if keep_batch_pv else ", batch_policy_version")
            + ("" if warmed_at is not None else ", session_warmed_at"),
            rollout_cond,
            {
                ":queued": QUEUED,
                ":dispatched": DISPATCHED,
                ":attempt": attempt,
                ":sid": session_id,
                ":exp": exp_id,
                ":batch": batch_id,
                ":input": input_id,
                ":index": index,
                ":submitted": submitted_at,
                ":now": self.table.now_iso(),
                ":deadline": deadline,
                ":dlpk": keys.deadline_pk(batch_id, input_id, index),
                ":ttl": self.table.expires_at(),
                ":pv": policy_version,
                **({":bpv": batch_policy_version} if keep_batch_pv else {}),
                **({":warmed": warmed_at} if warmed_at is not None else {}),
            },
            {"#st": "state", "#ix": "index", "#dlpk": keys.DEADLINE_PK, "#dlsk": keys.DEADLINE_SK},
        )
        if warmed_at is not None:
            ref = AttemptRef(batch_id, input_id, index, attempt)
            session_ops = self.warm.claim_ops(session_id, ref, warmed_at=warmed_at)
        else:
            session_ops = [self.limits.take_slot(max_sessions, slot_shard)]
        reasons = self.table.transact([batch_check, *session_ops, {"Update": rollout_update}])
        if reasons is None:
            return DispatchStart.STARTED
        return _dispatch_refused(reason_codes(reasons), warm=warmed_at is not None)

    def mark_invoked(self, ref: AttemptRef) -> bool:
        """Record that InvokeAgentRuntime succeeded; False if the attempt is no longer dispatched (cancel/late)."""
        return (
            self.table.update(
                keys.rollout_key(ref.batch_id, ref.input_id, ref.index),
                "SET invoked_at = :now",
                "#st = :dispatched AND attempt = :attempt",
                {":now": self.table.now_iso(), ":dispatched": DISPATCHED, ":attempt": ref.attempt},
                {"#st": "state"},
            )
            is not None
        )

    def undo_dispatch(self, ref: AttemptRef) -> bool:
        """Give the slot back after ACR kept throttling: dispatched(n) without invoke -> queued(n), in_flight -1."""
        update = self.table.update_op(
            keys.rollout_key(ref.batch_id, ref.input_id, ref.index),
            "SET #st = :queued REMOVE dispatched_at, deadline, #dlpk, #dlsk",
            "#st = :dispatched AND attempt = :attempt AND attribute_not_exists(invoked_at)",
            {":queued": QUEUED, ":dispatched": DISPATCHED, ":attempt": ref.attempt},
            {"#st": "state", "#dlpk": keys.DEADLINE_PK, "#dlsk": keys.DEADLINE_SK},
        )
        return self.table.transact([{"Update": update}, self.limits.free_slot(slot_holder(ref))]) is None

    def drop_warm(
        self, ref: AttemptRef, session_id: str, *, next_session_id: str, hold_slot_until: int
    ) -> RolloutRecord | None:
        """The warm session `session_id` attempt `ref` was dispatched into is dead (its invoke answered NotFound,
        was rejected or kept failing; it never started the rollout): dispatched(n) -> queued(n) on
        `next_session_id` (the attempt's own), the attempt kept. The warm session is not given back to the pool:
        its stop goes into the outbox and its slot stays held until the stop is confirmed (`free_stopped`), or
        `hold_slot_until` (epoch s). Returns the rollout as written, None when it moved on meanwhile (not
        dispatched in that session, or invoked)."""
        attributes = self.table.update(
            keys.rollout_key(ref.batch_id, ref.input_id, ref.index),
            "SET #st = :queued, session_id = :next, #obpk = :obpk, #obsk = :obsk, outbox_id = :obid, "
            "outbox_lease = :oblease, held_until = :held "
            "ADD outbox :stop, stop_sessions :s, held_slots :s "
            "REMOVE dispatched_at, invoked_at, deadline, #dlpk, #dlsk, session_warmed_at",
            "#st = :dispatched AND attempt = :attempt AND session_id = :sid AND attribute_not_exists(invoked_at)",
            {
                ":queued": QUEUED,
                ":dispatched": DISPATCHED,
                ":attempt": ref.attempt,
                ":sid": session_id,
                ":next": next_session_id,
                ":held": hold_slot_until,
                ":stop": {OUTBOX_STOP},
                ":s": {session_id},
                **new_entry(ref, self.table.epoch()),
            },
            {
                "#st": "state",
                "#dlpk": keys.DEADLINE_PK,
                "#dlsk": keys.DEADLINE_SK,
                "#obpk": keys.OUTBOX_PK,
                "#obsk": keys.OUTBOX_SK,
            },
            return_values="ALL_NEW",
        )
        return None if attributes is None else RolloutRecord.of(attributes)

    def finish(
        self,
        ref: AttemptRef,
        *,
        exp_id: str,
        from_state: str | None,
        outcome: Terminal,
        outbox: frozenset[str],
        session_id: str | None = None,
        policy_version: str | None = None,
        hold_slot_until: int | None = None,
    ) -> bool:
        """The one terminal transition of a rollout, with its counters, freed slot and outbox, atomically.

        `from_state`: DISPATCHED (frees the slot), QUEUED, or None (no item yet: cancel before dispatch).
        `hold_slot_until` (with DISPATCHED and `session_id`): keep the slot for the session instead, and stop it
        through the outbox; `free_stopped` frees the slot once the stop is confirmed, or after that epoch.
        Returns False when the condition failed (another delivery already moved the rollout).
        """
        change = self._terminal_change(
            ref,
            exp_id=exp_id,
            from_state=from_state,
            outcome=outcome,
            outbox=outbox,
            session_id=session_id,
            policy_version=policy_version,
            hold_slot_until=hold_slot_until,
        )
        return self._finish(ref, change, outcome, from_state=from_state)

    def finish_dispatched(
        self,
        rec: RolloutRecord,
        *,
        outcome: Terminal,
        outbox: frozenset[str],
        hold_slot_until: int | None = None,
        exp_id: str | None = None,
    ) -> RolloutRecord | None:
        """`finish` from the dispatched attempt `rec` (the item as just read) is at, its session `rec.session_id`
        (`exp_id`: the experiment to record, `rec.exp_id` when not given).
        Returns the rollout as the transaction left it, or None when the condition failed: the item as read with
        the transaction's own change applied (one `ItemChange` makes both the update and this record). Read again
        only when `rec` had an entry or stops of its own pending (whose writers may have changed them since)."""
        change = self._terminal_change(
            rec.ref,
            exp_id=exp_id or rec.exp_id,
            from_state=DISPATCHED,
            outcome=outcome,
            outbox=outbox,
            session_id=rec.session_id,
            hold_slot_until=hold_slot_until,
        )
        if not self._finish(rec.ref, change, outcome, from_state=DISPATCHED):
            return None
        if rec.outbox or rec.outbox_id or rec.stop_sessions or rec.held_slots or not rec.stored:
            return self.get_rollout(rec.batch_id, rec.input_id, rec.index)
        return RolloutRecord.of_values(change.applied(rec.stored))

    def _finish(self, ref: AttemptRef, change: ItemChange, outcome: Terminal, *, from_state: str | None) -> bool:
        """The terminal transaction: the rollout item's `change`, the group and batch counters, the slot freed
        unless the change holds it for its session."""
        update, names, values = change.expression()
        condition = "attribute_not_exists(pk)"
        if from_state is not None:
            condition = "#st = :from AND attempt = :attempt"
            names["#st"] = "state"
            values |= {":from": from_state, ":attempt": ref.attempt}
        rollout = self.table.update_op(
            keys.rollout_key(ref.batch_id, ref.input_id, ref.index), update, condition, values, names
        )
        items: list[dict[str, Any]] = [
            {"Update": rollout},
            {"Update": self._group_outcome(ref, outcome)},
            {"Update": self._batch_counts(ref, outcome, int(change.sets[keys.TTL_ATTRIBUTE]))},
        ]
        if from_state == DISPATCHED and "held_slots" not in change.adds:
            items.append(self.limits.free_slot(slot_holder(ref)))
        return self.table.transact_guarded(items, f"terminal transaction for {ref.batch_id}/{ref.input_id}#{ref.index}")

    def _terminal_change(
        self,
        ref: AttemptRef,
        *,
        exp_id: str,
        from_state: str | None,
        outcome: Terminal,
        outbox: frozenset[str],
        session_id: str | None,
        policy_version: str | None = None,
        hold_slot_until: int | None = None,
    ) -> ItemChange:
        """The rollout item's part of `finish`: terminal state and outcome, the deadline index left, a new outbox
        entry (`hold_slot_until`, with DISPATCHED and a session: the session keeps its slot until its stop is
        confirmed, its stop in the entry)."""
        hold = hold_slot_until is not None and from_state == DISPATCHED and bool(session_id)
        now = self.table.epoch()
        sets: dict[str, Any] = {
            "state": outcome.state,
            "finished_at": iso(outcome.finished_at),
            "exp_id": exp_id,
            "batch_id": ref.batch_id,
            "input_id": ref.input_id,
            "index": ref.index,
            "attempt": ref.attempt,
            keys.TTL_ATTRIBUTE: now + self.table.ttl_s,
            keys.OUTBOX_PK: keys.outbox_pk(ref.batch_id, ref.input_id, ref.index),
            keys.OUTBOX_SK: now,
            "outbox_id": secrets.token_hex(8),
            "outbox_lease": now + OUTBOX_LEASE_S,
        }
        optional = outcome.attributes()
        if from_state is None:
            optional |= {"session_id": session_id, "policy_version": policy_version}
        sets |= {attribute: value for attribute, value in optional.items() if value is not None}
        if from_state == DISPATCHED:  # the ended attempt's session: its end is `finished_at`; its CPU, or no session
            if not outcome.session_started:
                sets[span_attribute(ref.attempt, "none")] = True
            elif outcome.cpu_s is not None:
                sets[span_attribute(ref.attempt, "cpu")] = outcome.cpu_s
        # ADD, not SET: side effects still pending from an earlier transition (a throttled stop of the previous
        # attempt's session) are kept, not overwritten.
        adds = {"outbox": frozenset(outbox | {OUTBOX_PUBLISH} | ({OUTBOX_STOP} if hold else set()))}
        if hold and session_id:
            adds |= {"stop_sessions": frozenset({session_id}), "held_slots": frozenset({session_id})}
            sets["held_until"] = hold_slot_until
        return ItemChange(sets, adds, (keys.DEADLINE_PK, keys.DEADLINE_SK))

    def _group_outcome(self, ref: AttemptRef, outcome: Terminal) -> dict[str, Any]:
        """The group item's part of `finish`: one more terminal rollout, its reward or failure reason by index."""
        succeeded = outcome.state == SUCCEEDED
        costs = _cost_adds(outcome)
        cost_names = {f"#c{i}": name for i, name in enumerate(costs)}
        cost_values = {f":c{i}": value for i, value in enumerate(costs.values())}
        add_costs = "".join(f", #c{i} :c{i}" for i in range(len(costs)))
        return self.table.update_op(
            keys.group_key(ref.batch_id, ref.input_id),
            f"ADD terminal :one{add_costs} SET {'rewards' if succeeded else 'failures'}.#i = :v",
            "attribute_exists(pk)",
            {":one": 1, ":v": outcome.reward if succeeded else outcome.reason, **cost_values},
            {"#i": str(ref.index), **cost_names},
        )

    def _batch_counts(self, ref: AttemptRef, outcome: Terminal, expires_at: int) -> dict[str, Any]:
        """The batch's part of `finish`: its counters ADDed on one counter shard (created by the first ADD; the
        group's condition proves the batch exists)."""
        succeeded = outcome.state == SUCCEEDED
        adds: dict[str, float] = {"terminal": 1, "succeeded" if succeeded else "failed": 1}
        if not succeeded:
            adds[f"failed_{outcome.reason}"] = 1
        if succeeded and outcome.reward is not None:
            adds |= {"reward_sum": outcome.reward, "reward_sumsq": outcome.reward * outcome.reward, "reward_count": 1}
        adds |= _cost_adds(outcome)
        names = {f"#a{i}": name for i, name in enumerate(adds)} | {"#ttl": keys.TTL_ATTRIBUTE}
        values: dict[str, Any] = {f":a{i}": value for i, value in enumerate(adds.values())}
        values[":ttl"] = expires_at
        return self.table.update_op(
            keys.batch_count_key(ref.batch_id, keys.count_shard(ref.input_id)),
            f"ADD {', '.join(f'#a{i} :a{i}' for i in range(len(adds)))} SET #ttl = if_not_exists(#ttl, :ttl)",
            None,
            values,
            names,
        )

    def requeue_for_retry(
        self,
        rec: RolloutRecord,
        *,
        next_session_id: str,
        stop_pending: bool,
        hold_slot_until: int | None = None,
    ) -> bool:
        """A timed-out attempt with attempts left: dispatched(n) -> queued(n+1), slot freed, outbox enqueue.
        `hold_slot_until`: keep the slot for the old session until its stop is confirmed (see `finish`)."""
        hold = hold_slot_until is not None and bool(rec.session_id)
        stop_pending = stop_pending or hold
        outbox = {OUTBOX_ENQUEUE} | ({OUTBOX_STOP} if stop_pending else set())
        values: dict[str, Any] = {
            ":queued": QUEUED,
            ":dispatched": DISPATCHED,
            ":attempt": rec.attempt,
            ":next": rec.attempt + 1,
            ":sid": next_session_id,
            ":outbox": outbox,
            **new_entry(rec.ref, self.table.epoch()),
        }
        adds = "outbox :outbox"
        if stop_pending and rec.session_id:
            adds += ", stop_sessions :prev"
            values[":prev"] = {rec.session_id}
        held = ""
        if hold:
            adds += ", held_slots :prev"
            held = ", held_until = :held_until"
            values[":held_until"] = hold_slot_until
        # The ended attempt's session facts, copied before its dispatch time and deadline go (`items.SPAN_PARTS`).
        span = ""
        span_names: dict[str, str] = {}
        if rec.dispatched_at is not None:
            span = ", #sstart = :sstart, #sdue = :sdue, #send = :ended"
            values |= {
                ":sstart": iso(rec.dispatched_at),
                ":sdue": rec.deadline or 0,
                ":ended": epoch_ms(self.table.clock.now()),
            }
            span_names = {f"#s{part}": span_attribute(rec.attempt, part) for part in ("start", "due", "end")}
        update = self.table.update_op(
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            "SET #st = :queued, attempt = :next, session_id = :sid, "
            f"#obpk = :obpk, #obsk = :obsk, outbox_id = :obid, outbox_lease = :oblease{held}{span} "
            f"ADD {adds} REMOVE dispatched_at, invoked_at, deadline, #dlpk, #dlsk",
            "#st = :dispatched AND attempt = :attempt",
            values,
            {
                "#st": "state",
                "#dlpk": keys.DEADLINE_PK,
                "#dlsk": keys.DEADLINE_SK,
                "#obpk": keys.OUTBOX_PK,
                "#obsk": keys.OUTBOX_SK,
                **span_names,
            },
        )
        if hold:
            return self.table.transact([{"Update": update}]) is None
        return self.table.transact([{"Update": update}, self.limits.free_slot(slot_holder(rec.ref))]) is None
