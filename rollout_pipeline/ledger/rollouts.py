"""Rollout items, their conditional transitions, session slots and paced call budgets (see docs/lifecycle.md).

Every transition is one conditional write or one DynamoDB transaction keyed on the rollout's `(state, attempt)`:
a duplicated or stale delivery fails the condition and changes nothing. The transactions that end a rollout also
release its session slot (when it held one), bump the group and batch counters and set the outbox attributes, so
the side effects (publish, stop session, enqueue the retry) can always be finished later by whoever finds them.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from rollout_pipeline.contracts import parse_iso
from rollout_pipeline.ledger import keys, table
from rollout_pipeline.ledger.attributes import from_attribute_value
from rollout_pipeline.ledger.batches import query_batch_view
from rollout_pipeline.ledger.items import BatchItem, GroupItem, RolloutState, RolloutSummary
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.ledger.retry import TRANSACTION_CONFLICT_ATTEMPTS
from rollout_pipeline.ledger.table import LedgerTable, plain_values, reason_codes

QUEUED: Final = RolloutState.QUEUED
DISPATCHED: Final = RolloutState.DISPATCHED
SUCCEEDED: Final = RolloutState.SUCCEEDED
FAILED: Final = RolloutState.FAILED
TERMINAL_STATES: Final = frozenset({SUCCEEDED, FAILED})

#: Outbox actions: side effects decided by a transition that still have to happen.
OUTBOX_PUBLISH: Final = "publish"
OUTBOX_STOP: Final = "stop"
OUTBOX_ENQUEUE: Final = "enqueue"

#: The drainer that made a transition owns its outbox entry this long; others claim it only after that (or once
#: the owner gave it back after a failure), so concurrent duplicates do not publish the same events again.
OUTBOX_LEASE_S: Final = 60

#: How many times a transaction is retried after a `TransactionConflict` (hot counter items) before giving up.
CONFLICT_RETRIES: Final = TRANSACTION_CONFLICT_ATTEMPTS
#: Upper bound on the (1 MB) pages of one read of a batch's rollouts for the SDK and the CLI (bounded work).
MAX_READ_PAGES: Final = 2_000


#: The ledger's one error type (`ledger.table.LedgerError`), named here too: the stages import it from this module.
LedgerError = table.LedgerError


class DispatchStart(StrEnum):
    """Outcome of `begin_dispatch`."""

    STARTED = "started"  # slot acquired and the rollout is dispatched(attempt n)
    NO_SLOT = "no_slot"  # every session slot is taken: wait and try again
    CANCELLED = "cancelled"  # the batch is cancelled (or unknown)
    NOT_DISPATCHABLE = "not_dispatchable"  # the rollout is not queued for this attempt: read it and decide


# ------------------------------------------------------------------------------------------- (de)serialisation


def slot_holder(batch_id: str, input_id: str, index: int, attempt: int) -> str:
    """The name a rollout attempt's session slot is given back under (`LimitLedger.release_slot`)."""
    return f"{batch_id}/{input_id}#{index}@{attempt}"


