"""cfn-lint on the synthesized template of each image mode: 0 errors (CDK's redundant DependsOn warnings aside)."""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint

from tests.infra.conftest import Synthesized

#: Regions the template is linted for (resource types and properties must exist in each).
REGIONS = ["us-east-1", "us-west-2", "eu-central-1"]


def lint_errors(synthesized: Synthesized) -> list[str]:
    matches = lint(json.dumps(synthesized.artifact.template), config=ManualArgs(regions=REGIONS))
    return [str(match) for match in matches if match.rule.id.startswith("E")]


@pytest.mark.parametrize("mode", ["synth", "synth_local_image", "synth_prebuilt_image"])
def test_template_has_no_cfn_lint_errors(mode: str, request: pytest.FixtureRequest) -> None:
    synthesized: Synthesized = request.getfixturevalue(mode)
    assert lint_errors(synthesized) == []


def test_cfn_lint_reports_errors(synth: Synthesized) -> None:
    """The check can fail: a broken copy of the template has errors."""
    broken = json.loads(json.dumps(synth.artifact.template))
    (table,) = [r for r in broken["Resources"].values() if r["Type"] == "AWS::DynamoDB::Table"]
    table["Properties"]["BillingMode"] = "FREE"
    matches = lint(json.dumps(broken), config=ManualArgs(regions=REGIONS))
    assert any(match.rule.id.startswith("E") for match in matches)
