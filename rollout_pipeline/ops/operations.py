"""The SDK's way into operator code: the `Operations` object registered as the entry point `ops` of the group
`rollout_pipeline.operations` (pyproject.toml), which `Experiment` calls for launch, destroy and subscriptions."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import IO, Any

from rollout_pipeline.ops import launch, subscriptions
from rollout_pipeline.sdk.experiment import Experiment
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.operations import LaunchOptions, Operations
from rollout_pipeline.sdk.subscription import PruneResult, Subscription


class Operator:
    """Implements `rollout_pipeline.sdk.operations.Operations[Experiment]` with `ops.launch` and
    `ops.subscriptions`."""

    def launch(self, name: str, mode: str, settings: Mapping[str, Any], options: LaunchOptions) -> Experiment:
        return launch.launch(name, mode, settings, options)

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
        deployment = launch.Deployment(
            experiment.name,
            project_dir=project_dir,
            region=experiment.aws.region,
            session=experiment.aws.session,
            out=out or sys.stderr,
        )
        deployment.destroy(experiment, keep_results=keep_results, force=force, yes=yes)

    def list_subscriptions(self, experiment: ExperimentHandle) -> list[Subscription]:
        return subscriptions.list_subscriptions(experiment.aws, experiment.bus_name)

    def prune_subscriptions(
        self,
        experiment: ExperimentHandle,
        older_than_s: float,
        *,
        dry_run: bool,
        kinds: Iterable[str] | None,
        skip_recent: bool,
    ) -> list[PruneResult]:
        return subscriptions.prune_subscriptions(
            experiment.aws, experiment.bus_name, older_than_s, dry_run=dry_run, kinds=kinds, skip_recent=skip_recent
        )


#: The entry point's object.
OPERATIONS: Operations[Experiment] = Operator()
