"""Every resource kind of the experiment stack exists with its security and operational settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from rollout_pipeline import topology
from rollout_pipeline.config import ExperimentConfig, HandlerSettings
from rollout_pipeline.ledger import keys
from stacks.experiment_stack import OPERATOR_OUTPUT_NAMES, OUTPUT_NAMES
from tests.infra.conftest import EXPERIMENT, PUBLIC_MODEL_URL, Synthesized

#: cdk.json's defaults with the public model URL the tests deploy with (a loopback URL is refused).
DEFAULTS = ExperimentConfig(name=EXPERIMENT, model_base_url=PUBLIC_MODEL_URL)
FOURTEEN_DAYS_S = 14 * 24 * 3600


def ref(logical_id: str) -> dict[str, str]:
    return {"Ref": logical_id}


def arn(logical_id: str) -> dict[str, list[str]]:
    return {"Fn::GetAtt": [logical_id, "Arn"]}


# --- storage -------------------------------------------------------------------------------------------------


def test_three_buckets_encrypted_private_and_the_data_retained(synth: Synthesized) -> None:
    buckets = synth.of_type("AWS::S3::Bucket")
    assert len(buckets) == 3
    access_logs = synth.logical_id(synth.stack.storage.access_logs)
    for logical_id, bucket in buckets.items():
        props = bucket["Properties"]
        sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert sse == [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        if logical_id == access_logs:  # emptied and deleted with the stack (test_retention.py)
            assert bucket["DeletionPolicy"] == "Delete"
        else:
            assert bucket["DeletionPolicy"] == "RetainExceptOnCreate"
            assert bucket["UpdateReplacePolicy"] == "Retain"


def test_every_bucket_policy_denies_plain_http(synth: Synthesized) -> None:
    policies = synth.of_type("AWS::S3::BucketPolicy")
    assert {p["Properties"]["Bucket"]["Ref"] for p in policies.values()} == set(synth.of_type("AWS::S3::Bucket"))
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
        )


def test_input_bucket_versioned_notifies_eventbridge_and_expires_claims(synth: Synthesized) -> None:
    storage = synth.stack.storage
    props = synth.resources[synth.logical_id(storage.input_bucket)]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["LoggingConfiguration"]["DestinationBucketName"] == ref(synth.logical_id(storage.access_logs))
    rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-claims"]["Prefix"] == "claims/"
    assert rules["expire-claims"]["ExpirationInDays"] == DEFAULTS.ledger_ttl_days
    assert rules["expire-noncurrent"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": DEFAULTS.ledger_ttl_days}
    notifications = synth.of_type("Custom::S3BucketNotifications")
    by_bucket = {n["Properties"]["BucketName"]["Ref"]: n["Properties"] for n in notifications.values()}
    for bucket in (storage.input_bucket, storage.results_bucket):
        config = by_bucket[synth.logical_id(bucket)]["NotificationConfiguration"]
        assert config == {"EventBridgeConfiguration": {}}


def test_results_bucket_logged_and_not_expired_by_default(synth: Synthesized) -> None:
    storage = synth.stack.storage
    props = synth.resources[synth.logical_id(storage.results_bucket)]["Properties"]
    assert "VersioningConfiguration" not in props
    assert props["LoggingConfiguration"]["DestinationBucketName"] == ref(synth.logical_id(storage.access_logs))
    assert not [r for r in props["LifecycleConfiguration"]["Rules"] if "ExpirationInDays" in r]


# --- ledger --------------------------------------------------------------------------------------------------


def test_ledger_table_schema_matches_ledger_keys(synth: Synthesized) -> None:
    def gsi(name: str, pk: str, sk: str) -> dict[str, Any]:
        return {
            "IndexName": name,
            "KeySchema": [{"AttributeName": pk, "KeyType": "HASH"}, {"AttributeName": sk, "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"},
        }

    synth.template.resource_count_is("AWS::DynamoDB::Table", 1)
    synth.template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "DeletionPolicy": "RetainExceptOnCreate",
            "Properties": {
                "KeySchema": [
                    {"AttributeName": keys.PK, "KeyType": "HASH"},
                    {"AttributeName": keys.SK, "KeyType": "RANGE"},
                ],
                "AttributeDefinitions": Match.array_equals(
                    [
                        {"AttributeName": keys.PK, "AttributeType": "S"},
                        {"AttributeName": keys.SK, "AttributeType": "S"},
                        {"AttributeName": keys.DEADLINE_PK, "AttributeType": "S"},
                        {"AttributeName": keys.DEADLINE_SK, "AttributeType": "N"},
                        {"AttributeName": keys.OUTBOX_PK, "AttributeType": "S"},
                        {"AttributeName": keys.OUTBOX_SK, "AttributeType": "N"},
                    ]
                ),
                "BillingMode": "PAY_PER_REQUEST",
                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                "TimeToLiveSpecification": {"AttributeName": keys.TTL_ATTRIBUTE, "Enabled": True},
                "SSESpecification": {"SSEEnabled": True},
                "DeletionProtectionEnabled": False,
                "GlobalSecondaryIndexes": [
                    gsi(keys.DEADLINE_INDEX, keys.DEADLINE_PK, keys.DEADLINE_SK),
                    gsi(keys.OUTBOX_INDEX, keys.OUTBOX_PK, keys.OUTBOX_SK),
                ],
            },
        },
    )


# --- queues, DLQs, alarms ------------------------------------------------------------------------------------


def test_every_queue_encrypted_and_tls_only(synth: Synthesized) -> None:
    queues = synth.of_type("AWS::SQS::Queue")
    assert len(queues) == 9  # ingest, rollout, completion, trainer + their DLQs, undelivered events
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
    protected: set[str] = set()
    for policy in synth.of_type("AWS::SQS::QueuePolicy").values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        if any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
        ):
            protected.update(q["Ref"] for q in policy["Properties"]["Queues"])
    assert protected == set(queues)


def test_every_rule_to_a_queue_retries_then_dead_letters_undeliverable_events(synth: Synthesized) -> None:
    undelivered = synth.stack.resolve(synth.stack.events.undelivered.queue_arn)
    sqs_targets = [
        target
        for rule in synth.of_type("AWS::Events::Rule").values()
        for target in rule["Properties"].get("Targets", [])
        if "Sqs" in str(target["Arn"]) or "Queue" in str(target["Arn"])
    ]
    assert len(sqs_targets) == 3  # datasets -> ingest, results -> completion, bus -> trainer
    for target in sqs_targets:
        assert target["DeadLetterConfig"] == {"Arn": undelivered}
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 185, "MaximumEventAgeInSeconds": 86400}
    alarms = synth.of_type("AWS::CloudWatch::Alarm").values()
    assert any("could not deliver" in a["Properties"].get("AlarmDescription", "") for a in alarms)


def test_work_queues_redrive_to_14_day_dlqs_with_6x_visibility(synth: Synthesized) -> None:
    stack = synth.stack
    expected_visibility = {
        stack.ingest: 6 * 900,
        stack.dispatch: 6 * 180,
        stack.completion: 6 * 60,
    }
    for consumer, visibility in expected_visibility.items():
        queue = synth.resources[synth.logical_id(consumer.queue)]["Properties"]
        assert queue["VisibilityTimeout"] == visibility
        assert queue["RedrivePolicy"] == {
            "deadLetterTargetArn": arn(synth.logical_id(consumer.dlq)),
            "maxReceiveCount": 5,
        }
        dlq = synth.resources[synth.logical_id(consumer.dlq)]["Properties"]
        assert dlq["MessageRetentionPeriod"] == FOURTEEN_DAYS_S
    trainer = synth.resources[synth.logical_id(stack.events.trainer_queue)]["Properties"]
    assert "RedrivePolicy" in trainer


def test_a_dead_lettered_message_stays_at_least_four_days_in_its_dlq(synth: Synthesized) -> None:
    """SQS keeps a message's original enqueue time when it moves it to the DLQ: a queue's retention must leave room
    under its DLQ's (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-dead-letter-queues.html)."""
    queues = synth.of_type("AWS::SQS::Queue")
    redriven = {lid: q["Properties"] for lid, q in queues.items() if "RedrivePolicy" in q["Properties"]}
    assert len(redriven) == 4  # ingest, rollout, completion, trainer
    for lid, queue in redriven.items():
        dlq_id = queue["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        dlq_retention = queues[dlq_id]["Properties"]["MessageRetentionPeriod"]
        assert dlq_retention == FOURTEEN_DAYS_S, dlq_id
        assert dlq_retention - queue.get("MessageRetentionPeriod", 4 * 86400) >= 4 * 86400, lid
    undelivered = synth.resources[synth.logical_id(synth.stack.events.undelivered)]["Properties"]
    assert undelivered["MessageRetentionPeriod"] == FOURTEEN_DAYS_S


def test_a_queue_that_would_outlive_its_dlq_is_refused() -> None:
    from aws_cdk import App, Duration, Stack

    from stacks.queues import QueueWithDlq

    with pytest.raises(ValueError, match="at most 10 days"):
        QueueWithDlq(
            Stack(App(), "S"), "Q", visibility_timeout=Duration.seconds(30), retention_period=Duration.days(14)
        )


def test_an_alarm_on_every_dlq(synth: Synthesized) -> None:
    stack = synth.stack
    dlqs = {synth.logical_id(q) for q in (stack.ingest.dlq, stack.dispatch.dlq, stack.completion.dlq)}
    dlqs.add(synth.logical_id(stack.events.trainer.dlq))
    dlqs.add(synth.logical_id(stack.events.undelivered))
    alarmed: set[str] = set()
    # The stack has other alarms too (stacks/monitoring.py): here, every queue alarm is a DLQ alarm and vice versa.
    for alarm in synth.of_type("AWS::CloudWatch::Alarm").values():
        props = alarm["Properties"]
        if props.get("Namespace") != "AWS/SQS":
            continue
        assert props["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert props["Threshold"] == 0
        assert props["ComparisonOperator"] == "GreaterThanThreshold"
        (dimension,) = props["Dimensions"]
        alarmed.add(dimension["Value"]["Fn::GetAtt"][0])
    assert alarmed == dlqs


def test_queue_consumers_report_partial_failures_with_bounded_concurrency(synth: Synthesized) -> None:
    stack = synth.stack
    expected = {
        stack.ingest: (1, 5),
        stack.dispatch: (topology.DISPATCH_BATCH, DEFAULTS.dispatch_concurrency),
        stack.completion: (10, 10),
    }
    mappings = {
        m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]: m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
    }
    assert len(mappings) == 3
    for consumer, (batch_size, concurrency) in expected.items():
        props = mappings[synth.logical_id(consumer.queue)]
        assert props["FunctionName"] == ref(synth.logical_id(consumer.function))
        assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert props["BatchSize"] == batch_size
        assert props["ScalingConfig"] == {"MaximumConcurrency": concurrency}


# --- events --------------------------------------------------------------------------------------------------


def test_experiment_bus_archive_and_trainer_rule(synth: Synthesized) -> None:
    events = synth.stack.events
    synth.template.has_resource_properties("AWS::Events::EventBus", {"Name": f"rollouts-{EXPERIMENT}"})
    synth.template.has_resource_properties(
        "AWS::Events::Archive", {"SourceArn": arn(synth.logical_id(events.bus)), "RetentionDays": 14}
    )
    synth.template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventBusName": ref(synth.logical_id(events.bus)),
            "EventPattern": {"source": ["rollout.pipeline"]},
            "Targets": [Match.object_like({"Arn": arn(synth.logical_id(events.trainer_queue))})],
        },
    )


