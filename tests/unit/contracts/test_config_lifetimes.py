"""AgentCore's lifecycle rule: a runtime's idle session timeout may not exceed its max lifetime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import (
    DEFAULT_IDLE_TIMEOUT_S,
    LIFETIME_MARGIN_S,
    WARM_SHELF_LIFE_S,
    ConfigError,
    ExperimentConfig,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def cdk_json_context(**overrides: Any) -> dict[str, Any]:
    context: dict[str, Any] = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return {**context, "experiment": "short", **overrides}


@pytest.mark.parametrize("timeout", [10, 100, 299, 300, 900, 28_800])
def test_derived_idle_timeout_never_exceeds_the_lifetime(timeout: int) -> None:
    config = ExperimentConfig.from_context(cdk_json_context(rollout_timeout_s=str(timeout)))
    assert config.idle_timeout_s <= config.max_lifetime_s
    assert config.idle_timeout_s == min(DEFAULT_IDLE_TIMEOUT_S, config.max_lifetime_s)


def test_short_explicit_lifetime_caps_the_default_idle_timeout() -> None:
    config = ExperimentConfig.from_context(cdk_json_context(rollout_timeout_s="60", max_lifetime_s="120"))
    assert (config.idle_timeout_s, config.max_lifetime_s) == (120, 120)


def test_an_explicit_idle_timeout_is_kept() -> None:
    config = ExperimentConfig.from_context(cdk_json_context(idle_timeout_s="300"))
    assert config.idle_timeout_s == 300


def test_idle_timeout_above_the_lifetime_is_refused_naming_both_keys() -> None:
    with pytest.raises(ConfigError, match=r"idle_timeout_s \(900\) must be <= max_lifetime_s \(600\)"):
        ExperimentConfig.from_context(
            cdk_json_context(rollout_timeout_s="100", idle_timeout_s="900", max_lifetime_s="600")
        )
    with pytest.raises(ValueError, match="max_lifetime_s"):
        ExperimentConfig(name="x", rollout_timeout_s=100, idle_timeout_s=900)


def test_with_the_warm_pool_the_lifetime_leaves_warm_sessions_a_shelf_life() -> None:
    """AgentCore ends a session `max_lifetime_s` after its start, busy or idle: a warm session waits before its
    rollout, so with the pool on the derived lifetime adds a shelf life to what one attempt needs."""
    cold = ExperimentConfig.from_context(cdk_json_context(rollout_timeout_s="900"))
    warm = ExperimentConfig.from_context(cdk_json_context(rollout_timeout_s="900", warm_sessions="auto"))
    assert cold.max_lifetime_s == 900 + LIFETIME_MARGIN_S
    assert warm.max_lifetime_s == 900 + LIFETIME_MARGIN_S + WARM_SHELF_LIFE_S
    assert (warm.warm_shelf_life_s, cold.warm_shelf_life_s) == (WARM_SHELF_LIFE_S, 0)
    kept = ExperimentConfig.from_context(cdk_json_context(warm_sessions="8", max_lifetime_s="2000"))
    assert kept.max_lifetime_s == 2000  # a lifetime set is kept


def test_a_lifetime_that_leaves_warm_sessions_no_time_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"max_lifetime_s \(1600\) leaves warm sessions 100 s"):
        ExperimentConfig.from_context(cdk_json_context(warm_sessions="8", max_lifetime_s="1600"))
    assert ExperimentConfig.from_context(cdk_json_context(max_lifetime_s="1600")).max_lifetime_s == 1600  # no pool


@pytest.mark.parametrize("idle", [60, 90, 119])
def test_an_idle_timeout_too_short_to_keep_warm_sessions_alive_is_refused(idle: int) -> None:
    """A warm session is offered until 60 s before the idle timeout could end it and kept alive halfway to that:
    below 120 s there is no room for both (the pool stopped and re-warmed its sessions in a loop)."""
    with pytest.raises(ConfigError, match=rf"idle_timeout_s \({idle}\) is too short for the warm pool"):
        ExperimentConfig.from_context(cdk_json_context(warm_sessions="2", idle_timeout_s=str(idle)))
    assert ExperimentConfig.from_context(cdk_json_context(idle_timeout_s=str(idle))).idle_timeout_s == idle
    assert (
        ExperimentConfig.from_context(cdk_json_context(warm_sessions="2", idle_timeout_s="120")).warm_stale_after_s
        == 60
    )
