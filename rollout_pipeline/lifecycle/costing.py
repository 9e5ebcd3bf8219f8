"""Pricing in the lifecycle (`rollout_pipeline.costs` holds the model): the cost a terminal transition records,
and what freeing a session's slot adds to the experiment's spend.

- A terminal transition prices every session of the rollout once (`terminal_cost`, `costs.price_rollout`): the ended
  attempt's session as ending then (its stop follows the event at once), earlier attempts' sessions as their stops
  say. The transaction stores the figure on the rollout item (`Terminal.cost`) and ADDs it to the group's and the
  batch's sums; `Rollout Completed`/`Failed` carry it as stored (`RolloutRecord.stored_cost`), and `EstimatedCost`
  counts it once the transaction committed.
- Freeing a session's slot (its stop confirmed, or the pipeline giving up on a confirmation once AgentCore has
  ended it) ADDs that session's cost, now exact (or its bound), to the experiment's spend (`LimitLedger.free_slot`):
  the figure budgets are held to.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from rollout_pipeline.contracts import RolloutCost
from rollout_pipeline.costs import price_rollout, price_span, with_span_end
from rollout_pipeline.ledger.items import RolloutRecord, RolloutState, to_the_ms
from rollout_pipeline.lifecycle.deps import LifecycleDeps


def terminal_cost(
    deps: LifecycleDeps,
    rec: RolloutRecord | None,
    *,
    at: datetime | None = None,
    ended_at: datetime | None = None,
    idle: bool = False,
    cpu_s: float | None = None,
    session_started: bool = True,
) -> RolloutCost:
    """The cost of rollout `rec` (as read just before its terminal transition) as that transition records it.

    Priced at `at` (default now). When `rec` is dispatched, its attempt ends: at `ended_at` (default: `at`), `idle`
    when the agent wrote its result, with `cpu_s` as the host measured it; `session_started=False` drops the
    attempt's session (its invoke was refused: none ran)."""
    now = at or deps.now()
    spans = list(rec.spans) if rec is not None else []
    if rec is not None and rec.state is RolloutState.DISPATCHED:
        current = next((s for s in spans if s.attempt == rec.attempt), None)
        spans = [s for s in spans if s.attempt != rec.attempt]
        if current is not None and session_started:
            spans.append(with_span_end(current, ended_at=ended_at or now, idle=idle, cpu_s=cpu_s))
    return price_rollout(sorted(spans, key=lambda s: s.attempt), deps.prices, now)


def session_charge(
    deps: LifecycleDeps, rec: RolloutRecord, session_id: str, *, confirmed: bool, at: datetime | None = None
) -> float:
    """What freeing `session_id`'s slot adds to the experiment's spend: its session priced as ending `at` (default
    now: a confirmed stop, recorded with the same time), or at its bound (no confirmation: AgentCore ended it at its
    idle timeout or maximum lifetime); a warm session as the attempt that ran in it (`RolloutRecord.attempt_of`). 0
    for a session the rollout item has no start of (written before costs were kept)."""
    span = rec.session_span(session_id)
    if span is None:
        return 0.0
    now = to_the_ms(at or deps.now())  # as the ledger records it
    if span.ended_at is None:  # still running when its stop came (a late invoke): busy until now
        span = replace(span, ended_at=now)
    span = replace(span, stopped_at=now, closed_at=None) if confirmed else replace(span, stopped_at=None, closed_at=now)
    return price_span(span, deps.prices, now).usd