def test_no_rule_on_the_default_bus_has_a_wildcard(synth: Synthesized) -> None:
    """EventBridge allows 30 rules containing wildcards per bus (not adjustable): the account's default bus is shared
    by every experiment and everything else in the account."""
    rules = [res["Properties"] for res in synth.of_type("AWS::Events::Rule").values()]
    rules = [props for props in rules if "EventBusName" not in props and "EventPattern" in props]
    assert len(rules) == 2  # the S3 rules: datasets to ingest, results to completion (the sweeper's is a schedule)
    assert all("wildcard" not in json.dumps(rule["EventPattern"]) for rule in rules)


def test_dataset_rule_matches_the_datasets_prefix(synth: Synthesized) -> None:
    stack = synth.stack
    synth.template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventBusName": Match.absent(),
            "EventPattern": {
                "source": ["aws.s3"],
                "detail-type": ["Object Created"],
                "detail": {
                    "bucket": {"name": [ref(synth.logical_id(stack.storage.input_bucket))]},
                    "object": {"key": [{"prefix": "datasets/"}]},
                },
            },
            "Targets": [Match.object_like({"Arn": arn(synth.logical_id(stack.ingest.queue))})],
        },
    )


def test_result_rule_feeds_completion_queue(synth: Synthesized) -> None:
    stack = synth.stack
    synth.template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventBusName": Match.absent(),
            "EventPattern": {
                "source": ["aws.s3"],
                "detail-type": ["Object Created"],
                "detail": {
                    "bucket": {"name": [ref(synth.logical_id(stack.storage.results_bucket))]},
                    "object": {"key": [{"suffix": ".json"}]},
                },
            },
            "Targets": [Match.object_like({"Arn": arn(synth.logical_id(stack.completion.queue))})],
        },
    )


