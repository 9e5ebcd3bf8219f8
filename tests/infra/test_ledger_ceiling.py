"""Synth warns when a config promises more than the ledger's measured ceiling (the pure function the stack calls;
`test_agent_endpoints` sees the warning in a synthesized stack)."""

from __future__ import annotations

from rollout_pipeline.capacity import LEDGER_CEILING_SESSIONS_S, ceiling_warnings
from rollout_pipeline.config import ExperimentConfig


def test_the_defaults_and_the_account_quota_are_within_the_ceiling() -> None:
    defaults = ExperimentConfig(name="ceiling")
    assert ceiling_warnings(defaults.tps_limit, defaults.session_rate_limit, defaults.endpoints) == []
    assert ceiling_warnings(50, 6, 4) == []  # 24 new sessions/s: just under the account's 25/s


def test_a_session_rate_above_the_ceiling_warns() -> None:
    endpoints = 8
    rate = LEDGER_CEILING_SESSIONS_S / endpoints + 1
    (warning,) = ceiling_warnings(2 * LEDGER_CEILING_SESSIONS_S, rate, endpoints)
    assert "endpoints x session_rate_limit" in warning
    assert "measured ceiling" in warning


def test_a_tps_limit_above_what_the_ceiling_needs_warns() -> None:
    (warning,) = ceiling_warnings(2 * LEDGER_CEILING_SESSIONS_S + 1, 5, 1)
    assert warning.startswith("tps_limit")


def test_too_few_dispatchers_for_several_endpoints_warn() -> None:
    assert ceiling_warnings(50, 6, 4, dispatch_concurrency=20) == []  # measured: 0.9 of 24/s over 2,400 rollouts
    (warning,) = ceiling_warnings(50, 6, 4, dispatch_concurrency=15)  # measured: 0.88 over 2,400 (0.9 over 480)
    assert warning.startswith("dispatch_concurrency 15")
    assert "about 20" in warning
    (warning,) = ceiling_warnings(50, 6, 4, dispatch_concurrency=5)  # measured: 0.79
    assert "about 20" in warning
    assert ceiling_warnings(25, 5, 1, dispatch_concurrency=5) == []  # one endpoint: its budget has every rollout
