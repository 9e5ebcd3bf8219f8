"""cdk-nag runs on every synth, fails it on a finding, and the stack has no unacknowledged finding."""

from __future__ import annotations

from pathlib import Path

import pytest
from aws_cdk import App, Environment, Stack, Validations
from aws_cdk import aws_sqs as sqs
from aws_cdk.cx_api import CloudFormationStackArtifact

from stacks import nag
from tests.infra.conftest import Synthesized, cdk_json_context, synthesize


def errors(artifact: CloudFormationStackArtifact) -> list[str]:
    return [f"{m.id}: {m.entry.data}" for m in artifact.messages if m.level.value == "error"]


def test_stack_synthesizes_with_checks_and_no_error_annotations(synth: Synthesized) -> None:
    assert errors(synth.artifact) == []


def test_checks_are_attached_and_fail_the_synth(tmp_path: Path) -> None:
    app = App(outdir=str(tmp_path))
    stack = Stack(app, "Bad")
    sqs.Queue(stack, "PlainQueue")
    nag.add_checks(app)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = (tmp_path / "validation-report.json").read_text()
    assert "AwsSolutions-SQS4" in report


def test_acknowledgments_are_scoped_to_a_resource_and_give_a_reason(synth: Synthesized) -> None:
    acknowledged: dict[str, dict[str, str]] = {}
    for construct in synth.stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                acknowledged.setdefault(construct.node.path, {}).update(entry.data)
    assert acknowledged, "expected the stack's deliberate findings to be acknowledged"
    for path, findings in acknowledged.items():
        assert path.count("/") >= 2, f"acknowledgment broader than one resource: {path}"
        for finding, reason in findings.items():
            if "IAM5" in finding:
                # A wildcard resource or (CDK's read grant to the image build, stacks/image.py) a wildcard action.
                assert "[Resource::" in finding or "[Action::" in finding, f"IAM5 must name the finding: {finding}"
            assert len(reason) > 30, (path, finding, reason)
            assert reason.endswith("."), (path, finding, reason)


def test_destroy_variant_also_passes_the_checks(tmp_path: Path) -> None:
    """Second synth (config variant): results_retention=destroy adds auto-delete custom resources."""
    destroyed = synthesize(tmp_path, results_retention="destroy", results_expiration_days="30")
    assert errors(destroyed.artifact) == []
    buckets = destroyed.of_type("AWS::S3::Bucket")
    assert {b["DeletionPolicy"] for b in buckets.values()} == {"Delete"}
    assert len(destroyed.of_type("Custom::S3AutoDeleteObjects")) == 3
    (table,) = destroyed.of_type("AWS::DynamoDB::Table").values()
    assert table["DeletionPolicy"] == "Delete"
    assert table["Properties"]["DeletionProtectionEnabled"] is False
    results = buckets[destroyed.logical_id(destroyed.stack.storage.results_bucket)]["Properties"]
    expiring = [r for r in results["LifecycleConfiguration"]["Rules"] if "ExpirationInDays" in r]
    assert [r["ExpirationInDays"] for r in expiring] == [30]


def test_finding_ids_follow_the_stack_environment() -> None:
    """cdk-nag prints literals once account/region are known (deploy with credentials) and pseudo parameters if not."""
    app = App(context=cdk_json_context())
    agnostic = Stack(app, "Agnostic")
    known = Stack(app, "Known", env=Environment(account="123456789012", region="cn-north-1"))
    assert nag.account_arn(agnostic, "logs") == "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>"
    assert nag.account_arn(known, "logs") == "arn:aws-cn:logs:cn-north-1:123456789012"
