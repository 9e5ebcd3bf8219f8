"""The budget: dispatch pauses when the experiment's (or a batch's) spend reaches its budget, and resumes where it
stopped once the budget is raised (docs/costs.md, "Budget").

- **Spend.** The experiment's: every ended session's cost (exact at its confirmed stop, `lifecycle.costing`),
  summed on the 32 session-slot counters (`ExperimentLedger.slots_and_spend`: no item of its own, no hot item). A
  batch's: the cost its events carried (its counter shards).
- **Budget.** The experiment's: the one set at run time (`LIMIT/BUDGET`, `rollouts budget set`), else the deployed
  `budget_usd`. A batch's: the one set later (`rollouts budget set --batch`), else the one it was submitted with.
- **Announced once.** A dispatcher (once per SQS batch) and the sweeper (every minute) read the experiment's budget
  and spend, sample `BudgetUsedPercent` and publish `Budget Warning` at 80% and `Budget Exhausted` at 100%, each
  once per budget value (a conditional write claims it; a failed publication gives the claim back).
- **Held, never failed.** A rollout whose budget is spent is not dispatched: its message is re-sent to come back at
  the next multiple of `LifecycleDeps.budget_recheck_s` in epoch seconds (SQS DelaySeconds, `return_delay_s`) and the
  received one is acknowledged, so its receive count starts over and it never reaches the dead-letter queue. Every
  rollout held during one such period comes back in the same second, whenever it was held, so the gate orders
  them together as any burst and dispatch resumes in group order. Its wait does not count toward `max_limit_wait_s`
  (the message carries when its hold began; `waiting_since` moves forward by the hold once it ends) nor
  `max_limit_requeues`. Rollouts in flight finish and are recorded;
  the release window and group order are untouched, so dispatch resumes where it stopped.
- **The account pool** shares AgentCore's quotas between experiments; `paused(deps)` says whether this experiment's
  dispatch is paused on its budget.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from rollout_pipeline import ids
from rollout_pipeline.contracts import BudgetExhausted, BudgetWarning, DetailType, RolloutMessage
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.metric_names import BUDGET_HELD, BUDGET_USED_PERCENT

log = logging.getLogger(__name__)

#: The share of a budget that warns (`Budget Warning`, the `BudgetWarning` alarm).
WARNING_SHARE: Final = 0.8
#: SQS's longest DelaySeconds: a held rollout comes back at most this much later.
MAX_RECHECK_S: Final = 900
#: Batches looked at to say what is waiting (`Budget Exhausted`): the newest ones.
WAITING_BATCHES: Final = 50
#: A dispatcher reads the experiment's budget again before a dispatch when its last read is older than this: without
#: a budget 30 s (one set at run time holds within 30 s; a dispatcher that waits minutes for slots costs one read per
#: SQS batch and 30 s, not one per rollout), with one 2 s, and past `WARNING_SHARE` of it before every dispatch.
FRESH_FAR_S: Final = 30.0
FRESH_S: Final = 2.0

Scope = Literal["experiment", "batch"]


@dataclass(frozen=True, slots=True)
class ExperimentBudget:
    """The experiment's budget and spend, as read once."""

    budget_usd: float | None
    spent_usd: float = 0.0
    in_flight: int = 0
    warned_for: float | None = None
    exhausted_for: float | None = None

    @property
    def used(self) -> float | None:
        """The share spent (1.0 = exhausted), None without a budget."""
        if self.budget_usd is None:
            return None
        return self.spent_usd / self.budget_usd if self.budget_usd > 0 else float("inf")

    @property
    def exhausted(self) -> bool:
        return self.budget_usd is not None and self.spent_usd >= self.budget_usd


def read(deps: LifecycleDeps) -> ExperimentBudget:
    """The experiment's budget (the ledger's, else `budget_usd`) and, when it has one, its spend: one GetItem, and
    one Query of the slot counters when a budget is set."""
    state = deps.ledger.experiment.budget()
    budget = state.budget_usd if state.budget_usd is not None else deps.config.budget_usd
    if budget is None:
        return ExperimentBudget(None)
    in_flight, spent = deps.ledger.experiment.slots_and_spend()
    return ExperimentBudget(budget, spent, in_flight, state.warned_for, state.exhausted_for)


