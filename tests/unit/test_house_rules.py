"""The house's small habits that no type checker sees (docs/CONTRIBUTING.md, "Names" and "History lives in
commits"): one name for one thing, one suffix for what a run returns, no history in comments or docstrings."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The library, the Lambdas and the stacks: one namespace for class and alias names.
LIBRARY = ("rollout_pipeline", "lambdas", "stacks")
#: Where history in a comment would be read as if it were a rule.
DOCUMENTED = (*LIBRARY, "tests", "bench")


def python_files(*roots: str) -> Iterator[Path]:
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def top_level_names(path: Path) -> Iterator[str]:
    """The classes and the type aliases (`Name = Literal[...]`) a module defines at its top level."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Subscript)
            and node.targets[0].id[:1].isupper()
        ):
            yield node.targets[0].id


def test_one_name_one_thing() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for path in python_files(*LIBRARY):
        for name in top_level_names(path):
            homes[name].append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1}
    assert shared == {}


def test_what_a_run_returns_is_a_result() -> None:
    reports = [
        f"{path.relative_to(REPO)}: {name}"
        for path in python_files(*LIBRARY)
        if "report" not in path.relative_to(REPO).parts
        for name in top_level_names(path)
        if name.endswith("Report")
    ]
    assert reports == []


#: History told in code: it belongs in the commit that made the change.
HISTORY = re.compile(r"\bissue\s*#?\d+|\bitem\s+\d+\b|\bformer home\b|\bformerly\b|\bused to be\b", re.IGNORECASE)


def prose(source: str) -> Iterator[tuple[int, str]]:
    """Each comment and docstring of a module, with its line."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield (node.body[0].lineno, docstring)


def test_history_lives_in_commits() -> None:
    told = [
        f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}"
        for path in python_files(*DOCUMENTED)
        if path.name != Path(__file__).name
        for line, text in prose(path.read_text(encoding="utf-8"))
        for match in HISTORY.finditer(text)
    ]
    assert told == []


def test_the_history_check_can_fail() -> None:
    source = '"""The former home of X."""\n\n# see issue 23 for why\nx = 1\n'
    assert [HISTORY.search(text) is not None for _, text in prose(source)] == [True, True]


#: The longest a library function may be (docstring and signature included).
MAX_FUNCTION_LINES = 80


def test_no_library_function_is_longer_than_the_ceiling() -> None:
    long = {
        f"{path.relative_to(REPO)}:{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for path in python_files("rollout_pipeline", "lambdas")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long == {}
