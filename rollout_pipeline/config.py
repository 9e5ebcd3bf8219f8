"""Experiment configuration: one source of truth for the stack, the Lambdas and local mode.

The stack reads it from CDK context (`cdk.json` defaults, `-c key=value` overrides); the Lambdas receive it as JSON
in their environment (`FunctionEnvironment`, read back into `HandlerSettings`); local mode builds it from the same
defaults plus CLI options.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollout_pipeline.metric_names import METRICS_NAMESPACE
from rollout_pipeline.quotas import ACTIVE_SESSIONS_ELSEWHERE, DOCUMENTED_INVOKE_RATE_PER_AGENT, PoolSettings

EXPERIMENT_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
#: Context values that mean "not set: derive the default" (`-c key=` and cdk.json's "").
_UNSET: Final = (None, "", "none", "None")


#: Rollouts one dispatcher Lambda holds at once: its SQS batch (`topology.FUNCTIONS` reads it), one thread each.
#: More than SQS's 10 per receive (Lambda's poller gathers up to 10,000 for a standard queue, given a batching window
#: of at least 1 s): each dispatcher process costs its own admission-board heartbeats, slot-gate polls and schedule
#: reads whatever it holds, so the same rollouts in hand in fewer Lambdas cost fewer requests (bench_capacity: 30
#: dispatchers of 10 for three experiments, 18.1 requests per rollout; docs/benchmarks.md, "Capacity").
DISPATCH_BATCH: Final = 25
#: Seconds a rollout spends in a dispatcher's hands before its session starts (its wait on the admission board for
#: room in the schedule, up to ~2 s, and the invoke's answer): the dispatchers must hold rate x this many rollouts.
#: Measured (bench/bench_capacity.py, one experiment alone on the whole account pool, 22.5/s): 50 in hand sustained
#: 0.846 of the rate, 100 in hand 0.933 (docs/benchmarks.md, "Capacity").
IN_HAND_S: Final = 4.4
#: Seconds a warm take spends in a dispatcher's hands (receipt to invoke, and the rest of its SQS batch): with a warm
#: pool, the dispatchers must also hold the invoke rate x this many takes. Measured (bench/bench_warm.py, 1,024
#: takes): 4 dispatchers of 25 took 116 a second at a 200/s invoke rate, 8 took 186 a second at 400/s: each take about
#: 0.9 s in hand (its SQS batch waits for its slowest take's turn on the schedule; docs/benchmarks.md).
TAKE_IN_HAND_S: Final = 1.0
#: The dispatch concurrency derived when none is set is at least this (the field's own minimum).
MIN_DISPATCHERS: Final = 2
#: ... and at most this (a new-session quota raised far above AgentCore's default asks for many dispatchers).
MAX_DISPATCHERS_DERIVED: Final = 100


def warm_pool_wanted(warm_sessions: int | str) -> bool:
    """Whether a `warm_sessions` value (as its field validates it) keeps a warm pool: a count above 0, or `auto`."""
    return warm_sessions == WARM_AUTO or (isinstance(warm_sessions, int) and warm_sessions > 0)


def new_sessions_cap(
    session_rate_limit: float | None, tps_limit: float | None, invoke_rate_limit: float | None = None
) -> float | None:
    """The most new sessions/s an experiment asks for: `session_rate_limit`, half of `tps_limit` (an invoke and a
    stop each) and half of `invoke_rate_limit` (a new session's invoke and as many calls into existing sessions);
    None: no cap of its own."""
    halves = [None if limit is None else limit / 2 for limit in (tps_limit, invoke_rate_limit)]
    caps = [c for c in (session_rate_limit, *halves) if c]
    return min(caps) if caps else None


def invoke_rate_cap(invoke_rate_limit: float | None, tps_limit: float | None) -> float:
    """The most InvokeAgentRuntime calls/s an experiment's agent makes (new sessions and calls into existing ones):
    `invoke_rate_limit`, else AgentCore's documented per-agent rate (`quotas.DOCUMENTED_INVOKE_RATE_PER_AGENT`), and
    never more than `tps_limit` (every data-plane call). The one home of the rule: the standalone budgets and the
    account pool's data-plane schedule both read it."""
    rate = float(invoke_rate_limit) if invoke_rate_limit else DOCUMENTED_INVOKE_RATE_PER_AGENT
    return rate if tps_limit is None else min(rate, float(tps_limit))


def derived_dispatch_concurrency(
    *,
    session_rate_limit: float | None,
    tps_limit: float | None,
    max_sessions: int,
    account_sessions_per_s: float | None = None,
    warm_invoke_rate: float | None = None,
) -> int:
    """The dispatcher Lambdas an experiment needs to keep its new-session rate busy: enough to hold rate x
    `IN_HAND_S` rollouts (`DISPATCH_BATCH` each), the rate being its own cap (`new_sessions_cap`) or else the whole
    account pool less the reserve (`account_sessions_per_s`; default: AgentCore's documented quota), and never more
    than its `max_sessions` can start at once. With a warm pool (`warm_invoke_rate`: its invoke rate,
    `invoke_rate_cap`), also enough to hold that rate x `TAKE_IN_HAND_S` warm takes: a GRPO step's burst of takes
    runs at the invoke rate, not the new-session rate. The one home of the formula: synth and local mode both use
    it; an explicit `dispatch_concurrency` wins."""
    account = PoolSettings().budget("sessions") if account_sessions_per_s is None else account_sessions_per_s
    cap = new_sessions_cap(session_rate_limit, tps_limit)
    rate = account if cap is None else min(cap, account)
    by_rate = math.ceil(rate * IN_HAND_S / DISPATCH_BATCH - 1e-9)
    if warm_invoke_rate:
        by_rate = max(by_rate, math.ceil(warm_invoke_rate * TAKE_IN_HAND_S / DISPATCH_BATCH - 1e-9))
    by_slots = math.ceil(max_sessions / DISPATCH_BATCH)
    return max(MIN_DISPATCHERS, min(by_rate, by_slots, MAX_DISPATCHERS_DERIVED))


#: A session lives this much longer than one attempt's timeout (dispatch-to-invoke, result write, stop).
LIFETIME_MARGIN_S = 600
#: With the warm pool on, the derived `max_lifetime_s` also leaves a warm session this long to wait for its rollout
#: (its shelf life: AgentCore ends a session `max_lifetime_s` after its start, busy or idle); a set `max_lifetime_s`
#: must leave at least `MIN_WARM_SHELF_LIFE_S`.
WARM_SHELF_LIFE_S: Final = 3600
MIN_WARM_SHELF_LIFE_S: Final = 300
#: A warm session is offered until this long before AgentCore's idle timeout could end it (a take's invoke, clocks),
#: and kept alive halfway to that: the pool needs `idle_timeout_s` of at least twice this.
WARM_STALE_MARGIN_S: Final = 60
#: The idle session timeout when none is set (capped at `max_lifetime_s`: AgentCore requires idle <= lifetime).
DEFAULT_IDLE_TIMEOUT_S = 900


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the key and the reason."""


class SamplingParams(BaseModel):
    """Sampling parameters handed to the agent in `_rollout.sampling_params` (OpenAI-style names)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    temperature: float | None = Field(default=None, ge=0, le=10)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)


