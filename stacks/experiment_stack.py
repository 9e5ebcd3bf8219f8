"""One stack per experiment: storage, ledger, events, the agent runtime and the four pipeline Lambdas."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from aws_cdk import CfnOutput, Duration, Fn, RemovalPolicy, Stack, Token
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from rollout_pipeline import access, quotas, routing, topology
from rollout_pipeline.config import ExperimentConfig, FunctionEnvironment, HandlerSettings
from rollout_pipeline.ids import CLAIMS_PREFIX
from rollout_pipeline.metric_names import METRICS_NAMESPACE
from rollout_pipeline.ops.deploy_settings import DeploySettings
from stacks import nag
from stacks.agent_runtime import DEFAULT_ENDPOINT, AgentRuntimeConstruct
from stacks.attempt_key import AttemptKey
from stacks.bundling import REPO_ROOT, lambda_code
from stacks.environment_size import check_environment_size
from stacks.events import EventRouting
from stacks.functions import LOG_RETENTION_DAYS, RUNTIME, PipelineFunctionConstruct
from stacks.image import AgentImage
from stacks.ledger import LedgerTableConstruct
from stacks.monitoring import (
    Monitoring,
    RuntimeLogRetention,
    expire_every_log_group,
    give_every_function_a_log_group,
)
from stacks.mtrl import MtrlEnvironmentConstruct
from stacks.queues import QueuedLambdaConsumer, private_queue
from stacks.retention import is_retained, removal_policy
from stacks.sinks import SinksConstruct
from stacks.storage import Storage
from stacks.trainer_policy import TrainerPolicy, subscription_queue_arns, subscription_rule_arns

#: Stack outputs the trainer SDK reads to attach to an experiment (logical ids are part of the contract).
OUTPUT_NAMES: Final = topology.StackOutputs.names()
#: Outputs for the operator (not read by the SDK).
OPERATOR_OUTPUT_NAMES: Final = topology.OPERATOR_OUTPUT_NAMES


def stack_name(config: ExperimentConfig) -> str:
    return topology.stack_name(config.name)


class ExperimentStack(Stack):
    """Everything one experiment needs; `cdk deploy -c experiment=NAME` creates it, `cdk destroy` removes it.

    Buckets, table and logs are retained on destroy unless `results_retention=destroy`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        settings: DeploySettings | None = None,
        repo_root: Path = REPO_ROOT,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        self.settings = settings = settings or DeploySettings()
        removal = removal_policy(config)

        self.storage = Storage(self, "Storage", config=config)
        self.ledger = LedgerTableConstruct(self, "Ledger", config=config)
        self.events = EventRouting(
            self, "Events", config=config, archive_retention_days=settings.archive_retention_days
        )
        self.sinks = SinksConstruct(self, "Sinks", config=config, bus=self.events.bus) if config.sinks else None
        self._agent(repo_root)
        self._functions(repo_root, removal)
        handler_settings = self._routes()
        self._grant(**self.functions)
        self.mtrl = self._mtrl(removal) if config.mtrl_environment else None
        self.attempt_key = AttemptKey(self, "AttemptKey")
        self.attempt_key.grant(self.functions["dispatch"], self.functions["completion"], self.functions["sweeper"])
        self._observability(removal)
        self.trainer_policy = TrainerPolicy(
            self,
            "Trainer",
            config=config,
            input_bucket=self.storage.input_bucket,
            results_bucket=self.storage.results_bucket,
            rollout_queue=self.dispatch.queue,
            trainer_queue=self.events.trainer_queue,
            table=self.ledger.table,
            bus=self.events.bus,
            runtime_resources=self.agent.session_resources(),
        )
        self._outputs(handler_settings)
        self._operator_outputs()
        nag.acknowledge(
            nag.ExperimentFindings(
                stack=self,
                config=config,
                undelivered=self.events.undelivered,
                input_bucket=self.storage.input_bucket,
                results_bucket=self.storage.results_bucket,
                function_roles={name: function.role for name, function in self.functions.items()},
                runtime=self.agent.runtime,
                runtime_role=self.agent.runtime.role,
                warm_queue=self.warm_queue,
            )
        )

    def _agent(self, repo_root: Path) -> None:
        """The agent's image (built in CodeBuild) and its AgentCore runtime, which pulls it."""
        config, settings = self.config, self.settings
        self.image = AgentImage(self, "Image", config=config, settings=settings, repo_root=repo_root)
        self.agent = AgentRuntimeConstruct(
            self,
            "Agent",
            config=config,
            artifact=self.image.artifact,
            results_bucket=self.storage.results_bucket,
            model_secret_kms_key_arn=settings.model_secret_kms_key_arn,
        )
        if self.image.dependable is not None:
            self.agent.runtime.node.add_dependency(self.image.dependable)
        self.ledger.protect_after(self.agent)
        self.image.grant_pull(self.agent.runtime.role)

    def _functions(self, repo_root: Path, removal: RemovalPolicy) -> None:
        """The four pipeline functions (one code asset) and the queues that feed three of them."""
        config = self.config
        self.code = code = lambda_code(RUNTIME, repo_root)
        specs = topology.function_specs(config)

        def function(name: topology.FunctionName, description: str) -> PipelineFunctionConstruct:
            return PipelineFunctionConstruct(
                self,
                name.capitalize(),
                code=code,
                handler=f"{name}.handler",
                description=f"{description} ({config.name})",
                timeout=Duration.seconds(specs[name].timeout_s),
                memory_size=specs[name].memory_mb,
                removal_policy=removal,
            )

        ingest = function("ingest", "Reads dataset files into rollout messages")
        dispatch = function("dispatch", "Starts rollouts on AgentCore within the limits")
        completion = function("completion", "Records results, stops sessions, publishes")
        sweeper = function("sweeper", "Times out overdue rollouts and drains the outbox")
        self.functions = {"ingest": ingest, "dispatch": dispatch, "completion": completion, "sweeper": sweeper}
        layout_stamp = self.ledger.stamp_layout()
        for pipeline_function in self.functions.values():
            pipeline_function.function.node.add_dependency(layout_stamp)

        self.ingest = QueuedLambdaConsumer(self, "IngestConsumer", function=ingest.function, spec=specs["ingest"])
        self.dispatch = QueuedLambdaConsumer(
            self, "DispatchConsumer", function=dispatch.function, spec=specs["dispatch"]
        )
        self.completion = QueuedLambdaConsumer(
            self, "CompletionConsumer", function=completion.function, spec=specs["completion"]
        )
        # The warm pool's offers (`lifecycle.warm`): the sweeper sends them, dispatchers receive them.
        warm = topology.warm_queue_attributes(config)
        self.warm_queue = (
            private_queue(
                self,
                "WarmQueue",
                visibility_timeout=Duration.seconds(warm["VisibilityTimeout"]),
                retention_period=Duration.seconds(warm["MessageRetentionPeriod"]),
            )
            if config.warm_pool_on
            else None
        )

    def _routes(self) -> HandlerSettings:
        """What reaches the functions: the S3 rules to their queues, the sweeper's schedule, and every function's
        environment (the handler settings, returned for the stack's outputs)."""
        config = self.config
        self.events.s3_rule(
            self,
            "DatasetUploaded",
            pattern=routing.dataset_event_pattern(self.storage.input_bucket.bucket_name),
            queue=self.ingest.queue,
            description="Dataset files created under datasets/ to the ingest queue",
        )
        self.events.s3_rule(
            self,
            "ResultWritten",
            pattern=routing.result_event_pattern(self.storage.results_bucket.bucket_name),
            queue=self.completion.queue,
            description="Result objects written by the agent to the completion queue",
        )
        sweeper = self.functions["sweeper"].function
        events.Rule(
            self,
            "SweepSchedule",
            description="Runs the sweeper every minute",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            targets=[targets.LambdaFunction(sweeper, retry_attempts=0, max_event_age=Duration.minutes(1))],
        )

        # The account pool (`rollouts bootstrap`): its table's name from the pool stack's export, so this stack
        # cannot be deployed into an account without it, nor the pool deleted while an experiment uses it.
        self.pool_table_name = Fn.import_value(topology.POOL_TABLE_EXPORT)
        handler_settings = HandlerSettings(
            table_name=self.ledger.table.table_name,
            input_bucket=self.storage.input_bucket.bucket_name,
            results_bucket=self.storage.results_bucket.bucket_name,
            rollout_queue_url=self.dispatch.queue.queue_url,
            bus_name=self.events.bus.event_bus_name,
            runtime_arn=self.agent.arn,
            ingest_queue_url=self.ingest.queue.queue_url,
            pool_table_name=self.pool_table_name,
            warm_queue_url="" if self.warm_queue is None else self.warm_queue.queue_url,
            experiment=config,
        )
        environment = FunctionEnvironment.of(
            handler_settings,
            POWERTOOLS_SERVICE_NAME=topology.resource_base(config.name),
            POWERTOOLS_METRICS_NAMESPACE=METRICS_NAMESPACE,
            POWERTOOLS_LOG_LEVEL="INFO",
        ).to_environ()
        check_environment_size(environment)
        self.function_environment = environment
        for pipeline_function in self.functions.values():
            for key, value in environment.items():
                pipeline_function.function.add_environment(key, value)
        return handler_settings

    def _mtrl(self, removal: RemovalPolicy) -> MtrlEnvironmentConstruct:
        """MTRL environment mode: the forwarder, the reporter and the agent's job-runtime grants (`stacks.mtrl`)."""
        mtrl = MtrlEnvironmentConstruct(
            self,
            "Mtrl",
            config=self.config,
            code=self.code,
            environment=self.function_environment,
            removal_policy=removal,
            ledger=self.ledger,
            rollout_queue=self.dispatch.queue,
            input_bucket=self.storage.input_bucket,
            routing_construct=self.events,
            agent=self.agent,
        )
        for made in mtrl.functions.values():
            made.function.node.add_dependency(self.ledger.layout_stamp)
        return mtrl

    def _observability(self, removal: RemovalPolicy) -> None:
        """Alarms and the dashboard, and a retention for every log group (the runtime's, one per endpoint, too)."""
        config = self.config
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            functions={name: fn.function for name, fn in {**self.functions, **self._mtrl_functions()}.items()},
            queues={
                "ingest": self.ingest.queue,
                "rollouts": self.dispatch.queue,
                "completion": self.completion.queue,
                "trainer": self.events.trainer_queue,
                "undelivered": self.events.undelivered,
                **({"mtrl-report": self.mtrl.report.queue} if self.mtrl is not None else {}),
            },
            alarm_email=self.settings.alarm_email,
            active_session_quota=quotas.documented_active_sessions(
                None if Token.is_unresolved(self.region) else self.region
            ),
        )
        self.monitoring.notify_every_alarm(self)
        # The service creates one log group per endpoint (`{runtime id}-{endpoint}`), each with no retention.
        self.runtime_logs = [
            RuntimeLogRetention(
                self,
                "RuntimeLogs" if endpoint == DEFAULT_ENDPOINT else f"RuntimeLogs-{endpoint}",
                runtime=self.agent.runtime,
                endpoint=endpoint,
                retention_days=LOG_RETENTION_DAYS,
                retained=is_retained(removal),
            )
            for endpoint in self.agent.endpoint_names
        ]
        give_every_function_a_log_group(self, LOG_RETENTION_DAYS, removal)
        expire_every_log_group(self, LOG_RETENTION_DAYS, removal)

    def _mtrl_functions(self) -> dict[str, PipelineFunctionConstruct]:
        return dict(self.mtrl.functions) if self.mtrl is not None else {}

    def _grant(
        self,
        ingest: PipelineFunctionConstruct,
        dispatch: PipelineFunctionConstruct,
        completion: PipelineFunctionConstruct,
        sweeper: PipelineFunctionConstruct,
    ) -> None:
        input_bucket = self.storage.input_bucket
        results_bucket = self.storage.results_bucket
        rollout_queue = self.dispatch.queue
        datasets = input_bucket.arn_for_objects(f"{routing.DATASET_PREFIX}*")
        claims = input_bucket.arn_for_objects(f"{CLAIMS_PREFIX}*")
        # Whoever drains a rollout's outbox (dispatch, completion, sweeper) inlines a small result in its event.
        results = results_bucket.arn_for_objects(f"{self.config.name}/*")

        def allow(fn: PipelineFunctionConstruct, actions: list[str], resources: list[str]) -> None:
            fn.role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=resources))

        allow(ingest, ["s3:GetObject", "s3:GetObjectVersion"], [datasets])
        allow(ingest, ["s3:PutObject"], [datasets, claims])
        self.ledger.grant_read_write(ingest.role)
        rollout_queue.grant_send_messages(ingest.role)
        self.ingest.queue.grant_send_messages(ingest.role)
        self.events.bus.grant_put_events_to(ingest.role)

        allow(dispatch, ["s3:GetObject"], [claims, results])
        self.ledger.grant_read_write(dispatch.role)
        self.ledger.grant_list_batches(dispatch.role)  # `Budget Exhausted` says which batches wait
        rollout_queue.grant_send_messages(dispatch.role)
        self.agent.grant_invoke(dispatch.role)
        self.agent.grant_stop_session(dispatch.role)
        self.events.bus.grant_put_events_to(dispatch.role)

        allow(completion, ["s3:GetObject"], [results])
        self.ledger.grant_read_write(completion.role)
        rollout_queue.grant_send_messages(completion.role)
        self.agent.grant_stop_session(completion.role)
        self.events.bus.grant_put_events_to(completion.role)

        allow(sweeper, ["s3:GetObject"], [results])

        # s3:ListBucket on exactly the prefixes a role must see as "gone" (404, not 403): rollout_pipeline/access.py.
        roles = {
            access.INGEST: ingest,
            access.DISPATCH: dispatch,
            access.COMPLETION: completion,
            access.SWEEPER: sweeper,
        }
        buckets = {"input": input_bucket, "results": results_bucket}
        for role_name, grants in access.LIST_GRANTS.items():
            for grant in grants:
                roles[role_name].role.add_to_principal_policy(
                    iam.PolicyStatement(
                        actions=["s3:ListBucket"],
                        resources=[buckets[grant.bucket].bucket_arn],
                        conditions={"StringLike": {"s3:prefix": [f"{grant.resolve(self.config.name)}*"]}},
                    )
                )
        # The account pool's one item: read and conditionally updated by whoever renews the experiment's lease
        # (the dispatcher, completion's stops, the sweeper's heartbeat); nothing else of the table.
        for fn in (dispatch, completion, sweeper):
            fn.role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=list(access.POOL_ITEM_ACTIONS),
                    resources=[self.pool_table_arn()],
                    conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [access.POOL_LEADING_KEY]}},
                )
            )
        self.ledger.grant_read_write(sweeper.role, query_indexes=True)
        rollout_queue.grant_send_messages(sweeper.role)
        self.agent.grant_stop_session(sweeper.role)
        if self.warm_queue is not None:  # the warm pool: warm-ups and keep-alives, its offers sent and taken
            self.agent.grant_invoke(sweeper.role)
            self.warm_queue.grant(sweeper.role, "sqs:SendMessage")
            self.warm_queue.grant(
                dispatch.role, "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"
            )
        self.events.bus.grant_put_events_to(sweeper.role)
        self._grant_subscription_reaper(sweeper)

    def _grant_subscription_reaper(self, sweeper: PipelineFunctionConstruct) -> None:
        """The sweeper removes private subscriptions whose owner is gone (`lifecycle.subscriptions`): it lists the
        bus's rules (ListRules has no resource-level permission), reads their queues' `seen-at` and removes targets,
        rule and queue, of those subscriptions only."""
        bus = topology.bus_name(self.config.name)
        sweeper.role.add_to_principal_policy(iam.PolicyStatement(actions=["events:ListRules"], resources=["*"]))
        sweeper.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["events:RemoveTargets", "events:DeleteRule"], resources=subscription_rule_arns(self, bus)
            )
        )
        sweeper.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["sqs:GetQueueUrl", "sqs:ListQueueTags", "sqs:DeleteQueue"],
                resources=subscription_queue_arns(self, bus),
            )
        )

    def pool_table_arn(self) -> str:
        """The account pool's table (its well-known name: `topology.POOL_TABLE_NAME`)."""
        return self.format_arn(service="dynamodb", resource="table", resource_name=topology.POOL_TABLE_NAME)

    def _operator_outputs(self) -> None:
        """Where an operator looks: the alarm topic, the dashboard and the agent image."""
        CfnOutput(self, "AlarmTopicArn", value=self.monitoring.topic.topic_arn, description="Every alarm notifies it")
        CfnOutput(
            self,
            "DashboardUrl",
            value=(
                f"https://{self.region}.console.aws.amazon.com/cloudwatch/home?region={self.region}"
                f"#dashboards/dashboard/{self.monitoring.dashboard.dashboard_name}"
            ),
            description="The experiment's CloudWatch dashboard",
        )
        CfnOutput(self, "AgentImageUri", value=self.image.image_uri, description="The image the runtime runs")
        CfnOutput(
            self,
            "TrainerPolicyArn",
            value=self.trainer_policy.policy.managed_policy_arn,
            description="What the trainer SDK and the ART backend call: attach this managed policy to the trainer role",
        )

    def _outputs(self, settings: HandlerSettings) -> None:
        outputs = topology.StackOutputs(
            experiment_name=self.config.name,
            experiment_config=self.config.to_env(),
            input_bucket=settings.input_bucket,
            results_bucket=settings.results_bucket,
            rollout_queue_url=settings.rollout_queue_url,
            trainer_queue_url=self.events.trainer_queue.queue_url,
            ingest_queue_url=settings.ingest_queue_url,
            bus_name=settings.bus_name,
            table_name=settings.table_name,
            runtime_arn=settings.runtime_arn,
            pool_table_name=settings.pool_table_name,
        )
        descriptions = topology.StackOutputs.descriptions()
        for name, value in outputs.to_outputs().items():
            CfnOutput(self, name, value=value, description=descriptions.get(name))
