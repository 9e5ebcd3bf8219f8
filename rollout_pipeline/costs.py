"""What a rollout costs, in one module: AgentCore Runtime's price table with its sources, the session's size, the
pipeline's own AWS cost per rollout attempt, and the one function that prices a rollout's sessions.

AgentCore Runtime bills each session per second, from the microVM's start to its end (a confirmed stop, or the idle
timeout), in two parts (https://aws.amazon.com/bedrock/agentcore/pricing/, November 2026):

- memory, "the peak memory consumed up to that second" (128 MB at least), for the whole life of the session, idle
  included: the pipeline prices the session's configured size (`session_memory_gb`, AgentCore's per-session maximum
  of 8 GB by default), so this part is an upper bound unless the setting is lowered to what the agent really uses;
- CPU, the CPU actually consumed (none while the agent waits on I/O): **measured** when the agent host reports the
  process CPU seconds of the session beside the result (`config.RESULT_USAGE_KEY`, written by
  `rollout_pipeline.agent`), else **bounded** by the session's busy time x its vCPUs (`session_vcpus`, 2 by default).

The pipeline's own AWS cost (DynamoDB, Lambda, SQS, EventBridge, S3) per attempt is `PIPELINE_USD_PER_ROLLOUT`,
derived below from `bench/bench_scale.py`'s all-in run (docs/benchmarks.md, "Scale"). The model is excluded.

Every figure is computed here; the stages, the SDK, the report and local mode only call `PriceBook.of` and
`price_rollout` / `price_span`. docs/costs.md explains the model and what is measured and what is estimated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts.events import CostSummary, RolloutCost

log = logging.getLogger(__name__)

#: AgentCore's pricing page, and the date its figures were read.
AGENTCORE_PRICING_URL: Final = "https://aws.amazon.com/bedrock/agentcore/pricing/"
PRICES_AS_OF: Final = "2026-11"
#: AgentCore's per-session maximum size and its memory minimum (docs/aws-facts.md).
MAX_SESSION_VCPUS: Final = 2.0
MAX_SESSION_MEMORY_GB: Final = 8.0
MIN_BILLED_MEMORY_GB: Final = 0.125


@dataclass(frozen=True, slots=True)
class RuntimePrice:
    """AgentCore Runtime's list prices in one region, with where and when they were read."""

    region: str
    vcpu_hour_usd: float
    gb_hour_usd: float
    source: str
    as_of: str


#: AgentCore Runtime list prices by region. Only regions with a public source are listed; every other region
#: falls back to `FALLBACK_REGION`, visibly (`PriceBook.fallback`, the `priced_as` label, a log warning, and
#: `rollouts cost`). Add a region here (with its source and date) or set `acr_vcpu_hour_usd` / `acr_gb_hour_usd`.
AGENTCORE_PRICES: Final[Mapping[str, RuntimePrice]] = {
    "us-east-1": RuntimePrice("us-east-1", 0.0895, 0.00945, AGENTCORE_PRICING_URL, PRICES_AS_OF),
}
FALLBACK_REGION: Final = "us-east-1"

#: The pipeline's own AWS cost per million rollouts, by part, at us-east-1 list prices (`bench/prices.py`), from
#: the all-in run of `bench/bench_scale.py` at 24 new sessions/s (docs/benchmarks.md, "Scale": 22.4 WRU + 3.95
#: RRU per rollout; one result PUT and one GET; Lambda arm64 GB-s on the virtual clock, dispatchers' waits
#: included). The part names are the bench's own (`tests/unit/contracts/test_costs.py` ties them to it). ACR and
#: the model are not in it.
PIPELINE_USD_PER_MILLION: Final[Mapping[str, float]] = {
    "dynamodb": 14.49,
    "s3_result_puts": 5.00,
    "s3_reads": 0.40,
    "lambda_compute_arm64": 5.62,
    "lambda_requests": 0.13,
    "eventbridge_events": 1.13,
    "sqs_pollers_and_trainer": 0.96,
    "sqs_eventbridge_deliveries": 0.85,
    "sqs_sends_by_pipeline": 0.04,
}
#: ... per rollout attempt (a retried attempt repeats dispatch, invoke, result and stop): $28.62 per million.
PIPELINE_USD_PER_ROLLOUT: Final = sum(PIPELINE_USD_PER_MILLION.values()) / 1e6

CpuBasis = Literal["measured", "bounded"]