#: Environment variable naming the agent's model-key secret (Secrets Manager) in the runtime.
MODEL_SECRET_ENV: Final = "ROLLOUTS_MODEL_SECRET"
#: Environment variables of the agent image's start command, the agent host (`rollout_pipeline.agent.host`): the
#: agent module it imports and serves, and its kind (`art`; `rft`: the RFT adapter's front door starts first).
AGENT_MODULE_ENV: Final = "ROLLOUTS_AGENT_MODULE"
AGENT_KIND_ENV: Final = "ROLLOUTS_AGENT_KIND"
#: The SageMaker RFT job ARN agents send as `X-Amzn-SageMaker-Job-Arn` when `_rollout.job_arn` is not set.
JOB_ARN_ENV: Final = "SAGEMAKER_JOB_ARN"
#: MTRL environment mode (`mtrl_environment`): the SageMaker job runtime (`job_runtime_url`) the agent host forwards
#: an MTRL rollout's model calls and terminal report to, and the MTRL reporter Lambda reports to. The stack sets it on
#: the runtime and the reporter only in that mode (local mode: its stand-in's loopback URL); unset, nothing is
#: forwarded.
MTRL_RUNTIME_ENV: Final = "ROLLOUTS_MTRL_RUNTIME"


def job_runtime_url(region: str) -> str:
    """SageMaker's job runtime in `region` (the MTRL guide's endpoint; `sagemaker.train.rft.feedback` builds the
    same): `https://job-runtime.sagemaker.{region}.api.aws`."""
    return f"https://job-runtime.sagemaker.{region}.api.aws"


