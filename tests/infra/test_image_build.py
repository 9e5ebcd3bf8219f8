"""The deploy-time image build is bounded in time and does not rebuild an image its repository already holds."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stacks.image import (
    BUILD_TIMEOUT_MINUTES,
    LIBRARY_BUILD_COMMANDS,
    QUEUED_TIMEOUT_MINUTES,
    SERVICE_TIMEOUT_S,
    TAG_EXISTS_CHECK,
)
from tests.infra.conftest import Synthesized

#: CloudFormation's default wait for a custom resource's answer, and its maximum.
CFN_DEFAULT_SERVICE_TIMEOUT_S = 3600


def build_commands(synth: Synthesized) -> list[str]:
    (project,) = synth.of_type("AWS::CodeBuild::Project").values()
    spec = json.loads(project["Properties"]["Source"]["BuildSpec"])
    commands: list[str] = spec["phases"]["build"]["commands"]
    return commands


def test_codebuild_timeouts_are_set(synth: Synthesized) -> None:
    (project,) = synth.of_type("AWS::CodeBuild::Project").values()
    assert project["Properties"]["TimeoutInMinutes"] == BUILD_TIMEOUT_MINUTES
    assert project["Properties"]["QueuedTimeoutInMinutes"] == QUEUED_TIMEOUT_MINUTES


def test_cloudformation_waits_at_most_the_build_limits_plus_a_margin(synth: Synthesized) -> None:
    (build,) = synth.of_type("Custom::CDKContainerImageBuild").values()
    timeout = build["Properties"]["ServiceTimeout"]
    assert timeout == SERVICE_TIMEOUT_S
    assert (QUEUED_TIMEOUT_MINUTES + BUILD_TIMEOUT_MINUTES) * 60 < timeout < CFN_DEFAULT_SERVICE_TIMEOUT_S


def test_the_build_phase_checks_the_tag_first_and_keeps_the_librarys_commands(synth: Synthesized) -> None:
    (command,) = build_commands(synth)
    assert command.startswith(f"if {TAG_EXISTS_CHECK}; then")
    for library_command in LIBRARY_BUILD_COMMANDS:
        assert f"{{ {library_command}; }}" in command


def _fake_tools(bin_dir: Path, log: Path, image_exists: bool) -> None:
    """`aws`, `docker` and `unzip` that log their arguments; `aws ecr describe-images` finds the tag or not."""
    scripts = {
        "aws": (
            f'echo "aws $*" >> {log}\n'
            'if [ "$1 $2" = "ecr describe-images" ]; then exit ' + ("0" if image_exists else "254") + "; fi\n"
            'if [ "$2" = "get-login-password" ]; then echo token; fi\n'
        ),
        "docker": f'echo "docker $*" >> {log}\n',
        "unzip": f'echo "unzip $*" >> {log}\n',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}exit 0\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_build_phase(command: str, tmp_path: Path, *, image_exists: bool) -> list[str]:
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    log = tmp_path / "calls.log"
    log.touch()
    _fake_tools(bin_dir, log, image_exists)
    env: dict[str, Any] = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "repositoryUri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/rollouts-x-imagerepo-abc",
        "repositoryRegion": "us-west-2",
        "repositoryAuthUri": "123456789012.dkr.ecr.us-west-2.amazonaws.com",
        "imageTag": "0123abcd",
        "sourceS3Url": "s3://assets/context.zip",
        "buildCommand": "docker buildx build --platform linux/arm64 .",
        "input": "",
    }
    subprocess.run(["sh", "-c", command], cwd=work, env=env, check=True, timeout=30, capture_output=True)
    return log.read_text().splitlines()


@pytest.mark.parametrize("image_exists", [True, False])
def test_an_existing_tag_is_not_built_again(synth: Synthesized, tmp_path: Path, image_exists: bool) -> None:
    (command,) = build_commands(synth)
    calls = _run_build_phase(command, tmp_path, image_exists=image_exists)
    assert calls[0] == (
        "aws ecr describe-images --region us-west-2 --repository-name rollouts-x-imagerepo-abc "
        "--image-ids imageTag=0123abcd"
    )
    pushes = [call for call in calls if call.startswith("docker push")]
    if image_exists:
        assert calls == calls[:1], "nothing but the check runs when the tag exists"
    else:
        assert any(call.startswith("docker buildx build") for call in calls)
        assert pushes == ["docker push 123456789012.dkr.ecr.us-west-2.amazonaws.com/rollouts-x-imagerepo-abc:0123abcd"]


def test_the_build_reads_its_own_context_zip_only(synth: Synthesized) -> None:
    """Not the whole CDK assets bucket (other stacks' assets): s3:GetObject on the one asset key."""
    project, _handler = synth.stack.image._singletons()
    assert project.role is not None
    role_id = synth.logical_id(project.role)
    statements = [
        statement
        for policy in synth.of_type("AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    s3 = [
        s
        for s in statements
        if any(a.startswith("s3:") for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))
    ]
    (statement,) = s3
    assert statement["Action"] == "s3:GetObject"
    (build,) = synth.of_type("Custom::CDKContainerImageBuild").values()
    key = build["Properties"]["sourceS3Url"]["Fn::Sub"].rsplit("/", 1)[1]
    assert json.dumps(statement["Resource"]).endswith(f'"/{key}"]]}}')
