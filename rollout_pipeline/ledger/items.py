"""Every item type of the ledger, typed: what its reads and conditional writes return.

The ledger parses each item once, at the table boundary (`of`: the low-level client's typed form, `{"N": "3"}`,
through `attributes.item_values`); the stages, the SDK and the CLI never see a raw DynamoDB dict. Times are
datetimes, states enums, counters ints and floats, JSON attributes parsed. `BatchView` is a batch as its readers
see it (the batch item with its control item and its counter shards merged, `batches.merge_batch_items`);
`GroupItem` a group; `RolloutRecord` a rollout item and `RolloutSummary` any projection of it; `Terminal` is the
outcome a terminal transition records. Rollout transitions are keyed by value: `ids.AttemptRef`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from rollout_pipeline import ids
from rollout_pipeline.contracts import CostSummary, FailureReason, FileOptions, RolloutCost, parse_iso
from rollout_pipeline.costs import SessionSpan
from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger.attributes import float_at, int_at, item_values, optional_float_at, text_at


class BatchState(StrEnum):
    """A batch's `status`."""

    INGESTING = "ingesting"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


class RolloutState(StrEnum):
    """A rollout's `state`."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


TERMINAL_STATES: Final = frozenset({RolloutState.SUCCEEDED, RolloutState.FAILED})
#: A budget's announcements (`Budget Warning`, `Budget Exhausted`), as the ledger names their claims.
BUDGET_EVENT_KINDS: Final = ("warned", "exhausted")


def announced_budget_events(item: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A budget's announced events as published (JSON) by kind, from the item that claims them (`{prefix}{kind}_event`:
    the experiment's budget item, or a batch item with prefix "budget_")."""
    return {kind: text for kind in BUDGET_EVENT_KINDS if (text := text_at(item, f"{prefix}{kind}_event"))}


#: Attempts whose session facts a rollout item can hold (`config.ExperimentConfig.max_attempts` is at most 10).
MAX_SPAN_ATTEMPTS: Final = 10
#: The parts of one attempt's session facts on the rollout item (`span_attribute`). The current attempt's start,
#: deadline and end are its `dispatched_at`, `deadline` and `finished_at` (its session idle from then on when it wrote
#: a result: `result_uri`); an earlier attempt's are copied when it ends (`start` S ISO, `due` N epoch s, `end` N
#: epoch ms). Every attempt may have `cpu` (N: measured CPU seconds), `stop` or `closed` (N, epoch ms: its confirmed
#: stop, or its close without one) and `none` (BOOL: its invoke was refused, no session ran). Small on purpose:
#: the rollout item stays under 1 KB, so each write to it costs one write unit, not two.
SPAN_PARTS: Final = ("start", "due", "end", "cpu", "stop", "closed", "none")

#: Cost sums ADDed by each terminal transaction, on the group item and the batch's counter shard.
COST_COUNTERS: Final = (
    "cost_usd",
    "cost_memory_usd",
    "cost_cpu_usd",
    "cost_pipeline_usd",
    "cost_rollouts",
    "cost_cpu_measured",
)


#: The figures of a rollout's cost (`contracts.RolloutCost`) its terminal transition stores in the rollout item's
#: `cost` attribute, in this order (a JSON list: short, so the item stays under 1 KB); `priced_as` and `local` are the
#: price book's, given when it is read (`RolloutRecord.stored_cost`).
STORED_COST_FIELDS: Final = (
    "usd",
    "agentcore_memory_usd",
    "agentcore_cpu_usd",
    "pipeline_usd",
    "cpu",
    "cpu_s",
    "session_s",
    "sessions",
    "session_end",
    "usd_max",
)


def span_attribute(attempt: int, part: str) -> str:
    """The rollout item's attribute holding `part` of attempt `attempt`'s session (e.g. `s2_start`)."""
    return f"s{attempt}_{part}"


def epoch_ms(moment: datetime) -> int:
    """A time as the ledger stores session facts: epoch milliseconds."""
    return round(moment.timestamp() * 1000)


def from_epoch_ms(value: Any) -> datetime:
    return datetime.fromtimestamp(int(value) / 1000, UTC)


def to_the_ms(moment: datetime) -> datetime:
    """`moment` as it reads back from the ledger's epoch milliseconds (so a figure priced with it is reproducible)."""
    return datetime.fromtimestamp(round(moment.timestamp() * 1000) / 1000, UTC)


