"""The repository stands alone: no code, doc or config cites a file a user's clone does not have (the team's own
notes beside the repository). Facts the code relies on live in docs/aws-facts.md with their public sources."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
#: Names of the team's notes outside the repository; a user's clone has none of them.
OUTSIDE = ("PEERS.md", "DESIGN.md", "../shared", "shared/reference")
#: Tracked files that are not text; every other tracked file is read (locks, Dockerfile, .ci/run, .dockerignore).
BINARY = {".png"}


def test_nothing_cites_a_file_outside_the_repo() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    offenders = [
        f"{name}: {needle}"
        for name in tracked
        if Path(name).suffix not in BINARY
        and name != "tests/unit/house/test_repo_stands_alone.py"
        and (REPO / name).is_file()
        for needle in OUTSIDE
        if needle in (REPO / name).read_text(encoding="utf-8", errors="replace")
    ]
    assert offenders == []
