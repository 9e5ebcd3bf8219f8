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

REPO = Path(__file__).resolve().parents[3]
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


#: The longest a function may be (docstring and signature included), in the library, the Lambdas, the stacks and
#: the benchmarks.
MAX_FUNCTION_LINES = 80
#: Functions over the ceiling, each with why and the length it may not grow beyond (shorten it, then lower it).
OVER_THE_CEILING: dict[str, tuple[int, str]] = {
    # A benchmark run's harness: its feeder, dispatcher, completer, sweeper and trainer threads share the run's
    # state (queues, counters, stop flags, the dilated clock) through closures; split, they would pass a dozen of
    # them around.
    "bench/bench_scale.py:run": (360, "one run's harness"),
    "bench/bench_capacity.py:run": (240, "one run's harness"),
    "bench/bench_acr_quotas.py:run": (255, "one run's harness"),
    "bench/bench_lifecycle.py:run": (185, "one run's harness"),
    "bench/bench_art.py:run": (110, "one run's harness"),
    "bench/bench_local.py:time_moto_ops": (90, "one run's harness"),
    # Reports: one printed line per figure, in the order the reader reads them.
    "bench/bench_scale.py:print_report": (85, "one line per figure"),
    "bench/bench_notify.py:report": (85, "one line per figure"),
    "bench/bench_capacity.py:figures": (95, "one entry per figure"),
    # The command line: one argument per line.
    "bench/bench_scale.py:main": (90, "one argument per line"),
}


def function_lengths(*roots: str) -> dict[str, int]:
    """`path:name` -> lines of every function under `roots` (the longest, for functions of one name in one file)."""
    lengths: dict[str, int] = {}
    for path in python_files(*roots):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{path.relative_to(REPO)}:{node.name}"
                lengths[name] = max(lengths.get(name, 0), (node.end_lineno or node.lineno) - node.lineno + 1)
    return lengths


def test_no_function_is_longer_than_the_ceiling() -> None:
    lengths = function_lengths("rollout_pipeline", "lambdas", "stacks", "bench")
    long = {
        name: lines
        for name, lines in lengths.items()
        if lines > MAX_FUNCTION_LINES and lines > OVER_THE_CEILING.get(name, (0, ""))[0]
    }
    assert long == {}
    listed_but_short = {name for name in OVER_THE_CEILING if lengths.get(name, 0) <= MAX_FUNCTION_LINES}
    assert listed_but_short == set(), "under the ceiling now: take it off the list"


#: What a test that needs AWS stand-ins (moto, in process or on loopback) uses: it belongs in tests/integration/.
AWS_STAND_INS = re.compile(r"\bmoto\b|\bmock_aws\b|\bmoto_aws\b|\bresources: ExperimentResources\b")


def test_unit_tests_need_no_aws_stand_in() -> None:
    """tests/unit/ is pure logic on the doubles of tests/doubles.py (docs/CONTRIBUTING.md, "Where things go")."""
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in python_files("tests/unit")
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if AWS_STAND_INS.search(line)
    ]
    assert found == []
    assert AWS_STAND_INS.search("def test_x(resources: ExperimentResources) -> None:")


#: The other meanings "capacity" and "release" once had (docs/CONTRIBUTING.md, "Names"): each keeps one.
OTHER_MEANINGS = re.compile(
    r"\bat capacity\b|\bno capacity\b|\bcapacity units?\b"
    r"|\bslots? (?:is |are |was )?releas|\breleas\w* (?:its|the|a) slot\b|\breleased sessions?\b|\bslot'?s? release\b"
    r"|\b(?:moto|CDK|verl|Node(?:\.js)?) releases?\b|\breleased? \(visibility",
    re.IGNORECASE,
)


def test_capacity_and_release_mean_one_thing() -> None:
    texts = [*python_files(*DOCUMENTED), *sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    found = [
        f"{path.relative_to(REPO)}:{number}: {match.group(0)!r}"
        for path in texts
        if path.name != Path(__file__).name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for match in OTHER_MEANINGS.finditer(line)
    ]
    assert found == []
    assert OTHER_MEANINGS.search("the slot is released once the stop is confirmed")
    assert not OTHER_MEANINGS.search("the release window released 8 rollouts")


#: Who may start a session, when and at what cost (docs/lifecycle.md, "Limits" and "The warm pool"): the limits area,
#: the ledger's limit, pool and warm modules, the quotas and the measured ceilings, the warm pool and the agent's
#: warm-up. A feature that needs more lines here takes them out somewhere else in it first.
ADMISSION_CODE = (
    "rollout_pipeline/limits/*.py",
    "rollout_pipeline/ledger/limits.py",
    "rollout_pipeline/ledger/pool*.py",
    "rollout_pipeline/ledger/pace.py",
    "rollout_pipeline/ledger/warm*.py",
    "rollout_pipeline/quotas.py",
    "rollout_pipeline/ceilings.py",
    "rollout_pipeline/lifecycle/warm*.py",
    "rollout_pipeline/agent/warmup.py",
)
MAX_ADMISSION_LINES = 3_200


def test_the_admission_code_stays_small() -> None:
    files = sorted({path for pattern in ADMISSION_CODE for path in REPO.glob(pattern)})
    assert len(files) >= 18, "a module of the admission code moved: update ADMISSION_CODE"
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files)
    assert lines <= MAX_ADMISSION_LINES, f"the admission code is {lines} lines (at most {MAX_ADMISSION_LINES})"