def from_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item (attribute values) as plain Python values (numbers: int when integral, else float)."""
    return {k: from_attribute_value(v) for k, v in item.items()}


_values = plain_values


# ------------------------------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout item, typed: parsed once at the table boundary (`from_item`); times are UTC datetimes (ISO-8601
    text in the item), the state a `RolloutState`."""

    batch_id: str
    input_id: str
    index: int
    state: RolloutState
    attempt: int
    exp_id: str = ""
    session_id: str | None = None
    submitted_at: datetime | None = None
    dispatched_at: datetime | None = None
    invoked_at: datetime | None = None
    finished_at: datetime | None = None
    deadline: int | None = None
    reason: str | None = None
    error: str | None = None
    reward: float | None = None
    rewards: float | list[float] | None = None
    result_uri: str | None = None
    result_size: int | None = None
    policy_version: str | None = None
    #: The batch's policy version, when the rollout was dispatched with another one (the experiment's current).
    batch_policy_version: str | None = None
    outbox: frozenset[str] = field(default_factory=frozenset)
    outbox_id: str | None = None
    stop_sessions: frozenset[str] = field(default_factory=frozenset)
    #: Sessions whose slot is still held: their attempt ended but their stop is not confirmed yet.
    held_slots: frozenset[str] = field(default_factory=frozenset)
    #: When AgentCore has ended the held sessions anyway (their maximum lifetime since they started): the slot is
    #: free then.
    held_until: int | None = None
    stop_tries: int = 0
    #: Sessions whose stop answered ResourceNotFound once (a second NotFound confirms the stop).
    stop_not_found: frozenset[str] = field(default_factory=frozenset)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_item(cls, raw: Mapping[str, Any]) -> RolloutRecord:
        item = from_item(raw)
        rewards_json = item.get("rewards_json")
        return cls(
            batch_id=str(item["batch_id"]),
            input_id=str(item["input_id"]),
            index=int(item["index"]),
            state=RolloutState(item["state"]),
            attempt=int(item.get("attempt") or 0),
            exp_id=str(item.get("exp_id") or ""),
            session_id=item.get("session_id"),
            submitted_at=parse_iso(item.get("submitted_at")),
            dispatched_at=parse_iso(item.get("dispatched_at")),
            invoked_at=parse_iso(item.get("invoked_at")),
            finished_at=parse_iso(item.get("finished_at")),
            deadline=item.get("deadline"),
            reason=item.get("reason"),
            error=item.get("error"),
            reward=None if item.get("reward") is None else float(item["reward"]),
            rewards=json.loads(rewards_json) if rewards_json else None,
            result_uri=item.get("result_uri"),
            result_size=item.get("result_size"),
            policy_version=item.get("policy_version"),
            batch_policy_version=item.get("batch_policy_version"),
            outbox=frozenset(item.get("outbox") or ()),
            outbox_id=item.get("outbox_id"),
            stop_sessions=frozenset(item.get("stop_sessions") or ()),
            held_slots=frozenset(item.get("held_slots") or ()),
            held_until=None if item.get("held_until") is None else int(item["held_until"]),
            stop_tries=int(item.get("stop_tries") or 0),
            stop_not_found=frozenset(item.get("stop_not_found") or ()),
        )


@dataclass(frozen=True)
class Terminal:
    """The terminal outcome to record."""

    state: str  # SUCCEEDED or FAILED
    finished_at: str
    reason: str | None = None
    error: str | None = None
    reward: float | None = None
    rewards: float | list[float] | None = None
    result_uri: str | None = None
    result_size: int | None = None


# ------------------------------------------------------------------------------------------------- the ledger