def test_eventbridge_may_send_to_the_queues_it_targets(synth: Synthesized) -> None:
    stack = synth.stack
    # The three rule targets, and the queue where their undeliverable events go.
    targets = {stack.ingest.queue, stack.completion.queue, stack.events.trainer_queue, stack.events.undelivered}
    allowed: set[str] = set()
    for policy in synth.of_type("AWS::SQS::QueuePolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement.get("Principal") == {"Service": "events.amazonaws.com"}:
                assert "sqs:SendMessage" in statement["Action"]
                assert "aws:SourceArn" in statement["Condition"]["ArnEquals"]
                allowed.update(q["Ref"] for q in policy["Properties"]["Queues"])
    assert allowed == {synth.logical_id(q) for q in targets}


def test_sweeper_runs_every_minute(synth: Synthesized) -> None:
    sweeper = synth.stack.functions["sweeper"]
    synth.template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(1 minute)",
            "Targets": [Match.object_like({"Arn": arn(synth.logical_id(sweeper.function))})],
        },
    )
    synth.template.has_resource_properties(
        "AWS::Lambda::Permission",
        {"FunctionName": arn(synth.logical_id(sweeper.function)), "Principal": "events.amazonaws.com"},
    )


# --- Lambdas -------------------------------------------------------------------------------------------------


