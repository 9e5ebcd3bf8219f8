"""Synth warns when a config promises more than the ledger's measured ceiling (the pure function the stack calls;
`test_agent_endpoints` sees the warning in a synthesized stack)."""

from __future__ import annotations

from rollout_pipeline.ceilings import LEDGER_CEILING_SESSIONS_S, ceiling_warnings
from rollout_pipeline.config import ExperimentConfig


def config(**values: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"name": "ceiling", **values})


def test_the_defaults_and_the_account_pool_are_within_the_ceiling() -> None:
    assert ceiling_warnings(config()) == []  # the pool's 25/s less the reserve
    assert ceiling_warnings(config(session_rate_limit=24, tps_limit=50)) == []


def test_a_session_rate_above_the_ceiling_warns() -> None:
    (warning,) = ceiling_warnings(config(session_rate_limit=LEDGER_CEILING_SESSIONS_S + 1))
    assert warning.startswith("session_rate_limit")
    assert "measured ceiling" in warning


def test_a_tps_limit_above_what_the_ceiling_needs_warns() -> None:
    (warning,) = ceiling_warnings(config(tps_limit=int(2 * LEDGER_CEILING_SESSIONS_S) + 1))
    assert warning.startswith("tps_limit")


def test_too_few_dispatchers_for_several_endpoints_warn() -> None:
    """Only an account whose quota is per endpoint gains rate from endpoints (then each budget needs rollouts in
    hand); with the account pool, endpoints add none and one budget has every rollout."""
    per_endpoint = {"session_rate_limit": 6, "endpoints": 4}
    # measured in rollouts in hand (0.9 of 24/s with 200, 0.88 over 2,400 with 150), 25 per dispatcher
    assert ceiling_warnings(config(**per_endpoint, dispatch_concurrency=8)) == []
    (warning,) = ceiling_warnings(config(**per_endpoint, dispatch_concurrency=6))
    assert warning.startswith("dispatch_concurrency 6")
    assert "about 8" in warning
    assert ceiling_warnings(config(session_rate_limit=22, dispatch_concurrency=5)) == []  # one endpoint
