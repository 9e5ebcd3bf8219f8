"""The operator's verbs that `Experiment` offers (launch or destroy a stack, list and prune subscriptions), done by
operator code (`rollout_pipeline.ops`), and the launch options they share.

`ops` runs on the SDK (it returns attached `Experiment`s and raises `SdkError`s), so the SDK never imports it: it
finds the one `Operations` object through the entry point `ops` of the group `rollout_pipeline.operations`
(pyproject.toml), the way it finds local mode's launcher.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final, Protocol, TypeVar

from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.handle import ExperimentHandle

if TYPE_CHECKING:
    from rollout_pipeline.sdk.subscription import PruneResult, Subscription

#: The entry-point group and name of the operator code.
OPERATIONS_GROUP: Final = "rollout_pipeline.operations"
OPERATIONS_NAME: Final = "ops"

#: The attached experiment operator code returns and takes (`Experiment`).
ExperimentT = TypeVar("ExperimentT", bound=ExperimentHandle)


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch an experiment, as opposed to what it is (its settings): the keywords of `Experiment.launch`
    that are not settings, as the operator code takes them (`ops.operations.Operator.launch`, `ops.launch.launch`)."""

    #: Go on without asking (a new stack, a change, a failed stack to create again).
    yes: bool = False
    #: Update a deployed experiment with rollouts in flight (a new ledger layout or `endpoints` still refuse).
    force: bool = False
    region: str | None = None
    #: A `boto3.Session` (its credential source is handed to the CDK CLI).
    session: Any | None = None
    #: The checkout holding cdk.json and app.py (default: found from the working directory upwards).
    project_dir: str | os.PathLike[str] | None = None
    #: Local mode's own settings (`LocalSettings` fields: `agent_module`, `work_dir`, ...).
    local_options: Mapping[str, Any] | None = None
    #: Where a person follows the deploy (default: stderr).
    out: IO[str] | None = None

    def __post_init__(self) -> None:
        for flag in ("yes", "force"):
            if not isinstance(getattr(self, flag), bool):
                raise SdkError(f"{flag} is True or False (got {getattr(self, flag)!r})")
        if self.local_options is not None and not isinstance(self.local_options, Mapping):
            raise SdkError(
                f"local_options must be a dict of local mode's settings, e.g. {{'agent_module': 'my_agent'}} "
                f"(got {type(self.local_options).__name__})"
            )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def split(cls, given: Mapping[str, Any]) -> tuple[LaunchOptions, dict[str, Any]]:
        """`given` keywords as (these options, the experiment's settings: every other keyword)."""
        names = cls.names()
        options = cls(**{key: value for key, value in given.items() if key in names})
        return options, {key: value for key, value in given.items() if key not in names}


class Operations(Protocol[ExperimentT]):
    """What `Experiment.launch`, `destroy` and `exp.subscriptions.list/prune` call."""

    def launch(self, name: str, mode: str, settings: Mapping[str, Any], options: LaunchOptions) -> ExperimentT:
        """Start experiment `name` in `mode` (see `Experiment.launch`)."""
        ...

    def destroy(
        self,
        experiment: ExperimentT,
        *,
        keep_results: bool,
        force: bool,
        yes: bool,
        project_dir: str | os.PathLike[str] | None,
        out: IO[str] | None,
    ) -> None:
        """Tear a deployed experiment's stack down (see `Experiment.destroy`)."""
        ...

    def list_subscriptions(self, experiment: ExperimentHandle) -> list[Subscription]:
        """The private subscriptions on the experiment's bus."""
        ...

    def prune_subscriptions(
        self,
        experiment: ExperimentHandle,
        older_than_s: float,
        *,
        dry_run: bool,
        kinds: Iterable[str] | None,
        skip_recent: bool,
    ) -> list[PruneResult]:
        """Remove the private subscriptions not seen for `older_than_s` seconds."""
        ...


@functools.cache
def operations() -> Operations[Any]:
    """The operator code registered under `rollout_pipeline.operations` (shipped by this package)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=OPERATIONS_GROUP):
        if entry.name == OPERATIONS_NAME:
            found: Operations[Any] = entry.load()
            return found
    raise SdkError(
        f"the operator code (entry point {OPERATIONS_NAME!r} of {OPERATIONS_GROUP}) is not installed: reinstall the "
        "package (pip install -e .)"
    )
