"""A model secret under a customer-managed KMS key: the agent may decrypt it through Secrets Manager only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import ConfigError
from stacks.application import build_app
from tests.infra.conftest import Synthesized, stack_context, synthesize

KEY_ARN = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def agent_statements(synth: Synthesized) -> list[dict[str, Any]]:
    role_id = synth.logical_id(synth.stack.agent.runtime.role)
    return [
        statement
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_agent_may_decrypt_its_secret_with_the_given_key(tmp_path: Path) -> None:
    synth = synthesize(tmp_path, model_secret_name="rollouts/model-key", model_secret_kms_key_arn=KEY_ARN)
    decrypts = [s for s in agent_statements(synth) if "kms" in json.dumps(s["Action"])]
    (statement,) = decrypts
    assert statement["Action"] == "kms:Decrypt"
    assert statement["Resource"] == KEY_ARN
    via = json.dumps(statement["Condition"]["StringEquals"]["kms:ViaService"])
    assert "secretsmanager." in via
    assert ".amazonaws.com" in via
    for function in synth.stack.functions.values():
        role_id = synth.logical_id(function.role)
        for policy in synth.of_type("AWS::IAM::Policy").values():
            if {"Ref": role_id} in policy["Properties"]["Roles"]:
                assert "kms:" not in json.dumps(policy["Properties"]["PolicyDocument"])


def test_no_kms_grant_without_the_setting(synth: Synthesized) -> None:
    assert not [s for s in agent_statements(synth) if "kms:Decrypt" in json.dumps(s["Action"])]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model_secret_name": "m", "model_secret_kms_key_arn": "alias/my-key"}, "model_secret_kms_key_arn"),
        (
            {"model_secret_name": "m", "model_secret_kms_key_arn": "arn:aws:kms:us-west-2:123456789012:alias/k"},
            "not an alias",
        ),
        ({"model_secret_kms_key_arn": KEY_ARN}, "model_secret_name is not"),
    ],
)
def test_a_bad_key_setting_is_refused(overrides: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_app(stack_context(**overrides))