def cost_summary(item: Mapping[str, Any]) -> CostSummary | None:
    """The cost sums of a group item or a batch view (None before any rollout was priced)."""
    rollouts = int_at(item, "cost_rollouts")
    if rollouts <= 0:
        return None
    return CostSummary(
        usd=float_at(item, "cost_usd"),
        agentcore_memory_usd=float_at(item, "cost_memory_usd"),
        agentcore_cpu_usd=float_at(item, "cost_cpu_usd"),
        pipeline_usd=float_at(item, "cost_pipeline_usd"),
        rollouts=rollouts,
        cpu_measured=int_at(item, "cost_cpu_measured"),
    )


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """What a rollout item stores of one attempt's session (`SPAN_PARTS`)."""

    start: datetime | None = None
    due: datetime | None = None
    end: datetime | None = None
    cpu_s: float | None = None
    stop: datetime | None = None
    closed: datetime | None = None
    none: bool = False


def _span_facts(item: Mapping[str, Any]) -> dict[int, SpanFacts]:
    facts: dict[int, SpanFacts] = {}
    for attempt in range(1, MAX_SPAN_ATTEMPTS + 1):
        found = {part: item.get(span_attribute(attempt, part)) for part in SPAN_PARTS}
        if all(value is None for value in found.values()):
            continue
        facts[attempt] = SpanFacts(
            start=parse_iso(found["start"]),
            due=None if found["due"] is None else datetime.fromtimestamp(int(found["due"]), UTC),
            end=None if found["end"] is None else from_epoch_ms(found["end"]),
            cpu_s=None if found["cpu"] is None else float(found["cpu"]),
            stop=None if found["stop"] is None else from_epoch_ms(found["stop"]),
            closed=None if found["closed"] is None else from_epoch_ms(found["closed"]),
            none=bool(found["none"]),
        )
    return facts


def _options(raw: Any) -> FileOptions | None:
    if not raw:
        return None
    try:
        return FileOptions.model_validate_json(raw)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class BatchView:
    """One batch as the ledger knows it (the batch view: counters summed over its shards)."""

    exp_id: str
    batch_id: str
    status: BatchState
    source: str | None = None
    #: The effective per-file options; None for a file rejected before they were known (or an unreadable value).
    options: FileOptions | None = None
    created_at: datetime | None = None
    accepted_at: datetime | None = None
    completed_at: datetime | None = None
    cancelled_at: datetime | None = None
    rows_accepted: int = 0
    rows_rejected: int = 0
    #: Set when ingestion ends; until then the batch cannot complete.
    rollouts_total: int | None = None
    rollouts_enqueued: int = 0
    errors_listed: int = 0
    cursor: int = 0
    errors_uri: str | None = None
    error: str | None = None
    #: Stored on a batch rejected as a whole (its options are unknown).
    group_size: int | None = None
    terminal: int = 0
    succeeded: int = 0
    failed: int = 0
    failed_by_reason: Mapping[str, int] = field(default_factory=dict)
    reward_sum: float = 0.0
    reward_sumsq: float = 0.0
    reward_count: int = 0
    completed_event_by: str | None = None
    #: The sum of its terminal rollouts' costs as published (None before the first).
    cost: CostSummary | None = None
    #: The batch's budget set after submission (`BatchLedger.set_budget`; it replaces the submitted one).
    budget_set_usd: float | None = None
    #: The batch budget values whose warning and exhaustion were announced.
    budget_warned_for: float | None = None
    budget_exhausted_for: float | None = None
    #: Those events as published (JSON), by kind ("warned", "exhausted"; `sdk.replay` rebuilds them).
    budget_events: Mapping[str, str] = field(default_factory=dict)

    @property
    def budget_usd(self) -> float | None:
        """The batch's own budget: the one set later, else the one it was submitted with (None: only the
        experiment's applies)."""
        if self.budget_set_usd is not None:
            return self.budget_set_usd
        return self.options.budget_usd if self.options is not None else None

    @property
    def complete(self) -> bool:
        """Ingestion has ended and every rollout is terminal."""
        return (
            self.status is not BatchState.INGESTING
            and self.rollouts_total is not None
            and self.terminal >= self.rollouts_total
        )

    @property
    def cancelled(self) -> bool:
        return self.status is BatchState.CANCELLED

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> BatchView:
        """Parse a batch view (typed: `batches.merge_batch_items`, or the batch item an update returned)."""
        item = item_values(raw)
        total = item.get("rollouts_total")
        group_size = item.get("group_size")
        return cls(
            exp_id=str(item.get("exp_id") or ""),
            batch_id=str(item.get("batch_id") or ""),
            status=BatchState(str(item.get("status") or BatchState.INGESTING)),
            source=text_at(item, "source"),
            options=_options(item.get("options")),
            created_at=parse_iso(item.get("created_at")),
            accepted_at=parse_iso(item.get("accepted_at")),
            completed_at=parse_iso(item.get("completed_at")),
            cancelled_at=parse_iso(item.get("cancelled_at")),
            rows_accepted=int_at(item, "rows_accepted"),
            rows_rejected=int_at(item, "rows_rejected"),
            rollouts_total=None if total is None else int(total),
            rollouts_enqueued=int_at(item, "rollouts_enqueued"),
            errors_listed=int_at(item, "errors_listed"),
            cursor=int_at(item, "cursor"),
            errors_uri=text_at(item, "errors_uri"),
            error=text_at(item, "error"),
            group_size=None if group_size is None else int(group_size),
            terminal=int_at(item, "terminal"),
            succeeded=int_at(item, "succeeded"),
            failed=int_at(item, "failed"),
            failed_by_reason={
                reason.value: int_at(item, f"failed_{reason.value}")
                for reason in FailureReason
                if int_at(item, f"failed_{reason.value}")
            },
            reward_sum=float_at(item, "reward_sum"),
            reward_sumsq=float_at(item, "reward_sumsq"),
            reward_count=int_at(item, "reward_count"),
            completed_event_by=text_at(item, "completed_event_by"),
            cost=cost_summary(item),
            budget_set_usd=optional_float_at(item, "budget_usd"),
            budget_warned_for=optional_float_at(item, "budget_warned_for"),
            budget_exhausted_for=optional_float_at(item, "budget_exhausted_for"),
            budget_events=announced_budget_events(item, "budget_"),
        )


