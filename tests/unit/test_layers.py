"""The layer rules of docs/CONTRIBUTING.md, checked on every import statement of the tree (including imports inside
functions and under TYPE_CHECKING): a rule broken here is a dependency running against the layers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "rollout_pipeline"

#: The base every layer may use; it imports nothing above it.
BASE = ("contracts", "config", "ids", "ports")
#: Library areas and what each may never import (areas are the first name under `rollout_pipeline`).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        BASE, ("adapters", "ledger", "details", "ingest", "lifecycle", "sdk", "cli", "local", "trainers", "report")
    ),
    "adapters": ("ledger", "ingest", "lifecycle", "sdk", "cli", "local", "trainers"),
    "ledger": ("details", "ingest", "lifecycle", "sdk", "cli", "local", "trainers"),
    # Event details sit between the ledger (typed items) and the stages that publish them.
    "details": ("adapters", "ingest", "lifecycle", "sdk", "cli", "local", "trainers"),
    "ingest": ("lifecycle", "sdk", "cli", "local", "trainers"),
    "lifecycle": ("ingest", "sdk", "cli", "local", "trainers"),
    "sdk": ("cli", "local", "trainers"),
    # The CLI runs on the SDK only: no ledger items, adapters or stages of its own.
    "cli": ("ledger", "details", "adapters", "ingest", "lifecycle", "local", "trainers"),
    "trainers": ("cli", "local", "ledger", "ingest", "lifecycle"),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(top: str) -> Iterator[tuple[str, str]]:
    """(importing module, imported module) for every absolute import under `top`."""
    root = REPO / top
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    assert paths, f"no Python files under {top}"
    for path in paths:
        module = _module(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield module, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield module, node.module
                for alias in node.names:  # `from rollout_pipeline import ledger`
                    yield module, f"{node.module}.{alias.name}"


def area(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def test_the_library_never_imports_the_infrastructure_or_the_app() -> None:
    bad = [
        (m, i) for m, i in imports(PACKAGE) if i.split(".")[0] in ("stacks", "app", "aws_cdk", "constructs", "cdk_nag")
    ]
    assert bad == []


def test_only_local_mode_imports_the_lambda_entry_points() -> None:
    bad = [(m, i) for m, i in imports(PACKAGE) if i.split(".")[0] == "lambdas" and area(m) != "local"]
    assert bad == []


def test_nothing_but_local_mode_imports_local_mode() -> None:
    for top in (PACKAGE, "lambdas", "stacks"):
        bad = [(m, i) for m, i in imports(top) if area(i) == "local" and area(m) != "local"]
        assert bad == [], top


def test_the_agent_package_stands_apart() -> None:
    """Agent code ships in the agent image: it may use the experiment config and itself, nothing else of ours."""
    bad = [
        (m, i)
        for m, i in imports(f"{PACKAGE}/agent")
        if i.split(".")[0] == PACKAGE and area(i) not in ("agent", "config", None)
    ]
    assert bad == []
    users = [(m, i) for m, i in imports(PACKAGE) if area(i) == "agent" and area(m) not in ("agent", "local")]
    assert users == [], "only local mode starts agents from the library"


def test_lambdas_are_thin_and_never_use_the_trainer_side() -> None:
    bad = [(m, i) for m, i in imports("lambdas") if area(i) in ("sdk", "cli", "local", "trainers", "report")]
    assert bad == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_only_downwards(layer: str) -> None:
    bad = [(m, i) for m, i in imports(f"{PACKAGE}/{layer}") if area(i) in FORBIDDEN[layer]]
    assert bad == [], f"{layer} may not import {FORBIDDEN[layer]}"
