"""What every command shares: exit codes, the user-facing error, and attaching to the experiment the options name."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rollout_pipeline.sdk import Experiment

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


def add_experiment_arguments(parser: Any) -> None:
    """`-e/--experiment` (default `$ROLLOUTS_EXPERIMENT`) and `--region`, on a parser or an argument group."""
    parser.add_argument(
        "-e",
        "--experiment",
        metavar="NAME",
        default=os.environ.get("ROLLOUTS_EXPERIMENT"),
        help="experiment name (stack Rollouts-NAME); default: $ROLLOUTS_EXPERIMENT",
    )
    parser.add_argument("--region", help="AWS region (default: the AWS configuration's)")


def add_context_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """`-c/--context KEY=VALUE`, repeatable, as `cdk deploy -c` takes it."""
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE", help=help_text)


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
