"""What warm sessions cost while they wait: AgentCore bills a session's memory for as long as it lives, idle
included, and its CPU only while it is active (https://aws.amazon.com/bedrock/agentcore/pricing/, November 2026;
docs/aws-facts.md). A warm session that waits for its rollout costs memory only: GB-seconds x the memory price.

The prices live in `costs` (its price table and `PriceBook`); this module only applies them to idle time. Without
a price book: the fallback region's list price and AgentCore's per-session maximum, 8 GB (an upper bound: AgentCore
bills the peak memory the session used, which an idle agent process keeps far lower).
"""

from __future__ import annotations

from typing import Final

from rollout_pipeline.costs import AGENTCORE_PRICES, FALLBACK_REGION, MAX_SESSION_MEMORY_GB, PriceBook

#: AgentCore Runtime memory, USD per GB-hour, when no price book is given (`costs.AGENTCORE_PRICES`).
GB_HOUR_USD: Final = AGENTCORE_PRICES[FALLBACK_REGION].gb_hour_usd
PRICE_SOURCE: Final = (
    f"{AGENTCORE_PRICES[FALLBACK_REGION].source} ({FALLBACK_REGION}, {AGENTCORE_PRICES[FALLBACK_REGION].as_of})"
)
#: The size an idle warm session is priced at without a price book: AgentCore's per-session maximum.
SESSION_MEMORY_GB: Final = MAX_SESSION_MEMORY_GB


def idle_gb_s(idle_seconds: float, memory_gb: float = SESSION_MEMORY_GB) -> float:
    """GB-seconds of sessions that waited `idle_seconds` in all (summed over sessions)."""
    return max(0.0, idle_seconds) * memory_gb


def idle_usd(idle_seconds: float, memory_gb: float = SESSION_MEMORY_GB, prices: PriceBook | None = None) -> float:
    """What sessions that waited `idle_seconds` in all cost in memory (USD): at `prices` (the experiment's price
    book: its region's price and `session_memory_gb`) when given, else at `memory_gb` and `GB_HOUR_USD`."""
    if prices is not None:
        return prices.memory_usd(idle_seconds)
    return idle_gb_s(idle_seconds, memory_gb) / 3600.0 * GB_HOUR_USD
