"""How `make test` hands the suite's files to its pytest-xdist workers (`--dist loadfile`, see tests/conftest.py).

xdist's own order is by number of tests per file, so the files of one long test (the e2e walks, the local
account, the demo's budget) came last and kept one worker busy while the others had nothing left. Here the longest
suites start first and the many short unit files fill the end: e2e, then the infra tests (one unit: every file of
tests/infra on one worker, so the session-scoped synths in tests/infra/conftest.py run once, not once per worker),
then integration, then unit; within a suite, xdist's order. A file's tests still run in one worker, in file order.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling

#: Suites in the order their files are handed out; anything else goes last.
SUITE_ORDER = ("tests/e2e/", "tests/infra/", "tests/integration/", "tests/unit/")
#: Files under this folder form one unit of work (one worker, one synth per session fixture).
ONE_UNIT = "tests/infra/"


def suite_rank(scope: str) -> int:
    """Where a unit of work (a file, or the infra folder) goes in the queue: its suite's place in SUITE_ORDER."""
    return next((rank for rank, suite in enumerate(SUITE_ORDER) if scope.startswith(suite)), len(SUITE_ORDER))


class SuiteOrderScheduling(LoadFileScheduling):  # type: ignore[misc]
    """`--dist loadfile` with tests/infra as one unit and the units queued by suite (SUITE_ORDER)."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return ONE_UNIT if nodeid.startswith(ONE_UNIT) else str(super()._split_scope(nodeid))

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is complete before the first unit is handed out
            self._ordered = True
            for scope in sorted(self.workqueue, key=suite_rank):  # stable: xdist's order within a suite
                self.workqueue.move_to_end(scope)
        super()._assign_work_unit(node)
