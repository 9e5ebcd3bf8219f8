"""`exp.cost`: what an experiment and its batches cost, from the ledger (`exp.cost()`, `rollouts cost`), and the
budget it is held to (`exp.cost.budget()`, `exp.cost.set_budget(...)`).

Two figures per batch:

- **published**: the sum of the costs its events carried (the batch's counters): each rollout priced when it ended,
  its session's stop then still pending (`RolloutCost`);
- **now**: every rollout of the batch priced again from the ledger's session facts at the moment of the call: a
  confirmed stop is exact, a stop still pending is priced as ending now, a session the pipeline gave up waiting
  for is priced to its bound (AgentCore's idle timeout or maximum lifetime).

And for the experiment: its **spend**, the sum of every ended session's cost (exact at its confirmed stop), which
is what a budget is held to, with the budget itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rollout_pipeline.contracts import CostSummary, RolloutCost, iso, utcnow
from rollout_pipeline.costs import PriceBook, price_rollout, summarize
from rollout_pipeline.ledger.items import BatchState, BatchView, RolloutRecord
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.errors import BatchNotFound, SdkError
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.status import COMPLETED


@dataclass(frozen=True)
class BatchCost:
    """One batch's cost (see the module doc)."""

    batch_id: str
    status: str
    rollouts_total: int | None
    terminal: int
    #: The sum the events carried (None before the first rollout ended).
    published: CostSummary | None
    #: Every dispatched rollout priced now from its sessions (running ones included, to now).
    now: CostSummary | None
    #: Sessions whose stop is still pending (their part of `now` is an estimate) and sessions priced at their bound.
    stops_pending: int = 0
    sessions_bounded: int = 0
    created_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "status": self.status,
            "rollouts_total": self.rollouts_total,
            "terminal": self.terminal,
            "published": None if self.published is None else self.published.model_dump(),
            "now": None if self.now is None else self.now.model_dump(),
            "stops_pending": self.stops_pending,
            "sessions_bounded": self.sessions_bounded,
            "created_at": None if self.created_at is None else self.created_at.isoformat(),
        }


@dataclass(frozen=True)
class ExperimentCost:
    """An experiment's cost: its spend, its budget, and its batches' costs (newest first)."""

    experiment: str
    priced_as: str
    #: The region has no row in the price table: another region's prices are used (say so).
    fallback: bool
    #: Every ended session's cost (exact at its confirmed stop): what the budget is held to.
    spent_usd: float
    budget_usd: float | None
    sessions_in_flight: int
    batches: list[BatchCost] = field(default_factory=list)

    @property
    def budget_used(self) -> float | None:
        """The share of the budget spent (1.0 = exhausted), None without a budget."""
        return None if self.budget_usd is None or self.budget_usd <= 0 else self.spent_usd / self.budget_usd

    def as_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "priced_as": self.priced_as,
            "price_fallback": self.fallback,
            "spent_usd": self.spent_usd,
            "budget_usd": self.budget_usd,
            "budget_used": self.budget_used,
            "sessions_in_flight": self.sessions_in_flight,
            "batches": [b.as_dict() for b in self.batches],
        }


def batch_cost(batch: BatchView, rollouts: Iterable[RolloutRecord], book: PriceBook, at: datetime) -> BatchCost:
    """Price a batch (its view and its rollout items) at `at`."""
    priced: list[RolloutCost] = []
    pending = bounded = 0
    for rec in rollouts:
        if not rec.spans:
            # ended without a session (cancelled or refused before one ran): its figure as stored
            stored = rec.stored_cost(book.label, local=book.local)
            if stored is not None:
                priced.append(stored)
            continue
        spans = list(rec.spans)
        for span in spans:
            _end, how = span.end(book, at)
            pending += how == "estimated"
            bounded += how == "bounded"
        priced.append(price_rollout(spans, book, at))
    return BatchCost(
        batch_id=batch.batch_id,
        status=COMPLETED if batch.status is BatchState.ACCEPTED and batch.complete else batch.status.value,
        rollouts_total=batch.rollouts_total,
        terminal=batch.terminal,
        published=batch.cost,
        now=summarize(priced),
        stops_pending=pending,
        sessions_bounded=bounded,
        created_at=batch.created_at,
    )


def usd(amount: float) -> str:
    """A US-dollar amount with the precision it needs: cents from $1, else four decimals from a cent, else six (a
    local run's budget of $0.0008 is not shown as $0.00)."""
    size = abs(amount)
    if size >= 1:
        return f"${amount:,.2f}"
    if size >= 0.01 or size == 0:
        return f"${amount:.4f}"
    return f"${amount:.6f}"


