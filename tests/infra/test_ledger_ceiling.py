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
