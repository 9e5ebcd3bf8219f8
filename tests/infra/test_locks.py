"""The locks of what ships and the dev/test constraints agree with pyproject.toml and with each other.

pyproject's library `dependencies` are ranges; its extras are exact pins. `constraints.txt` (dev/test env),
`lambdas/requirements.lock` (Lambda bundle) and `agent_image/requirements.lock` (agent image) hold exact versions.
A pin outside its pyproject range, a direct dependency missing from a lock, or a shipped version that differs from
the one the tests ran with fails here: run `make lock` after editing pyproject.toml.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

from stacks import locks
from stacks.functions import RUNTIME
from tests.infra.conftest import REPO_ROOT


def environment(python_version: str) -> dict[str, str]:
    """Marker environment of a Linux aarch64 CPython `python_version` (the shipped targets)."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "aarch64",
        "os_name": "posix",
    }


def applicable(pins: list[locks.Pin], python_version: str | None) -> dict[str, str]:
    """name -> version of the pins that apply on `python_version` (None: every pin, which must then be unique)."""
    versions: dict[str, str] = {}
    for pin in pins:
        marker = Marker(pin.marker) if pin.marker is not None else None
        if marker is not None and python_version is not None and not marker.evaluate(environment(python_version)):
            continue
        if python_version is None and pin.name in versions:
            continue  # universal file: forks for other Pythons are each checked by range below
        versions[pin.name] = pin.version
    return versions


def range_disagreements(requirements: list[str], pins: list[locks.Pin]) -> list[str]:
    """Each requirement missing from the pins, or any of its pins (every marker fork) outside its specifier."""
    problems = []
    by_name: dict[str, list[locks.Pin]] = {}
    for pin in pins:
        by_name.setdefault(pin.name, []).append(pin)
    for text in requirements:
        requirement = Requirement(text)
        name = locks.canonical(requirement.name)
        if name not in by_name:
            problems.append(f"{name}: required by pyproject ({text}) but not pinned")
            continue
        for pin in by_name[name]:
            if not requirement.specifier.contains(pin.version, prereleases=True):
                problems.append(f"{name}=={pin.version} is outside pyproject's {text!r}")
    return problems


def version_drift(shipped: dict[str, str], tested: dict[str, str]) -> list[str]:
    """Shipped packages whose version is not the one the dev/test environment runs."""
    return [
        f"{name}: ships {version}, tests run {tested[name]}"
        for name, version in sorted(shipped.items())
        if name in tested and tested[name] != version
    ]


def dev_requirements() -> list[str]:
    requirements = locks.pyproject_requirements()
    for extra in locks.DEV_EXTRAS:
        requirements += locks.pyproject_requirements(extra)
    return requirements


# --- the files as committed ---------------------------------------------------------------------------------------


def test_dev_constraints_pin_every_pyproject_requirement_inside_its_range() -> None:
    assert range_disagreements(dev_requirements(), locks.read_pins(locks.DEV_CONSTRAINTS)) == []


def test_extras_named_by_the_lock_target_exist() -> None:
    for extra in locks.DEV_EXTRAS:
        assert locks.pyproject_requirements(extra), extra


def test_lambda_lock_carries_boto3_and_botocore_inside_pyproject_ranges() -> None:
    pins = locks.read_pins(locks.LAMBDA_LOCK)
    assert {"boto3", "botocore", "s3transfer", "pydantic", "pydantic-core", "aws-lambda-powertools"} <= {
        pin.name for pin in pins
    }
    assert "rich" not in {pin.name for pin in pins}, "the CLI's display library is not bundled into the Lambdas"
    assert range_disagreements(locks.lambda_requirements(), pins) == []


def test_agent_lock_holds_every_direct_pin_of_the_agent_extra() -> None:
    lock = applicable(locks.read_pins(locks.AGENT_LOCK), locks.AGENT_PYTHON)
    for text in locks.agent_requirements():
        requirement = Requirement(text)
        name = locks.canonical(requirement.name)
        assert name in lock, f"{name} of the agent extra is missing from {locks.AGENT_LOCK.name}"
        pinned = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        assert pinned == [lock[name]], f"{name}: agent extra says {text!r}, the image lock {lock[name]}"


@pytest.mark.parametrize(
    ("lock", "python"), [(locks.LAMBDA_LOCK, locks.LAMBDA_PYTHON), (locks.AGENT_LOCK, locks.AGENT_PYTHON)]
)
def test_what_ships_is_what_the_tests_ran_with(lock: Path, python: str) -> None:
    tested = applicable(locks.read_pins(locks.DEV_CONSTRAINTS), python)
    assert version_drift(applicable(locks.read_pins(lock), python), tested) == []


@pytest.mark.parametrize("lock", [locks.LAMBDA_LOCK, locks.AGENT_LOCK, locks.RFT_AGENT_LOCK])
def test_shipped_locks_are_hash_checked(lock: Path) -> None:
    blocks = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
    pinned = [block for block in blocks if "==" in block.split("\n")[0] and not block.startswith("#")]
    assert pinned
    assert all("--hash=sha256:" in block for block in pinned)


