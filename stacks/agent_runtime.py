"""The AgentCore Runtime that runs the agent image (linux/arm64), one microVM session per rollout attempt."""

from __future__ import annotations

from typing import Final

from aws_cdk import Annotations, Arn, ArnComponents, ArnFormat, Duration, Stack
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from rollout_pipeline import ids
from rollout_pipeline.ceilings import ceiling_warnings
from rollout_pipeline.config import (
    AGENT_KIND_ENV,
    AGENT_MODULE_ENV,
    JOB_ARN_ENV,
    MODEL_SECRET_ENV,
    MTRL_RUNTIME_ENV,
    ExperimentConfig,
    job_runtime_url,
)

#: ACR's DEFAULT endpoint: what InvokeAgentRuntime without a qualifier targets.
DEFAULT_ENDPOINT: Final = ids.DEFAULT_ENDPOINT_NAME
STOP_SESSION_ACTION: Final = "bedrock-agentcore:StopRuntimeSession"


class AgentRuntimeConstruct(Construct):
    """ACR runtime of the agent image (`stacks.image`) whose role may only put objects under `{exp_id}/` of the results
    bucket.

    `config.endpoints` = N provisions N endpoints (DEFAULT plus `rollouts_1`..`rollouts_{N-1}`, `ids.endpoint_name`):
    sessions are spread over them (`ids.endpoint_index`), for versions and A/B; they add no new-session rate (the
    account's quota is one pool, paced on one schedule: `limits.account`)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        artifact: agentcore.AgentRuntimeArtifact,
        results_bucket: s3.IBucket,
        model_secret_kms_key_arn: str = "",
    ) -> None:
        super().__init__(scope, construct_id)
        self.runtime = agentcore.Runtime(
            self,
            "Runtime",
            runtime_name=config.runtime_name,
            description=f"Rollout agent of experiment {config.name}",
            agent_runtime_artifact=artifact,
            lifecycle_configuration=agentcore.LifecycleConfiguration(
                idle_runtime_session_timeout=Duration.seconds(config.idle_timeout_s),
                max_lifetime=Duration.seconds(config.max_lifetime_s),
            ),
            environment_variables={
                "ROLLOUTS_EXPERIMENT": config.name,
                "ROLLOUTS_RESULTS_BUCKET": results_bucket.bucket_name,
                "MODEL_BASE_URL": config.model_base_url,
                "MODEL_ID": config.model_id,
                **({MODEL_SECRET_ENV: config.model_secret_name} if config.model_secret_name else {}),
                AGENT_KIND_ENV: config.agent_kind,
                AGENT_MODULE_ENV: config.served_agent_module,
                **({JOB_ARN_ENV: config.rft_job_arn} if config.rft_job_arn else {}),
                **({MTRL_RUNTIME_ENV: job_runtime_url(Stack.of(self).region)} if config.mtrl_environment else {}),
            },
        )
        self.endpoint_names = [ids.endpoint_name(i) for i in range(config.endpoints)]
        for name in self.endpoint_names[1:]:
            self.runtime.add_endpoint(name, description=f"New sessions of experiment {config.name} (spread)")
        ceiling = ceiling_warnings(config)
        for warning in [*config.warnings(), *ceiling]:
            Annotations.of(self).add_warning_v2("rollouts:config", warning)
        Annotations.of(self.runtime).acknowledge_info(
            "aws-cdk-lib.aws-bedrockagentcore:containerUriValidationSkipped",
            "The image URI comes from the deploy (an image build or asset) or is given; CloudFormation validates it.",
        )
        self._trust_own_runtime_only(config)
        self._grant(config, results_bucket, model_secret_kms_key_arn)

    def _trust_own_runtime_only(self, config: ExperimentConfig) -> None:
        # The L2 trusts `runtime/{name}*`, which also matches every runtime whose name merely starts with ours
        # (rollouts_a* matches rollouts_ab-...). A runtime id is `{name}-{suffix}` and names have no hyphen.
        role_resource = self.runtime.role.node.default_child
        if isinstance(role_resource, iam.CfnRole):
            role_resource.add_property_override(
                "AssumeRolePolicyDocument.Statement.0.Condition.ArnLike.aws:SourceArn",
                Arn.format(
                    ArnComponents(
                        service="bedrock-agentcore", resource="runtime", resource_name=f"{config.runtime_name}-*"
                    ),
                    Stack.of(self),
                ),
            )

    def _grant(self, config: ExperimentConfig, results_bucket: s3.IBucket, model_secret_kms_key_arn: str) -> None:
        """The runtime's own grants: its model secret (and its key), and writing its experiment's results."""
        if config.model_secret_name:
            # The model credential stays out of payloads: the agent reads this one secret at start, nothing else.
            self.runtime.add_to_role_policy(
                iam.PolicyStatement(
                    sid="ReadModelSecret",
                    actions=["secretsmanager:GetSecretValue"],
                    resources=[
                        Arn.format(
                            ArnComponents(
                                service="secretsmanager",
                                resource="secret",
                                resource_name=f"{config.model_secret_name}-??????",
                                arn_format=ArnFormat.COLON_RESOURCE_NAME,
                            ),
                            Stack.of(self),
                        )
                    ],
                )
            )
        if config.model_secret_name and model_secret_kms_key_arn:
            # A secret under a customer-managed key: GetSecretValue also needs kms:Decrypt, only through Secrets
            # Manager (https://docs.aws.amazon.com/secretsmanager/latest/userguide/security-encryption.html).
            self.runtime.add_to_role_policy(
                iam.PolicyStatement(
                    sid="DecryptModelSecret",
                    actions=["kms:Decrypt"],
                    resources=[model_secret_kms_key_arn],
                    conditions={
                        "StringEquals": {"kms:ViaService": f"secretsmanager.{Stack.of(self).region}.amazonaws.com"}
                    },
                )
            )
        self.runtime.add_to_role_policy(
            iam.PolicyStatement(
                sid="WriteOwnResults",
                actions=["s3:PutObject"],
                resources=[results_bucket.arn_for_objects(f"{config.name}/*")],
            )
        )

    @property
    def arn(self) -> str:
        return self.runtime.agent_runtime_arn

    def session_resources(self) -> list[str]:
        """The runtime and its endpoints: the only resources our sessions run on."""
        return [self.arn, *(f"{self.arn}/runtime-endpoint/{name}" for name in self.endpoint_names)]

    def grant_invoke(self, grantee: iam.IGrantable) -> None:
        """InvokeAgentRuntime on this runtime (the L2's grant: the runtime and its endpoints)."""
        self.runtime.grant_invoke_runtime(grantee)

    def grant_stop_session(self, grantee: iam.IGrantable) -> None:
        iam.Grant.add_to_principal(
            grantee=grantee, actions=[STOP_SESSION_ACTION], resource_arns=self.session_resources()
        )
