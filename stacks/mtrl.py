"""MTRL environment mode (`-c mtrl_environment=true`): the experiment as SageMaker MTRL's custom-agent environment.

- the forwarder Lambda MTRL invokes once per rollout (`CustomAgentLambdaConfig{LambdaArn}`: the stack's output
  `MtrlForwarderArn`), allowed to this account only (a resource policy: principal the account, `SourceAccount` the
  account), and a managed policy granting just that invoke (output `MtrlInvokePolicyArn`: attach it to the MTRL
  job's execution role, with which SageMaker invokes it);
- the MTRL reporter: a rule on the experiment bus sends the forwarded rollouts' terminal events to its queue (+DLQ),
  and it reports them to the job runtime (`sagemaker:CompleteRollout`, `sagemaker:UpdateReward`);
- the agent runtime's role may call the job runtime (`Sample`, `SampleWithResponseStream`, `CompleteRollout`,
  `UpdateReward`, and `CallWithBearerToken` for the SDK's bearer tokens: what AWS's managed policy
  `AmazonSageMakerJobRuntimeAccess` grants), on this account's jobs in this region only.
"""

from __future__ import annotations

from typing import Final

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from rollout_pipeline import routing, topology
from rollout_pipeline.config import MTRL_RUNTIME_ENV, ExperimentConfig, job_runtime_url
from rollout_pipeline.ids import CLAIMS_PREFIX
from stacks import nag
from stacks.agent_runtime import AgentRuntimeConstruct
from stacks.events import EventRouting, event_pattern
from stacks.functions import PipelineFunctionConstruct
from stacks.ledger import LedgerTableConstruct
from stacks.queues import QueuedLambdaConsumer

#: What the agent's role may call on the job runtime, and what the reporter may (the service model's operations).
AGENT_JOB_ACTIONS: Final = (
    "sagemaker:Sample",
    "sagemaker:SampleWithResponseStream",
    "sagemaker:CompleteRollout",
    "sagemaker:UpdateReward",
)
REPORTER_JOB_ACTIONS: Final = ("sagemaker:CompleteRollout", "sagemaker:UpdateReward")
BEARER_TOKEN_ACTION: Final = "sagemaker:CallWithBearerToken"
OUTPUT_FORWARDER_ARN: Final = "MtrlForwarderArn"
OUTPUT_INVOKE_POLICY_ARN: Final = "MtrlInvokePolicyArn"