def mtrl_client_token(job_arn: str, trajectory_id: str, call: str) -> str:
    """The `ClientToken` of one MTRL job-runtime call about one trajectory (`call`: `complete-ready`,
    `complete-failed`, `reward`): the same for every sender of that call (the agent host, the reporter, any
    retry), so a repeated report is a no-op at the job runtime rather than a second one."""
    digest = hashlib.sha256(f"{job_arn}\n{trajectory_id}\n{call}".encode()).hexdigest()
    return f"rollouts-{digest[:48]}"


AgentKind = Literal["art", "rft"]
#: `_rollout.warmup`: the mark of the warm pool's own invocation (`warmup_payload`). The agent host answers such an
#: invocation itself and never hands it to the agent; no dataset row may set it (`contracts.rows`), and the
#: dispatcher never sends it (`contracts.messages.build_agent_payload` drops the pipeline's keys a message carries).
WARMUP_KEY: Final = "warmup"


def warmup_payload(exp_id: str, session_id: str) -> dict[str, Any]:
    """The warm pool's own invocation: `_rollout.warmup` and nothing a rollout needs (no row, no `exp_id` /
    `input_id` / `s3_bucket`: were it ever handed to an ART app, ART would save nothing)."""
    return {"_rollout": {WARMUP_KEY: {"exp_id": exp_id, "session_id": session_id}}}


def is_warmup_payload(payload: Any) -> bool:
    """Whether an invocation's payload is the warm pool's own (`warmup_payload`): the agent host answers it."""
    rollout = payload.get("_rollout") if isinstance(payload, Mapping) else None
    return isinstance(rollout, Mapping) and isinstance(rollout.get(WARMUP_KEY), Mapping)


#: `warm_sessions` = "auto": aim at the next step's size (the last batch's rollouts, capped by `max_sessions`).
WARM_AUTO: Final = "auto"
#: The default of `warm_idle_stop_s`: the pool stops every warm session once the experiment has had no work for
#: this long (a GRPO training phase is shorter; an abandoned experiment pays at most this much idle memory).
DEFAULT_WARM_IDLE_STOP_S: Final = 600


#: The result object's key under which the agent host reports what the session used (`{"cpu_s": ..., ...}`: the
#: process CPU seconds and peak RSS of the session, `rollout_pipeline.agent.usage`); the host owns it and
#: overwrites whatever the agent returned under it. Completion prices the session's CPU with it (`costs`).
RESULT_USAGE_KEY: Final = "_rollout_usage"
#: The example agent of each kind (what the image serves when `agent_module` is not set).
DEFAULT_AGENT_MODULES: Final[dict[str, str]] = {
    "art": "rollout_pipeline.agent.examples.math_agent",
    "rft": "rollout_pipeline.agent.examples.rft_math_agent",
}


#: A sink's name: its rule, API destination, connection and dead-letter queue are named after it.
SINK_NAME_PATTERN: Final = r"^[a-z][a-z0-9-]{0,31}$"


class SinkAuth(BaseModel):
    """How a sink authenticates (an EventBridge connection): `none`, an API key header, or basic auth. The key or
    password is never in the settings: `secret` names a Secrets Manager secret (name or ARN) holding it, as a
    plain string or, with `secret_field`, as a field of its JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["none", "api_key", "basic"] = "none"
    header: str = Field(default="x-api-key", pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,256}$")
    username: str | None = Field(default=None, min_length=1, max_length=512)
    secret: str | None = Field(default=None, pattern=r"^[A-Za-z0-9/_+=.@:-]{1,2048}$")
    secret_field: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _complete(self) -> SinkAuth:
        if self.type != "none" and not self.secret:
            raise ValueError(f"auth type {self.type} needs `secret` (the Secrets Manager secret holding it)")
        if self.type == "basic" and not self.username:
            raise ValueError("auth type basic needs `username`")
        return self


class SinkSettings(BaseModel):
    """One HTTP sink (`sinks`): the events it takes, where they go and the body each becomes. Deployed, an
    EventBridge API destination; locally, a local consumer with the same semantics (`rollout_pipeline.sinks`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SINK_NAME_PATTERN)
    url: str = Field(min_length=1, max_length=2048, description="https://...; `{$.detail.x}` path parameters")
    events: tuple[str, ...] = Field(default=("Group Completed",), min_length=1, description="Detail types taken")
    body: Any = Field(default="$.detail", description="JSON whose strings `$.path` take the event's values")
    bodies: dict[str, Any] = Field(
        default_factory=dict, description="A body per detail type, where it differs from `body`"
    )
    method: Literal["POST", "PUT", "PATCH"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    auth: SinkAuth = Field(default_factory=SinkAuth)
    batch_prefix: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,47}$", description="Only the batches whose id starts so"
    )
    rate_per_s: int = Field(default=300, ge=1, le=300, description="Invocations per second, at most")
    max_retry_attempts: int = Field(default=185, ge=0, le=185)
    max_event_age_s: int = Field(default=86_400, ge=60, le=86_400)