def paused(deps: LifecycleDeps) -> bool:
    """Whether the experiment's dispatch is paused on its budget (the account pool's demand is zero then)."""
    return read(deps).exhausted


def check(deps: LifecycleDeps) -> ExperimentBudget:
    """Read the experiment's budget, sample `BudgetUsedPercent` and announce what is due (see the module doc)."""
    found = read(deps)
    if found.budget_usd is None:
        return found
    deps.metrics.sample(BUDGET_USED_PERCENT, 100.0 * (found.used or 0.0))
    if (found.used or 0.0) >= WARNING_SHARE and found.warned_for != found.budget_usd:
        _announce(deps, "experiment", "", "warned", **_figures(found))
    if found.exhausted and found.exhausted_for != found.budget_usd:
        _announce(deps, "experiment", "", "exhausted", **_figures(found))
    return found


def _freshness(found: ExperimentBudget) -> float:
    """How old a read of the experiment's budget may be before a dispatch (`FRESH_S`)."""
    if found.budget_usd is None:
        return FRESH_FAR_S
    return 0.0 if (found.used or 0.0) >= WARNING_SHARE else FRESH_S


def _figures(found: ExperimentBudget) -> dict[str, float]:
    return {"budget_usd": found.budget_usd or 0.0, "spent_usd": found.spent_usd, "in_flight": found.in_flight}


def check_batch(deps: LifecycleDeps, batch: BatchView, in_flight: int = 0) -> bool:
    """Announce what is due of `batch`'s own budget; True when it is spent (its rollouts wait)."""
    budget = batch.budget_usd
    if budget is None:
        return False
    spent = batch.cost.usd if batch.cost is not None else 0.0
    if spent >= WARNING_SHARE * budget and batch.budget_warned_for != budget:
        _announce(deps, "batch", batch.batch_id, "warned", budget_usd=budget, spent_usd=spent, in_flight=in_flight)
    if spent >= budget and batch.budget_exhausted_for != budget:
        _announce(deps, "batch", batch.batch_id, "exhausted", budget_usd=budget, spent_usd=spent, in_flight=in_flight)
    return spent >= budget


def return_delay_s(now_epoch_s: float, recheck_s: int) -> int:
    """The SQS delay that brings a message held at `now_epoch_s` back at the next multiple of `recheck_s` (capped
    at `MAX_RECHECK_S`) in whole epoch seconds: messages held at different moments of one period come back in the
    same second, and one held again on its return waits a whole period."""
    period = max(0, min(MAX_RECHECK_S, recheck_s))
    if period == 0:
        return 0
    return period - int(now_epoch_s) % period


def hold(message: RolloutMessage, deps: LifecycleDeps) -> None:
    """Hold a rollout whose budget is spent: re-send its message to come back with every other held one
    (`return_delay_s`; a fresh message: its receive count starts over; `limit_requeues` unchanged), marked with when
    its hold began. The caller acknowledges the received one."""
    delay = return_delay_s(deps.now().timestamp(), deps.budget_recheck_s)
    fresh = message.model_copy(update={"budget_held_since": message.budget_held_since or deps.now()})
    deps.feed.hold(fresh, delay)
    deps.metrics.count(BUDGET_HELD)


def after_hold(message: RolloutMessage, deps: LifecycleDeps) -> RolloutMessage:
    """A message whose budget has room again: its hold ends, and the time held moves its limit wait's start
    forward (`waiting_since`), so waiting on the budget never counts toward `max_limit_wait_s`."""
    if message.budget_held_since is None:
        return message
    update: dict[str, object] = {"budget_held_since": None}
    if message.waiting_since is not None:
        update["waiting_since"] = message.waiting_since + max(timedelta(), deps.now() - message.budget_held_since)
    return message.model_copy(update=update)


