"""Adding a failure reason is one change (`contracts.results.FailureReason`) plus its docs: the dashboard derives
its series from the enum (checked on the synthesized stack in tests/infra/test_monitoring.py) and these tests fail
when the docs forget a reason or keep one that is gone."""

from __future__ import annotations

import re
from pathlib import Path

from rollout_pipeline.contracts import FailureReason
from stacks.monitoring import FAILURE_REASONS

REPO = Path(__file__).resolve().parents[3]
REASONS = {reason.value for reason in FailureReason}


def table_reasons(markdown: str, heading: str) -> set[str]:
    """The first-column values (in backticks) of the table under `heading`."""
    section = markdown.split(heading, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))


def test_the_lifecycle_docs_table_lists_every_reason() -> None:
    documented = table_reasons((REPO / "docs" / "lifecycle.md").read_text(encoding="utf-8"), "## Failure reasons")
    assert documented == REASONS


def test_the_readme_event_row_lists_every_reason() -> None:
    (row,) = [
        line
        for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
        if "`Rollout Failed`" in line and "reason" in line
    ]
    assert set(re.findall(r"`([a-z_]+)`", row)) >= REASONS


def test_the_dashboard_shows_every_reason() -> None:
    assert set(FAILURE_REASONS) == REASONS


def test_the_docs_check_can_fail() -> None:
    table = "## Failure reasons\n\n| reason | when |\n|---|---|\n| `timeout` | late |\n\n## Next\n| `other` | x |\n"
    assert table_reasons(table, "## Failure reasons") == {"timeout"} != REASONS
