"""The warm pool's ledger items (`warm_items`: each warm session `WARM/S#{session}`, holding a session slot; the claim
`WS#{session}/CLAIM` a dispatch writes when it takes one; the pool's own item `WARM/POOL`), written in transactions
of up to `CHUNK` items, each conditional on the state the pool read (docs/lifecycle.md, "The warm pool")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import plain_values
from rollout_pipeline.ledger.limits import LimitLedger, free_shard
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import CONDITION_FAILED, LedgerTable, reason_codes
from rollout_pipeline.ledger.warm_items import WarmClaim, WarmPoolState, WarmSession, WarmState

WARM_PK: Final = "WARM"
SESSION_PREFIX: Final = "S#"
#: Items of one transaction at most (DynamoDB's limit is 100; room for the slot counters besides).
CHUNK: Final = 50
_STATE: Final = {"#st": "state"}


def session_key(session_id: str) -> dict[str, dict[str, str]]:
    return {keys.PK: {"S": WARM_PK}, keys.SK: {"S": f"{SESSION_PREFIX}{session_id}"}}


def pool_key() -> dict[str, dict[str, str]]:
    return {keys.PK: {"S": WARM_PK}, keys.SK: {"S": "POOL"}}


def claim_key(session_id: str) -> dict[str, dict[str, str]]:
    return {keys.PK: {"S": f"WS#{session_id}"}, keys.SK: {"S": "CLAIM"}}


def _in_state(state: WarmState) -> dict[str, Any]:
    return {
        "ConditionExpression": "#st = :state",
        "ExpressionAttributeNames": _STATE,
        "ExpressionAttributeValues": plain_values({":state": state.value}),
    }


class WarmLedger:
    """The warm pool's items, read and conditionally written through the table's gateway (slots through `limits`)."""

    def __init__(self, table: LedgerTable, limits: LimitLedger) -> None:
        self.table = table
        self.limits = limits

    def sessions(self) -> list[WarmSession]:
        """Every warm session the pool holds, strongly consistent."""
        request: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": plain_values({":pk": WARM_PK, ":prefix": SESSION_PREFIX}),
            "ConsistentRead": True,
        }
        return [WarmSession.of(raw) for raw in self.table.query(request, max_pages=20)]

    def pool(self) -> WarmPoolState:
        """The pool's item (empty before the pool first ran)."""
        return WarmPoolState.of(self.table.get(pool_key()))

    def claim_of(self, session_id: str) -> WarmClaim | None:
        """Which attempt took warm session `session_id` (strongly consistent), or None."""
        raw = self.table.get(claim_key(session_id))
        return WarmClaim.of(raw) if raw else None

    def add_warming(
        self, sessions: Sequence[str], *, max_sessions: int, takes: Mapping[int, int], warmed_at: float
    ) -> bool:
        """Record new warm sessions and take their slots (`takes`: by counter) in one transaction, unless halted."""
        if sum(takes.values()) != len(sessions) or any(count <= 0 for count in takes.values()):
            raise ValueError(f"slot takes {dict(takes)} do not add up to {len(sessions)} sessions")
        ttl = self.table.expires_at()
        items: list[dict[str, Any]] = [
            self.limits.take_slot(max_sessions, shard, count) for shard, count in sorted(takes.items())
        ]
        check = {"TableName": self.table.name, "Key": pool_key(), "ConditionExpression": "attribute_not_exists(halted)"}
        items.append({"ConditionCheck": check})
        values = {"state": WarmState.WARMING.value, "warmed_at": warmed_at, "kept_at": warmed_at, "expires_at": ttl}
        for session_id in sessions:
            item = {**session_key(session_id), **plain_values(values)}
            items.append({"Put": {"TableName": self.table.name, "Item": item}})
        reasons = self.table.transact(items)
        if reasons is not None and CONDITION_FAILED not in reason_codes(reasons):
            raise LedgerError(f"recording warm sessions cancelled: {reason_codes(reasons)}")
        return reasons is None

    def mark(self, sessions: Sequence[str], *, kept_at: float, from_states: Sequence[WarmState]) -> list[str]:
        """Sessions whose warm-up (or keep-alive) answered, still in one of `from_states`: idle, kept at `kept_at`."""
        return self._set_state(sessions, WarmState.IDLE, from_states, {"kept_at": kept_at})

    def begin_stop(self, sessions: Sequence[str]) -> list[str]:
        """Sessions about to be stopped, those still in the pool (not taken meanwhile): state stopping."""
        return self._set_state(sessions, WarmState.STOPPING, tuple(WarmState), {})

    def _set_state(
        self, sessions: Sequence[str], state: WarmState, from_states: Sequence[WarmState], extra: Mapping[str, Any]
    ) -> list[str]:
        allowed = {f":s{i}": s.value for i, s in enumerate(from_states)}
        update = "SET #st = :to" + "".join(f", {name} = :{name}" for name in extra)
        values = {":to": state.value, **allowed, **{f":{name}": value for name, value in extra.items()}}
        condition = f"#st IN ({', '.join(allowed)})"

        def ops(chunk: list[str]) -> list[dict[str, Any]]:
            return [{"Update": self.table.update_op(session_key(s), update, condition, values, _STATE)} for s in chunk]

        return self._each(sessions, ops, CHUNK, "updating warm sessions")

    def _each(
        self, sessions: Sequence[str], ops: Callable[[list[str]], list[dict[str, Any]]], size: int, what: str
    ) -> list[str]:
        """One transaction per chunk of `size` sessions, again without those whose condition failed; those written."""
        done: list[str] = []
        for start in range(0, len(sessions), size):
            left = list(sessions[start : start + size])
            for _ in range(len(left) + 1):
                reasons = self.table.transact(ops(left)) if left else None
                if reasons is None:
                    done += left
                    break
                codes = reason_codes(reasons)
                failed = {left[i] for i, code in enumerate(codes[: len(left)]) if code == CONDITION_FAILED}
                if not failed:
                    raise LedgerError(f"{what} cancelled: {codes}")
                left = [s for s in left if s not in failed]
        return done

    def forget(self, sessions: Sequence[str]) -> list[str]:
        """Stopped sessions (confirmed, or ended by AgentCore): items deleted and slots given back, atomically, once."""
        stopping = _in_state(WarmState.STOPPING)

        def ops(chunk: list[str]) -> list[dict[str, Any]]:
            deletes = [{"Delete": {"TableName": self.table.name, "Key": session_key(s), **stopping}} for s in chunk]
            shards = Counter(free_shard(s) for s in chunk)
            holders = {free_shard(s): s for s in chunk}
            return [*deletes, *(self.limits.free_slot(holders[shard], n) for shard, n in shards.items())]

        return self._each(sessions, ops, CHUNK - keys.SESSION_SHARDS, "forgetting stopped warm sessions")

    def claim_ops(self, session_id: str, ref: AttemptRef, *, warmed_at: float) -> list[dict[str, Any]]:
        """The dispatch transaction's part when `ref` takes `session_id`: its item deleted if idle, the claim."""
        claim = {
            "batch_id": ref.batch_id,
            "input_id": ref.input_id,
            "index": ref.index,
            "attempt": ref.attempt,
            "warmed_at": warmed_at,
            "claimed_at": self.table.now().timestamp(),
            "expires_at": self.table.expires_at(),
        }
        take = {"TableName": self.table.name, "Key": session_key(session_id), **_in_state(WarmState.IDLE)}
        put = {"TableName": self.table.name, "Item": {**claim_key(session_id), **plain_values(claim)}}
        return [{"Delete": take}, {"Put": put}]

    def take_lease(self, owner: str, *, now: float, lease_s: float) -> bool:
        """Run the pool until `now + lease_s` (one manager at a time); False when another does."""
        update = "SET lease_owner = :owner, lease_until = :until"
        condition = "attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :owner"
        values = {":owner": owner, ":until": now + lease_s, ":now": now}
        return self.table.update(pool_key(), update, condition, values) is not None

    def end_lease(self, owner: str) -> None:
        """Give the lease back (the next manager need not wait for it to expire)."""
        self.table.update(pool_key(), "SET lease_until = :zero", "lease_owner = :owner", {":zero": 0, ":owner": owner})

    def note_busy(self, now: float, *, last_batch: tuple[str, int] | None = None) -> None:
        """The experiment has work now (and its newest batch has this many rollouts)."""
        values: dict[str, Any] = {":now": now}
        update = "SET busy_at = :now"
        if last_batch is not None:
            update += ", last_batch_id = :batch, last_batch_rollouts = :rollouts"
            values |= {":batch": last_batch[0], ":rollouts": last_batch[1]}
        self.table.update(pool_key(), update, None, values)

    def note(self, what: Literal["demand_at", "took_at"], now: float) -> None:
        """A dispatch took a new session for want of a warm one (`demand_at`), or took a warm one (`took_at`)."""
        self.table.update(pool_key(), "SET #what = :now", None, {":now": now}, {"#what": what})

    def halt(self, reason: str, now: float) -> None:
        """Keep no warm session until a batch created after now ("destroyed": never again)."""
        self.table.update(pool_key(), "SET halted = :why, halted_at = :now", None, {":why": reason, ":now": now})

    def resume(self) -> None:
        """A batch came after the halt: the pool runs again (never after "destroyed")."""
        self.table.update(pool_key(), "REMOVE halted", "halted <> :destroyed", {":destroyed": "destroyed"})

    def add_totals(self, **counts: float) -> None:
        """ADD to the pool's totals (`WarmPoolState`); zeros are left out."""
        given = {name: value for name, value in counts.items() if value}
        if not given:
            return
        names = {f"#a{i}": name for i, name in enumerate(given)}
        values = {f":a{i}": value for i, value in enumerate(given.values())}
        update = f"ADD {', '.join(f'#a{i} :a{i}' for i in range(len(given)))}"
        self.table.update(pool_key(), update, None, values, names)