@dataclass(frozen=True, slots=True)
class PriceBook:
    """The prices and sizes one experiment's costs are computed with (`of`: the table, then the settings)."""

    region: str
    vcpu_hour_usd: float
    gb_hour_usd: float
    source: str
    as_of: str
    session_vcpus: float
    session_memory_gb: float
    pipeline_usd_per_rollout: float
    idle_timeout_s: int
    max_lifetime_s: int
    #: The region has no row in `AGENTCORE_PRICES`: `FALLBACK_REGION`'s prices are used.
    fallback: bool = False
    #: Local mode: the figures are what the run would cost on AgentCore.
    local: bool = False

    @classmethod
    def of(cls, config: ExperimentConfig, region: str | None = None, *, local: bool = False) -> PriceBook:
        """The price book of `config` in `region` (the deployment's; `config.price_region` when set wins):
        `AGENTCORE_PRICES`' row, or `FALLBACK_REGION`'s with `fallback` set (logged), then the price overrides."""
        wanted = config.price_region or region or FALLBACK_REGION
        row = AGENTCORE_PRICES.get(wanted)
        fallback = row is None
        if row is None:
            row = AGENTCORE_PRICES[FALLBACK_REGION]
            if config.acr_vcpu_hour_usd is None or config.acr_gb_hour_usd is None:
                log.warning(
                    "no AgentCore price for region %s in the price table: %s prices are used (set "
                    "acr_vcpu_hour_usd and acr_gb_hour_usd to yours)",
                    wanted,
                    FALLBACK_REGION,
                )
        overridden = config.acr_vcpu_hour_usd is not None or config.acr_gb_hour_usd is not None
        return cls(
            region=wanted,
            vcpu_hour_usd=config.acr_vcpu_hour_usd if config.acr_vcpu_hour_usd is not None else row.vcpu_hour_usd,
            gb_hour_usd=config.acr_gb_hour_usd if config.acr_gb_hour_usd is not None else row.gb_hour_usd,
            source="settings (acr_vcpu_hour_usd, acr_gb_hour_usd)" if overridden else row.source,
            as_of=row.as_of,
            session_vcpus=config.session_vcpus,
            session_memory_gb=config.session_memory_gb,
            pipeline_usd_per_rollout=(
                config.pipeline_usd_per_rollout
                if config.pipeline_usd_per_rollout is not None
                else PIPELINE_USD_PER_ROLLOUT
            ),
            idle_timeout_s=config.idle_timeout_s,
            max_lifetime_s=config.max_lifetime_s,
            fallback=fallback and not (config.acr_vcpu_hour_usd is not None and config.acr_gb_hour_usd is not None),
            local=local,
        )

    @property
    def label(self) -> str:
        """What the figures are, in words (the events' `priced_as`)."""
        priced = f"AgentCore {self.region} ({self.source}, {self.as_of})"
        if self.fallback:
            priced = f"AgentCore {FALLBACK_REGION} prices for {self.region}, which has no row in the price table"
        size = f"{self.session_vcpus:g} vCPU / {self.session_memory_gb:g} GB sessions"
        what = f"{priced}, {size}"
        return f"local run priced as on {what}" if self.local else what

    @property
    def billed_memory_gb(self) -> float:
        """The memory a session is billed for: the configured size, at least AgentCore's minimum."""
        return max(self.session_memory_gb, MIN_BILLED_MEMORY_GB)

    def memory_gb_s(self, session_s: float) -> float:
        """GB-seconds of sessions living `session_s` seconds in all (`billed_memory_gb` each): e.g. the idle memory
        of warm sessions waiting for their rollouts (docs/costs.md)."""
        return max(0.0, session_s) * self.billed_memory_gb

    def memory_usd(self, session_s: float) -> float:
        """Memory of sessions living `session_s` seconds in all (`billed_memory_gb` each)."""
        return self.memory_gb_s(session_s) * self.gb_hour_usd / 3600.0

    def cpu_usd(self, cpu_s: float) -> float:
        """CPU-seconds (one vCPU busy for a second is one)."""
        return max(0.0, cpu_s) * self.vcpu_hour_usd / 3600.0


@dataclass(frozen=True, slots=True)
class SessionSpan:
    """One attempt's AgentCore session as the ledger knows it (`RolloutRecord.spans`)."""

    attempt: int
    #: When the pipeline started the session (written just before the first InvokeAgentRuntime).
    started_at: datetime
    #: When the attempt ended: its result was written, or the pipeline ended it (timeout, cancel, cold start).
    ended_at: datetime | None = None
    #: The agent had finished at `ended_at` (it wrote its result): the session is idle from then on.
    idle: bool = False
    #: Process CPU seconds of the session, as the agent host measured them (None: not measured).
    cpu_s: float | None = None
    #: The confirmed stop.
    stopped_at: datetime | None = None
    #: The pipeline stopped waiting for a stop without a confirmation (AgentCore's idle timeout or the session's
    #: maximum lifetime has ended it): the session's end is its bound.
    closed_at: datetime | None = None
    #: The attempt's deadline.
    due_at: datetime | None = None

    def bound_end(self, book: PriceBook) -> datetime:
        """The latest the session can live without a stop: AgentCore ends an idle session `idle_timeout_s` after its
        last activity and any session `max_lifetime_s` after its start."""
        lifetime = self.started_at + timedelta(seconds=book.max_lifetime_s)
        if self.idle and self.ended_at is not None:
            return min(lifetime, self.ended_at + timedelta(seconds=book.idle_timeout_s))
        return lifetime

    def end(self, book: PriceBook, at: datetime) -> tuple[datetime, Literal["stopped", "estimated", "bounded"]]:
        """The session's end as far as it is known at `at`: the confirmed stop; the bound once the pipeline gave
        up on a confirmation; else `at` (the stop is pending: it follows at once, or the bound comes first)."""
        if self.stopped_at is not None:
            return max(self.stopped_at, self.started_at), "stopped"
        bound = self.bound_end(book)
        if self.closed_at is not None or at >= bound:
            return bound, "bounded"
        return max(at, self.ended_at or self.started_at, self.started_at), "estimated"


