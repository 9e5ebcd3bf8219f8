"""Rollouts as a dataset: the versioned schema of one row per rollout, its rows built from the ledger and the result
objects, the group statistics (GRPO advantages), and the filters people need.

The schema (`SCHEMA_VERSION`, `COLUMNS`) lives here and nowhere else: the Parquet writer (`sdk.parquet`) types its
columns from it, the dataset card lists it, docs/datasets.md documents it (a test keeps the two equal). No pyarrow
here: building and filtering rows is plain Python, so it is tested without the `data` extra.

Rows come a group at a time: the ledger's group items (`G#{input}`) and rollout items (`R#{input}#{index}`) are
two sorted Queries of the batch's partition, joined as they stream (`join_groups`), so memory holds one group (plus
the writer's row group), never a batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from rollout_pipeline import ids
from rollout_pipeline.contracts import MAX_ABS_REWARD, RolloutCost, grpo_advantages, reward_stats, scalar_reward
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.ledger.items import GroupItem, RolloutRecord, RolloutState

#: The dataset schema's version: MAJOR changes when a column is removed, renamed or retyped; MINOR when one is added
#: (readers must ignore columns they do not know). Written in every file's metadata and in the dataset card.
SCHEMA_VERSION: Final = "1.1"
#: Parquet key-value metadata of every file (`sdk.parquet`).
METADATA_SCHEMA_VERSION: Final = "rollout_pipeline.schema_version"
METADATA_EXPERIMENT: Final = "rollout_pipeline.experiment"
METADATA_BATCH: Final = "rollout_pipeline.batch"
METADATA_RESCORED_WITH: Final = "rollout_pipeline.rescored_with"
METADATA_FILTERS: Final = "rollout_pipeline.filters"

#: Column types, as `sdk.parquet` maps them to Arrow: `timestamp` is UTC with microseconds.
COLUMN_TYPES: Final = frozenset({"string", "int32", "int64", "float64", "bool", "timestamp", "list<float64>"})


@dataclass(frozen=True)
class Column:
    """One column of the dataset: its name, type (`COLUMN_TYPES`) and meaning. Every column is nullable."""

    name: str
    type: str
    description: str


#: The columns of schema `SCHEMA_VERSION`, in file order.
COLUMNS: Final[tuple[Column, ...]] = (
    Column("exp_id", "string", "experiment name"),
    Column("batch_id", "string", "batch id (one dataset file or one SDK submission)"),
    Column("input_id", "string", "the dataset row's id: the GRPO group key"),
    Column("index", "int32", "the rollout's index in its group, 0 .. group_size-1"),
    Column("rollout_id", "string", "`{input_id}#{index}`"),
    Column("line", "int64", "1-based position of the row in its dataset file (or payload list)"),
    Column("group_size", "int32", "rollouts in the group"),
    Column("status", "string", "`succeeded`, `failed`, `dispatched` (running) or `queued` (never dispatched)"),
    Column(
        "failure_reason",
        "string",
        "why a `failed` rollout failed (`agent_error`, `timeout`, `invalid_result`, "
        "`invoke_rejected`, `cancelled`, `throttled`); null otherwise",
    ),
    Column("error", "string", "the failure's error text; null otherwise"),
    Column(
        "model_warning",
        "string",
        "what the agent host saw go wrong in the model replies the result was computed from (cut short, empty or "
        "failed: the event's `warning`); null when nothing did",
    ),
    Column("attempt", "int32", "the attempt that ended the rollout (1 = first); null when never dispatched"),
    Column(
        "reward",
        "float64",
        "the scalar reward (the last turn's for per-turn rewards); null unless `succeeded`: "
        "a failure never has reward 0",
    ),
    Column("turn_rewards", "list<float64>", "per-turn rewards when the agent returned a list; null for a number"),
    Column("group_complete", "bool", "every rollout of the group is terminal (`succeeded` or `failed`)"),
    Column("group_reward_mean", "float64", "mean of the group's successful rewards; null until the group is complete"),
    Column("group_reward_std", "float64", "population std of the group's successful rewards; null until complete"),
    Column(
        "advantage",
        "float64",
        "GRPO advantage `(reward - mean) / (std + 1e-6)` within the group (the SDK's "
        "`Group.advantages()`); null for a failure or an incomplete group",
    ),
    Column("policy_version", "string", "the policy version the rollout was dispatched with"),
    Column("batch_policy_version", "string", "the batch's policy version, when the rollout ran with another one"),
    Column("submitted_at", "timestamp", "when the rollout was queued (UTC)"),
    Column("dispatched_at", "timestamp", "when its last attempt was dispatched (UTC)"),
    Column("invoked_at", "timestamp", "when AgentCore accepted its last invocation (UTC)"),
    Column("finished_at", "timestamp", "when it became terminal (UTC)"),
    Column("duration_s", "float64", "`finished_at - dispatched_at` in seconds (the last attempt)"),
    Column("session_id", "string", "the AgentCore session of the last attempt"),
    Column("result_uri", "string", "`s3://` URI of the result object"),
    Column("result_size", "int64", "size of the result object in bytes"),
    Column("result_json", "string", "the result object as JSON text; null when there is none or it cannot be read"),
    Column("result_status_code", "int64", "the result object's `status_code` (ART: 200 = success)"),
    Column("result_stop_reason", "string", "the result object's `stop_reason`"),
    Column(
        "payload_json",
        "string",
        "the row's payload (the agent's input, `_rollout` overrides excluded) as JSON "
        "text; null when it is stored aside (`payload_ref`)",
    ),
    Column("payload_ref", "string", "`s3://` URI of a payload over 32 KiB (claim check)"),
)
#: What a rollout cost (`contracts.RolloutCost`, docs/costs.md), as its `Rollout Completed` / `Rollout Failed`
#: carried it: after the core columns. Null for a rollout not terminal yet or one that ended before costs were kept.
COST_COLUMNS: Final[tuple[Column, ...]] = (
    Column(
        "cost_usd",
        "float64",
        "what the rollout cost in USD (AgentCore memory and CPU, the pipeline's own AWS), as its event carried it",
    ),
    Column("cost_agentcore_usd", "float64", "its AgentCore sessions' part (memory + CPU)"),
    Column("cost_pipeline_usd", "float64", "the pipeline's own AWS part"),
    Column("cost_usd_max", "float64", "the figure if no pending session stop is ever confirmed"),
    Column("cost_session_end", "string", "`stopped`, `estimated` (a stop was pending) or `bounded`"),
    Column("cost_priced_as", "string", "which prices and session size (and whether a local run)"),
)
#: The columns a re-scored dataset adds after the others (`sdk.rescore`): `reward`, `turn_rewards`, the group
#: statistics and `advantage` are then the new ones.
RESCORE_COLUMNS: Final[tuple[Column, ...]] = (
    Column("original_reward", "float64", "the reward the agent gave (the ledger's)"),
    Column("original_turn_rewards", "list<float64>", "the per-turn rewards the agent gave"),
    Column("original_advantage", "float64", "the advantage from the agent's rewards"),
    Column(
        "rescore_error",
        "string",
        "what the reward function raised or returned wrongly on this row (its `reward` is then null); null otherwise",
    ),
)
#: The prefix of the columns `result_fields` adds (one per selected top-level field of the result object).
RESULT_FIELD_PREFIX: Final = "result_"
_NAMES: Final = frozenset(column.name for column in (*COLUMNS, *COST_COLUMNS, *RESCORE_COLUMNS))
_TERMINAL: Final = frozenset({RolloutState.SUCCEEDED.value, RolloutState.FAILED.value})


def result_field_columns(fields: Sequence[str]) -> tuple[Column, ...]:
    """The columns of selected top-level fields of the result object (`result_{field}`: the value as text, JSON
    text unless it is a string). `ValueError` for a field that is not an identifier or whose column exists."""
    columns: list[Column] = []
    for name in fields:
        column = f"{RESULT_FIELD_PREFIX}{name}"
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"result field {name!r}: expected a top-level field name such as `response`")
        if column in _NAMES or any(c.name == column for c in columns):
            raise ValueError(f"result field {name!r}: column {column!r} exists already")
        columns.append(Column(column, "string", f"the result object's `{name}` (JSON text unless a string)"))
    return tuple(columns)


def schema_columns(*, result_fields: Sequence[str] = (), rescored: bool = False) -> tuple[Column, ...]:
    """Every column of one export, in file order: the core ones, cost (when it exists), the selected result fields,
    then the re-scoring columns."""
    return (*COLUMNS, *COST_COLUMNS, *result_field_columns(result_fields), *(RESCORE_COLUMNS if rescored else ()))


Row = dict[str, Any]


# ----------------------------------------------------------------------------------------------------- join


def _order(input_id: str) -> str:
    """The sort position of a group's items in the batch partition: `G#{input}` and `R#{input}#{index}` sort
    alike, because every character an input id may hold sorts after `#` (`ids.validate_input_id`)."""
    return f"{input_id}#"


def join_groups(
    groups: Iterable[GroupItem], rollouts: Iterable[RolloutRecord]
) -> Iterator[tuple[GroupItem, dict[int, RolloutRecord]]]:
    """Each group with its rollout items by index, from the two sorted streams of one batch (groups, then
    rollouts, in sort-key order, as `ledger.groups.batch_groups` and `ledger.rollouts.batch_rollouts` read them): one
    pass over each, one group in memory. A rollout item without a group item (never written by the pipeline) is
    skipped."""
    pending = iter(rollouts)
    current = next(pending, None)
    for group in groups:
        key = _order(group.input_id)
        members: dict[int, RolloutRecord] = {}
        while current is not None and _order(current.input_id) <= key:
            if current.input_id == group.input_id:
                members[current.index] = current
            current = next(pending, None)
        yield group, members


# ------------------------------------------------------------------------------------------------------ rows


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def rollout_row(group: GroupItem, index: int, rec: RolloutRecord | None, prices: PriceBook | None = None) -> Row:
    """The dataset row of one rollout, from its group item and its rollout item (None: never dispatched), without
    the result object's columns nor the group statistics (`group_rows` adds both); its cost as its item stores it,
    labelled with `prices` (None: no cost columns' values)."""
    succeeded = rec is not None and rec.state is RolloutState.SUCCEEDED
    failed = rec is not None and rec.state is RolloutState.FAILED
    turn_rewards = list(rec.rewards) if rec is not None and isinstance(rec.rewards, list) else None
    cost = None
    if rec is not None and rec.terminal and prices is not None:
        cost = rec.stored_cost(prices.label, local=prices.local)
    return {
        "exp_id": group.exp_id,
        "batch_id": group.batch_id,
        "input_id": group.input_id,
        "index": index,
        "rollout_id": ids.rollout_id(group.input_id, index),
        "line": group.line,
        "group_size": group.group_size,
        "status": rec.state.value if rec is not None else RolloutState.QUEUED.value,
        "failure_reason": (rec.reason or "agent_error") if failed and rec is not None else None,
        "error": rec.error if failed and rec is not None else None,
        "model_warning": rec.warning if rec is not None else None,
        "attempt": rec.attempt if rec is not None and rec.attempt else None,
        "reward": rec.reward if succeeded and rec is not None else None,
        "turn_rewards": turn_rewards if succeeded else None,
        "policy_version": rec.policy_version if rec is not None else None,
        "batch_policy_version": rec.batch_policy_version if rec is not None else None,
        "submitted_at": rec.submitted_at if rec is not None else None,
        "dispatched_at": rec.dispatched_at if rec is not None else None,
        "invoked_at": rec.invoked_at if rec is not None else None,
        "finished_at": rec.finished_at if rec is not None else None,
        "duration_s": _seconds(rec.dispatched_at, rec.finished_at) if rec is not None else None,
        "session_id": rec.session_id if rec is not None else None,
        "result_uri": rec.result_uri if rec is not None else None,
        "result_size": rec.result_size if rec is not None else None,
        "payload_json": _json_text(group.payload) if group.payload is not None else None,
        "payload_ref": group.payload_ref,
        **cost_columns(cost),
    }


def cost_columns(cost: RolloutCost | None) -> Row:
    """The cost columns of one rollout (`COST_COLUMNS`), all null without a cost."""
    if cost is None:
        return {column.name: None for column in COST_COLUMNS}
    return {
        "cost_usd": cost.usd,
        "cost_agentcore_usd": cost.agentcore_memory_usd + cost.agentcore_cpu_usd,
        "cost_pipeline_usd": cost.pipeline_usd,
        "cost_usd_max": cost.usd_max,
        "cost_session_end": cost.session_end,
        "cost_priced_as": cost.priced_as,
    }


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def add_group_stats(rows: list[Row]) -> list[Row]:
    """Set each row's group columns: complete, the successful rewards' mean and std, the GRPO advantage
    (`contracts.grpo_advantages`, the formula of `Group.advantages()`). Statistics only once the group is complete
    (as `Group Completed` carries them)."""
    complete = bool(rows) and all(row["status"] in _TERMINAL for row in rows)
    rewards: list[float | None] = [row["reward"] for row in rows]
    mean, std = reward_stats([r for r in rewards if r is not None]) if complete else (None, None)
    advantages = grpo_advantages(rewards) if complete else [None] * len(rows)
    for row, advantage in zip(rows, advantages, strict=True):
        row["group_complete"] = complete
        row["group_reward_mean"] = mean
        row["group_reward_std"] = std
        row["advantage"] = advantage
    return rows


def result_columns(result: Mapping[str, Any] | None, result_fields: Sequence[str]) -> Row:
    """The columns taken from a result object (None: none, or unreadable)."""
    if result is None:
        return {"result_json": None, "result_status_code": None, "result_stop_reason": None} | {
            f"{RESULT_FIELD_PREFIX}{name}": None for name in result_fields
        }
    status = result.get("status_code")
    stop = result.get("stop_reason")
    columns: Row = {
        "result_json": _json_text(result),
        "result_status_code": status if isinstance(status, int) and not isinstance(status, bool) else None,
        "result_stop_reason": None if stop is None else str(stop),
    }
    for name in result_fields:
        value = result.get(name)
        columns[f"{RESULT_FIELD_PREFIX}{name}"] = None if value is None else value if isinstance(value, str) else (
            _json_text(value)
        )  # fmt: skip
    return columns


#: Reads one result object by its URI: the parsed object, or None when it cannot be read.
FetchResult = Callable[[str], Mapping[str, Any] | None]


def group_rows(
    group: GroupItem,
    members: Mapping[int, RolloutRecord],
    *,
    results: Mapping[int, Mapping[str, Any] | None] | None = None,
    result_fields: Sequence[str] = (),
    prices: PriceBook | None = None,
) -> list[Row]:
    """Every row of one group (one per index, in index order), with group statistics, costs priced with `prices`
    and, given `results` (index -> result object), the result columns."""
    rows = add_group_stats([rollout_row(group, i, members.get(i), prices) for i in range(group.group_size)])
    for row in rows:
        row.update(result_columns((results or {}).get(row["index"]), result_fields))
    return rows


# --------------------------------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class RowFilter:
    """Which rows an export keeps. Group statistics are computed over the whole group first, so a filter never
    changes a kept row's advantage.

    - `variance_only`: only complete groups whose successful rewards differ (the groups a GRPO trainer learns from:
      the others have all-zero advantages);
    - `succeeded_only`: only `succeeded` rollouts;
    - `min_reward`: only rollouts with a reward at or above it (failures, which have none, are dropped).
    """

    variance_only: bool = False
    succeeded_only: bool = False
    min_reward: float | None = None

    def __post_init__(self) -> None:
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise ValueError(f"min_reward must be a finite number (got {self.min_reward})")

    @property
    def active(self) -> bool:
        return self.variance_only or self.succeeded_only or self.min_reward is not None

    def describe(self) -> str:
        """The filters as one line (for the dataset card and the files' metadata); `none` when inactive."""
        parts = []
        if self.variance_only:
            parts.append("groups with reward variance only")
        if self.succeeded_only:
            parts.append("succeeded rollouts only")
        if self.min_reward is not None:
            parts.append(f"reward >= {self.min_reward:g}")
        return "; ".join(parts) or "none"

    def keep(self, rows: list[Row]) -> list[Row]:
        """The rows of one group this filter keeps."""
        if self.variance_only and not has_variance(rows):
            return []
        kept = rows
        if self.succeeded_only:
            kept = [row for row in kept if row["status"] == RolloutState.SUCCEEDED.value]
        if self.min_reward is not None:
            threshold = self.min_reward
            kept = [row for row in kept if row["reward"] is not None and row["reward"] >= threshold]
        return kept


def has_variance(rows: Sequence[Row]) -> bool:
    """The group is complete and its successful rewards are not all equal (exactly: a float mean of equal values
    can leave a non-zero std)."""
    if not rows or not rows[0].get("group_complete"):
        return False
    return len({row["reward"] for row in rows if row["reward"] is not None}) > 1


# -------------------------------------------------------------------------------------------------- rewards


def checked_rewards(value: Any) -> float | list[float]:
    """A reward function's return value as the pipeline takes an agent's `rewards`: a finite number, or a non-empty
    list of finite numbers, within +-`MAX_ABS_REWARD`. `ValueError` naming what came back otherwise."""

    def number(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= MAX_ABS_REWARD

    if number(value):
        return float(value)
    if isinstance(value, list | tuple) and value and all(number(x) for x in value):
        return [float(x) for x in value]
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ValueError(
        f"returned {shown} ({type(value).__name__}): expected a finite number or a non-empty list of finite numbers"
    )


def with_rewards(row: Row, rewards: float | list[float] | None, error: str | None) -> Row:
    """`row` re-scored: the new reward and per-turn rewards (None with `error`: the function failed on it), the
    agent's own kept as `original_*`. Group statistics are recomputed by `add_group_stats` afterwards."""
    return row | {
        "original_reward": row["reward"],
        "original_turn_rewards": row["turn_rewards"],
        "original_advantage": row["advantage"],
        "reward": None if rewards is None else scalar_reward(rewards),
        "turn_rewards": rewards if isinstance(rewards, list) else None,
        "rescore_error": error,
    }


@dataclass
class DatasetExport:
    """What one export (or re-scoring) wrote: rows and files, by batch; for a re-scoring, the rows re-scored and
    the rows whose reward function failed (`errors`: rollout id -> what it raised, the first `MAX_LISTED_ERRORS`)."""

    directory: str
    rows: int = 0
    files: list[str] = field(default_factory=list)
    rows_by_batch: dict[str, int] = field(default_factory=dict)
    rescored: int = 0
    failed: int = 0
    errors: dict[str, str] = field(default_factory=dict)


#: How many failing rows a re-scoring lists by id (all of them are marked in the data: `rescore_error`).
MAX_LISTED_ERRORS: Final = 20
