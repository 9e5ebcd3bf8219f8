"""AgentCore's lifecycle rule: a runtime's idle session timeout may not exceed its max lifetime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import DEFAULT_IDLE_TIMEOUT_S, ConfigError, ExperimentConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


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
