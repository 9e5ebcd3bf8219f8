"""What every command shares: exit codes, the user-facing error, and attaching to the experiment the options name."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rollout_pipeline.sdk import Experiment

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def attach(args: argparse.Namespace) -> Experiment:
    """The experiment the common options name."""
    from rollout_pipeline.sdk import Experiment
    from rollout_pipeline.sdk.experiment import read_outputs_file

    if args.outputs_file is not None:
        return Experiment.from_outputs(
            read_outputs_file(args.outputs_file, args.experiment), region=args.region, endpoint_url=args.endpoint_url
        )
    if not args.experiment:
        raise CliError("no experiment: pass --experiment NAME (or set ROLLOUTS_EXPERIMENT)")
    return Experiment.attach(args.experiment, region=args.region, endpoint_url=args.endpoint_url)
