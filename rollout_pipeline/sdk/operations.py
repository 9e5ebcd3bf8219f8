"""The operator's verbs that `Experiment` offers (launch or destroy a stack, list and prune subscriptions), done by
operator code (`rollout_pipeline.ops`).

`ops` runs on the SDK (it returns attached `Experiment`s and raises `SdkError`s), so the SDK never imports it: it
finds the one `Operations` object through the entry point `ops` of the group `rollout_pipeline.operations`
(pyproject.toml), the way it finds local mode's launcher.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

from rollout_pipeline.sdk.errors import SdkError

if TYPE_CHECKING:
    from rollout_pipeline.sdk.experiment import Experiment
    from rollout_pipeline.sdk.subscription import PruneResult, Subscription

#: The entry-point group and name of the operator code.
OPERATIONS_GROUP: Final = "rollout_pipeline.operations"
OPERATIONS_NAME: Final = "ops"


class Operations(Protocol):
    """What `Experiment.launch/deploy/destroy` and `list_subscriptions/prune_subscriptions` call."""

    def launch(
        self,
        name: str,
        mode: str,
        settings: Mapping[str, Any],
        *,
        yes: bool,
        force: bool,
        region: str | None,
        session: Any | None,
        project_dir: str | os.PathLike[str] | None,
        local_options: Mapping[str, Any] | None,
        out: IO[str] | None,
    ) -> Experiment:
        """Start experiment `name` in `mode` (see `Experiment.launch`)."""
        ...

    def destroy(
        self,
        experiment: Experiment,
        *,
        keep_results: bool,
        force: bool,
        yes: bool,
        project_dir: str | os.PathLike[str] | None,
        out: IO[str] | None,
    ) -> None:
        """Tear a deployed experiment's stack down (see `Experiment.destroy`)."""
        ...

    def list_subscriptions(self, experiment: Experiment) -> list[Subscription]:
        """The private subscriptions on the experiment's bus."""
        ...

    def prune_subscriptions(
        self,
        experiment: Experiment,
        older_than_s: float,
        *,
        dry_run: bool,
        kinds: Iterable[str] | None,
        skip_recent: bool,
    ) -> list[PruneResult]:
        """Remove the private subscriptions not seen for `older_than_s` seconds."""
        ...


@functools.cache
def operations() -> Operations:
    """The operator code registered under `rollout_pipeline.operations` (shipped by this package)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=OPERATIONS_GROUP):
        if entry.name == OPERATIONS_NAME:
            found: Operations = entry.load()
            return found
    raise SdkError(
        f"the operator code (entry point {OPERATIONS_NAME!r} of {OPERATIONS_GROUP}) is not installed: reinstall the "
        "package (pip install -e .)"
    )