@dataclass(frozen=True, slots=True)
class GroupItem:
    """One group (an accepted row) and the per-index outcomes of its rollouts."""

    exp_id: str
    batch_id: str
    input_id: str
    line: int
    group_size: int
    #: The inline payload (parsed), or None when it is stored aside (`payload_ref`).
    payload: Mapping[str, Any] | None = None
    payload_ref: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    terminal: int = 0
    rewards: Mapping[int, float] = field(default_factory=dict)
    failures: Mapping[int, FailureReason] = field(default_factory=dict)
    created_at: datetime | None = None
    completed_event_by: str | None = None
    #: The sum of its terminal rollouts' costs as published (None before the first).
    cost: CostSummary | None = None
    #: With oversample: the valid rollouts the group needs (`group_size` counts the extra ones too), and the
    #: successful rollouts let into the group so far (`GroupLedger.claim_kept`); None / empty without.
    target: int | None = None
    kept: frozenset[int] = frozenset()

    @property
    def complete(self) -> bool:
        return self.group_size > 0 and self.terminal >= self.group_size

    @property
    def full(self) -> bool:
        """An oversampled group that has all the valid rollouts it needs: the rest of its rollouts are surplus."""
        return self.target is not None and len(self.kept) >= self.target

    def surplus_success(self, index: int) -> bool:
        """A successful rollout that the full group did not let in (`GroupLedger.claim_kept`)."""
        return self.full and index not in self.kept

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> GroupItem:
        """Parse a group item (typed)."""
        item = item_values(raw)
        payload = item.get("payload")
        overrides = item.get("overrides")
        return cls(
            exp_id=str(item.get("exp_id") or ""),
            batch_id=str(item.get("batch_id") or ""),
            input_id=str(item.get("input_id") or ""),
            line=int_at(item, "line"),
            group_size=int_at(item, "group_size"),
            payload=json.loads(payload) if payload is not None else None,
            payload_ref=text_at(item, "payload_ref"),
            overrides=json.loads(overrides) if overrides else {},
            terminal=int_at(item, "terminal"),
            rewards={int(k): float(v) for k, v in (item.get("rewards") or {}).items()},
            failures={int(k): FailureReason(str(v)) for k, v in (item.get("failures") or {}).items()},
            created_at=parse_iso(item.get("created_at")),
            completed_event_by=text_at(item, "completed_event_by"),
            cost=cost_summary(item),
            target=None if item.get("target") is None else int(item["target"]),
            kept=frozenset(int(k) for k in (item.get("kept") or {})),
        )


