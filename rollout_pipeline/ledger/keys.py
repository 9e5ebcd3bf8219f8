"""Ledger item keys and attribute names (see docs/ARCHITECTURE.md, "Ledger").

One table, string keys `pk`/`sk`; two sparse GSIs (`deadline`, `outbox`) and TTL on `expires_at`.
"""

from __future__ import annotations

import zlib
from typing import Final

PK: Final = "pk"
SK: Final = "sk"
TTL_ATTRIBUTE: Final = "expires_at"

BATCH_SK: Final = "BATCH"
#: A batch's satellite items share the `BATCH` sort-key prefix, so one Query (`begins_with(sk, "BATCH")`) reads the
#: batch item, its control item and its counter shards (and never a group `G#` or rollout `R#` item).
#: CONTROL: the cancel flag the dispatch transaction checks (written at cancel only).
CONTROL_SK: Final = "BATCH#CONTROL"
#: CONTROL#{shard}: copies of the cancel flag (written at cancel, in the same transaction); each dispatch transaction
#: checks its group's copy, so no one item is in every dispatch transaction of a batch.
CONTROL_SHARD_PREFIX: Final = "BATCH#CONTROL#"
CONTROL_SHARDS: Final = 32
#: COUNT#{shard}: terminal counters and reward sums, ADDed by the terminal transaction of each rollout.
COUNT_PREFIX: Final = "BATCH#COUNT#"
#: Counter shards per batch: each terminal transaction touches one, so a shard sees 1/16 of the batch's rate.
COUNT_SHARDS: Final = 16
#: P#{first line}: groups of an ingest chunk in line order, waiting for the release window (`ledger.release`).
PENDING_PREFIX: Final = "P#"
GROUP_PREFIX: Final = "G#"
ROLLOUT_PREFIX: Final = "R#"
LIMIT_PK: Final = "LIMIT"
#: SESSIONS#{shard}: the session-slot counters (`ledger.limits`: their caps sum to `max_sessions`).
SESSIONS_SHARD_PREFIX: Final = "SESSIONS#"
SESSION_SHARDS: Final = 32
#: SESSIONS: the one session-slot counter of ledgers before the shards (layout 1); read only to see what is in flight.
LEGACY_SESSIONS_SK: Final = "SESSIONS"
#: LAYOUT: the ledger's layout version (`LAYOUT_VERSION`), stamped by the stack, checked by every function.
LAYOUT_SK: Final = "LAYOUT"
#: The layout of the ledger this code reads and writes: which items exist and what they hold. Raise it in the
#: version of the code that changes them so that old items no longer fit (and say how in docs/deploy.md,
#: "Upgrades"): the stack stamps the new value before its functions are updated, the functions refuse another one,
#: and the deploy refuses the change while work is in flight (`rollout_pipeline.ops.upgrade`).
#: 1: every ledger before the stamp (a single `SESSIONS` counter, later 16 then 32 `SESSIONS#` shards, results
#: without attempt tokens). 2: 32 `SESSIONS#` shards, attempt tokens, the stamp itself. 3: the call budgets leased
#: from the account pool (`PACE#session` for the account's new-session rate, the lease's fields on `PACE#tps` and
#: `PACE#session`; `PACE#session#i` only in the per-endpoint scope): layout-2 functions would pace by their own
#: limits beside them and over-admit the account. 4: the account's one new-session schedule (`PACE#session` spaced
#: by the item's own `interval_us`, the experiment's share; no lease): layout-3 functions would book on leases that
#: no longer exist beside functions booking on the account's schedule.
LAYOUT_VERSION: Final = 4
#: What a ledger without a stamp is taken for.
UNSTAMPED_LAYOUT: Final = 1
#: The experiment's current policy version (set by the trainer; stamped on each rollout at dispatch).
POLICY_SK: Final = "POLICY"
#: The experiment's budget (`ExperimentLedger.budget`); its spend lives on the session-slot counters.
BUDGET_SK: Final = "BUDGET"
TPS_PREFIX: Final = "TPS#"
#: WAIT#{process}: the admission board, one item per dispatcher process with waiters
#: (`limits.admission.SlotGate`).
WAIT_PREFIX: Final = "WAIT#"
#: PACE#{budget}: a call budget's schedule (`pace_key`); sorts before the session-slot counters.
PACE_PREFIX: Final = "PACE#"

DEADLINE_INDEX: Final = "deadline"
DEADLINE_PK: Final = "gsi_deadline_pk"
DEADLINE_SK: Final = "gsi_deadline_sk"
OUTBOX_INDEX: Final = "outbox"
OUTBOX_PK: Final = "gsi_outbox_pk"
OUTBOX_SK: Final = "gsi_outbox_sk"
#: Shards of each sparse GSI partition key, so no single index partition gets every write.
INDEX_SHARDS: Final = 4
#: The `deadline` index's partition that lists the experiment's batch items (sort key: created, epoch ms).
BATCHES_INDEX_PK: Final = "BAT"


#: A batch's partition key is this prefix and its id.
BATCH_PK_PREFIX: Final = "B#"


def batch_pk(batch_id: str) -> str:
    """A batch's partition key; the key builders below write it in place (`f"{BATCH_PK_PREFIX}{batch_id}"`), each
    one expression."""
    return f"{BATCH_PK_PREFIX}{batch_id}"


