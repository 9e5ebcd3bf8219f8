"""The layer rules of docs/CONTRIBUTING.md, checked on every import statement of the tree (including imports inside
functions and under TYPE_CHECKING): a rule broken here is a dependency running against the layers."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = "rollout_pipeline"

#: The base every layer may use; it imports nothing above it.
BASE = ("contracts", "config", "ids", "ports", "metric_names", "quotas", "costs")
#: What only tests, benchmarks and local mode run on.
TEST_ONLY = ("fakes",)
#: The root's plain modules: names, numbers and small rules the stages and the stack read.
PLAIN = (
    "topology",
    "routing",
    "access",
    "observability",
    "sqs_batch",
    "ceilings",
    "sinks",
    "bus_subscriptions",
)
#: What every area of the library may import of ours (its own modules aside): an allow-list per area, so a new
#: dependency is a decision made here (and in docs/CONTRIBUTING.md's table), never one that slips through.
ALLOWED: dict[str, frozenset[str]] = {
    # The base imports only the base.
    "metric_names": frozenset(),
    "ids": frozenset(),
    "quotas": frozenset(),
    "config": frozenset({"metric_names", "quotas"}),
    "ports": frozenset({"contracts"}),
    "contracts": frozenset({"config", "ids", "ports"}),
    "costs": frozenset({"config", "contracts"}),
    # The root's plain modules: the base and each other.
    "topology": frozenset(BASE),
    "routing": frozenset(BASE),
    "access": frozenset({*BASE, "routing"}),
    "observability": frozenset(BASE),
    "sqs_batch": frozenset(BASE),
    "ceilings": frozenset({*BASE, "topology"}),
    "sinks": frozenset(BASE),
    "bus_subscriptions": frozenset(),
    # boto3 implementations of the ports, and the stand-ins for tests, benchmarks and local mode.
    "adapters": frozenset(BASE),
    "fakes": frozenset({*BASE, "adapters", "access"}),
    # The DynamoDB table: its items, read and written; nothing that sends, publishes or decides.
    "ledger": frozenset({*BASE, "adapters"}),
    # Event details, built from typed ledger items.
    "details": frozenset({*BASE, "ledger"}),
    # Work into the rollout queue: messages, the release window over its ledger items.
    "feed": frozenset({*BASE, "topology", "ledger"}),
    # Admission and call budgets: who may start a session, when (session slots, schedules, the account pool).
    "limits": frozenset({*BASE, "ledger"}),
    # The stages: each other never.
    "ingest": frozenset({*BASE, *PLAIN, "adapters", "ledger", "details", "feed"}),
    "lifecycle": frozenset({*BASE, *PLAIN, "adapters", "ledger", "details", "feed", "limits"}),
    # The composition root: what it composes.
    "wiring": frozenset(
        {*BASE, "topology", "bus_subscriptions", "adapters", "ledger", "feed", "ingest", "limits", "lifecycle"}
    ),
    # The trainer's side: everything below it.
    "sdk": frozenset(
        {*BASE, *PLAIN, "adapters", "ledger", "details", "feed", "ingest", "limits", "lifecycle", "wiring"}
    ),
    # Operator code (preflight, deploy settings, deploy/destroy, smoke, trainer permissions, pruning): it runs on the
    # SDK and everything below it; the SDK reaches it only through the entry point `rollout_pipeline.operations`.
    "ops": frozenset(
        {*BASE, *PLAIN, "adapters", "ledger", "details", "feed", "ingest", "limits", "lifecycle", "wiring", "sdk"}
    ),
    # The CLI runs on the SDK and operator code only: no ledger items, adapters or stages of its own.
    "cli": frozenset({"contracts", "sdk", "ops", "report"}),
    "trainers": frozenset({*BASE, "adapters", "sdk"}),
    "report": frozenset(BASE),
    "schemas": frozenset(BASE),
    # Ships in the agent image: the experiment config and itself.
    "agent": frozenset({"config"}),
}


#: Local mode runs everything (the Lambdas' entry points too: `test_only_local_mode_imports_the_lambda_entry_points`).
ALLOWED["local"] = frozenset(ALLOWED)


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
    bad = [
        (m, i) for m, i in imports("lambdas") if area(i) in ("sdk", "cli", "local", "trainers", "report", *TEST_ONLY)
    ]
    assert bad == []


def test_every_area_has_an_allow_list() -> None:
    root = REPO / PACKAGE
    areas = {path.stem for path in root.glob("*.py") if path.stem != "__init__"}
    areas |= {path.parent.name for path in root.glob("*/__init__.py")}
    assert areas == set(ALLOWED)


def violations(area_name: str, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (importing, imported) pairs that break `area_name`'s allow-list."""
    allowed = (area_name, None, *ALLOWED[area_name])
    return [(m, i) for m, i in pairs if i.split(".")[0] == PACKAGE and area(i) not in allowed]


@pytest.mark.parametrize("area_name", sorted(ALLOWED))
def test_each_area_imports_only_what_its_allow_list_names(area_name: str) -> None:
    bad = violations(area_name, imports(f"{PACKAGE}/{area_name}"))
    assert bad == [], f"{area_name} may import only {sorted(ALLOWED[area_name])}"


def test_an_import_outside_the_allow_list_is_caught() -> None:
    """The release window's rule importing the stack's numbers from the ledger's room breaks the ledger's rule."""
    pairs = [
        ("rollout_pipeline.ledger.window", "rollout_pipeline.topology"),
        ("rollout_pipeline.ledger.window", "rollout_pipeline.ledger.items"),
        ("rollout_pipeline.ledger.window", "rollout_pipeline.contracts"),
    ]
    assert violations("ledger", pairs) == pairs[:1]