@dataclass(frozen=True, slots=True)
class SpanCost:
    """One session priced."""

    session_s: float
    memory_usd: float
    cpu_s: float
    cpu_usd: float
    cpu: CpuBasis
    end: Literal["stopped", "estimated", "bounded"]
    usd_max: float
    pipeline_usd: float

    @property
    def usd(self) -> float:
        return self.memory_usd + self.cpu_usd + self.pipeline_usd


def price_span(span: SessionSpan, book: PriceBook, at: datetime) -> SpanCost:
    """Price one session at `at` (`SessionSpan.end`): memory for its life, CPU measured (capped at what its vCPUs
    could do while it lived) or bounded by its busy time x vCPUs, and the pipeline's cost of one attempt."""
    end, how = span.end(book, at)
    session_s = (end - span.started_at).total_seconds()
    bound_s = (span.bound_end(book) - span.started_at).total_seconds()

    def busy(until_s: float) -> float:
        if span.idle and span.ended_at is not None:
            return min(until_s, max(0.0, (span.ended_at - span.started_at).total_seconds()))
        return until_s

    measured = span.cpu_s is not None and span.cpu_s >= 0
    if measured:
        cpu_s = min(float(span.cpu_s or 0.0), session_s * book.session_vcpus)
        cpu_max_s = cpu_s
    else:
        cpu_s = busy(session_s) * book.session_vcpus
        cpu_max_s = busy(bound_s) * book.session_vcpus
    usd_max = book.memory_usd(max(bound_s, session_s)) + book.cpu_usd(max(cpu_max_s, cpu_s))
    return SpanCost(
        session_s=session_s,
        memory_usd=book.memory_usd(session_s),
        cpu_s=cpu_s,
        cpu_usd=book.cpu_usd(cpu_s),
        cpu="measured" if measured else "bounded",
        end=how,
        usd_max=usd_max + book.pipeline_usd_per_rollout,
        pipeline_usd=book.pipeline_usd_per_rollout,
    )


def price_rollout(spans: Sequence[SessionSpan], book: PriceBook, at: datetime) -> RolloutCost:
    """A rollout's cost at `at`: the sum of its sessions (`price_span`). `session_end` says how their ends are
    known: all confirmed stops; some estimated at `at` (a stop still pending); some taken at their bound."""
    priced = [price_span(span, book, at) for span in spans]
    ends = {p.end for p in priced}
    session_end: Literal["stopped", "estimated", "bounded"] = (
        "estimated" if "estimated" in ends else "bounded" if "bounded" in ends else "stopped"
    )
    return RolloutCost(
        usd=_round(sum(p.usd for p in priced)),
        agentcore_memory_usd=_round(sum(p.memory_usd for p in priced)),
        agentcore_cpu_usd=_round(sum(p.cpu_usd for p in priced)),
        pipeline_usd=_round(sum(p.pipeline_usd for p in priced)),
        cpu="measured" if priced and all(p.cpu == "measured" for p in priced) else "bounded",
        cpu_s=round(sum(p.cpu_s for p in priced), 3),
        session_s=round(sum(p.session_s for p in priced), 3),
        sessions=len(priced),
        session_end=session_end,
        usd_max=_round(sum(p.usd_max for p in priced)),
        priced_as=book.label,
        local=book.local,
    )


def summarize(costs: Iterable[RolloutCost]) -> CostSummary | None:
    """The sum of rollout costs (None for none)."""
    items = list(costs)
    if not items:
        return None
    return CostSummary(
        usd=_round(sum(c.usd for c in items)),
        agentcore_memory_usd=_round(sum(c.agentcore_memory_usd for c in items)),
        agentcore_cpu_usd=_round(sum(c.agentcore_cpu_usd for c in items)),
        pipeline_usd=_round(sum(c.pipeline_usd for c in items)),
        rollouts=len(items),
        cpu_measured=sum(1 for c in items if c.cpu == "measured"),
    )


def with_span_end(span: SessionSpan, *, ended_at: datetime, idle: bool, cpu_s: float | None) -> SessionSpan:
    """`span` as its attempt ends (`ended_at`; `idle`: the agent wrote its result; `cpu_s`: as measured)."""
    return replace(span, ended_at=ended_at, idle=idle, cpu_s=cpu_s if cpu_s is not None else span.cpu_s)


def _round(usd: float) -> float:
    """Dollars to a hundred-millionth of a cent: exact enough to sum millions of rollouts, short in JSON."""
    return round(usd, 10)