def batch_id_of(pk: str) -> str:
    """The batch id of a batch partition key (`batch_pk`'s inverse)."""
    return pk.removeprefix(BATCH_PK_PREFIX)


def batch_key(batch_id: str) -> dict[str, dict[str, str]]:
    return {PK: {"S": f"{BATCH_PK_PREFIX}{batch_id}"}, SK: {"S": BATCH_SK}}


def batch_control_key(batch_id: str) -> dict[str, dict[str, str]]:
    """The batch's control item: `status`/`cancelled_at` once cancelled (see `BATCH_SK`)."""
    return {PK: {"S": batch_pk(batch_id)}, SK: {"S": CONTROL_SK}}


def control_shard_key(batch_id: str, input_id: str, index: int) -> dict[str, dict[str, str]]:
    """The copy of the batch's cancel flag that one rollout's dispatch transaction checks: a group's rollouts, which
    are dispatched together, on consecutive copies (by group they met on one copy: 1.8 conflict retries per rollout
    at 24 sessions/s; hashed by rollout, 2 of 8 met on one copy on average)."""
    return control_shard_key_of(batch_id, (zlib.crc32(input_id.encode()) + index) % CONTROL_SHARDS)


def control_shard_key_of(batch_id: str, shard: int) -> dict[str, dict[str, str]]:
    """Copy `shard` of the batch's cancel flag (cancel writes every copy)."""
    return {PK: {"S": batch_pk(batch_id)}, SK: {"S": control_shard_sk(shard)}}


def control_shard_sk(shard: int) -> str:
    return f"{CONTROL_SHARD_PREFIX}{shard:02d}"


def count_shard(input_id: str) -> int:
    """The counter shard of a group's rollouts (all rollouts of one group count on the same shard)."""
    return zlib.crc32(input_id.encode()) % COUNT_SHARDS


def batch_count_key(batch_id: str, shard: int) -> dict[str, dict[str, str]]:
    """One counter shard of a batch (see `COUNT_PREFIX`)."""
    return {PK: {"S": f"{BATCH_PK_PREFIX}{batch_id}"}, SK: {"S": f"{COUNT_PREFIX}{shard:02d}"}}


def group_key(batch_id: str, input_id: str) -> dict[str, dict[str, str]]:
    return {PK: {"S": f"{BATCH_PK_PREFIX}{batch_id}"}, SK: {"S": f"{GROUP_PREFIX}{input_id}"}}


def rollout_key(batch_id: str, input_id: str, index: int) -> dict[str, dict[str, str]]:
    return {PK: {"S": f"{BATCH_PK_PREFIX}{batch_id}"}, SK: {"S": f"{ROLLOUT_PREFIX}{input_id}#{index}"}}


def session_shard_key(shard: int) -> dict[str, dict[str, str]]:
    """One session-slot counter (`SESSIONS#{shard}`)."""
    return {PK: {"S": LIMIT_PK}, SK: {"S": f"{SESSIONS_SHARD_PREFIX}{shard:02d}"}}


def legacy_sessions_key() -> dict[str, dict[str, str]]:
    """The single session-slot counter of layout 1 (`LEGACY_SESSIONS_SK`)."""
    return {PK: {"S": LIMIT_PK}, SK: {"S": LEGACY_SESSIONS_SK}}


def layout_key() -> dict[str, dict[str, str]]:
    return {PK: {"S": LIMIT_PK}, SK: {"S": LAYOUT_SK}}


def layout_item(version: int = LAYOUT_VERSION) -> dict[str, dict[str, str]]:
    """The stamp item (DynamoDB JSON) the stack puts into the table (and local mode into its own)."""
    return {**layout_key(), "version": {"N": str(version)}}


def policy_key() -> dict[str, dict[str, str]]:
    return {PK: {"S": LIMIT_PK}, SK: {"S": POLICY_SK}}


def budget_key() -> dict[str, dict[str, str]]:
    return {PK: {"S": LIMIT_PK}, SK: {"S": BUDGET_SK}}


def tps_key(epoch_second: int) -> dict[str, dict[str, str]]:
    return {PK: {"S": LIMIT_PK}, SK: {"S": f"{TPS_PREFIX}{epoch_second}"}}


def pace_key(budget: str) -> dict[str, dict[str, str]]:
    """The schedule item of one call budget (`limits.pacing.Pacer`): `tps`, `session#0`, `session#1`, ..."""
    return {PK: {"S": LIMIT_PK}, SK: {"S": f"{PACE_PREFIX}{budget}"}}


def waiting_key(process: str) -> dict[str, dict[str, str]]:
    """One dispatcher process's entry on the admission board (its waiting rollouts' admission keys)."""
    return {PK: {"S": LIMIT_PK}, SK: {"S": f"{WAIT_PREFIX}{process}"}}


def deadline_pk(batch_id: str, input_id: str, index: int) -> str:
    """The `deadline` index shard of a rollout: CRC-32 of `batch/input/index` modulo `INDEX_SHARDS`."""
    return f"DL#{zlib.crc32(f'{batch_id}/{input_id}/{index}'.encode()) % INDEX_SHARDS}"


def outbox_pk(batch_id: str, input_id: str, index: int) -> str:
    """The `outbox` index shard of a rollout: CRC-32 of `batch/input/index` modulo `INDEX_SHARDS`."""
    return f"OB#{zlib.crc32(f'{batch_id}/{input_id}/{index}'.encode()) % INDEX_SHARDS}"