def test_no_loop_between_areas_hides_behind_a_lazy_import() -> None:
    """The areas' import graph (imports inside functions included) has no cycle but the base's own
    (`contracts` types its reader with `ports.ObjectReader`, `ports` stamps times with `contracts.utcnow`)."""
    graph: dict[str, set[str]] = {}
    for m, i in imports(PACKAGE):
        source, target = area(m), area(i)
        if source and target and source != target and not {source, target} <= set(BASE):
            graph.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(nxt == goal or reaches(nxt, goal, seen | {nxt}) for nxt in graph.get(start, set()) - seen)

    loops = sorted(a for a in graph if reaches(a, a, set()))
    assert loops == []


def module_imports(*tops: str) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, under `tops` (imports inside functions and under TYPE_CHECKING
    too). `from package import name` imports the module `package.name` when there is one, else `package`. The
    packages a module sits in are not counted: a package's `__init__` re-exports what it shows its users, and a
    module that imports a sibling by its full path does not reach those re-exports."""
    known = {_module(path) for top in tops for path in (REPO / top).rglob("*.py")}
    graph: dict[str, set[str]] = {module: set() for module in known}
    for top in tops:
        for path in sorted((REPO / top).rglob("*.py")):
            module = _module(path)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    named = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    full = [f"{node.module}.{alias.name}" for alias in node.names]
                    named = [name if name in known else node.module for name in full]
                else:
                    continue
                graph[module].update(name for name in named if name in known and name != module)
    return graph


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, directly or through others: each loop as its sorted modules (the
    strongly connected components of more than one module, Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(loops)


@pytest.mark.parametrize("top", [PACKAGE, "stacks"])
def test_no_import_loop_between_modules(top: str) -> None:
    """No two modules of the library, or of the stacks, import each other, not even through a lazy import or one
    made for a type only: a part the facade is built from imports what it uses, never the facade (`sdk/`'s topics
    take `ExperimentHandle`, not `Experiment`), and a helper is handed what it works on (`stacks/nag.py` gets
    the constructs it acknowledges, not the stacks)."""
    loops = import_loops(module_imports(top))
    assert loops == [], "\n".join(" <-> ".join(loop) for loop in loops)


def test_an_import_loop_is_caught() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": {"f"}}
    assert import_loops(graph) == [["a", "b", "c"], ["d", "e"]]


def test_a_from_import_names_the_module_it_takes() -> None:
    """`from rollout_pipeline.sdk import subscription` imports that module; `from rollout_pipeline.sdk import
    Experiment`, the package."""
    graph = module_imports(PACKAGE)
    assert "rollout_pipeline.sdk.subscription" in graph["rollout_pipeline.sdk.events"]
    assert "rollout_pipeline.sdk" in graph["rollout_pipeline.cli.base"]
    assert "rollout_pipeline.sdk" not in graph["rollout_pipeline.sdk.events"]


def test_no_module_of_ours_is_imported_by_name() -> None:
    """`importlib.import_module("rollout_pipeline...")` is an import the rules above cannot see: a mode the
    library does not import directly is reached through an entry point (`rollout_pipeline.launchers`,
    `rollout_pipeline.cli`)."""
    bad = []
    for top in (PACKAGE, "lambdas", "stacks"):
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).split(".")[0] in (PACKAGE, "lambdas", "stacks")
                ):
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bad == []


def test_the_stacks_read_the_librarys_facts_not_its_stages() -> None:
    """The stack takes names, numbers and grants from the base and the root modules (metric names from
    `metric_names`, not the lifecycle); it never imports a stage, an adapter, the SDK, local mode or the CLI."""
    never = ("ingest", "lifecycle", "adapters", "fakes", "sdk", "local", "cli", "wiring", "trainers", "agent")
    bad = [(m, i) for top in ("stacks", "app") for m, i in imports(top) if area(i) in never]
    assert bad == []


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a `from package import name` counts as the name's module when
    there is one), over the library, the stacks and the app."""
    known = {_module(path) for top in (PACKAGE, "stacks") for path in (REPO / top).rglob("*.py")} | {"app"}
    graph: dict[str, set[str]] = {}
    for top in (PACKAGE, "stacks", "app"):
        for module, imported in imports(top):
            if imported in known:
                graph.setdefault(module, set()).add(imported)
                parts = imported.split(".")
                graph[module].update(".".join(parts[:n]) for n in range(1, len(parts)) if ".".join(parts[:n]) in known)
    return graph


def test_a_synth_loads_no_sdk() -> None:
    """What the stack imports, followed through every import of ours (lazy ones too), reaches no SDK module: the
    operator modules the stack reads (`ops.permissions`, `ops.deploy_settings`) stand on the base alone."""
    graph = _module_graph()
    seen: set[str] = set()
    todo = [module for module in graph if module == "app" or module.startswith("stacks")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    never = ("sdk", "cli", "local", "trainers", "lifecycle", "ingest", "adapters")
    assert sorted(m for m in seen if area(m) in never) == []


def test_only_the_feed_sends_to_the_rollout_queue() -> None:
    """One sender: the lifecycle and ingestion hand work to the feed's verbs (`submit`, `retry`, `resend`, `hold`);
    none of their modules names the rollout queue's URL."""
    naming = [
        str(path.relative_to(REPO))
        for area in ("lifecycle", "ingest")
        for path in sorted((REPO / "rollout_pipeline" / area).rglob("*.py"))
        if "rollout_queue_url" in path.read_text(encoding="utf-8")
    ]
    assert naming == []
