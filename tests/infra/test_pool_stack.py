"""The account pool's stack (`rollouts bootstrap`): its table, the settings it writes at deploy, the export every
experiment stack imports, cdk-nag clean; and every experiment stack's least-privilege access to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline import access, topology
from rollout_pipeline.config import ConfigError
from rollout_pipeline.ledger.pool_schema import POOL_PK, POOL_SK
from stacks.application import build_app
from stacks.functions import LOG_RETENTION_DAYS
from tests.infra.conftest import NO_BUNDLING, Synthesized


def synth_pool(tmp_path: Path, **context: Any) -> dict[str, Any]:
    app, stack = build_app({"rollouts_pool": "true", **NO_BUNDLING, **context}, outdir=str(tmp_path))
    template: dict[str, Any] = app.synth().get_stack_artifact(stack.artifact_id).template  # cdk-nag runs here
    return template


def test_the_pool_stack_holds_the_table_by_its_well_known_name_and_exports_it(tmp_path: Path) -> None:
    template = synth_pool(tmp_path)
    (table,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::DynamoDB::Table"]
    assert table["Properties"]["TableName"] == topology.POOL_TABLE_NAME
    assert table["Properties"]["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["Properties"]["SSESpecification"]["SSEEnabled"] is True
    (output,) = template["Outputs"].values()
    assert output["Export"]["Name"] == topology.POOL_TABLE_EXPORT


def test_the_settings_from_bootstrap_are_written_at_deploy(tmp_path: Path) -> None:
    template = synth_pool(tmp_path, new_session_quota="50", capacity_reserve="0.2", quota_source="service-quotas")
    (writer,) = [r for r in template["Resources"].values() if r["Type"] == "Custom::AWS"]
    create = json.loads(writer["Properties"]["Create"])
    assert create["action"] == "updateItem"
    parameters = create["parameters"]
    assert parameters["Key"] == {"pk": {"S": POOL_PK}, "sk": {"S": POOL_SK}}
    values = parameters["ExpressionAttributeValues"]
    assert values[":ns"] == {"N": "50"}
    assert values[":reserve"] == {"N": "0.2"}
    assert values[":source"] == {"S": "service-quotas"}


def test_the_pool_stacks_handler_logs_a_month_and_its_logs_go_with_the_stack(tmp_path: Path) -> None:
    """CDK gives AwsCustomResource's handler a log group kept two years (731 days) and retained: not here."""
    template = synth_pool(tmp_path)
    groups = [r for r in template["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup"]
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert functions
    assert len(groups) >= len(functions)
    assert {(g["Properties"]["RetentionInDays"], g["DeletionPolicy"]) for g in groups} == {
        (LOG_RETENTION_DAYS, "Delete")
    }


def test_bad_pool_settings_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="capacity_reserve"):
        synth_pool(tmp_path, capacity_reserve="2")
    with pytest.raises(ConfigError, match="new_session_quota"):
        synth_pool(tmp_path, new_session_quota="lots")


def test_experiment_stacks_import_the_pool_and_reach_only_its_item(synth: Synthesized) -> None:
    env = synth.stack.functions["dispatch"].function
    variables = synth.resources[synth.logical_id(env)]["Properties"]["Environment"]["Variables"]
    assert variables["POOL_TABLE_NAME"] == {"Fn::ImportValue": topology.POOL_TABLE_EXPORT}
    statements = [
        s
        for r in synth.of_type("AWS::IAM::Policy").values()
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        if "dynamodb:UpdateItem" in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
        and topology.POOL_TABLE_NAME in json.dumps(s["Resource"])
    ]
    assert len(statements) == 3  # dispatch, completion, sweeper
    for statement in statements:
        assert sorted(statement["Action"]) == sorted(access.POOL_ITEM_ACTIONS)
        assert statement["Condition"] == {
            "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [access.POOL_LEADING_KEY]}
        }
