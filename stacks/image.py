"""The agent image: a dedicated ECR repository per experiment, filled during `cdk deploy` without local Docker.

Three modes (`rollout_pipeline.ops.deploy_settings.DeploySettings.image_mode`):
- `codebuild` (default): `cdklabs-deploy-time-build`'s `ContainerImageBuild` zips the build context (a plain file
  asset, so synth needs no Docker), builds `agent_image/Dockerfile` for linux/arm64 in AWS CodeBuild on an ARM build
  image during the deploy and pushes it to the experiment's repository. The tag is the context's content hash: an
  unchanged `agent_image/` and library keep the same zip, so the custom resource does not change and nothing rebuilds.
- `local` (`-c image_build=local`): today's CDK Docker image asset, built by the deploying machine's Docker.
- `uri` (`-c image_uri=...`): a prebuilt image in ECR (e.g. from the user's own CI); nothing is built.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import jsii
from aws_cdk import Aspects, CfnResource, FileSystem, IAspect, IgnoreMode, RemovalPolicy, Stack
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from cdklabs.deploy_time_build import ContainerImageBuild
from constructs import Construct, IConstruct

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ops.deploy_settings import ECR_IMAGE_URI, DeploySettings
from stacks import nag
from stacks.retention import removal_policy

AGENT_DIR: Final = "agent_image"
DOCKERFILE: Final = f"{AGENT_DIR}/Dockerfile"
#: Used when agent_image/Dockerfile.dockerignore is missing; the build context is the repository root.
DEFAULT_IMAGE_EXCLUDES: Final = ["**", f"!{AGENT_DIR}/**", "!rollout_pipeline/**", "**/__pycache__", "**/*.pyc"]
#: Images kept in the experiment's repository; older ones are expired by the lifecycle policy.
KEEP_IMAGES: Final = 10
BUILD_LOG_RETENTION: Final = logs.RetentionDays.ONE_MONTH
ECR_PULL_ACTIONS: Final = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
#: CodeBuild's limits for the image build (its defaults: 60 minutes building, 8 hours queued).
BUILD_TIMEOUT_MINUTES: Final = 20
QUEUED_TIMEOUT_MINUTES: Final = 10
#: How long CloudFormation waits for the build's answer (its default: 3,600 s). A build that times out, or dies
#: before its buildspec runs, never answers; this bounds the wait to the build's own limits plus a margin for the
#: handler and the post_build callback.
BUILD_MARGIN_MINUTES: Final = 5
SERVICE_TIMEOUT_S: Final = (QUEUED_TIMEOUT_MINUTES + BUILD_TIMEOUT_MINUTES + BUILD_MARGIN_MINUTES) * 60
#: The ARM build image: Amazon Linux 2023, CodeBuild's `al/aarch64/standard/4.0` (Docker 28 with buildx, AWS CLI v2).
#: The library pins `amazonlinux2-aarch64-standard:3.0`, an Amazon Linux 2 image (Amazon Linux 2 reached its end
#: of life) and gives no option for it: `AgentImage._current_build_image` replaces it, refusing a layout it does not
#: know.
BUILD_IMAGE: Final = codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_4_0.image_id
LIBRARY_BUILD_IMAGE: Final = "aws/codebuild/amazonlinux2-aarch64-standard:3.0"
#: The library's build phase must hold these, the push last (the skip-if-tagged wrapper runs them unchanged).
LIBRARY_BUILD_COMMANDS: Final = ('eval "$buildCommand"', "docker push $repositoryUri:$imageTag")
#: Runs first in the build phase: an image already pushed under this content-hash tag is not built again.
TAG_EXISTS_CHECK: Final = (
    'aws ecr describe-images --region "$repositoryRegion" --repository-name "${repositoryUri#*/}" '
    '--image-ids imageTag="$imageTag" > /dev/null 2>&1'
)


def image_excludes(repo_root: Path) -> list[str]:
    """The agent image's `.dockerignore` lines (the build context is the repository root)."""
    ignore_file = repo_root / f"{DOCKERFILE}.dockerignore"
    if not ignore_file.is_file():
        return list(DEFAULT_IMAGE_EXCLUDES)
    lines = (line.strip() for line in ignore_file.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@jsii.implements(IAspect)
class _AtSynth:
    """Runs `action` on one construct when CDK prepares the app (after every construct has been added)."""

    def __init__(self, target: IConstruct, action: Callable[[], None]) -> None:
        self._target, self._action = target, action

    def visit(self, node: IConstruct) -> None:
        if node.node.path == self._target.node.path:
            self._action()


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def sorted_list(value: Any) -> list[str]:
    """A statement's Resource (one or a list, strings or intrinsics) in a comparable order."""
    return sorted(json.dumps(item, sort_keys=True) for item in as_list(value))


def skip_if_tagged(commands: list[str]) -> str:
    """One build command: the library's `commands` in order (stopping at the first failure, as CodeBuild does)
    unless the repository already holds `$imageTag`. A failed check (not found, or no permission) builds."""
    build = " && ".join(f"{{ {command}; }}" for command in commands)
    return f'if {TAG_EXISTS_CHECK}; then echo "$repositoryUri:$imageTag exists: nothing to build"; else {build}; fi'


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
            self._given(settings.image_uri)
            return
        args = build_args(config)
        if self.mode == "local":
            self._built_here(repo_root, args)
            return

        removal = removal_policy(config)
        # No fixed name: CloudFormation names it, so a retained repository (after `cdk destroy`) never blocks the
        # next create of the same experiment with "already exists".
        self.repository = ecr.Repository(
            self,
            "Repository",
            image_scan_on_push=True,
            encryption=ecr.RepositoryEncryption.AES_256,
            # Mutable: a build that CloudFormation runs again for the same content-hash tag may push it again.
            image_tag_mutability=ecr.TagMutability.MUTABLE,
            lifecycle_rules=[
                ecr.LifecycleRule(description=f"Keep the last {KEEP_IMAGES} agent images", max_image_count=KEEP_IMAGES)
            ],
            removal_policy=removal,
        )
        cfn_repository = self.repository.node.default_child
        assert isinstance(cfn_repository, ecr.CfnRepository)
        # The image is pushed before the runtime (the likeliest resource to fail) is created: a failed create must
        # delete a repository that holds it (DeleteRepository refuses a non-empty one). EmptyOnDelete matters only
        # when CloudFormation deletes the repository: a retained one (RetainExceptOnCreate) keeps its images on
        # destroy. CDK's L2 refuses `empty_on_delete` without RemovalPolicy.DESTROY, hence the L1 property.
        cfn_repository.empty_on_delete = True
        # ECR encrypts every repository at rest; say so in the template (CDK omits its default AES256).
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
        self._own_build_logs(removal)
        self._current_build_image()
        self._bound_build_time()
        self._skip_existing_tag()
        self._scope_context_read()
        self._acknowledge()

    def _given(self, image_uri: str) -> None:
        """An image the user built (`-c image_uri=...`): pulled from its own repository."""
        match = ECR_IMAGE_URI.match(image_uri)
        assert match is not None  # DeploySettings validated it
        self.image_uri = image_uri
        self.pull_grant_arn = Stack.of(self).format_arn(
            service="ecr",
            account=match["account"],
            region=match["region"],
            resource="repository",
            resource_name=match["repository"],
        )
        self.artifact = agentcore.AgentRuntimeArtifact.from_image_uri(image_uri)

    def _built_here(self, repo_root: Path, args: dict[str, str]) -> None:
        """An image built by the deploying machine's Docker (`-c image_build=local`), a CDK asset."""
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

    def _own_build_logs(self, removal: RemovalPolicy) -> None:
        """Create the build's log group with a retention (CodeBuild would create one that never expires).

        The custom-resource handler's log group is already CDK-managed (`@aws-cdk/aws-lambda:useCdkManagedLogGroup`).
        """
        project, _handler = self._singletons()
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

    def _current_build_image(self) -> None:
        """Build on `BUILD_IMAGE` instead of the library's end-of-life Amazon Linux 2 image."""
        project, _handler = self._singletons()
        cfn_project = project.node.default_child
        assert isinstance(cfn_project, codebuild.CfnProject)
        environment = Stack.of(self).resolve(cfn_project.environment)
        if environment.get("image") != LIBRARY_BUILD_IMAGE or environment.get("type") != "ARM_CONTAINER":
            raise RuntimeError("cdklabs-deploy-time-build's build image changed: review _current_build_image")
        cfn_project.add_property_override("Environment.Image", BUILD_IMAGE)

    def _bound_build_time(self) -> None:
        """CodeBuild's build and queue timeouts, and CloudFormation's wait for the custom resource's answer."""
        project, _handler = self._singletons()
        cfn_project = project.node.default_child
        assert isinstance(cfn_project, codebuild.CfnProject)
        cfn_project.timeout_in_minutes = BUILD_TIMEOUT_MINUTES
        cfn_project.queued_timeout_in_minutes = QUEUED_TIMEOUT_MINUTES
        assert self.build is not None
        # The library's CustomResource takes no serviceTimeout; ServiceTimeout is a property of its CfnResource.
        custom = self.build.node.find_child("Resource").node.default_child
        assert isinstance(custom, CfnResource)
        custom.add_property_override("ServiceTimeout", SERVICE_TIMEOUT_S)

    def _skip_existing_tag(self) -> None:
        """Wrap the library's build phase: when the content-hash tag is already in the repository, push nothing.

        The tag is a hash of the whole build context (`content_tag`), so an image under it is this build's image.
        A rollback (CloudFormation updates the resource back to the old tag, still among the last `KEEP_IMAGES`)
        or a re-run then answers in seconds instead of rebuilding from scratch. The library offers no option for
        it, so this rewrites its project's buildspec and refuses a layout it does not know.
        """
        project, _handler = self._singletons()
        cfn_project = project.node.default_child
        assert isinstance(cfn_project, codebuild.CfnProject)
        stack = Stack.of(self)
        source = stack.resolve(cfn_project.source)
        spec = json.loads(source["buildSpec"])
        commands = spec["phases"]["build"]["commands"]
        if not set(LIBRARY_BUILD_COMMANDS) <= set(commands) or commands[-1] != LIBRARY_BUILD_COMMANDS[-1]:
            raise RuntimeError("cdklabs-deploy-time-build's buildspec changed: review AgentImage._skip_existing_tag")
        spec["phases"]["build"]["commands"] = [skip_if_tagged(commands)]
        cfn_project.add_property_override("Source.BuildSpec", json.dumps(spec, indent=2))

    def _scope_context_read(self) -> None:
        """The build reads its one context zip, not the whole CDK assets bucket.

        The library grants `Asset.grantRead`, i.e. `s3:GetObject*`, `s3:GetBucket*`, `s3:List*` on the bootstrap
        bucket and every object in it (other stacks' assets included). The project's policy document is rewritten
        at synth (lazily, so every statement added before then is kept) with `s3:GetObject` on the asset's key.
        """
        project, _handler = self._singletons()
        assert self.build is not None
        assert project.role is not None
        asset = self.build.node.find_child("Source")
        assert isinstance(asset, s3_assets.Asset)
        policy = nag.default_policy(project.role).node.default_child
        assert isinstance(policy, iam.CfnPolicy)
        stack = Stack.of(self)
        bucket_arns = [asset.bucket.bucket_arn, asset.bucket.arn_for_objects("*")]
        object_arn = asset.bucket.arn_for_objects(asset.s3_object_key)

        scoped: list[bool] = []

        def scope() -> None:
            if scoped:  # a later synth of the same app (e.g. assertions) prepares it again
                return
            scoped.append(True)
            document: dict[str, Any] = stack.resolve(policy.policy_document)
            bucket_read = stack.resolve(bucket_arns)
            statements = document["Statement"]
            matches = [
                i for i, s in enumerate(statements) if sorted_list(s.get("Resource")) == sorted_list(bucket_read)
            ]
            if len(matches) != 1 or not all(a.startswith("s3:") for a in as_list(statements[matches[0]]["Action"])):
                raise RuntimeError("cdklabs-deploy-time-build's asset read grant changed: review _scope_context_read")
            statements[matches[0]] = {
                "Action": "s3:GetObject",
                "Effect": "Allow",
                "Resource": stack.resolve(object_arn),
            }
            policy.policy_document = document

        Aspects.of(policy).add(_AtSynth(policy, scope))

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
