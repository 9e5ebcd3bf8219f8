"""Synthesize the experiment stack once per test session (no bundling, no Docker, no AWS) and share the template.

Synthesis runs cdk-nag: if any finding is unacknowledged, the fixture (and so every infra test) fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk import cx_api
from aws_cdk.assertions import Template

from stacks.application import build_app
from stacks.experiment_stack import ExperimentStack

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = "test-exp"
NO_BUNDLING: dict[str, list[str]] = {"aws:cdk:bundling-stacks": []}
#: A deployed stack refuses a loopback model URL (cdk.json's default is local mode's server).
PUBLIC_MODEL_URL = "https://models.example.com/v1"


def cdk_json_context() -> dict[str, Any]:
    context: dict[str, Any] = json.loads((REPO_ROOT / "cdk.json").read_text())["context"]
    return context


def stack_context(**overrides: Any) -> dict[str, Any]:
    """cdk.json's context as the CLI would pass it, with `-c` style overrides and bundling off."""
    return {
        **cdk_json_context(),
        "experiment": EXPERIMENT,
        "model_base_url": PUBLIC_MODEL_URL,
        **NO_BUNDLING,
        **overrides,
    }


@dataclass(frozen=True)
class Synthesized:
    """One synthesized experiment stack: the construct, its template (dict and assertions) and its artifact."""

    stack: ExperimentStack
    template: Template
    resources: Mapping[str, Any]
    outputs: Mapping[str, Any]
    artifact: cx_api.CloudFormationStackArtifact

    def of_type(self, resource_type: str) -> dict[str, Any]:
        return {lid: res for lid, res in self.resources.items() if res["Type"] == resource_type}

    def logical_id(self, construct: Any) -> str:
        return str(self.stack.resolve(self.stack.get_logical_id(construct.node.default_child)))


def synthesize(outdir: Path, **overrides: Any) -> Synthesized:
    app, stack = build_app(stack_context(**overrides), outdir=str(outdir))
    assembly = app.synth()
    artifact = assembly.get_stack_artifact(stack.artifact_id)
    template_json = artifact.template
    return Synthesized(
        stack=stack,
        template=Template.from_json(template_json),
        resources=template_json["Resources"],
        outputs=template_json.get("Outputs", {}),
        artifact=artifact,
    )


@contextmanager
def credential_less() -> Iterator[None]:
    """No account/region in the environment, like a synth on a laptop without AWS credentials."""
    saved = {key: os.environ.pop(key, None) for key in ("CDK_DEFAULT_ACCOUNT", "CDK_DEFAULT_REGION")}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is not None:
                os.environ[key] = value


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    """The default experiment stack (cdk.json defaults, retain), env-agnostic like a credential-less synth."""
    with credential_less():
        yield synthesize(tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="session")
def synth_destroyed(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """`-c results_retention=destroy`: everything the stack made goes with it."""
    return synthesize(tmp_path_factory.mktemp("cdk.out.destroy"), results_retention="destroy")


ALARM_EMAIL = "ops@example.com"
#: HTTP sinks of `synth_local_image`: every kind of authorization, a path parameter, bodies per detail type.
SINKS: list[dict[str, Any]] = [
    {
        "name": "gateway",
        "url": "https://gateway.example.com/sessions/{$.detail.input_id}/complete",
        "events": ["Rollout Completed", "Rollout Failed"],
        "bodies": {
            "Rollout Completed": {"reward_info": {"reward": "$.detail.reward", "excluded": False}},
            "Rollout Failed": {"reward_info": {"reward": None, "excluded": True, "reason": "$.detail.reason"}},
        },
        "auth": {"type": "api_key", "header": "Authorization", "secret": "trainer/gateway", "secret_field": "key"},
        "max_retry_attempts": 20,
        "max_event_age_s": 3600,
    },
    {
        "name": "groups",
        "url": "https://trainer.example.com/groups",
        "auth": {"type": "basic", "username": "rollouts", "secret": "trainer/basic"},
        "rate_per_s": 10,
    },
    {"name": "open", "url": "https://hooks.example.com/batch", "events": ["Batch Completed"], "body": {"done": True}},
]
#: A prebuilt image in the user's own ECR repository (`-c image_uri=...`).
PREBUILT_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/my-agents/math:v7"


@pytest.fixture(scope="session")
def synth_local_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    """`-c image_build=local`: the agent image as a CDK Docker image asset (staged only: synth needs no Docker).

    Also subscribes an e-mail address to the alarm topic, keeps a warm pool and has HTTP sinks (`SINKS`: one synth
    per image mode, other variants ride along).
    """
    with credential_less():
        yield synthesize(
            tmp_path_factory.mktemp("cdk.out.local"),
            image_build="local",
            alarm_email=ALARM_EMAIL,
            warm_sessions="auto",
            sinks=json.dumps(SINKS),
            drop_zero_variance="true",
        )


@pytest.fixture(scope="session")
def synth_prebuilt_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synthesized]:
    """`-c image_uri=...`: a prebuilt image; nothing is built. It asks for a warm pool, which it cannot have (the
    image may not run the agent host)."""
    with credential_less():
        yield synthesize(tmp_path_factory.mktemp("cdk.out.uri"), image_uri=PREBUILT_IMAGE, warm_sessions="64")