class ExperimentConfig(BaseModel):
    """Everything that differs between experiments. Validated; every field has a sane default but `name`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=EXPERIMENT_NAME_PATTERN, description="Experiment name; also the exp_id")
    tps_limit: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="At most this many AgentCore data-plane calls/s (invokes, stops) for this experiment; default: "
        "its share of the account pool (the account's data-plane quota, 1,000/s, less the reserve)",
    )
    invoke_rate_limit: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="At most this many InvokeAgentRuntime calls/s for this experiment's agent (AgentCore's quota per "
        "agent: 200, adjustable; stops are not in it); default: the documented 200. Never above tps_limit",
    )
    session_rate_limit: float | None = Field(
        default=None,
        gt=0,
        le=10_000,
        description="At most this many new AgentCore sessions/s for this experiment (all its endpoints together); "
        "default: its share of the account pool (the account's new-session quota, 25/s, less the reserve)",
    )
    capacity_weight: float = Field(
        default=1.0,
        gt=0,
        le=1_000,
        description="This experiment's weight in the account pool: while several are backlogged, each gets "
        "weight / total of every budget",
    )
    endpoints: int = Field(
        default=1,
        ge=1,
        le=20,
        description="Runtime endpoints sessions are spread across (versions, A/B); they add no new-session rate: "
        "the account's quota is one pool",
    )
    max_sessions: int = Field(default=100, ge=1, le=100_000, description="Rollouts in flight at once")
    group_size: int = Field(default=8, ge=1, le=1024, description="Rollouts per dataset row (GRPO group)")
    release_window: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Rollouts released to the rollout queue and not yet ended, every batch together, at most (group "
        "order through the queue, older batches first); default max_sessions + dispatch_concurrency x 10; 0: every "
        "rollout at once",
    )
    rollout_timeout_s: int = Field(default=900, ge=10, le=28_800, description="Deadline of one attempt")
    max_attempts: int = Field(default=2, ge=1, le=10, description="Attempts per rollout (timeouts are retried)")
    model_base_url: str = Field(default="http://127.0.0.1:8000/v1", min_length=1)
    model_id: str = Field(default="default", min_length=1)
    model_secret_name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9/_+=.@-]{1,512}$",
        description="Secrets Manager secret holding the model API key; the agent reads it at start (only it may)",
    )
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    agent_kind: AgentKind = Field(
        default="art", description="How the image serves the agent: art (python -m MODULE) or rft (the RFT host)"
    )
    agent_module: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$",
        description="The agent module the image serves (default: the example agent of agent_kind)",
    )
    rft_job_arn: str | None = Field(
        default=None,
        pattern=r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:[A-Za-z0-9/_+=.@:-]{1,1024}$",
        description="SageMaker RFT job ARN the agents send with their model calls and feedback (if any)",
    )
    mtrl_environment: bool = Field(
        default=False,
        description="SageMaker MTRL environment mode: deploy the forwarder Lambda MTRL's CustomAgentLambdaConfig "
        "names, forward MTRL rollouts' model calls and reports to the job runtime (needs agent_kind rft)",
    )
    policy_version: str | None = Field(default=None, max_length=128)
    results_retention: Literal["retain", "destroy"] = "retain"
    results_expiration_days: int | None = Field(default=None, ge=1, le=3650)
    idle_timeout_s: int = Field(
        default=DEFAULT_IDLE_TIMEOUT_S,
        ge=60,
        le=28_800,
        description="ACR idle session timeout, <= max_lifetime_s (default: 900 s, at most max_lifetime_s); with the "
        "warm pool on, at least 120 s",
    )
    max_lifetime_s: int = Field(
        default=28_800,
        ge=60,
        le=28_800,
        description="ACR max session lifetime (default: rollout_timeout_s + LIFETIME_MARGIN_S, plus "
        "WARM_SHELF_LIFE_S with the warm pool on; at most 8 h)",
    )
    dispatch_concurrency: int = Field(
        default=MIN_DISPATCHERS,
        ge=2,
        le=1000,
        description="Max concurrent dispatcher Lambdas (default: derived from the experiment's new-session rate, "
        "`derived_dispatch_concurrency`)",
    )
    max_limit_requeues: int = Field(
        default=200, ge=1, le=100_000, description="Re-sends because of limits/throttles before `throttled`"
    )
    max_limit_wait_s: int = Field(
        default=6 * 3600, ge=60, le=7 * 86_400, description="Time waiting for limits before `throttled`"
    )
    result_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, le=100 * 1024 * 1024)
    ledger_ttl_days: int = Field(default=30, ge=1, le=3650)
    warm_sessions: int | Literal["auto"] = Field(
        default=0,
        description="Sessions the warm pool keeps started ahead of the next batch (0: off; auto: the last batch's "
        "rollouts, capped by max_sessions); they count against max_sessions",
    )
    oversample: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Extra rollouts per group: group_size + oversample run, and once group_size of them ended with a "
        "reward the rest are cancelled (surplus, never delivered as part of the group)",
    )
    drop_zero_variance: bool = Field(
        default=False,
        description="Groups whose valid rewards are all equal (no GRPO signal; flagged zero_variance either way) "
        "are not delivered to the sinks",
    )
    sinks: tuple[SinkSettings, ...] = Field(
        default=(), description="HTTP sinks (EventBridge API destinations; a local consumer in local mode)"
    )
    warm_idle_stop_s: int = Field(
        default=DEFAULT_WARM_IDLE_STOP_S,
        ge=30,
        le=86_400,
        description="Every warm session is stopped once the experiment has had no work for this long",
    )

    @field_validator("warm_sessions", mode="before")
    @classmethod
    def _warm_sessions(cls, value: Any) -> Any:
        """`auto`, or a count of sessions (`-c warm_sessions=64` arrives as text)."""
        if isinstance(value, str):
            text = value.strip().lower()
            if text == WARM_AUTO:
                return WARM_AUTO
            if text in ("", "0", "off", "none"):
                return 0
            if not text.isdigit():
                raise ValueError("must be a number of sessions (0: off) or 'auto'")
            return int(text)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= 100_000:
            raise ValueError("must be 0 (off), a number of sessions up to 100000, or 'auto'")
        return value

    session_vcpus: float = Field(
        default=2.0,
        gt=0,
        le=2.0,
        description="vCPUs of one AgentCore session (AgentCore's maximum, 2): the CPU bound when CPU is not measured",
    )
    session_memory_gb: float = Field(
        default=8.0,
        ge=0.125,
        le=8.0,
        description="Memory of one AgentCore session priced per second of its life (AgentCore's maximum, 8 GB: an "
        "upper bound; AgentCore bills the peak memory used, at least 128 MB)",
    )
    price_region: str | None = Field(
        default=None,
        pattern=r"^[a-z]{2}(-[a-z]+)+-\d$",
        description="The region whose AgentCore prices are used (default: the deployment's)",
    )
    acr_vcpu_hour_usd: float | None = Field(
        default=None, ge=0, le=100, description="AgentCore CPU price per vCPU-hour (default: the price table's)"
    )
    acr_gb_hour_usd: float | None = Field(
        default=None, ge=0, le=100, description="AgentCore memory price per GB-hour (default: the price table's)"
    )
    pipeline_usd_per_rollout: float | None = Field(
        default=None, ge=0, le=1, description="The pipeline's own AWS cost per attempt (default: costs.py's)"
    )
    session_grace_s: int = Field(
        default=300,
        ge=0,
        le=28_800,
        description="A session alive this long past its attempt's deadline is overdue: the sweeper keeps stopping "
        "it and counts it (SessionsOverdue)",
    )
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="Spend (USD) at which dispatch pauses (a warning at 80%); `rollouts budget set` changes it",
    )

    @field_validator("model_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @model_validator(mode="before")
    @classmethod
    def _derive_defaults(cls, data: Any) -> Any:
        """Derive the session lifetimes that are not set (absent or empty), in this order:

        - `max_lifetime_s`: what one attempt can need (`rollout_timeout_s` + `LIFETIME_MARGIN_S`), not AgentCore's
          8 h maximum (an orphaned session would otherwise bill for up to 8 h); with the warm pool on, plus
          `WARM_SHELF_LIFE_S` (how long a warm session may wait for its rollout);
        - `idle_timeout_s`: 900 s, but never above `max_lifetime_s` (AgentCore rejects a runtime whose idle timeout
          exceeds its max lifetime, and a short `rollout_timeout_s` derives a short lifetime);
        - `dispatch_concurrency`: what the experiment's new-session rate needs (`derived_dispatch_concurrency`).
        A value that is not a number is left for the field's own validation to report.
        """
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        if data.get("dispatch_concurrency") in _UNSET:
            data.pop("dispatch_concurrency", None)
            with contextlib.suppress(TypeError, ValueError):  # a field not a number is reported by its validation
                tps_limit = _optional_number(data.get("tps_limit"))
                warm = warm_pool_wanted(cls._warm_sessions(data.get("warm_sessions", 0)))
                data["dispatch_concurrency"] = derived_dispatch_concurrency(
                    session_rate_limit=_optional_number(data.get("session_rate_limit")),
                    tps_limit=tps_limit,
                    max_sessions=int(data.get("max_sessions", 100)),
                    warm_invoke_rate=invoke_rate_cap(_optional_number(data.get("invoke_rate_limit")), tps_limit)
                    if warm
                    else None,
                )
        if data.get("max_lifetime_s") in _UNSET:
            data.pop("max_lifetime_s", None)
            try:
                timeout = int(data.get("rollout_timeout_s", 900))
                shelf = WARM_SHELF_LIFE_S if warm_pool_wanted(cls._warm_sessions(data.get("warm_sessions", 0))) else 0
            except (TypeError, ValueError):
                return data
            data["max_lifetime_s"] = max(60, min(28_800, timeout + LIFETIME_MARGIN_S + shelf))
        if data.get("idle_timeout_s") in _UNSET:
            data.pop("idle_timeout_s", None)
            try:
                lifetime = int(data["max_lifetime_s"])
            except (TypeError, ValueError):
                return data
            data["idle_timeout_s"] = max(60, min(DEFAULT_IDLE_TIMEOUT_S, lifetime))
        return data

    @property
    def warm_pool_on(self) -> bool:
        """Whether the experiment keeps a warm pool (`warm_sessions` is a count above 0 or `auto`)."""
        return warm_pool_wanted(self.warm_sessions)

    @property
    def warm_shelf_life_s(self) -> int:
        """How old a warm session may be when a rollout takes it: its remaining life still covers a rollout
        (`age + rollout_timeout_s + LIFETIME_MARGIN_S <= max_lifetime_s`)."""
        return self.max_lifetime_s - self.rollout_timeout_s - LIFETIME_MARGIN_S

    @property
    def warm_stale_after_s(self) -> int:
        """How long after its last keep-alive a warm session is still offered (`WARM_STALE_MARGIN_S` before
        AgentCore's idle timeout could end it)."""
        return self.idle_timeout_s - WARM_STALE_MARGIN_S

    def warnings(self) -> list[str]:
        """Settings that are valid but probably wrong (synth prints them; the preflight compares them with the
        account's quotas)."""
        found: list[str] = []
        if isinstance(self.warm_sessions, int) and self.warm_sessions > self.max_sessions:
            found.append(
                f"warm_sessions ({self.warm_sessions}) is above max_sessions ({self.max_sessions}): warm sessions "
                f"count against max_sessions, so the pool holds at most {self.max_sessions}"
            )
        if self.max_sessions > ACTIVE_SESSIONS_ELSEWHERE:
            found.append(
                f"max_sessions ({self.max_sessions}) is above AgentCore's documented active-session quota outside "
                f"us-east-1/us-west-2 ({ACTIVE_SESSIONS_ELSEWHERE}): the account pool grants at most the account's "
                "quota less the reserve; `rollouts preflight` compares it with your account's"
            )
        return found

    @model_validator(mode="after")
    def _sink_names_distinct(self) -> ExperimentConfig:
        names = [sink.name for sink in self.sinks]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"sinks: each sink needs its own name ({', '.join(repeated)} repeated)")
        return self

    @model_validator(mode="after")
    def _app_named_for_the_host_only(self) -> ExperimentConfig:
        if self.agent_kind == "art" and self.agent_module and ":" in self.agent_module:
            raise ValueError("agent_module MODULE:APP names an app, which only agent_kind=rft serves")
        return self

    @model_validator(mode="after")
    def _mtrl_needs_the_rft_host(self) -> ExperimentConfig:
        if self.mtrl_environment and self.agent_kind != "rft":
            raise ValueError(
                "mtrl_environment needs agent_kind=rft: MTRL's rollouts run SageMaker RFT SDK agents through the RFT "
                "host, which forwards their model calls and reports to the job runtime"
            )
        return self

    @model_validator(mode="after")
    def _lifetime_covers_timeout(self) -> ExperimentConfig:
        if self.max_lifetime_s < self.rollout_timeout_s:
            raise ValueError(
                f"max_lifetime_s ({self.max_lifetime_s}) must be >= rollout_timeout_s ({self.rollout_timeout_s})"
            )
        if self.idle_timeout_s > self.max_lifetime_s:
            raise ValueError(
                f"idle_timeout_s ({self.idle_timeout_s}) must be <= max_lifetime_s ({self.max_lifetime_s}): AgentCore "
                "rejects a runtime whose idle session timeout exceeds its max lifetime; lower idle_timeout_s or leave "
                "it empty (it then defaults to at most max_lifetime_s)"
            )
        return self

    @model_validator(mode="after")
    def _warm_pool_fits_the_lifetimes(self) -> ExperimentConfig:
        if not self.warm_pool_on:
            return self
        if self.idle_timeout_s < 2 * WARM_STALE_MARGIN_S:
            raise ValueError(
                f"idle_timeout_s ({self.idle_timeout_s}) is too short for the warm pool (warm_sessions="
                f"{self.warm_sessions}): a warm session is offered until {WARM_STALE_MARGIN_S} s before AgentCore's "
                f"idle timeout could end it and kept alive halfway to that, so it needs idle_timeout_s >= "
                f"{2 * WARM_STALE_MARGIN_S}; raise it or turn the pool off"
            )
        if self.warm_shelf_life_s < MIN_WARM_SHELF_LIFE_S:
            raise ValueError(
                f"max_lifetime_s ({self.max_lifetime_s}) leaves warm sessions {self.warm_shelf_life_s} s to wait for "
                f"their rollout (warm_sessions={self.warm_sessions}): AgentCore ends a session max_lifetime_s after "
                f"its start, busy or idle, so a warm session is offered only while its age + rollout_timeout_s + "
                f"{LIFETIME_MARGIN_S} <= max_lifetime_s; set max_lifetime_s >= rollout_timeout_s + "
                f"{LIFETIME_MARGIN_S + MIN_WARM_SHELF_LIFE_S}, or leave it empty (it then derives rollout_timeout_s + "
                f"{LIFETIME_MARGIN_S + WARM_SHELF_LIFE_S})"
            )
        return self

    @property
    def served_agent_module(self) -> str:
        """The module the agent image serves: `agent_module`, else the example agent of `agent_kind`."""
        return self.agent_module or DEFAULT_AGENT_MODULES[self.agent_kind]

    @property
    def runtime_name(self) -> str:
        """ACR runtime name: letters, digits and underscores, at most 48 characters."""
        return f"rollouts_{self.name.replace('-', '_')}"[:48]

    def to_env(self) -> str:
        """Serialise for a Lambda environment variable (without `sinks`: the stack's rules and local mode's
        consumer are built from them, no function reads them, and Lambda allows 4 KB of environment)."""
        return self.model_dump_json(exclude_none=True, exclude={"sinks"})

    @classmethod
    def from_env(cls, raw: str) -> ExperimentConfig:
        return cls.model_validate_json(raw)

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> ExperimentConfig:
        """Build from CDK context: `experiment` is the name, every other field by its own name.

        Values given with `-c key=value` arrive as strings; numbers are coerced and `sampling_params` may be JSON.
        Unknown keys are ignored (CDK context holds unrelated settings too).
        """
        name = context.get("experiment")
        if not name:
            raise ConfigError("missing experiment name: deploy with `-c experiment=NAME`")
        values: dict[str, Any] = {"name": name}
        for field_name in cls.model_fields:
            if field_name == "name" or field_name not in context:
                continue
            value = context[field_name]
            if field_name in ("sampling_params", "sinks") and isinstance(value, str):
                try:
                    value = json.loads(value) if value else ({} if field_name == "sampling_params" else [])
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{field_name}: not valid JSON ({exc.msg})") from exc
            if field_name in (
                "policy_version",
                "results_expiration_days",
                "release_window",
                "tps_limit",
                "invoke_rate_limit",
                "session_rate_limit",
                "model_secret_name",
                "agent_module",
                "rft_job_arn",
                "price_region",
                "acr_vcpu_hour_usd",
                "acr_gb_hour_usd",
                "pipeline_usd_per_rollout",
                "budget_usd",
            ) and value in (
                "",
                "none",
                "None",
            ):
                value = None
            values[field_name] = value
        return validate_config(values)


