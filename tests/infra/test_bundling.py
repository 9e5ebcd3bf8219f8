"""Local (Docker-free) Lambda bundling: what pip is asked for and what lands at the asset root (pip not run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aws_cdk import ILocalBundling
from aws_cdk import aws_lambda as lambda_

from stacks import bundling
from stacks.bundling import ASSET_EXCLUDES, LOCK_PATH, LocalPipBundling, copy_sources
from stacks.locks import LAMBDA_LOCK, lambda_requirements
from tests.infra.conftest import REPO_ROOT


# Changed on purpose: the bundle now carries boto3/botocore (pinned in the lock) instead of the runtime's SDK.
def test_lock_is_resolved_from_the_runtime_dependencies_boto3_included() -> None:
    names = {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].lower() for r in lambda_requirements()}
    assert {"boto3", "pydantic", "aws-lambda-powertools"} <= names
    assert "rich" not in names, "the CLI's display library is not bundled into the Lambdas"


def test_pip_installs_exactly_the_hash_checked_lock() -> None:
    command = LocalPipBundling(REPO_ROOT, "3.14", LAMBDA_LOCK, None).pip_command("/out")
    assert command[-2:] == ["-r", str(LAMBDA_LOCK)]
    assert {"--no-deps", "--require-hashes"} <= set(command)
    assert REPO_ROOT / LOCK_PATH == LAMBDA_LOCK


def test_pip_installs_only_aarch64_binary_wheels_for_the_lambda_python() -> None:
    bundler = LocalPipBundling(REPO_ROOT, "3.14", LAMBDA_LOCK, None)
    command = bundler.pip_command("/out")
    joined = " ".join(command)
    assert "--platform manylinux2014_aarch64" in joined
    assert "--implementation cp" in joined
    assert "--python-version 3.14" in joined
    assert "--only-binary=:all:" in command
    assert command[command.index("--target") + 1] == "/out"
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
    assert reincluded == {"rollout_pipeline", "rollout_pipeline/**", "lambdas", "lambdas/*.py", LOCK_PATH}


@pytest.mark.parametrize("compiler", ["/usr/bin/python3.14", None])
def test_try_bundle_runs_pip_copies_sources_then_precompiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], compiler: str | None
) -> None:
    calls: list[list[str]] = []

    def fake_run(command: list[str], **_kwargs: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    out = tmp_path / "asset"
    out.mkdir()
    bundler = LocalPipBundling(REPO_ROOT, "3.14", LAMBDA_LOCK, compiler)

    assert bundler.try_bundle(str(out), image=None) is True

    pip_call = calls.index(bundler.pip_command(str(out)))
    assert (out / "rollout_pipeline" / "config.py").is_file()
    for name in ("ingest", "dispatch", "completion", "sweeper"):
        assert (out / f"{name}.py").is_file(), f"handler module {name}.py missing from the asset root"
    if compiler is None:
        assert calls[-1] == bundler.pip_command(str(out))
        assert "no python3.14 here to precompile" in capsys.readouterr().err
    else:
        # Lambda runs the bytecode as is: compiled after pip and the sources, by the runtime's Python version.
        assert calls[pip_call + 1 :] == [[compiler, *bundling.COMPILE_ARGS, str(out)]]
        assert "unchecked-hash" in bundling.COMPILE_ARGS


def test_bytecode_compiler_is_this_python_only_for_its_own_version() -> None:
    assert bundling.bytecode_compiler(f"{sys.version_info.major}.{sys.version_info.minor}") == sys.executable
    assert bundling.bytecode_compiler("2.9") is None


def test_try_bundle_declines_when_pip_is_unusable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_run(command: list[str], **_kwargs: object) -> subprocess.CompletedProcess[bytes]:
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(subprocess, "run", broken_run)
    assert LocalPipBundling(REPO_ROOT, "3.14", LAMBDA_LOCK, None).try_bundle(str(tmp_path)) is False


def test_bytecode_compiler_finds_a_python_uv_knows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No pythonX.Y on PATH: `uv python find X.Y` (e.g. after `uv python install X.Y`) supplies the compiler."""
    interpreter = tmp_path / "cpython-9.98" / "bin" / "python9.98"
    interpreter.parent.mkdir(parents=True)
    interpreter.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(f'#!/bin/sh\n[ "$1 $2 $3" = "python find 9.98" ] && echo {interpreter} && exit 0\nexit 2\n')
    uv.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert bundling.bytecode_compiler("9.98") == str(interpreter)
    assert bundling.bytecode_compiler("9.97") is None  # uv finds none: the bundle ships without bytecode


def _function_code_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiler: str | None) -> set[str]:
    from tests.infra.conftest import synthesize

    monkeypatch.setattr(bundling, "bytecode_compiler", lambda _version: compiler)
    synth = synthesize(tmp_path)
    return {
        json.dumps(function["Properties"]["Code"]["S3Key"])
        for logical_id, function in synth.of_type("AWS::Lambda::Function").items()
        if logical_id.startswith(("Ingest", "Dispatch", "Completion", "Sweeper"))
    }


def test_the_bytecode_decision_is_part_of_the_asset_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two synths of the same sources, one with a Python 3.14 to precompile with and one without, upload two
    bundles: otherwise the one that reached the bootstrap bucket first would stay there."""
    compiled = _function_code_keys(tmp_path / "compiled", monkeypatch, "/usr/bin/python3.14")
    plain = _function_code_keys(tmp_path / "plain", monkeypatch, None)
    assert len(compiled) == len(plain) == 1, "one asset for the four functions"
    assert compiled != plain
    assert _function_code_keys(tmp_path / "again", monkeypatch, "/opt/other/python3.14") == compiled
