"""mypy skips aws-cdk-lib's modules that the code does not import (they were two thirds of its time): every module
the code imports must stay in the checked list of pyproject.toml, or its calls would go unchecked."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

from tests.unit.house.test_layers import REPO, imports


def imported_cdk_modules() -> set[str]:
    """The aws_cdk modules the library, the stacks, the Lambdas and the app import (`from aws_cdk import aws_sqs`
    imports `aws_cdk.aws_sqs`; `from aws_cdk import Duration` only `aws_cdk`)."""
    spec = importlib.util.find_spec("aws_cdk")  # the package is found, not imported (no jsii runtime started)
    assert spec is not None
    assert spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    named = {name for top in ("rollout_pipeline", "stacks", "lambdas", "app") for _module, name in imports(top)}
    cdk = {name for name in named if name.startswith("aws_cdk.") and (package / name.split(".")[1]).is_dir()}
    return {"aws_cdk", *cdk}


def test_every_aws_cdk_module_the_code_imports_is_type_checked() -> None:
    overrides = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]["overrides"]
    skipped = [o for o in overrides if o.get("follow_imports") == "skip"]
    assert [o["module"] for o in skipped] == [["aws_cdk.*"]]
    (checked,) = [set(o["module"]) for o in overrides if o.get("follow_imports") == "normal"]
    imported = imported_cdk_modules()
    assert {"aws_cdk.aws_lambda", "aws_cdk.aws_iam", "aws_cdk.aws_sqs", "aws_cdk.custom_resources"} <= imported
    assert imported <= checked, f"add to the checked list in pyproject.toml: {sorted(imported - checked)}"