def test_pipeline_functions_runtime_handlers_and_sizes(synth: Synthesized) -> None:
    expected = {
        "ingest": (900, 1024),
        "dispatch": (180, 512),
        "completion": (60, 512),
        "sweeper": (120, 512),
    }
    for name, (timeout, memory) in expected.items():
        fn = synth.stack.functions[name]
        props = synth.resources[synth.logical_id(fn.function)]["Properties"]
        assert props["Runtime"] == "python3.14"
        assert props["Architectures"] == ["arm64"]
        assert props["Handler"] == f"{name}.handler"
        assert props["Timeout"] == timeout
        assert props["MemorySize"] == memory
        assert props["Role"] == arn(synth.logical_id(fn.role))
        assert props["LoggingConfig"] == {
            "LogFormat": "JSON",
            "ApplicationLogLevel": "INFO",
            "SystemLogLevel": "WARN",
            "LogGroup": ref(synth.logical_id(fn.log_group)),
        }


def test_pipeline_functions_share_one_code_asset(synth: Synthesized) -> None:
    codes = {
        str(synth.resources[synth.logical_id(fn.function)]["Properties"]["Code"])
        for fn in synth.stack.functions.values()
    }
    assert len(codes) == 1


def test_function_environment_is_handler_settings_plus_powertools(synth: Synthesized) -> None:
    stack = synth.stack
    for name, fn in stack.functions.items():
        env = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
        if name != "ingest":  # the functions that issue or check attempt tokens also learn where the key is
            assert env.pop(topology.ATTEMPT_KEY_ENV) == ref(synth.logical_id(stack.attempt_key.secret))
        assert set(env) == {
            "TABLE_NAME",
            "INPUT_BUCKET",
            "RESULTS_BUCKET",
            "ROLLOUT_QUEUE_URL",
            "BUS_NAME",
            "RUNTIME_ARN",
            "INGEST_QUEUE_URL",
            "POOL_TABLE_NAME",
            "WARM_QUEUE_URL",
            "EXPERIMENT_CONFIG",
            "POWERTOOLS_SERVICE_NAME",
            "POWERTOOLS_METRICS_NAMESPACE",
            "POWERTOOLS_LOG_LEVEL",
        }
        assert env["TABLE_NAME"] == ref(synth.logical_id(stack.ledger.table))
        assert env["ROLLOUT_QUEUE_URL"] == ref(synth.logical_id(stack.dispatch.queue))
        assert env["INGEST_QUEUE_URL"] == ref(synth.logical_id(stack.ingest.queue))
        assert env["BUS_NAME"] == ref(synth.logical_id(stack.events.bus))
        assert env["RUNTIME_ARN"] == {"Fn::GetAtt": [synth.logical_id(stack.agent.runtime), "AgentRuntimeArn"]}
        assert env["WARM_QUEUE_URL"] == ""  # no warm pool: no queue (`test_iam`: with one)
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "RolloutPipeline"
        assert ExperimentConfig.from_env(env["EXPERIMENT_CONFIG"]) == DEFAULTS


