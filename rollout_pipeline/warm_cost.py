"""What warm sessions cost while they wait: AgentCore bills a session's memory for as long as it lives, idle
included, and its CPU only while it is active (https://aws.amazon.com/bedrock/agentcore/pricing/, November 2026;
docs/aws-facts.md). A warm session that waits for its rollout costs memory only: GB-seconds x the memory price.

The one place the warm pool's price lives until the pipeline's cost model takes it over: the memory price in
us-east-1, and the session size it is applied to (AgentCore's per-session maximum, 8 GB, so the figure is an upper
bound: AgentCore bills the peak memory the session used, which an idle agent process keeps far lower).
"""

from __future__ import annotations

from typing import Final

#: AgentCore Runtime memory, USD per GB-hour (us-east-1 list price, November 2026).
GB_HOUR_USD: Final = 0.00945
PRICE_SOURCE: Final = "https://aws.amazon.com/bedrock/agentcore/pricing/ (us-east-1, 2026-11)"
#: The size an idle warm session is priced at: AgentCore's per-session maximum (an upper bound).
SESSION_MEMORY_GB: Final = 8.0


def idle_gb_s(idle_seconds: float, memory_gb: float = SESSION_MEMORY_GB) -> float:
    """GB-seconds of sessions that waited `idle_seconds` in all (summed over sessions)."""
    return max(0.0, idle_seconds) * memory_gb


def idle_usd(idle_seconds: float, memory_gb: float = SESSION_MEMORY_GB) -> float:
    """What sessions that waited `idle_seconds` in all cost in memory (USD)."""
    return idle_gb_s(idle_seconds, memory_gb) / 3600.0 * GB_HOUR_USD