def _optional_number(value: Any) -> float | None:
    """A raw setting as a number (None when unset); ValueError/TypeError when it is not one."""
    return None if value in _UNSET else float(value)


def validate_config(values: Mapping[str, Any]) -> ExperimentConfig:
    """Validate raw values; raise `ConfigError` naming every bad key and why."""
    try:
        return ExperimentConfig.model_validate(dict(values))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']} (got {err.get('input')!r})"
            for err in exc.errors()
        )
        raise ConfigError(f"invalid experiment configuration: {problems}") from None


class HandlerSettings(BaseModel):
    """What every Lambda handler (and a local-mode consumer) needs: resource names plus the experiment config."""

    model_config = ConfigDict(frozen=True)

    table_name: str
    input_bucket: str
    results_bucket: str
    rollout_queue_url: str
    bus_name: str
    runtime_arn: str = ""
    ingest_queue_url: str = ""
    #: The account pool's table (`topology.POOL_TABLE_NAME`): every experiment of the account shares AgentCore's
    #: quotas through it. Empty: no pool, the experiment keeps its own limits as if it owned the account (tests,
    #: `bench_capacity.py --before`); a deployed stack always has one.
    pool_table_name: str = ""
    #: The warm pool's queue of idle warm session ids (`lifecycle.warm`): the sweeper sends, dispatchers receive.
    #: Empty: no warm pool (the stack makes the queue only with `warm_sessions` on).
    warm_queue_url: str = ""
    experiment: ExperimentConfig

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> HandlerSettings:
        """The settings of a Lambda, from its environment (`FunctionEnvironment`)."""
        return FunctionEnvironment.from_environ(os.environ if environ is None else environ).handler_settings()

    def to_environ(self) -> dict[str, str]:
        """The pipeline's own variables of `FunctionEnvironment` (Powertools' are the stack's)."""
        return FunctionEnvironment.of(self).to_environ(powertools=False)