class Budgets:
    """The budgets one SQS batch of the dispatcher is held to: the experiment's read on the first message and again
    when the last read is older than `FRESH_S` / `FRESH_FAR_S` (a message may wait minutes for a slot), each batch's
    from the batch view the dispatcher reads anyway. Thread-safe."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self._deps = deps
        self._lock = threading.Lock()
        self._experiment: ExperimentBudget | None = None
        self._read_at = 0.0
        self._batches: dict[str, bool] = {}

    def experiment(self) -> ExperimentBudget:
        with self._lock:
            now = self._deps.clock.monotonic()
            if self._experiment is None or now - self._read_at >= _freshness(self._experiment):
                self._experiment = check(self._deps)
                self._read_at = now
            return self._experiment

    def after_wait(self) -> None:
        """The caller waited for a slot, which a rollout ending freed, adding to the spend: the experiment's next
        look reads its budget again (when it has one)."""
        with self._lock:
            if self._experiment is not None and self._experiment.budget_usd is not None:
                self._read_at = -math.inf

    def spent(self, batch: BatchView) -> Scope | None:
        """Which budget holds `batch`'s rollouts back ("experiment" first), None when both have room."""
        experiment = self.experiment()
        if experiment.exhausted:
            return "experiment"
        with self._lock:
            if batch.batch_id not in self._batches:
                self._batches[batch.batch_id] = check_batch(self._deps, batch, experiment.in_flight)
            return "batch" if self._batches[batch.batch_id] else None


def _announce(
    deps: LifecycleDeps,
    scope: Scope,
    batch_id: str,
    kind: Literal["warned", "exhausted"],
    *,
    budget_usd: float,
    spent_usd: float,
    in_flight: float,
) -> None:
    """Publish `Budget Warning` / `Budget Exhausted` once per budget value: claimed first, with the event (a
    conditional write; a stream made later rebuilds it from there); a failed publication gives the claim back (the
    next check tries again) and is only logged."""
    limits, batches = deps.ledger.experiment, deps.ledger.batches
    exp_id = deps.config.name
    common: dict[str, Any] = {
        "exp_id": exp_id,
        "batch_id": batch_id,
        "scope": scope,
        "budget_usd": budget_usd,
        "spent_usd": spent_usd,
    }
    detail: BudgetWarning | BudgetExhausted
    if kind == "warned":
        event_id = budget_event_id(DetailType.BUDGET_WARNING, exp_id, batch_id, budget_usd)
        detail = BudgetWarning(event_id=event_id, threshold=WARNING_SHARE, **common)
    else:
        waiting = _waiting(deps, batch_id)
        detail = BudgetExhausted(
            event_id=budget_event_id(DetailType.BUDGET_EXHAUSTED, exp_id, batch_id, budget_usd),
            rollouts_in_flight=int(in_flight),
            rollouts_waiting=max(0, sum(waiting.values()) - int(in_flight)),
            waiting_by_batch=waiting,
            **common,
        )
    event_json = detail.model_dump_json()
    claimed = (
        limits.claim_budget_event(kind, budget_usd, event_json)
        if scope == "experiment"
        else batches.claim_budget_event(batch_id, kind, budget_usd, event_json)
    )
    if not claimed:
        return
    try:
        deps.publisher.publish([detail])
        log.info("%s budget of %s %s: $%.6f of $%.6f", scope, batch_id or exp_id, kind, spent_usd, budget_usd)
    except Exception:
        log.exception("budget event (%s, %s) not published; it is announced again on the next check", scope, kind)
        if scope == "experiment":
            limits.unclaim_budget_event(kind, budget_usd)
        else:
            batches.unclaim_budget_event(batch_id, kind, budget_usd)


def budget_event_id(detail_type: DetailType, exp_id: str, batch_id: str, budget_usd: float) -> str:
    """The id of a budget event: one per kind, scope and budget VALUE, written exactly (`repr` of the float: two
    budgets that differ in any digit get different ids)."""
    return ids.event_id(detail_type, exp_id, batch_id, f"budget:{float(budget_usd)!r}")


def _waiting(deps: LifecycleDeps, batch_id: str) -> dict[str, int]:
    """Per batch not yet complete: its rollouts not yet ended (`batch_id` only, or the newest batches)."""
    batches = [batch_id] if batch_id else deps.ledger.batches.recent_batch_ids(WAITING_BATCHES)
    waiting: dict[str, int] = {}
    for found in batches:
        view = deps.ledger.batches.read_batch(found)
        if view is None or view.complete or view.cancelled:
            continue
        total = view.rollouts_total if view.rollouts_total is not None else view.rollouts_enqueued
        left = max(0, total - view.terminal)
        if left:
            waiting[found] = left
    return waiting
