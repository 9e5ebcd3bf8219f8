"""Exact versions for what ships and for the dev/test environment, generated from pyproject.toml's ranges.

The library's own `dependencies` are compatible ranges, so it installs beside ART and a trainer's pins. What ships
is pinned exactly, to the versions the tests ran with:

- `lambdas/requirements.lock`: the Lambda bundle (boto3 and botocore included, not the runtime's), for the Lambda
  runtime's Python on aarch64 manylinux, with hashes; `stacks/bundling.py` installs it.
- `agent_image/requirements.lock`: the agent image (pyproject's `agent` extra), for the Dockerfile's Python on
  linux/arm64, with hashes; the Dockerfile installs it.
- `constraints.txt`: every package of the dev/test environment (`make setup` installs with `-c constraints.txt`).
  The two shipped locks are resolved under it, so they carry the versions the tests ran with.

The SageMaker RFT SDK (pyproject's `rft` extra) does not resolve under `constraints.txt`, so it has its own pair:

- `rft-constraints.txt`: the RFT test environment (`make rft-test`, .venv-rft: the `agent`, `local`, `dev` and
  `rft` extras), resolved starting from `constraints.txt`'s versions so only what the SDK forces moves;
- `agent_image/requirements-rft.lock`: the agent image with the `rft` extra (`-c agent_kind=rft`), under it.

`make lock` (`python -m stacks.locks [--upgrade]`) regenerates all five with `uv pip compile`; without `--upgrade`
it keeps every version that still fits and only fills in what changed. No CDK import here: `make lock` stays fast.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
PYPROJECT: Final = REPO_ROOT / "pyproject.toml"
DEV_CONSTRAINTS: Final = REPO_ROOT / "constraints.txt"
LAMBDA_LOCK: Final = REPO_ROOT / "lambdas" / "requirements.lock"
AGENT_LOCK: Final = REPO_ROOT / "agent_image" / "requirements.lock"
RFT_CONSTRAINTS: Final = REPO_ROOT / "rft-constraints.txt"
RFT_AGENT_LOCK: Final = REPO_ROOT / "agent_image" / "requirements-rft.lock"
#: The extras of the RFT test environment (`make rft-test`).
RFT_EXTRAS: Final = ("agent", "local", "dev", "rft")
#: The extras `make setup` / `make setup-model` / `make lock` install: the dev/test environment's closure.
DEV_EXTRAS: Final = ("cdk", "agent", "local", "dev", "report", "data", "readers", "model", "lock")
#: Python of the Lambda runtime (`stacks.functions.RUNTIME`; a test keeps the two equal).
LAMBDA_PYTHON: Final = "3.14"
#: Python of the agent image's base (`FROM ... python:3.13-slim` in agent_image/Dockerfile; a test checks it).
AGENT_PYTHON: Final = "3.13"
#: Library dependencies no handler imports (the CLI's terminal display): left out of the Lambda bundle.
CLI_ONLY: Final = frozenset({"rich"})
#: The header line uv writes as "the command that made this file".
COMPILE_COMMAND: Final = "make lock"

_NAME: Final = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PIN: Final = re.compile(
    r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)\s*(?:;\s*([^\\#]+?))?\s*(?:\\|#|$)"
)


def canonical(name: str) -> str:
    """A distribution name normalised as PEP 503 does (`Typing_Extensions` -> `typing-extensions`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical distribution name of a requirement string (`boto3>=1.40,<2` -> `boto3`)."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(match.group(1))


def pyproject_requirements(extra: str | None = None, pyproject: Path = PYPROJECT) -> list[str]:
    """The project's `dependencies` (extra=None) or one optional-dependencies extra, as written."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements: list[str] = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return list(requirements)


def lambda_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What the Lambda lock is resolved from: the library's runtime dependencies, boto3 included, minus the CLI's."""
    return [r for r in pyproject_requirements(None, pyproject) if requirement_name(r) not in CLI_ONLY]


def agent_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What the agent image's lock is resolved from: pyproject's `agent` extra."""
    return pyproject_requirements("agent", pyproject)


def rft_agent_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What the RFT agent image's lock is resolved from: pyproject's `agent` and `rft` extras."""
    return [*pyproject_requirements("agent", pyproject), *pyproject_requirements("rft", pyproject)]


@dataclass(frozen=True)
class Pin:
    """One `name==version` line of a lock or constraints file (with its environment marker, if any)."""

    name: str
    version: str
    marker: str | None = None


def read_pins(path: Path) -> list[Pin]:
    """Every pinned line of a uv/pip-compile style file (hash and comment lines skipped)."""
    pins = []
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            pins.append(Pin(canonical(match.group(1)), match.group(2), (match.group(3) or "").strip() or None))
    return pins


@dataclass(frozen=True)
class LockTarget:
    """One shipped lock: where it lives, what it is resolved from and for which interpreter and platform."""

    path: Path
    requirements: tuple[str, ...]
    python_version: str
    #: uv's `--python-platform` (the manylinux level is the oldest glibc the target must accept).
    platform: str


def shipped_targets(pyproject: Path = PYPROJECT) -> list[LockTarget]:
    """The Lambda bundle's and the agent image's locks."""
    return [
        LockTarget(LAMBDA_LOCK, tuple(lambda_requirements(pyproject)), LAMBDA_PYTHON, "aarch64-manylinux_2_28"),
        LockTarget(AGENT_LOCK, tuple(agent_requirements(pyproject)), AGENT_PYTHON, "aarch64-manylinux_2_36"),
    ]


def rft_target(pyproject: Path = PYPROJECT) -> LockTarget:
    """The RFT agent image's lock (resolved under `rft-constraints.txt`, not the dev constraints)."""
    return LockTarget(RFT_AGENT_LOCK, tuple(rft_agent_requirements(pyproject)), AGENT_PYTHON, "aarch64-manylinux_2_36")


def _uv(*args: str) -> None:
    command = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--custom-compile-command", COMPILE_COMMAND]
    subprocess.run([*command, *args], check=True, cwd=REPO_ROOT)


def compile_all(upgrade: bool = False) -> None:
    """Regenerate constraints.txt, then each shipped lock under it (same versions wherever the target allows)."""
    upgrade_args = ["--upgrade"] if upgrade else []
    extras = [arg for extra in DEV_EXTRAS for arg in ("--extra", extra)]
    dev_python = "3.11"  # the oldest Python pyproject accepts: universal markers cover newer ones
    constraints = str(DEV_CONSTRAINTS.relative_to(REPO_ROOT))
    _uv(PYPROJECT.name, *extras, "--universal", "--python-version", dev_python, "-o", constraints, *upgrade_args)
    rft_constraints = str(RFT_CONSTRAINTS.relative_to(REPO_ROOT))
    if not RFT_CONSTRAINTS.exists():
        RFT_CONSTRAINTS.write_text(DEV_CONSTRAINTS.read_text())  # start from the dev versions (uv keeps what fits)
    rft_extras = [arg for extra in RFT_EXTRAS for arg in ("--extra", extra)]
    _uv(
        PYPROJECT.name, *rft_extras, "--universal", "--python-version", dev_python, "-o", rft_constraints, *upgrade_args
    )
    targets = [(target, constraints) for target in shipped_targets()] + [(rft_target(), rft_constraints)]
    for target, target_constraints in targets:
        with tempfile.NamedTemporaryFile("w", suffix=".in", prefix=f"{target.path.parent.name}-") as source:
            source.write("\n".join(target.requirements) + "\n")
            source.flush()
            _uv(
                source.name,
                "--python-version",
                target.python_version,
                "--python-platform",
                target.platform,
                "--only-binary",
                ":all:",
                "--generate-hashes",
                "--no-annotate",
                "-c",
                target_constraints,
                "-o",
                str(target.path.relative_to(REPO_ROOT)),
                *upgrade_args,
            )


def main(argv: list[str] | None = None) -> None:
    """`python -m stacks.locks [--upgrade]`: regenerate the constraints and the locks from the registries."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upgrade", action="store_true", help="move every package to the newest version allowed")
    args = parser.parse_args(argv)
    compile_all(upgrade=args.upgrade)


if __name__ == "__main__":
    main()
