"""Create an experiment's AWS resources against moto (local mode and tests), from the experiment config.

Names derive from the config only; the same event patterns (`rollout_pipeline.routing`) and table schema
(`rollout_pipeline.ledger.schema`) as the CDK stack. Idempotent: creating twice returns the same resources.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from typing import Any

from rollout_pipeline import ids, routing, topology
from rollout_pipeline.config import ExperimentConfig, HandlerSettings
from rollout_pipeline.fakes import faithful
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.pool import PoolLedger
from rollout_pipeline.ledger.pool_schema import create_pool_table_kwargs
from rollout_pipeline.ledger.schema import create_table_kwargs
from rollout_pipeline.quotas import AccountQuotas, PoolSettings

LOCAL_ACCOUNT = "123456789012"
DLQ_MAX_RECEIVE_COUNT = topology.DLQ_MAX_RECEIVE_COUNT


@dataclass(frozen=True)
class ExperimentResources:
    """Everything a handler, the SDK or a test needs to reach one experiment's resources."""

    config: ExperimentConfig
    region: str
    input_bucket: str
    results_bucket: str
    table_name: str
    bus_name: str
    runtime_arn: str
    queue_urls: dict[str, str]
    dlq_urls: dict[str, str]
    #: The local account's pool table ("" without one: the experiment keeps its own limits).
    pool_table_name: str = ""
    #: The warm pool's queue of offers (local mode makes it for every experiment; the stack with the pool on).
    warm_queue_url: str = ""

    @property
    def ingest_queue_url(self) -> str:
        return self.queue_urls["ingest"]

    @property
    def rollout_queue_url(self) -> str:
        return self.queue_urls["rollout"]

    @property
    def completion_queue_url(self) -> str:
        return self.queue_urls["completion"]

    @property
    def trainer_queue_url(self) -> str:
        return self.queue_urls["trainer"]

    def settings(self) -> HandlerSettings:
        settings = topology.StackOutputs.from_outputs(self.stack_outputs()).handler_settings()
        return settings.model_copy(update={"warm_queue_url": self.warm_queue_url})

    def stack_outputs(self) -> dict[str, str]:
        """The same outputs the CloudFormation stack exposes (the SDK attaches with these)."""
        return topology.StackOutputs(
            experiment_name=self.config.name,
            experiment_config=self.config.to_env(),
            input_bucket=self.input_bucket,
            results_bucket=self.results_bucket,
            rollout_queue_url=self.rollout_queue_url,
            trainer_queue_url=self.trainer_queue_url,
            ingest_queue_url=self.ingest_queue_url,
            bus_name=self.bus_name,
            table_name=self.table_name,
            runtime_arn=self.runtime_arn,
            pool_table_name=self.pool_table_name,
        ).to_outputs()


def _base(config: ExperimentConfig) -> str:
    return topology.resource_base(config.name)


def create_pool(client: Any, *, region: str, settings: PoolSettings | None = None) -> str:
    """Create the local account's pool table (`topology.POOL_TABLE_NAME`) if it does not exist, and write
    `settings` (none: the documented quotas of `region`, unless the pool already has settings). Returns its name."""
    ddb = client("dynamodb")
    name = topology.POOL_TABLE_NAME
    with contextlib.suppress(ddb.exceptions.ResourceInUseException):
        ddb.create_table(**create_pool_table_kwargs(name))
    pool = PoolLedger.open(name, ddb, region=region)
    if settings is not None or not pool.account().configured:
        pool.write_settings(settings or PoolSettings(AccountQuotas.defaults(region)))
    return name


def _queue(sqs: Any, name: str, attributes: dict[str, str] | None = None) -> str:
    """Create queue `name` (or find it) and set its attributes: an existing queue of the same name keeps its messages
    and takes this run's settings (SQS refuses a CreateQueue whose attributes differ from the queue's)."""
    url = str(sqs.create_queue(QueueName=name)["QueueUrl"])
    if attributes:
        sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    return url


def _create_queues(sqs: Any, config: ExperimentConfig, base: str) -> tuple[dict[str, str], dict[str, str], str]:
    """The experiment's queues with their dead-letter queues, visibility timeouts as in the stack (derived from the
    function timeouts, so redelivery semantics match), and the warm pool's queue of offers (no dead-letter queue)."""
    queue_urls: dict[str, str] = {}
    dlq_urls: dict[str, str] = {}
    for name, visibility in topology.queue_visibility_timeouts(config).items():
        dlq_url = _queue(sqs, f"{base}-{name}-dlq")
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": DLQ_MAX_RECEIVE_COUNT})
        queue_urls[name] = _queue(
            sqs, f"{base}-{name}", {"VisibilityTimeout": str(visibility), "RedrivePolicy": redrive}
        )
        dlq_urls[name] = dlq_url
    warm = {key: str(value) for key, value in topology.warm_queue_attributes(config).items()}
    return queue_urls, dlq_urls, _queue(sqs, f"{base}-{topology.WARM_QUEUE}", warm)


