"""`make` with no target lists the targets (`make help`) and does nothing else; every documented target shows."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def test_bare_make_is_help_and_lists_every_annotated_target() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    annotated = re.findall(r"^([A-Za-z0-9_-]+):[^#\n]*## ", makefile, flags=re.MULTILINE)
    assert {"help", "demo", "test", "e2e", "lint", "art-test"} <= set(annotated)
    dry = subprocess.run(["make", "-n", "-C", str(REPO)], capture_output=True, text=True, check=True, timeout=30)
    assert "pip install" not in dry.stdout, "bare make must not install anything"
    out = subprocess.run(["make", "-s", "-C", str(REPO)], capture_output=True, text=True, check=True, timeout=30)
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert listed == annotated


def test_ci_runs_the_readme_test_command_once_with_no_retry() -> None:
    """A test that fails, fails CI: `.ci/run` calls `make test` (the README's test command) once, and nothing re-runs
    failed tests or skips them."""
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands
    assert "make test" in (REPO / "README.md").read_text(encoding="utf-8")
    for retry in ("--last-failed", "--lf", "rerun", "--reruns", "|| true", "if ! make"):
        assert not any(retry in command for command in commands), retry


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    """`make demo` (the README's first command) installs the demo's extras into .venv, not the developer toolchain
    (`cdk`, `dev`: aws-cdk-lib, cfn-lint's own extras, mypy, pytest); `make setup` (and so `make test`) installs
    everything, the dataset readers included."""
    extras = {}
    for target in ("demo", "setup"):
        dry = subprocess.run(
            ["make", "-n", "-B", "-C", str(REPO), target], capture_output=True, text=True, check=True, timeout=30
        )
        installs = [line for line in dry.stdout.splitlines() if "pip install" in line and '-e ".[' in line]
        extras[target] = {name for line in installs for name in re.findall(r'-e "\.\[([^\]]+)\]"', line)[0].split(",")}
    assert extras["demo"] == {"agent", "local", "report", "data", "model"}  # `data`: the Parquet export
    assert {"cdk", "dev"} <= extras["setup"]
    # The rollout dataset's tests read exports back with pyarrow, pandas, polars and `datasets` (extras `data` and
    # `readers`): `make test` installs them, so those tests run in CI and never skip for lack of a package.
    assert {"data", "readers"} <= extras["setup"]
    assert "cdk" not in extras["demo"]
    assert "dev" not in extras["demo"]


def test_make_demo_rft_sets_up_the_rft_environment_with_its_model_and_runs_the_example_unchanged() -> None:
    """One command for the SageMaker RFT path: `.venv-rft` (the `rft` extra under rft-constraints.txt), the local
    model in it, then the demo of the example RFT agent there."""
    dry = subprocess.run(
        ["make", "-n", "-B", "-C", str(REPO), "demo-rft"], capture_output=True, text=True, check=True, timeout=30
    )
    lines = [line for line in dry.stdout.splitlines() if not line.startswith("make")]
    installs = [line for line in lines if "pip install" in line and ".venv-rft/bin/" in line]
    installs = [line for line in installs if '-e ".[' in line or "-r pyproject.toml" in line]
    extras = {
        name for line in installs for found in re.findall(r'-e "\.\[([^\]]+)\]"', line) for name in found.split(",")
    }
    extras |= {name for line in installs for name in re.findall(r"--extra (\S+)", line)}
    assert {"rft", "model", "report"} <= extras
    assert all("-c rft-constraints.txt" in line for line in installs)
    assert lines[-1] == (
        ".venv-rft/bin/rollouts local demo --agent-module rollout_pipeline.agent.examples.rft_math_agent"
    )
