"""The agent image: a dedicated ECR repository per experiment, filled during `cdk deploy` without local Docker.

Three modes (`rollout_pipeline.deploy_settings.DeploySettings.image_mode`):
- `codebuild` (default): `cdklabs-deploy-time-build`'s `ContainerImageBuild` zips the build context (a plain file
  asset, so synth needs no Docker), builds `agent_image/Dockerfile` for linux/arm64 in AWS CodeBuild on an ARM build
  image during the deploy and pushes it to the experiment's repository. The tag is the context's content hash: an
  unchanged `agent_image/` and library keep the same zip, so the custom resource does not change and nothing rebuilds.
- `local` (`-c image_build=local`): today's CDK Docker image asset, built by the deploying machine's Docker.
- `uri` (`-c image_uri=...`): a prebuilt image in ECR (e.g. from the user's own CI); nothing is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from aws_cdk import FileSystem, IgnoreMode, RemovalPolicy, Stack, Token
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from cdklabs.deploy_time_build import ContainerImageBuild
from constructs import Construct, IConstruct

from rollout_pipeline import topology
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.deploy_settings import ECR_IMAGE_URI, DeploySettings
from stacks import nag

AGENT_DIR: Final = "agent_image"
DOCKERFILE: Final = f"{AGENT_DIR}/Dockerfile"
#: Used when agent_image/Dockerfile.dockerignore is missing; the build context is the repository root.
DEFAULT_IMAGE_EXCLUDES: Final = ["**", f"!{AGENT_DIR}/**", "!rollout_pipeline/**", "**/__pycache__", "**/*.pyc"]
#: Images kept in the experiment's repository; older ones are expired by the lifecycle policy.
KEEP_IMAGES: Final = 10
BUILD_LOG_RETENTION: Final = logs.RetentionDays.ONE_MONTH
ECR_PULL_ACTIONS: Final = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]


def image_excludes(repo_root: Path) -> list[str]:
    """The agent image's `.dockerignore` lines (the build context is the repository root)."""
    ignore_file = repo_root / f"{DOCKERFILE}.dockerignore"
    if not ignore_file.is_file():
        return list(DEFAULT_IMAGE_EXCLUDES)
    lines = (line.strip() for line in ignore_file.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def assets_bucket_arn(stack: Stack) -> str:
    """The CDK bootstrap assets bucket's ARN as cdk-nag prints it (pseudo parameters unless the env is known)."""

    def show(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value

    account, region = show(stack.account, "AccountId"), show(stack.region, "Region")
    return f"arn:{show(stack.partition, 'Partition')}:s3:::cdk-hnb659fds-assets-{account}-{region}"


def build_args(config: ExperimentConfig) -> dict[str, str]:
    """The Dockerfile's build arguments: `AGENT_EXTRAS=rft` adds the SageMaker RFT SDK for `agent_kind=rft`."""
    return {"AGENT_EXTRAS": "rft"} if config.agent_kind == "rft" else {}


def content_tag(repo_root: Path, args: dict[str, str] | None = None) -> str:
    """The image tag: a hash of the build context (`agent_image/` and the library, minus the dockerignored files)
    and the build arguments.

    A content fingerprint of the same files the zipped context holds: an unchanged context keeps the tag (and the
    asset hash, so the custom resource's properties), and CloudFormation does not run the build again.
    """
    extra = DOCKERFILE + "".join(f"|{key}={value}" for key, value in sorted((args or {}).items()))
    return FileSystem.fingerprint(
        str(repo_root), exclude=image_excludes(repo_root), ignore_mode=IgnoreMode.DOCKER, extra_hash=extra
    )


def repository_name(config: ExperimentConfig) -> str:
    return f"{topology.resource_base(config.name)}-agent"


class AgentImage(Construct):
    """The agent image for the experiment's runtime, from the mode `settings` selects.

    `artifact` is what `agentcore.Runtime` takes; `dependable` is what the runtime must be created after (the
    image build), or None when the image already exists at deploy time.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        settings: DeploySettings,
        repo_root: Path,
    ) -> None:
        super().__init__(scope, construct_id)
        self.mode = settings.image_mode
        self.repository: ecr.Repository | None = None
        self.build: ContainerImageBuild | None = None
        self.build_logs: logs.LogGroup | None = None
        self.pull_grant_arn: str | None = None
        if self.mode == "uri":
            match = ECR_IMAGE_URI.match(settings.image_uri)
            assert match is not None  # DeploySettings validated it
            self.image_uri = settings.image_uri
            self.pull_grant_arn = Stack.of(self).format_arn(
                service="ecr",
                account=match["account"],
                region=match["region"],
                resource="repository",
                resource_name=match["repository"],
            )
            self.artifact = agentcore.AgentRuntimeArtifact.from_image_uri(settings.image_uri)
            return
        args = build_args(config)
        if self.mode == "local":
            asset = ecr_assets.DockerImageAsset(
                self,
                "Asset",
                directory=str(repo_root),
                file=DOCKERFILE,
                build_args=args or None,
                platform=ecr_assets.Platform.LINUX_ARM64,
                exclude=image_excludes(repo_root),
                ignore_mode=IgnoreMode.DOCKER,
            )
            self.artifact = agentcore.AgentRuntimeArtifact.from_ecr_repository(asset.repository, asset.image_tag)
            self.image_uri = asset.image_uri
            return

        retained = config.results_retention == "retain"
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name(config),
            image_scan_on_push=True,
            encryption=ecr.RepositoryEncryption.AES_256,
            # Mutable: a stack re-created next to a retained repository pushes the same content-hash tag again.
            image_tag_mutability=ecr.TagMutability.MUTABLE,
            lifecycle_rules=[
                ecr.LifecycleRule(description=f"Keep the last {KEEP_IMAGES} agent images", max_image_count=KEEP_IMAGES)
            ],
            removal_policy=RemovalPolicy.RETAIN if retained else RemovalPolicy.DESTROY,
            empty_on_delete=not retained,
        )
        # ECR encrypts every repository at rest; say so in the template (CDK omits its default AES256).
        cfn_repository = self.repository.node.default_child
        assert isinstance(cfn_repository, ecr.CfnRepository)
        cfn_repository.encryption_configuration = ecr.CfnRepository.EncryptionConfigurationProperty(
            encryption_type="AES256"
        )
        self.build = ContainerImageBuild(
            self,
            "Build",
            directory=str(repo_root),
            file=DOCKERFILE,
            platform=ecr_assets.Platform.LINUX_ARM64,
            exclude=image_excludes(repo_root),
            ignore_mode=IgnoreMode.DOCKER,
            repository=self.repository,
            tag=content_tag(repo_root, args),
            build_args=args or None,
        )
        self.artifact = agentcore.AgentRuntimeArtifact.from_ecr_repository(self.repository, self.build.image_tag)
        self.image_uri = f"{self.repository.repository_uri}:{self.build.image_tag}"
        self._own_build_logs(retained)
        self._acknowledge()

    @property
    def dependable(self) -> IConstruct | None:
        """The construct the runtime must wait for (the deploy-time build), if any."""
        return self.build

    def grant_pull(self, role: iam.IRole) -> None:
        """Let the runtime's role pull a prebuilt image (the L2 grants it for a repository or an asset itself)."""
        if self.pull_grant_arn is not None:
            role.add_to_principal_policy(
                iam.PolicyStatement(sid="PullPrebuiltImage", actions=ECR_PULL_ACTIONS, resources=[self.pull_grant_arn])
            )
            role.add_to_principal_policy(
                iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"])
            )

    def _singletons(self) -> tuple[codebuild.Project, lambda_.Function]:
        """The CodeBuild project and custom-resource handler the library adds once per stack."""
        stack = Stack.of(self)
        projects = [c for c in stack.node.children if isinstance(c, codebuild.Project)]
        handlers = [
            c
            for c in stack.node.children
            if isinstance(c, lambda_.Function) and c.node.id.startswith("DeployTimeBuild")
        ]
        if len(projects) != 1 or len(handlers) != 1:
            raise RuntimeError("cdklabs-deploy-time-build's layout changed: expected one project and one handler")
        return projects[0], handlers[0]

    def _own_build_logs(self, retained: bool) -> None:
        """Create the build's log group with a retention (CodeBuild would create one that never expires).

        The custom-resource handler's log group is already CDK-managed (`@aws-cdk/aws-lambda:useCdkManagedLogGroup`).
        """
        project, _handler = self._singletons()
        removal = RemovalPolicy.RETAIN if retained else RemovalPolicy.DESTROY
        self.build_logs = logs.LogGroup(
            self,
            "BuildLogs",
            log_group_name=f"/aws/codebuild/{project.project_name}",
            retention=BUILD_LOG_RETENTION,
            removal_policy=removal,
        )
        assert self.build is not None
        # Exists before the first build writes to it, so CodeBuild does not create it without a retention.
        self.build.node.add_dependency(self.build_logs)

    def _acknowledge(self) -> None:
        project, handler = self._singletons()
        stack = Stack.of(self)
        project_id = nag.logical_id(project)
        project_policy = nag.default_policy(project.role) if project.role else project
        nag.ack(
            project.node.default_child or project,
            "AwsSolutions-CB4",
            "The build produces no artifacts (NO_ARTIFACTS): it only pushes the image to the encrypted ECR repository.",
        )
        if project.role is not None:
            nag.ack(
                project.role,
                f"{nag.IAM4}[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly]",
                "cdklabs-deploy-time-build: the build pulls public base images from ECR Public (read-only).",
            )
        findings = {
            nag.iam5(f"{nag.account_arn(stack, 'logs')}:log-group:/aws/codebuild/<{project_id}>:*"): (
                "CodeBuild writes one log stream per build into this project's own log group."
            ),
            nag.iam5(f"{nag.account_arn(stack, 'codebuild')}:report-group/<{project_id}>-*"): (
                "CodeBuild's default report groups of this one project (named after it)."
            ),
            nag.iam5("*"): "ecr:GetAuthorizationToken and ecr-public:GetAuthorizationToken have no resource scope.",
            "AwsSolutions-IAM5[Action::s3:GetObject*]": (
                "Read the zipped build context from the CDK assets bucket (CDK's read grant: GetObject*, GetBucket*)."
            ),
            "AwsSolutions-IAM5[Action::s3:GetBucket*]": (
                "Read the zipped build context from the CDK assets bucket (CDK's read grant: GetObject*, GetBucket*)."
            ),
            "AwsSolutions-IAM5[Action::s3:List*]": (
                "CDK's read grant on the assets bucket lists the one asset key the build downloads."
            ),
            nag.iam5(f"{assets_bucket_arn(stack)}/*"): (
                "The build context zip is a CDK file asset in the bootstrap assets bucket; its key is a content hash."
            ),
        }
        for finding, reason in findings.items():
            nag.ack(project_policy, finding, reason)
        nag.ack(
            handler.node.default_child or handler,
            "AwsSolutions-L1",
            "cdklabs-deploy-time-build pins its custom-resource handler's Node.js runtime; it only starts the build.",
        )
        nag.ack(
            handler.role.node.find_child("Resource") if handler.role else handler,
            f"{nag.IAM4}[{nag.BASIC_EXECUTION_POLICY}]",
            "The deploy-time build's custom-resource handler only needs to write its logs.",
        )