class MtrlEnvironmentConstruct(Construct):
    """The forwarder, the reporter and the agent's job-runtime grants (see the module doc)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        code: lambda_.Code,
        environment: dict[str, str],
        removal_policy: RemovalPolicy,
        ledger: LedgerTableConstruct,
        rollout_queue: sqs.IQueue,
        input_bucket: s3.IBucket,
        routing_construct: EventRouting,
        agent: AgentRuntimeConstruct,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.jobs_arn = stack.format_arn(service="sagemaker", resource="job", resource_name="*")
        specs = topology.MTRL_FUNCTIONS

        def function(construct: str, name: topology.FunctionName, description: str) -> PipelineFunctionConstruct:
            made = PipelineFunctionConstruct(
                self,
                construct,
                code=code,
                handler=f"{name}.handler",
                description=f"{description} ({config.name})",
                timeout=Duration.seconds(specs[name].timeout_s),
                memory_size=specs[name].memory_mb,
                removal_policy=removal_policy,
            )
            for key, value in environment.items():
                made.function.add_environment(key, value)
            return made

        self.forwarder = function("Forwarder", "mtrl_forwarder", "SageMaker MTRL's custom-agent Lambda: one rollout")
        self.reporter = function("Reporter", "mtrl_reporter", "Reports forwarded rollouts' ends to the job runtime")
        self.reporter.function.add_environment(MTRL_RUNTIME_ENV, job_runtime_url(stack.region))
        self.functions = {"mtrl_forwarder": self.forwarder, "mtrl_reporter": self.reporter}
        self.report = QueuedLambdaConsumer(
            self, "ReporterConsumer", function=self.reporter.function, spec=specs["mtrl_reporter"]
        )
        events.Rule(
            self,
            "ToReporter",
            event_bus=routing_construct.bus,
            description="The MTRL forwarder's rollouts' terminal events to the MTRL reporter's queue",
            event_pattern=event_pattern(routing.mtrl_report_event_pattern()),
            targets=[routing_construct.queue_target(self.report.queue)],
        )
        self._grant_forwarder(ledger, rollout_queue, input_bucket, routing_construct, stack)
        self._grant_reporter(ledger)
        self._grant_agent(agent, stack)
        self.invoke_policy = iam.ManagedPolicy(
            self,
            "InvokePolicy",
            description=f"Invoke the MTRL forwarder of experiment {config.name}: attach to the MTRL job's role",
            statements=[
                iam.PolicyStatement(
                    sid="InvokeMtrlForwarder",
                    actions=["lambda:InvokeFunction"],
                    resources=[self.forwarder.function.function_arn],
                )
            ],
        )
        CfnOutput(
            stack,
            OUTPUT_FORWARDER_ARN,
            value=self.forwarder.function.function_arn,
            description="MTRL's CustomAgentLambdaConfig.LambdaArn: the forwarder SageMaker invokes per rollout",
        )
        CfnOutput(
            stack,
            OUTPUT_INVOKE_POLICY_ARN,
            value=self.invoke_policy.managed_policy_arn,
            description="Attach to the MTRL job's execution role: it invokes the forwarder",
        )

    def _grant_forwarder(
        self,
        ledger: LedgerTableConstruct,
        rollout_queue: sqs.IQueue,
        input_bucket: s3.IBucket,
        routing_construct: EventRouting,
        stack: Stack,
    ) -> None:
        """What ingestion of one row does (ledger items, claim checks of big prompts, the rollout queue, batch
        events), and who may invoke it: this account, through the job's role."""
        role = self.forwarder.role
        ledger.grant_read_write(role)
        rollout_queue.grant_send_messages(role)
        routing_construct.bus.grant_put_events_to(role)
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[input_bucket.arn_for_objects(f"{CLAIMS_PREFIX}*")])
        )
        self.forwarder.function.add_permission(
            "InvokeFromThisAccount",
            principal=iam.AccountPrincipal(stack.account),
            action="lambda:InvokeFunction",
            source_account=stack.account,
        )
        nag.ack(
            nag.default_policy(role),
            nag.iam5(nag.bucket_prefix(input_bucket, CLAIMS_PREFIX)),
            "The forwarder writes the claim check of a prompt too big to travel inline, one key per rollout.",
        )

    def _grant_reporter(self, ledger: LedgerTableConstruct) -> None:
        """The forwarded batch's item (its `source` names the job and rollout), and the two reports."""
        role = self.reporter.role
        grants = ((["dynamodb:GetItem"], ledger.table.table_arn), (REPORTER_JOB_ACTIONS, self.jobs_arn))
        for actions, resource in grants:
            role.add_to_principal_policy(iam.PolicyStatement(actions=list(actions), resources=[resource]))
        nag.ack(
            nag.default_policy(role),
            nag.iam5(f"{nag.account_arn(Stack.of(self), 'sagemaker')}:job/*"),
            "MTRL jobs are created after the deploy (CreateJob names the forwarder): any job of this account and "
            "region, whose rollouts the forwarder took.",
        )

    def _grant_agent(self, agent: AgentRuntimeConstruct, stack: Stack) -> None:
        """The job runtime for the agent host (MTRL rollouts' model calls and reports), this account's jobs only."""
        agent.runtime.add_to_role_policy(
            iam.PolicyStatement(sid="MtrlJobRuntime", actions=list(AGENT_JOB_ACTIONS), resources=[self.jobs_arn])
        )
        nag.ack(
            nag.default_policy(agent.runtime.role),
            nag.iam5(f"{nag.account_arn(stack, 'sagemaker')}:job/*"),
            "MTRL jobs are created after the deploy: the agent samples from and reports to any job of this account "
            "and region whose rollouts the forwarder took (AWS's AmazonSageMakerJobRuntimeAccess grants job/*).",
        )
        agent.runtime.add_to_role_policy(
            iam.PolicyStatement(
                sid="MtrlBearerToken",
                actions=[BEARER_TOKEN_ACTION],
                resources=["*"],
                conditions={"StringEquals": {"aws:ResourceAccount": stack.account}},
            )
        )
