"""`-c agent_kind=rft`: the image adds the SageMaker RFT SDK (build argument, own tag) and the runtime's start
command serves the agent module through the RFT host (runtime environment)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from rollout_pipeline.config import (
    AGENT_KIND_ENV,
    AGENT_MODULE_ENV,
    DEFAULT_AGENT_MODULES,
    JOB_ARN_ENV,
    ConfigError,
    ExperimentConfig,
)
from stacks.image import content_tag
from tests.infra.conftest import REPO_ROOT, Synthesized, credential_less, stack_context, synthesize

JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft-run"


@pytest.fixture(scope="module")
def synth_rft(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    with credential_less():
        return synthesize(tmp_path_factory.mktemp("cdk.out.rft"), agent_kind="rft", rft_job_arn=JOB)


def _runtime_env(synthesized: Synthesized) -> dict[str, Any]:
    (resource,) = synthesized.of_type("AWS::BedrockAgentCore::Runtime").values()
    env: dict[str, Any] = resource["Properties"]["EnvironmentVariables"]
    return env


def test_rft_setting_serves_the_rft_example_through_the_host(synth_rft: Synthesized) -> None:
    env = _runtime_env(synth_rft)
    assert env[AGENT_KIND_ENV] == "rft"
    assert env[AGENT_MODULE_ENV] == DEFAULT_AGENT_MODULES["rft"]
    assert env[JOB_ARN_ENV] == JOB


def test_rft_setting_builds_the_image_with_the_sdk_under_its_own_tag(synth_rft: Synthesized) -> None:
    (build,) = synth_rft.of_type("Custom::CDKContainerImageBuild").values()
    props = build["Properties"]
    assert "AGENT_EXTRAS=rft" in json.dumps(props)
    assert props["imageTag"] == content_tag(REPO_ROOT, {"AGENT_EXTRAS": "rft"})
    assert props["imageTag"] != content_tag(REPO_ROOT), "an RFT image never overwrites the default image's tag"


def test_default_setting_serves_the_math_agent_with_no_build_argument(synth: Synthesized) -> None:
    env = _runtime_env(synth)
    assert env[AGENT_KIND_ENV] == "art"
    assert env[AGENT_MODULE_ENV] == DEFAULT_AGENT_MODULES["art"]
    assert JOB_ARN_ENV not in env
    (build,) = synth.of_type("Custom::CDKContainerImageBuild").values()
    assert "AGENT_EXTRAS" not in json.dumps(build["Properties"])


def test_the_image_starts_the_configured_agent_and_can_add_the_rft_lock() -> None:
    dockerfile = (REPO_ROOT / "agent_image" / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    # The agent host: it imports ROLLOUTS_AGENT_MODULE (a module written the ART way, ending in `app.run()`, runs as
    # it is: tests/integration/lifecycle/test_agent_compat.py runs this very command) and serves its app on
    # 0.0.0.0:8080.
    assert json.loads(cmd) == ["python", "-m", "rollout_pipeline.agent.host", "--host", "0.0.0.0", "--port", "8080"]
    assert "-r /app/agent_image/requirements-rft.lock" in dockerfile
    assert 'ARG AGENT_EXTRAS=""' in dockerfile


def test_agent_settings_are_validated() -> None:
    config = ExperimentConfig.from_context(stack_context(agent_module="my_agents.solver:app", agent_kind="rft"))
    assert config.served_agent_module == "my_agents.solver:app"
    for bad in ({"agent_kind": "sagemaker"}, {"agent_module": "x; rm -rf /"}, {"rft_job_arn": "arn:aws:s3:::b"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ExperimentConfig.from_context(stack_context(**bad))
    with pytest.raises(ConfigError, match="only agent_kind=rft"):
        ExperimentConfig.from_context(stack_context(agent_module="my_agents.solver:app"))
