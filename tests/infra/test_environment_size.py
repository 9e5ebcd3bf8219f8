"""Lambda refuses a function whose environment exceeds 4 KB: synth says so first, naming the setting."""

from __future__ import annotations

import json

import pytest

from rollout_pipeline.config import ConfigError
from stacks.application import build_app
from stacks.environment_size import LAMBDA_ENVIRONMENT_LIMIT_BYTES, environment_bytes
from tests.infra.conftest import Synthesized, stack_context


def test_the_default_environment_fits_with_room_to_spare(synth: Synthesized) -> None:
    (function, *_) = synth.stack.functions.values()
    resource = synth.resources[synth.logical_id(function.function)]
    variables = resource["Properties"]["Environment"]["Variables"]
    as_text = {name: value if isinstance(value, str) else "${Token[x]}" for name, value in variables.items()}
    # Tokens count at their longest: the bound is what any deployed names can reach.
    assert environment_bytes(as_text) < LAMBDA_ENVIRONMENT_LIMIT_BYTES // 2


def test_a_long_setting_fails_the_synth_naming_it() -> None:
    stops = json.dumps({"stop": ["</answer>" * 400]})
    with pytest.raises(ConfigError, match=r"over Lambda's 4096-byte limit.*largest settings: sampling_params"):
        build_app(stack_context(sampling_params=stops))


def test_long_model_settings_are_named_too() -> None:
    """Each is within the runtime's own 2,048-character limit per variable; together they are too long."""
    url = "https://models.example.com/v1/" + "a" * 2000
    with pytest.raises(ConfigError, match=r"largest settings: model_base_url \(\d+ bytes\), model_id"):
        build_app(stack_context(model_base_url=url, model_id="m" * 1500))
