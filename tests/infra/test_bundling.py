"""Local (Docker-free) Lambda bundling: what pip is asked for and what lands at the asset root (pip not run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from aws_cdk import ILocalBundling
from aws_cdk import aws_lambda as lambda_

from stacks.bundling import ASSET_EXCLUDES, LocalPipBundling, copy_sources, runtime_requirements
from tests.infra.conftest import REPO_ROOT


def test_runtime_requirements_are_pinned_and_leave_out_boto3() -> None:
    requirements = runtime_requirements(REPO_ROOT / "pyproject.toml")
    names = {r.split("==")[0].split("[")[0].lower() for r in requirements}
    assert {"pydantic", "aws-lambda-powertools"} <= names
    assert "boto3" not in names
    assert "rich" not in names, "the CLI's display library is not bundled into the Lambdas"
    assert all("==" in r for r in requirements)


def test_pip_installs_only_aarch64_binary_wheels_for_the_lambda_python() -> None:
    bundler = LocalPipBundling(REPO_ROOT, "3.14", ["pydantic==2.14.3"])
    command = bundler.pip_command("/out")
    joined = " ".join(command)
    assert "--platform manylinux2014_aarch64" in joined
    assert "--implementation cp" in joined
    assert "--python-version 3.14" in joined
    assert "--only-binary=:all:" in command
    assert command[command.index("--target") + 1] == "/out"
    assert command[-1] == "pydantic==2.14.3"
    assert ILocalBundling in LocalPipBundling.__jsii_ifaces__  # type: ignore[attr-defined]


def test_lambda_python_version_follows_the_runtime() -> None:
    assert lambda_.Runtime.PYTHON_3_14.name.removeprefix("python") == "3.14"


def test_sources_copied_to_the_asset_root(tmp_path: Path) -> None:
    source = tmp_path / "repo"
    (source / "rollout_pipeline" / "__pycache__").mkdir(parents=True)
    (source / "rollout_pipeline" / "__init__.py").write_text("")
    (source / "rollout_pipeline" / "__pycache__" / "x.pyc").write_bytes(b"")
    (source / "lambdas").mkdir()
    for module in ("__init__.py", "ingest.py", "dispatch.py"):
        (source / "lambdas" / module).write_text("def handler(event, context): ...\n")
    (source / "tests").mkdir()
    (source / "tests" / "test_x.py").write_text("")
    out = tmp_path / "out"
    out.mkdir()

    copy_sources(source, out)

    assert (out / "ingest.py").is_file()
    assert (out / "dispatch.py").is_file()
    assert not (out / "__init__.py").exists()
    assert (out / "lambdas" / "ingest.py").is_file()
    assert (out / "rollout_pipeline" / "__init__.py").is_file()
    assert not (out / "rollout_pipeline" / "__pycache__").exists()
    assert not (out / "tests").exists()


def test_asset_hash_ignores_everything_but_the_library_and_handlers() -> None:
    assert ASSET_EXCLUDES[0] == "*"
    reincluded = {pattern[1:] for pattern in ASSET_EXCLUDES if pattern.startswith("!")}
    assert reincluded == {"rollout_pipeline", "rollout_pipeline/**", "lambdas", "lambdas/*.py", "pyproject.toml"}


def test_try_bundle_runs_pip_then_copies_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(command: list[str], **_kwargs: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "asset"
    out.mkdir()
    bundler = LocalPipBundling(REPO_ROOT, "3.14", ["pydantic==2.14.3"])

    assert bundler.try_bundle(str(out), image=None) is True

    assert calls[-1] == bundler.pip_command(str(out))
    assert (out / "rollout_pipeline" / "config.py").is_file()
    for name in ("ingest", "dispatch", "completion", "sweeper"):
        assert (out / f"{name}.py").is_file(), f"handler module {name}.py missing from the asset root"


def test_try_bundle_declines_when_pip_is_unusable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_run(command: list[str], **_kwargs: object) -> subprocess.CompletedProcess[bytes]:
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(subprocess, "run", broken_run)
    assert LocalPipBundling(REPO_ROOT, "3.14", []).try_bundle(str(tmp_path)) is False
