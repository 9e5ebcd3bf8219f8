"""No raw ledger dict crosses the ledger's boundary: every public read and conditional write of
`rollout_pipeline.ledger` returns a typed view (`ledger.items`), and nothing outside the ledger imports the raw
layer underneath (the table gateway and the attribute codec) or a ledger function that takes or returns a raw item.

Both checks fail on the tree before the ledger was typed at its boundary (22 public reads returning dicts; the
stages importing `batches.as_batch`/`int_attr`, `items.plain_item`, `rollouts.from_item`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LEDGER = REPO / "rollout_pipeline" / "ledger"

#: A return annotation that is, or contains, an untyped item.
RAW = re.compile(r"\b(dict|Mapping)\[str, Any\]")

#: Public functions of the ledger that may return an untyped dict, each with why it is not an item read.
ALLOWED: dict[str, str] = {
    # Transaction items (a write to put into the caller's TransactWriteItems), not a read of an item.
    "limits.LimitLedger.take_slot": "a TransactWriteItems entry",
    "limits.LimitLedger.free_slot": "a TransactWriteItems entry",
    "warm.WarmLedger.claim_ops": "TransactWriteItems entries (the dispatch transaction's take of a warm session)",
    # The request of a Query of the `LIMIT` partition (the slot counters, the board), not an item.
    "limits.prefix_query": "Query arguments",
    # The arguments of CreateTable (local mode and tests create the table with them), not an item.
    "schema.create_table_kwargs": "CreateTable arguments",
    "pool_schema.create_pool_table_kwargs": "CreateTable arguments of the account pool's table",
    # The UpdateItem that writes the pool's settings: the pool stack's custom resource sends it at deploy.
    "pool_schema.settings_update": "UpdateItem arguments",
}
#: The raw layer under the views: the table gateway and the attribute codec. Their functions take and return
#: DynamoDB's typed form by design; only the ledger's modules may use them.
RAW_LAYER = ("table", "attributes")
#: Modules outside the ledger that may import a raw-layer name, each with why (none: the composition root builds
#: the ledger with `Ledger.open`).
RAW_IMPORTERS: dict[str, str] = {}
#: Where a module outside the ledger could import from it (tests inspect stored items, and may).
OUTSIDE = ("rollout_pipeline", "lambdas", "stacks", "bench")


def _public_functions(path: Path) -> Iterator[tuple[str, ast.FunctionDef]]:
    """(qualified name, definition) of each public function and public method of a public class."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and not member.name.startswith("_"):
                    yield f"{node.name}.{member.name}", member


def raw_returns() -> dict[str, str]:
    """`module.name` -> return annotation, for every public ledger function returning an untyped dict."""
    found: dict[str, str] = {}
    for path in sorted(LEDGER.glob("*.py")):
        if path.stem in RAW_LAYER:
            continue  # typed DynamoDB values by design; `test_the_raw_layer_stays_inside_the_ledger` fences it
        for name, node in _public_functions(path):
            annotation = ast.unparse(node.returns) if node.returns is not None else ""
            if RAW.search(annotation):
                found[f"{path.stem}.{name}"] = annotation
    return found


def raw_layer_names() -> set[str]:
    """Every public name the raw layer defines (functions, classes, constants)."""
    names: set[str] = set()
    for module in RAW_LAYER:
        tree = ast.parse((LEDGER / f"{module}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                names.add(f"rollout_pipeline.ledger.{module}.{node.name}")
    return names


def raw_accessors() -> set[str]:
    """Every public module-level ledger function that takes or returns an untyped item (a raw accessor: it reads
    attributes off a dict, or parses either form), except the allowed ones."""
    names: set[str] = set()
    for path in sorted(LEDGER.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            if f"{path.stem}.{node.name}" in ALLOWED:
                continue
            annotations = [arg.annotation for arg in node.args.args + node.args.kwonlyargs] + [node.returns]
            if any(a is not None and RAW.search(ast.unparse(a)) for a in annotations):
                names.add(f"rollout_pipeline.ledger.{path.stem}.{node.name}")
    return names


def imports_outside_the_ledger() -> Iterator[tuple[str, str]]:
    """(importing module, imported name) for every import of a ledger name by a module outside the ledger."""
    for top in OUTSIDE:
        for path in sorted((REPO / top).rglob("*.py")):
            if LEDGER in path.parents:
                continue
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module
                    and node.module.startswith("rollout_pipeline.ledger")
                ):
                    for alias in node.names:
                        yield module, f"{node.module}.{alias.name}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.startswith("rollout_pipeline.ledger"):
                            yield module, alias.name


def test_every_public_ledger_read_and_write_returns_a_typed_view() -> None:
    unexpected = {name: annotation for name, annotation in raw_returns().items() if name not in ALLOWED}
    assert unexpected == {}, "return a view of ledger.items (or allow the name in ALLOWED, saying why)"


def test_the_allow_list_names_only_functions_that_exist_and_need_it() -> None:
    assert set(ALLOWED) <= set(raw_returns())


def test_the_raw_layer_and_raw_accessors_stay_inside_the_ledger() -> None:
    raw = raw_layer_names() | raw_accessors()
    modules = {f"rollout_pipeline.ledger.{module}" for module in RAW_LAYER}
    bad = [
        (module, name)
        for module, name in imports_outside_the_ledger()
        if (name in raw or name in modules) and module not in RAW_IMPORTERS
    ]
    assert bad == []


def test_the_boundary_check_sees_a_raw_read(tmp_path: Path) -> None:
    """The checks can fail: a raw return annotation and a raw-layer import are both recognised."""
    assert RAW.search("dict[str, Any] | None")
    assert RAW.search("Iterator[Mapping[str, Any]]")
    assert not RAW.search("BatchView | None")
    assert "rollout_pipeline.ledger.attributes.item_values" in raw_layer_names()
    assert "rollout_pipeline.ledger.table.LedgerTable" in raw_layer_names()
    assert "rollout_pipeline.ledger.batches.merge_batch_items" in raw_accessors(), "it takes the typed items"
