"""The local resources route events exactly as the stack does: S3 datasets -> ingest queue, results ->
completion queue, pipeline events -> trainer queue."""

from __future__ import annotations

import json

from rollout_pipeline.adapters import clients
from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import BatchAccepted
from rollout_pipeline.local.resources import ExperimentResources, create_resources
from tests.conftest import REGION, receive_all


def test_dataset_upload_reaches_ingest_queue_and_other_keys_do_not(resources: ExperimentResources) -> None:
    """The rule matches `datasets/` by prefix, with no wildcard (EventBridge allows 30 rules with wildcards per bus,
    the account's default bus included): a key of another suffix reaches the queue, and ingestion skips it
    (`tests/integration/feed/test_ingest.py`)."""
    s3 = clients.client("s3")
    s3.put_object(Bucket=resources.input_bucket, Key="datasets/a.jsonl", Body=b"{}\n")
    s3.put_object(Bucket=resources.input_bucket, Key="datasets/b.jsonl.gz", Body=b"")
    s3.put_object(Bucket=resources.input_bucket, Key="datasets/c.csv", Body=b"")
    s3.put_object(Bucket=resources.input_bucket, Key="other/d.jsonl", Body=b"")
    events = receive_all(resources.ingest_queue_url)
    keys = sorted(e["detail"]["object"]["key"] for e in events)
    assert keys == ["datasets/a.jsonl", "datasets/b.jsonl.gz", "datasets/c.csv"]
    assert all(e["detail"]["object"].get("version-id") for e in events), "input bucket must be versioned"


def test_result_object_reaches_completion_queue(resources: ExperimentResources) -> None:
    s3 = clients.client("s3")
    s3.put_object(Bucket=resources.results_bucket, Key="test-exp/q1/s.json", Body=b"{}")
    events = receive_all(resources.completion_queue_url)
    assert [e["detail"]["object"]["key"] for e in events] == ["test-exp/q1/s.json"]
    assert receive_all(resources.ingest_queue_url) == []


def test_published_events_reach_trainer_queue(resources: ExperimentResources) -> None:
    detail = BatchAccepted(
        event_id="e1",
        exp_id="test-exp",
        batch_id="b-1",
        rows_accepted=1,
        rows_rejected=0,
        rollouts_enqueued=2,
        group_size=2,
    )
    EventBridgePublisher(resources.bus_name).publish([detail])
    events = receive_all(resources.trainer_queue_url)
    assert len(events) == 1
    assert events[0]["detail-type"] == "Batch Accepted"
    assert events[0]["source"] == "rollout.pipeline"
    assert BatchAccepted.model_validate(events[0]["detail"]) == detail


def test_create_resources_is_idempotent(resources: ExperimentResources, experiment_config: ExperimentConfig) -> None:
    again = create_resources(experiment_config, region=REGION, client=clients.client)
    assert again == resources
    assert json.loads(again.stack_outputs()["ExperimentConfig"])["name"] == "test-exp"


def test_an_experiment_made_again_with_other_settings_takes_them(
    resources: ExperimentResources, experiment_config: ExperimentConfig
) -> None:
    """Local mode's moto keeps its state per process: an experiment of the same name made again (another demo of a
    test session) with other lifetimes gets its queues with the new attributes, not SQS's QueueAlreadyExists."""
    longer = ExperimentConfig(name=experiment_config.name, rollout_timeout_s=experiment_config.rollout_timeout_s + 600)
    assert longer.max_lifetime_s != experiment_config.max_lifetime_s
    again = create_resources(longer, region=REGION, client=clients.client)
    attributes = clients.client("sqs").get_queue_attributes(QueueUrl=again.warm_queue_url, AttributeNames=["All"])
    assert int(attributes["Attributes"]["MessageRetentionPeriod"]) == max(60, longer.max_lifetime_s)
    assert again.warm_queue_url == resources.warm_queue_url


def test_handler_settings_round_trip_through_the_stack_outputs(resources: ExperimentResources) -> None:
    settings = resources.settings()
    assert settings.table_name == resources.table_name
    assert settings.rollout_queue_url == resources.rollout_queue_url
    assert settings.ingest_queue_url == resources.ingest_queue_url
    assert settings.runtime_arn == resources.runtime_arn
    assert settings.experiment == resources.config
    assert type(settings).from_environ(settings.to_environ()) == settings


def test_s3_adapter_raises_object_not_found_for_missing_keys_and_versions(resources: ExperimentResources) -> None:
    import pytest

    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.ports import ObjectNotFound

    store = S3ObjectStore()
    version = store.put_bytes(resources.input_bucket, "datasets/x.jsonl", b"{}\n")
    assert store.head(resources.input_bucket, "datasets/x.jsonl", version).size == 3
    with pytest.raises(ObjectNotFound, match=r"s3://.*/datasets/missing\.jsonl does not exist"):
        store.head(resources.input_bucket, "datasets/missing.jsonl")
    with pytest.raises(ObjectNotFound):
        store.get_bytes(resources.results_bucket, "nope.json", 100)
    with pytest.raises(ObjectNotFound):
        list(store.iter_bytes(resources.input_bucket, "datasets/missing.jsonl"))
    clients.client("s3").delete_object(Bucket=resources.input_bucket, Key="datasets/x.jsonl", VersionId=version)
    with pytest.raises(ObjectNotFound, match=f"version {version}"):
        store.head(resources.input_bucket, "datasets/x.jsonl", version)