@dataclass(frozen=True, slots=True)
class RolloutSummary:
    """What the SDK and the CLI read of one rollout item (any projection of it: attributes it lacks are None)."""

    state: RolloutState | None
    input_id: str | None = None
    index: int | None = None
    reward: float | None = None
    reason: str | None = None

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RolloutSummary:
        """Parse a rollout item (typed, whole or projected)."""
        item = item_values(raw)
        state, index, reward = item.get("state"), item.get("index"), item.get("reward")
        return cls(
            state=RolloutState(state) if state else None,
            input_id=text_at(item, "input_id"),
            index=None if index is None else int(index),
            reward=None if reward is None else float(reward),
            reason=text_at(item, "reason"),
        )


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout item, typed: parsed once at the table boundary (`of`); times are UTC datetimes (ISO-8601 text in
    the item), the state a `RolloutState`."""

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
    #: What the agent host saw go wrong in the model replies the result was computed from (`ModelCalls.warning`).
    warning: str | None = None

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
    #: The attempt runs in a warm session (`ledger.warm`): when that session was started (epoch s); None: its
    #: session was started by its own dispatch.
    session_warmed_at: float | None = None
    #: The item as read (plain values), which a write's `table.ItemChange` turns into the item it leaves; empty
    #: for a record made otherwise.
    stored: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: What the item stores of each attempt's session (`SPAN_PARTS`), by attempt.
    span_facts: Mapping[int, SpanFacts] = field(default_factory=dict)
    #: The figures of what the rollout cost as its terminal transition priced them (`STORED_COST_FIELDS`): the
    #: figure its event carries and its group and batch sums hold (`stored_cost`); None before it ended.
    cost_figures: Mapping[str, Any] | None = None
    #: Sessions found alive past their attempt's deadline plus `session_grace_s` (counted once each).
    overdue: frozenset[str] = field(default_factory=frozenset)

    @property
    def spans(self) -> tuple[SessionSpan, ...]:
        """Every attempt's AgentCore session as far as the ledger knows it, by attempt: earlier attempts' from their
        copied facts, the current one's from `dispatched_at`, `deadline`, `finished_at` and `result_uri`."""
        spans = [
            SessionSpan(n, f.start, f.end, False, f.cpu_s, f.stop, f.closed, f.due)
            for n, f in sorted(self.span_facts.items())
            if n != self.attempt and f.start is not None and not f.none
        ]
        current = self._current_span()
        return (*spans, current) if current is not None else tuple(spans)

    def _current_span(self) -> SessionSpan | None:
        facts = self.span_facts.get(self.attempt, SpanFacts())
        if self.dispatched_at is None or facts.none:  # not dispatched, or its invoke was refused
            return None
        started = self.dispatched_at
        if self.session_warmed_at is not None:  # a warm session: it lived (and was billed) from its warm start
            started = min(started, datetime.fromtimestamp(self.session_warmed_at, UTC))
        return SessionSpan(
            attempt=self.attempt,
            started_at=started,
            ended_at=self.finished_at if self.terminal else None,
            idle=self.terminal and self.result_uri is not None,
            cpu_s=facts.cpu_s,
            stopped_at=facts.stop,
            closed_at=facts.closed,
            due_at=None if self.deadline is None else datetime.fromtimestamp(int(self.deadline), UTC),
        )

    def span(self, attempt: int) -> SessionSpan | None:
        """The session of `attempt`, if it was started."""
        return next((s for s in self.spans if s.attempt == attempt), None)

    def session_span(self, session_id: str) -> SessionSpan | None:
        """The span of the attempt that ran in `session_id` (`attempt_of`: a warm session's too), if it started."""
        attempt = self.attempt_of(session_id)
        return None if attempt is None else self.span(attempt)

    def attempt_of(self, session_id: str) -> int | None:
        """The attempt that ran in `session_id`: the one its own id names (`ids.session_attempt`); for a warm
        session of the pool (its id names no attempt), the current attempt when it is the current session, else
        the earliest earlier attempt whose session is neither confirmed stopped nor its own (an attempt that took a
        warm session never started the session its id names, and a warm attempt retried in a new session leaves
        its warm session's stop pending). None when no attempt can be told."""
        attempt = ids.session_attempt(session_id)
        if attempt is not None:
            return attempt
        if session_id == self.session_id:
            return self.attempt
        pending = self.stop_sessions | self.held_slots
        for earlier, facts in sorted(self.span_facts.items()):
            if earlier >= self.attempt or facts.start is None or facts.none or facts.stop or facts.closed:
                continue
            own = ids.session_id(self.exp_id, self.batch_id, self.input_id, self.index, earlier) if self.exp_id else ""
            if own not in pending:
                return earlier
        return None

    def stored_cost(self, priced_as: str, *, local: bool = False) -> RolloutCost | None:
        """What the rollout cost as its terminal transition priced and stored it (never priced again), labelled with
        the price book's `priced_as` and `local` (`costs.PriceBook.label`); None before it ended (or for an item
        written before costs were stored)."""
        if self.cost_figures is None:
            return None
        return RolloutCost.model_validate({**self.cost_figures, "priced_as": priced_as, "local": local})

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def ref(self) -> AttemptRef:
        """The attempt this item is at."""
        return AttemptRef(self.batch_id, self.input_id, self.index, self.attempt)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> RolloutRecord:
        """Parse a whole rollout item (typed)."""
        return cls.of_values(item_values(raw))

    @classmethod
    def of_values(cls, item: Mapping[str, Any]) -> RolloutRecord:
        """A whole rollout item from its plain values (`attributes.item_values`)."""
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
            warning=item.get("warning"),
            policy_version=item.get("policy_version"),
            batch_policy_version=item.get("batch_policy_version"),
            outbox=frozenset(item.get("outbox") or ()),
            outbox_id=item.get("outbox_id"),
            stop_sessions=frozenset(item.get("stop_sessions") or ()),
            held_slots=frozenset(item.get("held_slots") or ()),
            held_until=None if item.get("held_until") is None else int(item["held_until"]),
            stop_tries=int(item.get("stop_tries") or 0),
            stop_not_found=frozenset(item.get("stop_not_found") or ()),
            session_warmed_at=None if item.get("session_warmed_at") is None else float(item["session_warmed_at"]),
            span_facts=_span_facts(item),
            cost_figures=None
            if item.get("cost") is None
            else dict(zip(STORED_COST_FIELDS, json.loads(item["cost"]), strict=True)),
            overdue=frozenset(item.get("overdue_sessions") or ()),
            stored=dict(item),
        )


