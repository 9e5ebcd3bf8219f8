"""HTTP sinks as the stack deploys them (`synth_local_image` has three, `conftest.SINKS`): per sink a connection, an
API destination, one rule per detail type whose target sends the compiled body, retried as set, dead-lettered into
the sink's own queue; least privilege: the target role invokes its API destination only, the queue takes messages
from the sink's rules only. cfn-lint and cdk-nag run on the same synth (test_cfn_lint.py, the fixture itself)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout_pipeline.config import ConfigError
from stacks.sinks import NO_AUTH_HEADER
from tests.infra.conftest import Synthesized, synthesize


def _rules(synth: Synthesized) -> list[dict[str, Any]]:
    rules = synth.of_type("AWS::Events::Rule").values()
    return [r["Properties"] for r in rules if "HTTP sink" in str(r["Properties"].get("Description", ""))]


def test_each_sink_is_an_api_destination_with_its_connection(synth_local_image: Synthesized) -> None:
    destinations = [r["Properties"] for r in synth_local_image.of_type("AWS::Events::ApiDestination").values()]
    assert sorted(d["InvocationEndpoint"] for d in destinations) == [
        "https://gateway.example.com/sessions/*/complete",
        "https://hooks.example.com/batch",
        "https://trainer.example.com/groups",
    ]
    assert {d["HttpMethod"] for d in destinations} == {"POST"}
    assert sorted(d["InvocationRateLimitPerSecond"] for d in destinations) == [10, 300, 300]
    connections = [r["Properties"] for r in synth_local_image.of_type("AWS::Events::Connection").values()]
    kinds = sorted(c["AuthorizationType"] for c in connections)
    assert kinds == ["API_KEY", "API_KEY", "BASIC"]
    text = json.dumps(connections)
    assert "{{resolve:secretsmanager:trainer/gateway:SecretString:key::}}" in text  # resolved at deploy, not stored
    assert "{{resolve:secretsmanager:trainer/basic:SecretString:::}}" in text
    assert NO_AUTH_HEADER in text


def test_rules_send_the_compiled_body_with_retries_and_a_dead_letter_queue(synth_local_image: Synthesized) -> None:
    rules = _rules(synth_local_image)
    assert len(rules) == 4  # gateway: two detail types; groups and open: one each
    by_type = {r["EventPattern"]["detail-type"][0]: r for r in rules}
    completed = by_type["Rollout Completed"]
    assert completed["EventPattern"]["detail"] == {"surplus": [False]}  # a surplus rollout is never sent
    (target,) = completed["Targets"]
    assert target["HttpParameters"]["PathParameterValues"] == ["$.detail.input_id"]
    assert target["InputTransformer"] == {
        "InputPathsMap": {"v0": "$.detail.reward"},
        "InputTemplate": '{"reward_info":{"reward":<v0>,"excluded":false}}',
    }
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 20, "MaximumEventAgeInSeconds": 3600}
    assert "DeadLetterConfig" in target
    assert "RoleArn" in target
    group = by_type["Group Completed"]
    assert group["EventPattern"]["detail"] == {"zero_variance": [False]}  # drop_zero_variance
    assert group["Targets"][0]["InputPath"] == "$.detail"
    assert by_type["Batch Completed"]["Targets"][0]["Input"] == '{"done":true}'


def test_the_target_role_invokes_its_api_destination_only(synth_local_image: Synthesized) -> None:
    statements = [
        statement
        for policy in synth_local_image.of_type("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if "events:InvokeApiDestination" in json.dumps(statement["Action"])
    ]
    assert statements
    for statement in statements:
        assert statement["Action"] == "events:InvokeApiDestination"
        assert "ApiDestination" in json.dumps(statement["Resource"])  # its own destination's ARN, no wildcard
        assert statement["Resource"] != "*"


def test_a_deployed_sink_needs_https(tmp_path: Any) -> None:
    sink = [{"name": "plain", "url": "http://trainer.example.com/x"}]
    with pytest.raises(ConfigError, match="API destinations call HTTPS endpoints only"):
        synthesize(tmp_path, sinks=json.dumps(sink))