#: The resource names of `HandlerSettings` (all but the experiment): `StackOutputs` has fields of the same names,
#: `FunctionEnvironment` variables of the same names in capitals.
RESOURCE_FIELDS: Final = tuple(name for name in HandlerSettings.model_fields if name != "experiment")


class FunctionEnvironment(BaseModel):
    """The environment the stack gives every pipeline Lambda (and local mode its consumers), declared once: each
    field is named after its variable. A Lambda reads it once per container (`from_environ`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    TABLE_NAME: str = Field(min_length=1)
    INPUT_BUCKET: str = Field(min_length=1)
    RESULTS_BUCKET: str = Field(min_length=1)
    ROLLOUT_QUEUE_URL: str = Field(min_length=1)
    BUS_NAME: str = Field(min_length=1)
    EXPERIMENT_CONFIG: str = Field(min_length=1, description="ExperimentConfig as JSON")
    RUNTIME_ARN: str = ""
    INGEST_QUEUE_URL: str = ""
    POOL_TABLE_NAME: str = ""
    WARM_QUEUE_URL: str = ""
    #: Read by Powertools itself (Logger, Metrics); declared so the stack and local mode set the same ones.
    POWERTOOLS_SERVICE_NAME: str = "rollouts"
    POWERTOOLS_METRICS_NAMESPACE: str = METRICS_NAMESPACE
    POWERTOOLS_LOG_LEVEL: str = "INFO"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FunctionEnvironment:
        """Validate the variables; raise `ConfigError` naming every missing or empty one."""
        missing = [name for name, info in cls.model_fields.items() if info.is_required() and not environ.get(name)]
        if missing:
            raise ConfigError(f"missing environment variables: {', '.join(missing)}")
        return cls.model_validate({name: environ[name] for name in cls.model_fields if name in environ})

    @classmethod
    def of(cls, settings: HandlerSettings, **powertools: str) -> FunctionEnvironment:
        """The environment of `settings` (each resource field's variable is its name in capitals)."""
        resources = {name.upper(): getattr(settings, name) for name in RESOURCE_FIELDS}
        return cls(**resources, EXPERIMENT_CONFIG=settings.experiment.to_env(), **powertools)

    def handler_settings(self) -> HandlerSettings:
        resources = {name: getattr(self, name.upper()) for name in RESOURCE_FIELDS}
        return HandlerSettings(**resources, experiment=ExperimentConfig.from_env(self.EXPERIMENT_CONFIG))

    def to_environ(self, *, powertools: bool = True) -> dict[str, str]:
        """The variables; without `powertools`, only the pipeline's own."""
        values = self.model_dump()
        if not powertools:
            values = {k: v for k, v in values.items() if not k.startswith("POWERTOOLS_")}
        return values
