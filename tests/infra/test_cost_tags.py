"""Cost allocation: every resource the stack creates that CloudFormation can tag, and the AgentCore runtime, carries
`rollouts:experiment` = the experiment, so Cost Explorer splits the bill by experiment (docs/deploy.md says to
activate the tag). Taggable is what CloudFormation's own resource schemas say (`tagging.taggable`, as cfn-lint
ships them)."""

from __future__ import annotations

from typing import Any

import pytest
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

from tests.infra.conftest import EXPERIMENT, Synthesized

TAG_KEY = "rollouts:experiment"


def _tagging(resource_type: str) -> dict[str, Any]:
    if resource_type.startswith("Custom::") or resource_type == "AWS::CloudFormation::CustomResource":
        return {"taggable": False}
    schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", resource_type)
    tagging: dict[str, Any] = schema.schema.get("tagging") or {"taggable": False}
    return tagging


def _tag_value(props: dict[str, Any], tag_property: str) -> Any:
    tags = props.get(tag_property.removeprefix("/properties/").split("/")[0])
    if isinstance(tags, dict):  # a map
        return tags.get(TAG_KEY)
    for tag in tags or []:  # a list of Key/Value
        if isinstance(tag, dict) and tag.get("Key") == TAG_KEY:
            return tag.get("Value")
    return None


@pytest.mark.parametrize("variant", ["synth", "synth_local_image", "synth_prebuilt_image"])
def test_every_taggable_resource_carries_the_experiment_tag(variant: str, request: pytest.FixtureRequest) -> None:
    synth: Synthesized = request.getfixturevalue(variant)
    untagged = []
    taggable = 0
    for logical_id, resource in synth.resources.items():
        tagging = _tagging(resource["Type"])
        if not tagging.get("taggable", True):
            continue
        taggable += 1
        value = _tag_value(resource.get("Properties") or {}, str(tagging.get("tagProperty", "/properties/Tags")))
        if value != EXPERIMENT:
            untagged.append(f"{logical_id} ({resource['Type']})")
    assert untagged == []
    assert taggable >= 20


def test_the_runtime_is_tagged(synth: Synthesized) -> None:
    (runtime,) = synth.of_type("AWS::BedrockAgentCore::Runtime").values()
    assert runtime["Properties"]["Tags"][TAG_KEY] == EXPERIMENT