def create_resources(
    config: ExperimentConfig, *, region: str, client: Any, pool: bool | PoolSettings = True
) -> ExperimentResources:
    """Create buckets, table, bus, queues and rules, and the account pool unless `pool` is False (a `PoolSettings`:
    with those settings). `client(service)` returns a boto3 client (moto)."""
    base = _base(config)
    s3, sqs, events, ddb = client("s3"), client("sqs"), client("events"), client("dynamodb")

    input_bucket, results_bucket = f"{base}-input", f"{base}-results"
    for bucket in (input_bucket, results_bucket):
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(**kwargs)
        s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}}
        )
    s3.put_bucket_versioning(Bucket=input_bucket, VersioningConfiguration={"Status": "Enabled"})

    faithful.note_buckets(config.name, input_bucket=input_bucket, results_bucket=results_bucket)

    table_name = f"{base}-ledger"
    with contextlib.suppress(ddb.exceptions.ResourceInUseException):
        ddb.create_table(**create_table_kwargs(table_name))
    ddb.put_item(TableName=table_name, Item=keys.layout_item())  # as the stack stamps its table

    queue_urls, dlq_urls, warm_queue_url = _create_queues(sqs, config, base)

    def queue_arn(name: str) -> str:
        attrs = sqs.get_queue_attributes(QueueUrl=queue_urls[name], AttributeNames=["QueueArn"])
        return str(attrs["Attributes"]["QueueArn"])

    bus_name = topology.bus_name(config.name)
    with contextlib.suppress(events.exceptions.ResourceAlreadyExistsException):
        events.create_event_bus(Name=bus_name)

    rules = [
        ("default", f"{base}-datasets", routing.dataset_event_pattern(input_bucket), "ingest"),
        ("default", f"{base}-results", routing.result_event_pattern(results_bucket), "completion"),
        (bus_name, f"{base}-trainer", routing.trainer_event_pattern(), "trainer"),
    ]
    if config.mtrl_environment:
        rules.append((bus_name, f"{base}-mtrl-report", routing.mtrl_report_event_pattern(), topology.MTRL_REPORT_QUEUE))
    for bus, rule_name, pattern, target in rules:
        events.put_rule(Name=rule_name, EventBusName=bus, EventPattern=json.dumps(pattern), State="ENABLED")
        events.put_targets(Rule=rule_name, EventBusName=bus, Targets=[{"Id": target, "Arn": queue_arn(target)}])

    return ExperimentResources(
        config=config,
        region=region,
        input_bucket=input_bucket,
        results_bucket=results_bucket,
        table_name=table_name,
        bus_name=bus_name,
        runtime_arn=(
            f"arn:aws:bedrock-agentcore:{region}:{LOCAL_ACCOUNT}:runtime/{config.runtime_name}"
            f"{ids.LOCAL_RUNTIME_SUFFIX}"
        ),
        queue_urls=queue_urls,
        dlq_urls=dlq_urls,
        warm_queue_url=warm_queue_url,
        pool_table_name=""
        if pool is False
        else create_pool(client, region=region, settings=pool if isinstance(pool, PoolSettings) else None),
    )


def register_stack(resources: ExperimentResources, *, client: Any) -> str:
    """Register the experiment's outputs as the stack `Rollouts-NAME` at the local endpoint, as a deploy would
    leave them, so another process attaches by name (`Experiment.attach`, `rollouts ... -e NAME --endpoint-url`)
    exactly as to a deployed stack. The stack holds one no-op resource (a template needs one) and the outputs.
    Replaces an earlier registration of the same name. Returns the stack name."""
    cloudformation = client("cloudformation")
    name = topology.stack_name(resources.config.name)
    template = {
        "Description": f"rollout-pipeline local experiment {resources.config.name} (outputs only)",
        "Resources": {"LocalPipeline": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
        "Outputs": {key: {"Value": value} for key, value in resources.stack_outputs().items() if value},
    }
    with contextlib.suppress(cloudformation.exceptions.ClientError):
        cloudformation.delete_stack(StackName=name)
    with warnings.catch_warnings():  # moto: "Tried to parse AWS::CloudFormation::WaitConditionHandle"
        warnings.simplefilter("ignore", UserWarning)
        cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template))
    return name
