"""What warm sessions cost while they wait: AgentCore bills a session's memory for as long as it lives, idle
included, and its CPU only while it is active (https://aws.amazon.com/bedrock/agentcore/pricing/, November 2026;
docs/aws-facts.md). A warm session that waits for its rollout costs memory only: GB-seconds x the memory price.

The prices and the session's size are the experiment's (`costs.PriceBook`: its region's price, its overrides and
`session_memory_gb`, 8 GB by default: an upper bound, since AgentCore bills the peak memory the session used, which
an idle agent process keeps far lower); this module only applies them to idle time.
"""

from __future__ import annotations

from rollout_pipeline.costs import PriceBook


def idle_gb_s(idle_seconds: float, prices: PriceBook) -> float:
    """GB-seconds of sessions that waited `idle_seconds` in all (summed over sessions), at the experiment's session
    size (`prices.billed_memory_gb`)."""
    return max(0.0, idle_seconds) * prices.billed_memory_gb


def idle_usd(idle_seconds: float, prices: PriceBook) -> float:
    """What sessions that waited `idle_seconds` in all cost in memory (USD) at the experiment's prices."""
    return prices.memory_usd(idle_seconds)