class RolloutLedger:
    """DynamoDB operations on rollout items, session slots and paced call budgets of one experiment's ledger table,
    through its gateway (`table.LedgerTable`)."""

    def __init__(self, table_name: str, ddb_client: Any | None = None, ttl_days: int = 30) -> None:
        self.table = LedgerTable(table_name, ddb_client, ttl_days=ttl_days)
        self.table_name = table_name
        #: Session slots, paced call budgets, the admission board and the policy version (`ledger.limits`).
        self.limits = LimitLedger(self.table)

    @property
    def ddb(self) -> Any:
        return self.table.ddb

    # ---------------------------------------------------------------------------------------------- reads

    def get(self, key: Mapping[str, Any], consistent: bool = True) -> dict[str, Any] | None:
        """Read one item (strongly consistent by default) as plain values, or None."""
        item = self.table.get(key, consistent=consistent)
        return from_item(item) if item else None

    def get_rollout(self, batch_id: str, input_id: str, index: int) -> RolloutRecord | None:
        item = self.table.get(keys.rollout_key(batch_id, input_id, index))
        return RolloutRecord.from_item(item) if item else None

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        """The batch view (`batches.merge_batch_items`: counters summed over the shards) as plain values."""
        view = query_batch_view(self.ddb, self.table_name, batch_id)
        return from_item(view) if view is not None else None

    def batch(self, batch_id: str) -> BatchItem | None:
        """The batch view, typed (`items.BatchItem`), or None."""
        view = query_batch_view(self.ddb, self.table_name, batch_id)
        return BatchItem.of(view) if view is not None else None

    def group(self, batch_id: str, input_id: str) -> GroupItem | None:
        """One group, typed (`items.GroupItem`), or None."""
        item = self.table.get(keys.group_key(batch_id, input_id))
        return GroupItem.of(item) if item else None

    def groups(self, batch_id: str) -> Iterator[GroupItem]:
        """Every group of a batch, typed, in input-id order (paged, strongly consistent)."""
        for item in self.iter_prefix(batch_id, keys.GROUP_PREFIX):
            yield GroupItem.of(item)

    def iter_prefix(
        self,
        batch_id: str,
        prefix: str,
        page_size: int | None = 100,
        *,
        attributes: Sequence[str] = (),
        max_pages: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Raw items of one batch partition whose sort key starts with `prefix` (groups `G#`, rollouts `R#...`);
        only `attributes` when given; `page_size` items a page (None: DynamoDB's 1 MB pages), at most `max_pages`
        pages when given."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": _values({":pk": keys.batch_pk(batch_id), ":prefix": prefix}),
            "ConsistentRead": True,
        }
        if page_size is not None:
            request["Limit"] = page_size
        if attributes:  # names, not values: several attribute names are DynamoDB reserved words (`state`)
            names = {f"#p{i}": name for i, name in enumerate(attributes)}
            request["ProjectionExpression"] = ", ".join(names)
            request["ExpressionAttributeNames"] = names
        yield from self.table.query(request, max_pages=max_pages)

    def iter_rollout_items(self, batch_id: str, *, attributes: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
        """Every rollout item of a batch (raw; never-dispatched rollouts have none), at most `MAX_READ_PAGES` pages
        of 1 MB: bounded work whatever the batch size."""
        return self.iter_prefix(batch_id, keys.ROLLOUT_PREFIX, None, attributes=attributes, max_pages=MAX_READ_PAGES)

    def rollout_summaries(self, batch_id: str, *, states_only: bool = False) -> Iterator[RolloutSummary]:
        """Every dispatched rollout of a batch, typed (`items.RolloutSummary`); `states_only` reads the state alone."""
        for item in self.iter_rollout_items(batch_id, attributes=("state",) if states_only else ()):
            yield RolloutSummary.of(item)

    def iter_groups(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """Every group item of a batch (paged, strongly consistent)."""
        for item in self.iter_prefix(batch_id, keys.GROUP_PREFIX):
            yield from_item(item)

    def iter_rollouts(self, batch_id: str, input_id: str) -> Iterator[RolloutRecord]:
        """Every rollout item of one group."""
        for item in self.iter_prefix(batch_id, f"{keys.ROLLOUT_PREFIX}{input_id}#"):
            yield RolloutRecord.from_item(item)

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
            "ExpressionAttributeValues": _values({":p": f"{prefix}{shard}", ":s": before_epoch}),
            "Limit": limit,
        }
        return [RolloutRecord.from_item(item) for item in self.table.query(request, max_pages=max_pages)]

    # ---------------------------------------------------------------------------------------- transitions

    def _transact(self, items: Sequence[Mapping[str, Any]]) -> list[str] | None:
        """Run a transaction (`LedgerTable.transact`); None when it committed, else the cancellation reason codes."""
        reasons = self.table.transact(items, attempts=CONFLICT_RETRIES)
        return None if reasons is None else reason_codes(reasons)

    def _update(
        self,
        key: Mapping[str, Any],
        update: str,
        condition: str | None,
        values: Mapping[str, Any],
        names: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        return self.table.update_op(key, update, condition, values, names)

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
        now_iso: str,
        now_epoch: int,
        deadline: int,
        max_sessions: int,
        policy_version: str | None,
        batch_policy_version: str | None = None,
        slot_shard: int = 0,
    ) -> DispatchStart:
        """Acquire a session slot and move the rollout to dispatched(attempt), in one transaction.

        Conditions: the batch is not cancelled (the rollout's copy of its cancel flag, `keys.control_shard_key`: the
        batch item itself is in no per-rollout transaction); session-slot counter `slot_shard` is below its cap
        (`LimitLedger.take_slot`); the rollout has no item yet (attempt 1) or is queued for
        exactly this attempt. So a redelivered message never starts a second session. The caller has read the
        batch (it needs its options), so the batch exists.
        `policy_version` is the version the rollout is dispatched with; `batch_policy_version`, the batch's, is
        kept only when it differs.
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
        rollout_update = self._update(
            keys.rollout_key(batch_id, input_id, index),
            "SET #st = :dispatched, attempt = :attempt, session_id = :sid, exp_id = :exp, batch_id = :batch, "
            "input_id = :input, #ix = :index, submitted_at = if_not_exists(submitted_at, :submitted), "
            "dispatched_at = :now, deadline = :deadline, #dlpk = :dlpk, #dlsk = :deadline, expires_at = :ttl, "
            "policy_version = :pv"
            + (
                ", batch_policy_version = :bpv REMOVE invoked_at"
                if keep_batch_pv
                else " REMOVE invoked_at, batch_policy_version"
            ),
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
                ":now": now_iso,
                ":deadline": deadline,
                ":dlpk": keys.deadline_pk(batch_id, input_id, index),
                ":ttl": self.table.expires_at(now_epoch),
                ":pv": policy_version,
                **({":bpv": batch_policy_version} if keep_batch_pv else {}),
            },
            {"#st": "state", "#ix": "index", "#dlpk": keys.DEADLINE_PK, "#dlsk": keys.DEADLINE_SK},
        )
        reasons = self._transact(
            [batch_check, self.limits.take_slot(max_sessions, slot_shard), {"Update": rollout_update}]
        )
        if reasons is None:
            return DispatchStart.STARTED
        batch_r, slot_r, rollout_r = (reasons + ["None"] * 3)[:3]
        if rollout_r == "ConditionalCheckFailed":
            return DispatchStart.NOT_DISPATCHABLE
        if batch_r == "ConditionalCheckFailed":
            return DispatchStart.CANCELLED
        if slot_r == "ConditionalCheckFailed":
            return DispatchStart.NO_SLOT
        raise LedgerError(f"dispatch transaction cancelled: {reasons}")

    def mark_invoked(self, batch_id: str, input_id: str, index: int, attempt: int, now_iso: str) -> bool:
        """Record that InvokeAgentRuntime succeeded; False if the attempt is no longer dispatched (cancel/late)."""
        return (
            self.table.update(
                keys.rollout_key(batch_id, input_id, index),
                "SET invoked_at = :now",
                "#st = :dispatched AND attempt = :attempt",
                {":now": now_iso, ":dispatched": DISPATCHED, ":attempt": attempt},
                {"#st": "state"},
            )
            is not None
        )

    def release_to_queue(self, batch_id: str, input_id: str, index: int, attempt: int) -> bool:
        """Give the slot back after ACR kept throttling: dispatched(n) without invoke -> queued(n), in_flight -1."""
        update = self._update(
            keys.rollout_key(batch_id, input_id, index),
            "SET #st = :queued REMOVE dispatched_at, deadline, #dlpk, #dlsk",
            "#st = :dispatched AND attempt = :attempt AND attribute_not_exists(invoked_at)",
            {":queued": QUEUED, ":dispatched": DISPATCHED, ":attempt": attempt},
            {"#st": "state", "#dlpk": keys.DEADLINE_PK, "#dlsk": keys.DEADLINE_SK},
        )
        holder = slot_holder(batch_id, input_id, index, attempt)
        return self._transact([{"Update": update}, self.limits.release_slot(holder)]) is None

    def _outbox_values(self, batch_id: str, input_id: str, index: int, now_epoch: int) -> dict[str, Any]:
        return {
            ":obpk": keys.outbox_pk(batch_id, input_id, index),
            ":obsk": now_epoch,
            ":obid": secrets.token_hex(8),
            ":oblease": now_epoch + OUTBOX_LEASE_S,
        }

    def finish(
        self,
        *,
        exp_id: str,
        batch_id: str,
        input_id: str,
        index: int,
        attempt: int,
        from_state: str | None,
        outcome: Terminal,
        outbox: frozenset[str],
        now_epoch: int,
        session_id: str | None = None,
        policy_version: str | None = None,
        hold_slot_until: int | None = None,
    ) -> bool:
        """The one terminal transition of a rollout, with its counters, slot release and outbox, atomically.

        `from_state`: DISPATCHED (releases the slot), QUEUED, or None (no item yet: cancel before dispatch).
        `hold_slot_until` (with DISPATCHED and `session_id`): keep the slot for the session instead, and stop it
        through the outbox; `release_stopped` frees the slot once the stop is confirmed, or after that epoch.
        Returns False when the condition failed (another delivery already moved the rollout).
        """
        hold = hold_slot_until is not None and from_state == DISPATCHED and bool(session_id)
        if hold:
            outbox = outbox | {OUTBOX_STOP}
        names = {
            "#st": "state",
            "#ix": "index",
            "#dlpk": keys.DEADLINE_PK,
            "#dlsk": keys.DEADLINE_SK,
            "#obpk": keys.OUTBOX_PK,
            "#obsk": keys.OUTBOX_SK,
        }
        values: dict[str, Any] = {
            ":state": outcome.state,
            ":finished": outcome.finished_at,
            ":exp": exp_id,
            ":batch": batch_id,
            ":input": input_id,
            ":index": index,
            ":attempt": attempt,
            ":ttl": self.table.expires_at(now_epoch),
            ":outbox": set(outbox) | {OUTBOX_PUBLISH},
            **self._outbox_values(batch_id, input_id, index, now_epoch),
        }
        sets = [
            "#st = :state",
            "finished_at = :finished",
            "exp_id = :exp",
            "batch_id = :batch",
            "input_id = :input",
            "#ix = :index",
            "attempt = :attempt",
            "expires_at = :ttl",
            "#obpk = :obpk",
            "#obsk = :obsk",
            "outbox_id = :obid",
            "outbox_lease = :oblease",
        ]
        optional = {
            "reason": outcome.reason,
            "error": outcome.error,
            "reward": outcome.reward,
            "rewards_json": None if outcome.rewards is None else json.dumps(outcome.rewards),
            "result_uri": outcome.result_uri,
            "result_size": outcome.result_size,
        }
        if from_state is None:
            optional["session_id"] = session_id
            optional["policy_version"] = policy_version
        for attr, value in optional.items():
            if value is not None:
                sets.append(f"#{attr} = :{attr}")
                values[f":{attr}"] = value
                names[f"#{attr}"] = attr
        if from_state is None:
            condition = "attribute_not_exists(pk)"
        else:
            condition = "#st = :from AND attempt = :attempt"
            values[":from"] = from_state
        # ADD, not SET: side effects still pending from an earlier transition (a throttled stop of the previous
        # attempt's session) are kept, not overwritten.
        adds = ["outbox :outbox"]
        if OUTBOX_STOP in outbox and session_id:
            adds.append("stop_sessions :stops")
            values[":stops"] = {session_id}
        if hold:
            adds.append("held_slots :stops")
            sets.append("held_until = :held_until")
            values[":held_until"] = hold_slot_until
        rollout = self._update(
            keys.rollout_key(batch_id, input_id, index),
            f"SET {', '.join(sets)} ADD {', '.join(adds)} REMOVE #dlpk, #dlsk",
            condition,
            values,
            names,
        )
        succeeded = outcome.state == SUCCEEDED
        group_values: dict[str, Any] = {":one": 1, ":v": outcome.reward if succeeded else outcome.reason}
        group = self._update(
            keys.group_key(batch_id, input_id),
            f"ADD terminal :one SET {'rewards' if succeeded else 'failures'}.#i = :v",
            "attribute_exists(pk)",
            group_values,
            {"#i": str(index)},
        )
        batch_adds: dict[str, float] = {"terminal": 1, "succeeded" if succeeded else "failed": 1}
        if not succeeded:
            batch_adds[f"failed_{outcome.reason}"] = 1
        if succeeded and outcome.reward is not None:
            batch_adds.update(
                {"reward_sum": outcome.reward, "reward_sumsq": outcome.reward * outcome.reward, "reward_count": 1}
            )
        batch_names = {f"#a{i}": name for i, name in enumerate(batch_adds)}
        batch_vals: dict[str, Any] = {f":a{i}": value for i, value in enumerate(batch_adds.values())}
        batch_vals[":ttl"] = self.table.expires_at(now_epoch)
        # One counter shard of the batch (created by the first ADD); the group's condition proves the batch exists.
        batch = self._update(
            keys.batch_count_key(batch_id, keys.count_shard(input_id)),
            f"ADD {', '.join(f'#a{i} :a{i}' for i in range(len(batch_adds)))} SET #ttl = if_not_exists(#ttl, :ttl)",
            None,
            batch_vals,
            {**batch_names, "#ttl": keys.TTL_ATTRIBUTE},
        )
        items: list[dict[str, Any]] = [{"Update": rollout}, {"Update": group}, {"Update": batch}]
        if from_state == DISPATCHED and not hold:
            items.append(self.limits.release_slot(slot_holder(batch_id, input_id, index, attempt)))
        reasons = self._transact(items)
        if reasons is None:
            return True
        if reasons[0] == "ConditionalCheckFailed":
            return False
        raise LedgerError(f"terminal transaction for {batch_id}/{input_id}#{index} cancelled: {reasons}")

    def requeue_for_retry(
        self,
        rec: RolloutRecord,
        *,
        next_session_id: str,
        now_epoch: int,
        stop_pending: bool,
        hold_slot_until: int | None = None,
    ) -> bool:
        """A timed-out attempt with attempts left: dispatched(n) -> queued(n+1), slot released, outbox enqueue.
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
            **self._outbox_values(rec.batch_id, rec.input_id, rec.index, now_epoch),
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
        update = self._update(
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            "SET #st = :queued, attempt = :next, session_id = :sid, "
            f"#obpk = :obpk, #obsk = :obsk, outbox_id = :obid, outbox_lease = :oblease{held} "
            f"ADD {adds} REMOVE dispatched_at, invoked_at, deadline, #dlpk, #dlsk",
            "#st = :dispatched AND attempt = :attempt",
            values,
            {
                "#st": "state",
                "#dlpk": keys.DEADLINE_PK,
                "#dlsk": keys.DEADLINE_SK,
                "#obpk": keys.OUTBOX_PK,
                "#obsk": keys.OUTBOX_SK,
            },
        )
        if hold:
            return self._transact([{"Update": update}]) is None
        holder = slot_holder(rec.batch_id, rec.input_id, rec.index, rec.attempt)
        return self._transact([{"Update": update}, self.limits.release_slot(holder)]) is None

    # ------------------------------------------------------------------------------------ stops and held slots

    def release_stopped(self, rec: RolloutRecord, session_id: str) -> bool:
        """A session's stop is confirmed (or AgentCore has reaped it): forget it and, if it still held a slot,
        release the slot, atomically and once. False if someone else did it first."""
        key = keys.rollout_key(rec.batch_id, rec.input_id, rec.index)
        if session_id not in rec.held_slots:
            self.table.update(key, "DELETE stop_sessions :s, stop_not_found :s", None, {":s": {session_id}})
            return True
        update = self._update(
            key,
            "DELETE held_slots :s, stop_sessions :s, stop_not_found :s",
            "contains(held_slots, :sid)",
            {":s": {session_id}, ":sid": session_id},
        )
        return self._transact([{"Update": update}, self.limits.release_slot(session_id)]) is None

    def note_stop_failed(self, rec: RolloutRecord, *, next_epoch: int, not_found: Sequence[str] = ()) -> None:
        """Stops of this entry failed: count the try, remember first NotFound answers, and come back to the entry
        at `next_epoch` (the outbox index sort key) with its lease given back."""
        names = {"#obsk": keys.OUTBOX_SK}
        values: dict[str, Any] = {":one": 1, ":next": next_epoch, ":obid": rec.outbox_id}
        adds = "stop_tries :one"
        if not_found:
            adds += ", stop_not_found :nf"
            values[":nf"] = set(not_found)
        self.table.update(  # a failed condition: the entry has moved on, nothing to do
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            f"SET #obsk = :next ADD {adds} REMOVE outbox_lease",
            "outbox_id = :obid",
            values,
            names,
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
                "REMOVE outbox, outbox_id, outbox_lease, stop_sessions, stop_tries, stop_not_found, #obpk, #obsk",
                "outbox_id = :obid",
                {":obid": rec.outbox_id},
                {"#obpk": keys.OUTBOX_PK, "#obsk": keys.OUTBOX_SK},
            )
            is not None
        )

    def claim_outbox(self, rec: RolloutRecord, now_epoch: int, lease_s: int = OUTBOX_LEASE_S) -> bool:
        """Take over an outbox entry nobody holds (lease absent or expired); False if someone else holds it."""
        if rec.outbox_id is None:
            return False
        return (
            self.table.update(
                keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
                "SET outbox_lease = :until",
                "outbox_id = :obid AND (attribute_not_exists(outbox_lease) OR outbox_lease < :now)",
                {":obid": rec.outbox_id, ":until": now_epoch + lease_s, ":now": now_epoch},
            )
            is not None
        )

    def release_outbox(self, rec: RolloutRecord) -> None:
        """Give an outbox entry back after a failed side effect, so a redelivery may drain it at once."""
        if rec.outbox_id is None:
            return
        self.table.update(  # a failed condition: the entry has moved on, nothing to do
            keys.rollout_key(rec.batch_id, rec.input_id, rec.index),
            "REMOVE outbox_lease",
            "outbox_id = :obid",
            {":obid": rec.outbox_id},
        )

    # -------------------------------------------------------------------------------------------- batches

    def set_batch_cancelled(self, batch_id: str, now_iso: str, now_epoch: int | None = None) -> bool:
        """Mark the batch cancelled (idempotent): its status, and its control item that the dispatch transaction
        checks, in one transaction. False if the batch does not exist or was rejected as a whole."""
        values = {":cancelled": "cancelled", ":now": now_iso}
        batch = self._update(
            keys.batch_key(batch_id),
            "SET #status = :cancelled, cancelled_at = if_not_exists(cancelled_at, :now)",
            "attribute_exists(pk) AND #status <> :rejected",
            {**values, ":rejected": "rejected"},
            {"#status": "status"},
        )
        epoch = now_epoch if now_epoch is not None else self.table.epoch()
        control_write: tuple[str, None, dict[str, Any], dict[str, str]] = (
            "SET #status = :cancelled, cancelled_at = if_not_exists(cancelled_at, :now), #ttl = :ttl",
            None,
            {**values, ":ttl": self.table.expires_at(epoch)},
            {"#status": "status", "#ttl": keys.TTL_ATTRIBUTE},
        )
        # The control item (the batch view's `cancelled_at`) and every copy the dispatch transactions check.
        control = self._update(keys.batch_control_key(batch_id), *control_write)
        shards = [
            {
                "Update": self._update(
                    {keys.PK: {"S": keys.batch_pk(batch_id)}, keys.SK: {"S": keys.control_shard_sk(i)}}, *control_write
                )
            }
            for i in range(keys.CONTROL_SHARDS)
        ]
        reasons = self._transact([{"Update": batch}, {"Update": control}, *shards])
        if reasons is None:
            return True
        if reasons[0] == "ConditionalCheckFailed":
            return False
        raise LedgerError(f"cancel transaction of {batch_id} cancelled: {reasons}")

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

    def claim_batch_completed(self, batch_id: str, claimant: str, now_iso: str) -> dict[str, Any] | None:
        """Like `claim_group_event` for `Batch Completed`; also stamps `completed_at` once. Returns the batch view
        (typed, `batches.merge_batch_items`) when `claimant` may publish, else None."""
        item = self.table.update(
            keys.batch_key(batch_id),
            "SET completed_at = if_not_exists(completed_at, :now), completed_event_by = :me",
            "attribute_exists(pk) AND (attribute_not_exists(completed_event_by) OR completed_event_by = :me)",
            {":now": now_iso, ":me": claimant},
            return_values="ALL_NEW",
        )
        if item is None:
            return None
        view = query_batch_view(self.ddb, self.table_name, batch_id)
        return view if view is not None else item
