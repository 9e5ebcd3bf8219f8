"""AgentCore Runtime's quotas as the pipeline models them: one home for their codes, documented defaults and budgets
(the sources: docs/aws-facts.md, "Amazon Bedrock AgentCore Runtime"). The account pool holds one `PoolSettings`: the
quotas and the reserve left for everything else in the account."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final, Literal

#: The account's budgets: new sessions/s, data-plane calls/s, active sessions.
Budget = Literal["sessions", "calls", "active"]


@dataclass(frozen=True)
class QuotaRef:
    """One Service Quotas quota: its service code, quota code and the exact name it is listed under."""

    service: str
    code: str
    name: str


AGENTCORE_SERVICE: Final = "bedrock-agentcore"
#: New Runtime sessions per second, one pool per account and region.
NEW_SESSION_RATE: Final = QuotaRef(AGENTCORE_SERVICE, "L-8EE2AEA2", "Rate of new Runtime session creation")
#: Every Runtime data-plane call (InvokeAgentRuntime, StopRuntimeSession, ...) per second, per account.
DATA_PLANE_RATE: Final = QuotaRef(AGENTCORE_SERVICE, "L-46ED137C", "Rate of Runtime data plane APIs")
ACTIVE_SESSIONS: Final = QuotaRef(AGENTCORE_SERVICE, "L-3E5722B2", "Active Session Workloads per Account")
#: The container-deployment session rate, listed per minute (its name is not published: matched by code only).
CONTAINER_SESSION_RATE: Final = QuotaRef(AGENTCORE_SERVICE, "L-0B3AF7ED", "")
ENDPOINTS_PER_AGENT: Final = QuotaRef(AGENTCORE_SERVICE, "L-9B442722", "Endpoints per Agent")

#: Documented defaults (November 2026), used when Service Quotas cannot be read.
DEFAULT_NEW_SESSIONS_PER_S: Final = 25.0
DEFAULT_DATA_PLANE_PER_S: Final = 1_000.0
ACTIVE_SESSIONS_BY_REGION: Final[dict[str, int]] = {"us-east-1": 5_000, "us-west-2": 5_000}
ACTIVE_SESSIONS_ELSEWHERE: Final = 2_500
#: AgentCore's documented InvokeAgentRuntime rate per agent (no quota code published): invokes count, stops do not.
DOCUMENTED_INVOKE_RATE_PER_AGENT: Final = 200.0
#: A paced call starts at most this long after its booked start, or not at all: spacing starts (1 + this) / n apart
#: keeps n of them in any sliding second.
START_LATENESS_S: Final = 0.04
#: The share of each budget the pipeline never uses: room for production agents and tools in the same account.
DEFAULT_RESERVE: Final = 0.10
MAX_RESERVE: Final = 0.9


def documented_active_sessions(region: str | None) -> int:
    """AgentCore's documented active-session quota in `region` (the lower figure when the region is unknown)."""
    return ACTIVE_SESSIONS_BY_REGION.get(region or "", ACTIVE_SESSIONS_ELSEWHERE)


@dataclass(frozen=True)
class AccountQuotas:
    """The three quotas of one account and region, and where their values came from."""

    new_sessions_per_s: float = DEFAULT_NEW_SESSIONS_PER_S
    data_plane_per_s: float = DEFAULT_DATA_PLANE_PER_S
    active_sessions: int = ACTIVE_SESSIONS_ELSEWHERE
    #: Where the values came from: "defaults", or which quota code set each figure; "+override" when one was given.
    source: str = "defaults"

    @classmethod
    def defaults(cls, region: str | None) -> AccountQuotas:
        """The documented values for `region`."""
        return cls(active_sessions=documented_active_sessions(region))

    def overridden(self, **values: float | int | str | None) -> AccountQuotas:
        """These quotas with every given (not None) value replaced; `source` says so."""
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            return self
        source = self.source if "override" in self.source else f"{self.source}+override"
        return replace(self, **given, source=source)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PoolSettings:
    """What the account pool holds: the quotas, and the reserve of each budget the pipeline leaves unused."""

    quotas: AccountQuotas = field(default_factory=AccountQuotas)
    reserve: float = DEFAULT_RESERVE

    def budget(self, name: Budget) -> float:
        """What every experiment together may use of `name`: the quota less the reserve."""
        quota = {
            "sessions": self.quotas.new_sessions_per_s,
            "calls": self.quotas.data_plane_per_s,
            "active": float(self.quotas.active_sessions),
        }[name]
        return quota * (1.0 - self.reserve)

    def start_interval_us(self, factor: float = 1.0) -> int:
        """The spacing of the account's new-session schedule at the backoff `factor`: at most floor(budget x factor)
        starts (at least one) in ANY sliding second (4/s with a 10% reserve: 3 a second, not 4)."""
        starts = max(1, math.floor(self.budget("sessions") * factor + 1e-9))
        return math.ceil((1.0 + START_LATENESS_S) / starts * 1e6)

    def problems(self) -> list[str]:
        """What is wrong with these settings (each names its key), empty when they are usable."""
        q, found = self.quotas, []
        if not q.new_sessions_per_s > 0:
            found.append(f"new_session_quota must be > 0 (got {q.new_sessions_per_s:g})")
        if not q.data_plane_per_s > 0:
            found.append(f"data_plane_quota must be > 0 (got {q.data_plane_per_s:g})")
        if q.active_sessions < 1:
            found.append(f"active_session_quota must be >= 1 (got {q.active_sessions})")
        if not 0.0 <= self.reserve <= MAX_RESERVE:
            found.append(f"capacity_reserve must be within 0..{MAX_RESERVE:g} (got {self.reserve:g})")
        return found


#: The account pool's settings as CDK context of `rollouts bootstrap`: key -> `AccountQuotas` field.
POOL_CONTEXT_KEYS: Final[dict[str, str]] = {
    "new_session_quota": "new_sessions_per_s",
    "data_plane_quota": "data_plane_per_s",
    "active_session_quota": "active_sessions",
}
RESERVE_KEY: Final = "capacity_reserve"
SOURCE_KEY: Final = "quota_source"


class PoolSettingsError(ValueError):
    """A pool setting is invalid; the message names the key."""


def pool_settings(values: dict[str, object], region: str | None) -> PoolSettings:
    """The pool's settings from `rollouts bootstrap`'s context, else the documented defaults of `region`. Raises
    `PoolSettingsError` naming every bad key."""
    given: dict[str, float] = {}
    problems = []
    for key in [*POOL_CONTEXT_KEYS, RESERVE_KEY]:
        raw = values.get(key)
        try:
            if raw not in (None, ""):
                given[key] = int(str(raw)) if key == "active_session_quota" else float(str(raw))
        except ValueError:
            problems.append(f"{key}: not a number (got {raw!r})")
    reserve = given.pop(RESERVE_KEY, DEFAULT_RESERVE)
    quotas = AccountQuotas.defaults(region)
    if values.get(SOURCE_KEY):
        quotas = replace(quotas, source=str(values[SOURCE_KEY]))
    quotas = replace(quotas, **{POOL_CONTEXT_KEYS[key]: value for key, value in given.items()})  # type: ignore[arg-type]
    settings = PoolSettings(quotas, reserve=reserve)
    problems += settings.problems()
    if problems:
        raise PoolSettingsError("invalid account pool settings: " + "; ".join(problems))
    return settings
