"""A failed first deploy leaves nothing behind, and a retained resource never blocks the next create.

CloudFormation keeps `DeletionPolicy: Retain` resources even when a stack CREATION rolls back; a resource left
behind with a fixed name makes the next `cdk deploy` of the same experiment fail with "already exists".
"""

from __future__ import annotations

import json
from typing import Any

from tests.infra.conftest import Synthesized

#: Properties that give a resource a fixed physical name (CloudFormation generates one when they are absent).
NAME_PROPERTIES = ("BucketName", "TableName", "RepositoryName", "LogGroupName", "QueueName", "TopicName")
RETAINING = ("Retain", "RetainExceptOnCreate", "Snapshot")


def _fixed_names(resource: dict[str, Any]) -> dict[str, str]:
    """The name properties whose value is a literal string (not derived from another resource)."""
    props = resource.get("Properties", {})
    return {key: props[key] for key in NAME_PROPERTIES if isinstance(props.get(key), str)}


def test_every_retained_resource_is_deleted_when_its_create_fails(synth: Synthesized) -> None:
    retained = {lid: r for lid, r in synth.resources.items() if r.get("DeletionPolicy") in RETAINING}
    assert retained, "results_retention=retain keeps buckets, table, logs and the image repository"
    kinds = {r["Type"] for r in retained.values()}
    assert {"AWS::S3::Bucket", "AWS::DynamoDB::Table", "AWS::Logs::LogGroup", "AWS::ECR::Repository"} <= kinds
    wrong = {lid: r["DeletionPolicy"] for lid, r in retained.items() if r["DeletionPolicy"] != "RetainExceptOnCreate"}
    assert wrong == {}, "plain Retain keeps what a failed first create made; use RETAIN_ON_UPDATE_OR_DELETE"


def test_no_retained_resource_has_a_fixed_name(synth: Synthesized) -> None:
    named = {
        lid: _fixed_names(r)
        for lid, r in synth.resources.items()
        if r.get("DeletionPolicy") in RETAINING and _fixed_names(r)
    }
    assert named == {}, f"a retained resource with a fixed name blocks the next create: {json.dumps(named)}"
