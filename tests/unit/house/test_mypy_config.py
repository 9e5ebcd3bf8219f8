"""mypy skips aws-cdk-lib's modules that the code does not import (they were two thirds of its time): every module
the code imports must stay in the checked list of pyproject.toml, or its calls would go unchecked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
IMPORTED = re.compile(
    r"^\s*(?:from aws_cdk import (aws_\w+|custom_resources)\b|from (aws_cdk\.\w+) import|import (aws_cdk\.\w+))", re.M
)


def imported_cdk_modules() -> set[str]:
    sources = [*REPO.glob("rollout_pipeline/**/*.py"), *REPO.glob("stacks/**/*.py"), *REPO.glob("lambdas/**/*.py")]
    found = {"aws_cdk"}
    for path in [*sources, REPO / "app.py"]:
        for match in IMPORTED.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1) or match.group(2) or match.group(3)
            found.add(name if name.startswith("aws_cdk.") else f"aws_cdk.{name}")
    return found


def test_every_aws_cdk_module_the_code_imports_is_type_checked() -> None:
    overrides = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["overrides"]
    skipped = [o for o in overrides if o.get("follow_imports") == "skip"]
    assert [o["module"] for o in skipped] == [["aws_cdk.*"]]
    (checked,) = [set(o["module"]) for o in overrides if o.get("follow_imports") == "normal"]
    imported = imported_cdk_modules()
    assert {"aws_cdk.aws_lambda", "aws_cdk.aws_iam", "aws_cdk.aws_sqs"} <= imported
    assert imported <= checked, f"add to the checked list in pyproject.toml: {sorted(imported - checked)}"