def test_lock_targets_follow_the_lambda_runtime_and_the_agent_base_image() -> None:
    assert RUNTIME.name.removeprefix("python") == locks.LAMBDA_PYTHON
    dockerfile = (REPO_ROOT / "agent_image" / "Dockerfile").read_text()
    assert re.search(rf"^FROM .*python:{re.escape(locks.AGENT_PYTHON)}(\.\d+)?-slim", dockerfile, re.MULTILINE)
    assert f"-r /app/agent_image/{locks.AGENT_LOCK.name}" in dockerfile
    assert "--require-hashes" in dockerfile


def test_make_installs_the_dev_environment_under_the_constraints() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(rf"^CONSTRAINTS := {re.escape(locks.DEV_CONSTRAINTS.name)}$", makefile, re.MULTILINE)
    # The ART venv (`make art-test`) resolves the library's ranges beside agentcore-rl-toolkit[rollout] on purpose:
    # it proves a trainer can install both, which the dev pins (newer botocore) would hide.
    installs = [
        line
        for line in makefile.splitlines()
        if re.search(r"pip install ", line) and "$(ART_VENV)" not in line and "$(RFT_VENV)" not in line
    ]
    assert len(installs) >= 3  # pip itself, setup and setup-model at least
    assert all("-c $(CONSTRAINTS)" in line for line in installs), installs
    # The RFT venv (`make rft-test`) has its own pins: the SageMaker SDK does not resolve under constraints.txt.
    assert re.search(rf"^RFT_CONSTRAINTS := {re.escape(locks.RFT_CONSTRAINTS.name)}$", makefile, re.MULTILINE)
    rft_installs = [
        line
        for line in makefile.splitlines()
        if "pip install" in line and "$(RFT_VENV)" in line and not line.endswith("--upgrade pip")
    ]
    assert len(rft_installs) >= 2  # the RFT environment and `setup-rft`'s local model
    assert all("-c $(RFT_CONSTRAINTS)" in line for line in rft_installs), rft_installs


def test_the_rft_pins_cover_the_rft_environment_and_the_rft_image_moves_no_image_pin() -> None:
    requirements = locks.pyproject_requirements()
    for extra in locks.RFT_EXTRAS:
        requirements += locks.pyproject_requirements(extra)
    assert range_disagreements(requirements, locks.read_pins(locks.RFT_CONSTRAINTS)) == []
    rft_image = applicable(locks.read_pins(locks.RFT_AGENT_LOCK), locks.AGENT_PYTHON)
    assert rft_image["sagemaker-train"] == "1.27.0"
    assert range_disagreements(locks.rft_agent_requirements(), locks.read_pins(locks.RFT_AGENT_LOCK)) == []
    # The RFT image is the default image plus the SDK: every package of the default image at the same version.
    base_image = applicable(locks.read_pins(locks.AGENT_LOCK), locks.AGENT_PYTHON)
    assert version_drift(base_image, rft_image) == []
    assert set(base_image) <= set(rft_image)
    rft_tested = applicable(locks.read_pins(locks.RFT_CONSTRAINTS), locks.AGENT_PYTHON)
    assert version_drift(rft_image, rft_tested) == []


# --- the checks themselves can fail --------------------------------------------------------------------------------


def test_a_pin_outside_its_range_is_reported(tmp_path: Path) -> None:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("boto3==1.39.0\n    # via x\npydantic==2.14.3 \\\n    --hash=sha256:00\n")
    pins = locks.read_pins(constraints)

    problems = range_disagreements(["boto3>=1.40,<2", "pydantic>=2.7,<3", "rich>=13.7,<16"], pins)

    assert problems == [
        "boto3==1.39.0 is outside pyproject's 'boto3>=1.40,<2'",
        "rich: required by pyproject (rich>=13.7,<16) but not pinned",
    ]


def test_a_shipped_version_other_than_the_tested_one_is_reported() -> None:
    assert version_drift({"botocore": "1.43.0", "six": "1.17.0"}, {"botocore": "1.44.5", "six": "1.17.0"}) == [
        "botocore: ships 1.43.0, tests run 1.44.5"
    ]


def test_pins_are_read_with_extras_markers_and_hashes(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(
        "# header==1\n"
        "Typing_Extensions==4.16.0 \\\n    --hash=sha256:ab\n"
        "moto[server]==5.2.5\n"
        "numpy==2.4.6 ; python_full_version < '3.12'\n"
        "    # via pandas==1\n"
    )
    assert locks.read_pins(lock) == [
        locks.Pin("typing-extensions", "4.16.0"),
        locks.Pin("moto", "5.2.5"),
        locks.Pin("numpy", "2.4.6", "python_full_version < '3.12'"),
    ]
