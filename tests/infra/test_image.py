"""The agent image in its three modes: built in CodeBuild (default), local Docker asset, prebuilt ECR image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import ConfigError, ExperimentConfig
from rollout_pipeline.ops.deploy_settings import DeploySettings
from stacks.image import KEEP_IMAGES, content_tag
from tests.infra.conftest import PREBUILT_IMAGE, REPO_ROOT, Synthesized, stack_context

#: Amazon Linux 2023 (the library pins an Amazon Linux 2 image, past its end of life).
ARM_BUILD_IMAGE = "aws/codebuild/amazonlinux-aarch64-standard:4.0"


def assets_manifest(synthesized: Synthesized) -> dict[str, Any]:
    path = Path(synthesized.artifact.assembly.directory) / f"{synthesized.artifact.stack_name}.assets.json"
    manifest: dict[str, Any] = json.loads(path.read_text())
    return manifest


def runtime(synthesized: Synthesized) -> dict[str, Any]:
    (resource,) = synthesized.of_type("AWS::BedrockAgentCore::Runtime").values()
    return resource


def agent_statements(synthesized: Synthesized) -> list[dict[str, Any]]:
    role_id = synthesized.logical_id(synthesized.stack.agent.runtime.role)
    return [
        statement
        for policy in synthesized.of_type("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


# --- default: built in CodeBuild during the deploy --------------------------------------------------------------


def test_default_mode_has_no_docker_image_asset(synth: Synthesized) -> None:
    manifest = assets_manifest(synth)
    assert manifest.get("dockerImages", {}) == {}
    assert synth.stack.image.mode == "codebuild"


def test_dedicated_repository_scanned_encrypted_expiring_and_retained(synth: Synthesized) -> None:
    (repo_id, repo), *others = synth.of_type("AWS::ECR::Repository").items()
    assert not others
    props = repo["Properties"]
    assert "RepositoryName" not in props  # CloudFormation names it: a retained one never blocks the next create
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert props["EncryptionConfiguration"] == {"EncryptionType": "AES256"}
    policy = json.loads(props["LifecyclePolicy"]["LifecyclePolicyText"])
    (rule,) = policy["rules"]
    assert rule["selection"]["countType"] == "imageCountMoreThan"
    assert rule["selection"]["countNumber"] == KEEP_IMAGES
    assert rule["action"] == {"type": "expire"}
    assert repo["DeletionPolicy"] == "RetainExceptOnCreate"
    assert synth.logical_id(synth.stack.image.repository) == repo_id


def test_image_is_built_on_an_arm_codebuild_image(synth: Synthesized) -> None:
    (project,) = synth.of_type("AWS::CodeBuild::Project").values()
    env = project["Properties"]["Environment"]
    assert env["Type"] == "ARM_CONTAINER"
    assert env["Image"] == ARM_BUILD_IMAGE
    assert env["PrivilegedMode"] is True  # docker buildx inside the build
    (build,) = synth.of_type("Custom::CDKContainerImageBuild").values()
    props = build["Properties"]
    assert "--platform linux/arm64" in props["buildCommand"]
    assert "--file agent_image/Dockerfile" in props["buildCommand"]
    assert props["imageTag"] == content_tag(REPO_ROOT)
    # The build context is a zip file asset (no Docker at synth) whose key is its content hash.
    key = props["sourceS3Url"]["Fn::Sub"].rsplit("/", 1)[1]
    manifest = assets_manifest(synth)
    assert key.removesuffix(".zip") in manifest["files"]


def test_build_context_holds_the_agent_and_the_library_only(synth: Synthesized) -> None:
    build = synth.stack.image.build
    assert build is not None
    source = build.node.find_child("Source")
    staged = Path(synth.artifact.assembly.directory) / source.asset_path  # type: ignore[attr-defined]
    top = {path.name for path in staged.iterdir()}
    assert top == {"agent_image", "rollout_pipeline"}
    assert (staged / "agent_image" / "Dockerfile").is_file()


def test_runtime_is_created_after_the_image_and_runs_the_built_tag(synth: Synthesized) -> None:
    (build_id,) = synth.of_type("Custom::CDKContainerImageBuild")
    resource = runtime(synth)
    assert build_id in resource["DependsOn"]
    uri = json.dumps(resource["Properties"]["AgentRuntimeArtifact"]["ContainerConfiguration"]["ContainerUri"])
    assert json.dumps({"Fn::GetAtt": [build_id, "ImageTag"]}) in uri
    assert synth.logical_id(synth.stack.image.repository) in uri


def test_build_logs_have_a_retention_and_exist_before_the_build(synth: Synthesized) -> None:
    image = synth.stack.image
    assert image.build_logs is not None
    logs_id = synth.logical_id(image.build_logs)
    props = synth.resources[logs_id]["Properties"]
    (project_id,) = synth.of_type("AWS::CodeBuild::Project")
    assert props["LogGroupName"] == {"Fn::Join": ["", ["/aws/codebuild/", {"Ref": project_id}]]}
    assert props["RetentionInDays"] == 30
    (build,) = synth.of_type("Custom::CDKContainerImageBuild").values()
    assert logs_id in build["DependsOn"]


def test_destroy_variant_empties_and_removes_the_repository(synth_destroyed: Synthesized) -> None:
    destroyed = synth_destroyed
    (repo,) = destroyed.of_type("AWS::ECR::Repository").values()
    assert repo["DeletionPolicy"] == "Delete"
    assert repo["Properties"]["EmptyOnDelete"] is True
    assert destroyed.resources[destroyed.logical_id(destroyed.stack.image.build_logs)]["DeletionPolicy"] == "Delete"
    # Nothing keeps billing: every log group goes, and the runtime's log group is deleted by its custom resource.
    assert {g["DeletionPolicy"] for g in destroyed.of_type("AWS::Logs::LogGroup").values()} == {"Delete"}
    deletes = [json.dumps(r["Properties"].get("Delete", "")) for r in destroyed.of_type("Custom::AWS").values()]
    assert any("deleteLogGroup" in call for call in deletes)


# --- the content tag: unchanged agent and library, same tag, no rebuild ----------------------------------------


def _copy_context(target: Path) -> Path:
    for name in ("agent_image", "rollout_pipeline"):
        shutil.copytree(REPO_ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def test_content_tag_changes_with_the_agent_or_library_only(tmp_path: Path) -> None:
    root = _copy_context(tmp_path)
    before = content_tag(root)
    assert content_tag(root) == before
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("x = 1\n")
    (root / "README.md").write_text("docs\n")
    assert content_tag(root) == before, "files outside the build context must not change the tag"
    (root / "agent_image" / "requirements.txt").write_text("openai==0.0.1\n")
    after_agent = content_tag(root)
    assert after_agent != before
    (root / "rollout_pipeline" / "ids.py").write_text("# changed\n")
    assert content_tag(root) != after_agent


# --- -c image_build=local ---------------------------------------------------------------------------------------


def test_local_mode_keeps_the_docker_image_asset(synth_local_image: Synthesized) -> None:
    manifest = assets_manifest(synth_local_image)
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerFile"] == "agent_image/Dockerfile"
    assert image["source"]["platform"] == "linux/arm64"
    assert synth_local_image.of_type("AWS::ECR::Repository") == {}
    assert synth_local_image.of_type("AWS::CodeBuild::Project") == {}


# --- -c image_uri=... -------------------------------------------------------------------------------------------


def test_prebuilt_image_is_used_as_given_and_may_be_pulled(synth_prebuilt_image: Synthesized) -> None:
    assert assets_manifest(synth_prebuilt_image).get("dockerImages", {}) == {}
    assert synth_prebuilt_image.of_type("AWS::CodeBuild::Project") == {}
    assert synth_prebuilt_image.of_type("AWS::ECR::Repository") == {}
    container = runtime(synth_prebuilt_image)["Properties"]["AgentRuntimeArtifact"]["ContainerConfiguration"]
    assert container["ContainerUri"] == PREBUILT_IMAGE
    statements = {s.get("Sid"): s for s in agent_statements(synth_prebuilt_image)}
    pull = statements["PullPrebuiltImage"]
    assert pull["Action"] == ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    assert pull["Resource"] == {
        "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":ecr:us-west-2:123456789012:repository/my-agents/math"]]
    }
    assert statements["EcrLogin"]["Action"] == "ecr:GetAuthorizationToken"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"image_build": "docker"}, "image_build"),
        ({"image_uri": "docker.io/library/python:3.13"}, "Amazon ECR only"),
        ({"image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x"}, "Amazon ECR only"),  # no tag or digest
        ({"alarm_email": "not-an-address"}, "alarm_email"),
        ({"allow_private_model_url": "maybe"}, "allow_private_model_url"),
    ],
)
def test_bad_image_and_stack_settings_are_refused(overrides: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DeploySettings.from_context({**stack_context(), **overrides})


def test_digest_image_uri_is_accepted() -> None:
    uri = f"123456789012.dkr.ecr.eu-west-1.amazonaws.com/agent@sha256:{'a' * 64}"
    assert DeploySettings.from_context({"image_uri": uri}).image_mode == "uri"


def test_the_base_image_is_pinned_by_digest() -> None:
    """A tag moves under the same Dockerfile (and so the same content-hash image tag): two builds of one tag could
    run different Pythons. Every FROM names an exact version and the digest that decides what is pulled."""
    import re

    dockerfile = (REPO_ROOT / "agent_image" / "Dockerfile").read_text()
    froms = [line for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert froms
    pinned = re.compile(
        r"^FROM --platform=linux/arm64 public\.ecr\.aws/docker/library/python:"
        r"3\.13\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}$"
    )
    assert [line for line in froms if not pinned.match(line)] == []


def test_a_prebuilt_image_gets_no_warm_pool_and_synth_says_so(synth_prebuilt_image: Synthesized) -> None:
    """A prebuilt image may not run the agent host, which answers the warm pool's warm-ups: the stack keeps no
    pool (its functions' configuration says warm_sessions 0, the sweeper may not invoke) and synth warns why."""
    warnings = [str(m.entry.data) for m in synth_prebuilt_image.artifact.messages if m.level.value == "WARNING"]
    (warning,) = [w for w in warnings if "warm_sessions" in w]
    assert "warm_sessions=64 is ignored" in warning
    assert "-c image_agent_host=true" in warning
    config = json.loads(synth_prebuilt_image.outputs["ExperimentConfig"]["Value"])
    assert config["warm_sessions"] == 0


def test_a_prebuilt_image_that_runs_the_agent_host_keeps_its_warm_pool() -> None:
    settings = DeploySettings.from_context({"image_uri": PREBUILT_IMAGE, "image_agent_host": "true"})
    config = ExperimentConfig(name="x", warm_sessions=64)
    assert settings.warm_pool_config(config) == (config, None)
    assert DeploySettings().warm_pool_config(config) == (config, None)  # the stack's own images run the host
    off, warning = DeploySettings.from_context({"image_uri": PREBUILT_IMAGE}).warm_pool_config(config)
    assert off.warm_sessions == 0
    assert warning is not None


def test_the_image_has_no_docker_health_check() -> None:
    """AgentCore polls /ping itself; a Docker HEALTHCHECK only starts an interpreter in the session every 30 s."""
    lines = (REPO_ROOT / "agent_image" / "Dockerfile").read_text().splitlines()
    assert not [line for line in lines if line.strip().upper().startswith("HEALTHCHECK")]