def test_handler_settings_round_trip_through_the_environment_keys() -> None:
    settings = HandlerSettings(
        table_name="t", input_bucket="i", results_bucket="r", rollout_queue_url="q", bus_name="b", experiment=DEFAULTS
    )
    assert HandlerSettings.from_environ(settings.to_environ()) == settings


def test_function_logs_kept_one_month(synth: Synthesized) -> None:
    for fn in synth.stack.functions.values():
        props = synth.resources[synth.logical_id(fn.log_group)]["Properties"]
        assert props["RetentionInDays"] == 30


# --- agent runtime -------------------------------------------------------------------------------------------


def test_agent_runtime_name_lifecycle_and_image(synth: Synthesized) -> None:
    synth.template.resource_count_is("AWS::BedrockAgentCore::Runtime", 1)
    synth.template.has_resource_properties(
        "AWS::BedrockAgentCore::Runtime",
        {
            "AgentRuntimeName": DEFAULTS.runtime_name,
            "LifecycleConfiguration": {
                "IdleRuntimeSessionTimeout": DEFAULTS.idle_timeout_s,
                "MaxLifetime": DEFAULTS.max_lifetime_s,
            },
            "AgentRuntimeArtifact": {"ContainerConfiguration": {"ContainerUri": Match.any_value()}},
            "EnvironmentVariables": Match.object_like({"ROLLOUTS_EXPERIMENT": EXPERIMENT}),
        },
    )


def test_agent_image_built_for_arm64_from_repo_root(synth_local_image: Synthesized) -> None:
    """`-c image_build=local` (the default builds in CodeBuild: tests/infra/test_image.py)."""
    synth = synth_local_image
    assets_file = Path(synth.artifact.assembly.directory) / f"{synth.stack.artifact_id}.assets.json"
    images = json.loads(assets_file.read_text())["dockerImages"]
    (image,) = images.values()
    assert image["source"]["dockerFile"] == "agent_image/Dockerfile"
    assert image["source"]["platform"] == "linux/arm64"


# --- outputs -------------------------------------------------------------------------------------------------


def test_outputs_the_sdk_attaches_with(synth: Synthesized) -> None:
    assert set(synth.outputs) == set(OUTPUT_NAMES) | set(OPERATOR_OUTPUT_NAMES)
    assert synth.outputs["ExperimentName"]["Value"] == EXPERIMENT
    assert ExperimentConfig.from_env(synth.outputs["ExperimentConfig"]["Value"]) == DEFAULTS
    stack = synth.stack
    assert synth.outputs["RolloutQueueUrl"]["Value"] == ref(synth.logical_id(stack.dispatch.queue))
    assert synth.outputs["TrainerQueueUrl"]["Value"] == ref(synth.logical_id(stack.events.trainer_queue))
    assert synth.outputs["IngestQueueUrl"]["Value"] == ref(synth.logical_id(stack.ingest.queue))
    assert synth.outputs["EventBusName"]["Value"] == ref(synth.logical_id(stack.events.bus))
    assert synth.outputs["LedgerTableName"]["Value"] == ref(synth.logical_id(stack.ledger.table))
    assert synth.outputs["InputBucketName"]["Value"] == ref(synth.logical_id(stack.storage.input_bucket))
    assert synth.outputs["ResultsBucketName"]["Value"] == ref(synth.logical_id(stack.storage.results_bucket))
    assert synth.outputs["AgentRuntimeArn"]["Value"] == {
        "Fn::GetAtt": [synth.logical_id(stack.agent.runtime), "AgentRuntimeArn"]
    }
    for output in synth.outputs.values():
        assert "Export" not in output


def test_the_stack_stamps_the_ledger_layout_before_its_functions(synth: Synthesized) -> None:
    """The functions refuse a ledger of another layout (`keys.LAYOUT_VERSION`): the stamp is put before any of
    them is created or updated, and again whenever the version changes (it is in the custom resource's
    properties)."""
    (stamp_id,) = [
        lid
        for lid, r in synth.of_type("Custom::AWS").items()
        if '\\"sk\\":{\\"S\\":\\"LAYOUT\\"}' in json.dumps(r["Properties"]["Create"])
    ]
    create = json.dumps(synth.resources[stamp_id]["Properties"]["Create"])
    assert f'\\"version\\":{{\\"N\\":\\"{keys.LAYOUT_VERSION}\\"}}' in create
    assert synth.resources[stamp_id]["Properties"]["Update"] == synth.resources[stamp_id]["Properties"]["Create"]
    for name, function in synth.stack.functions.items():
        assert stamp_id in synth.resources[synth.logical_id(function.function)]["DependsOn"], name
