"""A failed first deploy leaves nothing behind, and a retained resource never blocks the next create.

CloudFormation keeps `DeletionPolicy: Retain` resources even when a stack CREATION rolls back; a resource left
behind with a fixed name makes the next `cdk deploy` of the same experiment fail with "already exists".
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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


def _logging_destinations(synth: Synthesized) -> set[str]:
    """The buckets S3 delivers server access logs into (during the create too, minutes to hours after a request)."""
    found = set()
    for resource in synth.of_type("AWS::S3::Bucket").values():
        destination = resource.get("Properties", {}).get("LoggingConfiguration", {}).get("DestinationBucketName")
        if isinstance(destination, dict) and "Ref" in destination:
            found.add(destination["Ref"])
    return found


def _emptied_buckets(synth: Synthesized) -> set[str]:
    """Buckets CDK's auto-delete custom resource empties (writes denied first) before CloudFormation deletes them."""
    return {r["Properties"]["BucketName"]["Ref"] for r in synth.of_type("Custom::S3AutoDeleteObjects").values()}


def _why_not_deletable(synth: Synthesized, logical_id: str, resource: dict[str, Any]) -> str | None:
    """Why CloudFormation could not delete `resource` when the create that made it rolls back (None: it can)."""
    kind, props = resource["Type"], resource.get("Properties", {})
    if kind == "AWS::DynamoDB::Table":
        return "DeleteTable refuses a protected table" if props.get("DeletionProtectionEnabled") is True else None
    if kind == "AWS::ECR::Repository":
        return None if props.get("EmptyOnDelete") is True else "DeleteRepository refuses one holding the image"
    if kind == "AWS::S3::Bucket":
        # Nothing of ours writes into the input or results bucket before the stack exists; S3's log delivery does.
        if logical_id in _logging_destinations(synth) and logical_id not in _emptied_buckets(synth):
            return "S3 delivers access logs into it during the create, and DeleteBucket refuses a non-empty bucket"
        return None
    if kind == "AWS::Logs::LogGroup":
        return None
    if kind == "Custom::AWS" and "DeletionProtectionEnabled" in json.dumps(props.get("Delete", "")):
        return None  # the ledger's deletion protection, turned off by its Delete (before the table goes)
    return f"no rule for {kind}: say in this test how a failed create deletes it"


#: Resource types whose DeleteX call can refuse: checked whatever their DeletionPolicy.
REFUSING_TYPES = ("AWS::DynamoDB::Table", "AWS::ECR::Repository", "AWS::S3::Bucket")


@pytest.mark.parametrize("retention", ["retain", "destroy"])
def test_a_failed_create_can_delete_everything_it_made(
    synth: Synthesized, synth_destroyed: Synthesized, retention: str
) -> None:
    """RetainExceptOnCreate makes CloudFormation delete what a failed create made; one resource it cannot delete
    turns the rollback into ROLLBACK_FAILED: a protected table, a repository holding the image pushed before the
    runtime failed, a bucket holding objects."""
    stack = synth if retention == "retain" else synth_destroyed
    checked = {
        lid: resource
        for lid, resource in stack.resources.items()
        if resource["Type"] in REFUSING_TYPES or resource.get("DeletionPolicy") == "RetainExceptOnCreate"
    }
    assert checked
    problems = {lid: why for lid, r in checked.items() if (why := _why_not_deletable(stack, lid, r)) is not None}
    assert problems == {}


def test_the_access_log_bucket_is_emptied_and_deleted_with_the_stack(synth: Synthesized) -> None:
    (logs,) = _logging_destinations(synth)
    assert synth.resources[logs]["DeletionPolicy"] == "Delete"
    assert logs in _emptied_buckets(synth)


def test_retained_buckets_stop_logging_before_the_access_log_bucket_goes(
    synth: Synthesized, synth_destroyed: Synthesized
) -> None:
    """`cdk destroy` deletes the access-log bucket and keeps the input and results buckets: their logging is turned
    off first (a custom resource's Delete, which runs before the buckets it depends on are deleted), so they never
    log into a bucket that is gone, or that another account has created since under its name."""
    (logs,) = _logging_destinations(synth)
    calls = {
        lid: r
        for lid, r in synth.of_type("Custom::AWS").items()
        if "putBucketLogging" in json.dumps(r["Properties"].get("Delete", ""))
    }
    logged = {lid for lid, r in synth.of_type("AWS::S3::Bucket").items() if "LoggingConfiguration" in r["Properties"]}
    assert len(calls) == len(logged) == 2
    for resource in calls.values():
        delete = json.loads(json.dumps(resource["Properties"]["Delete"]))
        text = json.dumps(delete)
        assert '\\"BucketLoggingStatus\\":{}' in text
        assert logs in resource["DependsOn"]
        (bucket,) = [lid for lid in logged if lid in text]
        assert bucket in resource["DependsOn"]
    assert not [r for r in synth_destroyed.of_type("Custom::AWS").values() if "putBucketLogging" in json.dumps(r)]


def _protection(synth: Synthesized) -> dict[str, Any]:
    (found,) = [
        r for r in synth.of_type("Custom::AWS").values() if "DeletionProtectionEnabled" in json.dumps(r["Properties"])
    ]
    return found


def test_the_ledger_is_protected_only_once_the_runtime_exists(synth: Synthesized, synth_destroyed: Synthesized) -> None:
    ((table_id, table),) = synth.of_type("AWS::DynamoDB::Table").items()
    assert table["Properties"]["DeletionProtectionEnabled"] is False, "a failed create must be able to delete it"
    protection = _protection(synth)
    assert synth.logical_id(synth.stack.agent.runtime) in protection["DependsOn"]
    assert protection["DeletionPolicy"] == "RetainExceptOnCreate", "cdk destroy keeps the retained table protected"
    create, delete = json.dumps(protection["Properties"]["Create"]), json.dumps(protection["Properties"]["Delete"])
    assert '\\"DeletionProtectionEnabled\\":true' in create
    assert '\\"DeletionProtectionEnabled\\":false' in delete, "a failed create turns it off before the table goes"
    assert table_id in create
    destroyed = _protection(synth_destroyed)
    assert '\\"DeletionProtectionEnabled\\":false' in json.dumps(destroyed["Properties"]["Create"])
    assert destroyed["DeletionPolicy"] == "Delete"
