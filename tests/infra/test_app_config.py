"""The CDK app's configuration: cdk.json defaults, `-c` overrides, and clear errors (no synthesis needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from rollout_pipeline.config import ConfigError, ExperimentConfig
from stacks.application import build_app
from stacks.experiment_stack import stack_name
from tests.infra.conftest import EXPERIMENT, REPO_ROOT, cdk_json_context, stack_context

CONFIG_FIELDS = [name for name in ExperimentConfig.model_fields if name != "name"]


def test_cdk_json_has_a_default_for_every_config_field_equal_to_the_model_default() -> None:
    context = cdk_json_context()
    assert "experiment" not in context, "the experiment name must be given with -c experiment=NAME"
    assert set(CONFIG_FIELDS) <= set(context)
    assert ExperimentConfig.from_context({**context, "experiment": EXPERIMENT}) == ExperimentConfig(name=EXPERIMENT)


def test_cdk_json_runs_the_python_app_and_sets_recommended_flags() -> None:
    cdk_json = json.loads((REPO_ROOT / "cdk.json").read_text())
    assert "app.py" in cdk_json["app"]
    assert cdk_json["context"]["@aws-cdk/aws-iam:minimizePolicies"] is True
    assert cdk_json["context"]["@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"] is True
    assert "watch" in cdk_json


def test_string_overrides_from_the_command_line_are_coerced() -> None:
    config = ExperimentConfig.from_context(
        stack_context(tps_limit="40", group_size="4", sampling_params='{"temperature": 0.7}', policy_version="v3")
    )
    assert (config.tps_limit, config.group_size, config.policy_version) == (40, 4, "v3")
    assert config.sampling_params.temperature == 0.7


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tps_limit", "abc"),
        ("max_sessions", "0"),
        ("results_retention", "forever"),
        ("model_base_url", "ftp://model"),
        ("dispatch_concurrency", "1"),
        ("sampling_params", "{not json"),
    ],
)
def test_a_bad_value_names_its_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        build_app(stack_context(**{key: value}))


def test_missing_experiment_name_is_explained() -> None:
    context = stack_context()
    del context["experiment"]
    with pytest.raises(ConfigError, match="-c experiment=NAME"):
        build_app(context)


def test_bad_experiment_name_is_rejected() -> None:
    with pytest.raises(ConfigError, match="name"):
        build_app(stack_context(experiment="Bad_Name"))


def test_bad_archive_retention_is_rejected() -> None:
    with pytest.raises(ConfigError, match="event_archive_days"):
        build_app(stack_context(event_archive_days="soon"))


def test_stack_name_per_experiment() -> None:
    assert stack_name(ExperimentConfig(name="my-exp")) == "Rollouts-my-exp"


def test_app_py_exits_non_zero_with_the_reason() -> None:
    """What `cdk synth -c experiment=demo -c tps_limit=abc` runs: the CLI passes context in CDK_CONTEXT_JSON."""
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**cdk_json_context(), "experiment": "demo", "tps_limit": "abc"}),
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2
    assert "tps_limit" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000/v1", "http://localhost:8000/v1", "http://10.0.3.7/v1", "http://[::1]:8000/v1"],
)
def test_a_deployed_stack_refuses_a_model_url_the_agent_cannot_reach(url: str) -> None:
    with pytest.raises(ConfigError, match=r"model_base_url .*allow_private_model_url=true"):
        build_app(stack_context(model_base_url=url))


def test_a_private_model_url_is_deployed_when_explicitly_allowed() -> None:
    _app, stack = build_app(stack_context(model_base_url="http://10.0.3.7/v1", allow_private_model_url="true"))
    assert stack.config.model_base_url == "http://10.0.3.7/v1"


def test_cdk_json_default_model_url_needs_an_override_to_deploy() -> None:
    """cdk.json's default is local mode's loopback server: a synth without an override says what to set."""
    context = {**cdk_json_context(), "experiment": EXPERIMENT}
    with pytest.raises(ConfigError, match="-c model_base_url=https://"):
        build_app(context)


def test_make_deploy_runs_the_preflight_and_the_drain_check_first() -> None:
    """`make deploy` is `rollouts deploy`, which runs the preflight, then (for an update) refuses while rollouts are
    in flight (`ops.upgrade`) before `cdk deploy`: a bare `cdk deploy` would skip both."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    lines = makefile.splitlines()
    recipe = lines[next(i for i, line in enumerate(lines) if line.startswith("deploy:")) + 1]
    assert recipe.strip() == "$(BIN)/rollouts deploy -e $(EXPERIMENT) $(CDK_ARGS)"
    (preflight,) = [line for line in lines if line.startswith("preflight:")]
    assert preflight
    assert "rollouts preflight -e $(EXPERIMENT) $(CDK_ARGS)" in makefile