def format_cost(report: ExperimentCost) -> str:
    """`rollouts cost`'s text: the experiment's spend and budget, then one line per batch."""
    lines = [f"experiment {report.experiment}: spent {usd(report.spent_usd)}"]
    if report.budget_usd is not None:
        used = report.budget_used or 0.0
        lines[0] += f" of a {usd(report.budget_usd)} budget ({used:.0%})"
    lines[0] += f"; {report.sessions_in_flight} session(s) in flight"
    lines.append(f"  priced as: {report.priced_as}")
    if report.fallback:
        lines.append("  WARNING: no AgentCore price for this region in the price table; set acr_vcpu_hour_usd and")
        lines.append("           acr_gb_hour_usd (docs/costs.md)")
    if not report.batches:
        lines.append("  no batches found")
    for batch in report.batches:
        lines.append(_batch_line(batch))
    return "\n".join(lines)


def _batch_line(batch: BatchCost) -> str:
    total = "?" if batch.rollouts_total is None else str(batch.rollouts_total)
    head = f"  batch {batch.batch_id} ({batch.status}, {batch.terminal}/{total} ended)"
    if batch.now is None and batch.published is None:
        return f"{head}: nothing priced yet"
    parts: list[str] = []
    if batch.now is not None:
        now = batch.now
        per = now.usd / now.rollouts if now.rollouts else 0.0
        parts.append(
            f"now {usd(now.usd)} over {now.rollouts} rollout(s), {usd(per)} each (AgentCore memory "
            f"{usd(now.agentcore_memory_usd)}, CPU {usd(now.agentcore_cpu_usd)} {now.cpu_measured} measured / "
            f"{now.rollouts - now.cpu_measured} bounded, pipeline {usd(now.pipeline_usd)})"
        )
    if batch.published is not None:
        parts.append(f"published {usd(batch.published.usd)}")
    if batch.stops_pending:
        parts.append(f"{batch.stops_pending} stop(s) pending: estimated to now")
    if batch.sessions_bounded:
        parts.append(f"{batch.sessions_bounded} session(s) priced to their bound")
    return f"{head}: " + "; ".join(parts)


class Cost:
    """What one experiment costs and the budget it is held to (`exp.cost`). Calling it reads the cost:
    `exp.cost(batch=None, limit=20)`."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def __call__(self, batch: str | None = None, *, limit: int = 20) -> ExperimentCost:
        """What the experiment cost: its spend (every ended session's cost, exact at its confirmed stop: what the
        budget is held to) and budget, and per batch the sum its events carried and its rollouts priced again now.
        `batch`: that batch only; else the `limit` newest batches."""
        book = self._exp.price_book()
        with aws_errors("read the experiment's cost"):
            ledger = self._exp.ledger()
            in_flight, spent = ledger.experiment.slots_and_spend()
            batch_ids = [batch] if batch is not None else ledger.batches.recent_batch_ids(limit)
            batches = []
            now = utcnow()
            for batch_id in batch_ids:
                view = ledger.batches.read_batch(batch_id)
                if view is None:
                    if batch is not None:
                        raise BatchNotFound(f"no batch {batch_id!r} in experiment {self._exp.name!r}")
                    continue
                batches.append(batch_cost(view, ledger.rollouts.batch_rollouts(batch_id), book, now))
            budget = self.budget()
        return ExperimentCost(
            experiment=self._exp.name,
            priced_as=book.label,
            fallback=book.fallback,
            spent_usd=spent,
            budget_usd=budget,
            sessions_in_flight=in_flight,
            batches=batches,
        )

    def budget(self) -> float | None:
        """The experiment's budget (USD): the one set with `set_budget`, else the deployed `budget_usd`."""
        with aws_errors("read the budget"):
            state = self._exp.ledger().experiment.budget()
        return state.budget_usd if state.budget_usd is not None else self._exp.config.budget_usd

    def set_budget(self, budget_usd: float, *, batch: str | None = None) -> None:
        """Set the experiment's budget (USD), or `batch`'s own. Dispatch pauses while the spend is at or above it and
        resumes, where it stopped, once it is raised above the spend (within `budget_recheck_s`, a minute by
        default): held rollouts come back by themselves."""
        if not budget_usd > 0:
            raise SdkError(f"a budget is a positive number of US dollars, got {budget_usd!r}")
        with aws_errors("set the budget"):
            ledger = self._exp.ledger()
            if batch is None:
                ledger.experiment.set_budget(float(budget_usd), iso(utcnow()))
            elif not ledger.batches.set_budget(batch, float(budget_usd)):
                raise BatchNotFound(f"no batch {batch!r} in experiment {self._exp.name!r}")