@dataclass(frozen=True)
class Terminal:
    """The terminal outcome to record."""

    state: str  # SUCCEEDED or FAILED
    finished_at: datetime
    reason: str | None = None
    error: str | None = None
    reward: float | None = None
    rewards: float | list[float] | None = None
    result_uri: str | None = None
    result_size: int | None = None
    #: The model replies' warning (`ModelCalls.warning`), when the agent host saw one.
    warning: str | None = None
    #: What the rollout cost (`lifecycle.costing.terminal_cost`): stored on the item (`cost`, `STORED_COST_FIELDS`)
    #: and summed on its group and batch in the same transaction.
    cost: RolloutCost | None = None
    #: The ended attempt's session: the agent had finished (wrote its result); its CPU seconds as measured.
    idle: bool = False
    cpu_s: float | None = None
    #: False when the ended attempt never started a session (its invoke was refused): its span is removed.
    session_started: bool = True

    def attributes(self) -> dict[str, object]:
        """The outcome's optional attributes, as the rollout item stores them (None: not stored)."""
        return {
            "reason": self.reason,
            "error": self.error,
            "reward": self.reward,
            "rewards_json": None if self.rewards is None else json.dumps(self.rewards),
            "result_uri": self.result_uri,
            "result_size": self.result_size,
            "warning": self.warning,
            "cost": None
            if self.cost is None
            else json.dumps([getattr(self.cost, name) for name in STORED_COST_FIELDS], separators=(",", ":")),
        }
