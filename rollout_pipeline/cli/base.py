"""What every command shares: exit codes, the user-facing error, and attaching to the experiment the options name."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rollout_pipeline.sdk import Experiment

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
#: The reader of stdout went away (128 + SIGPIPE, what a shell reports for `cat big | head`).
EXIT_BROKEN_PIPE: Final = 141

#: How much of an error text an event line shows.
ERROR_CHARS: Final = 160


def clipped(text: str, limit: int = ERROR_CHARS) -> str:
    """`text` on one line, at most `limit` characters, cut at a word boundary with "..." when longer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 3]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "..."


def add_experiment_arguments(parser: Any) -> None:
    """`-e/--experiment` (default `$ROLLOUTS_EXPERIMENT`) and `--region`, on a parser or an argument group."""
    from rollout_pipeline.sdk.route import EXPERIMENT_ENV

    parser.add_argument(
        "-e",
        "--experiment",
        metavar="NAME",
        default=os.environ.get(EXPERIMENT_ENV),
        help=f"experiment name (stack Rollouts-NAME); default: ${EXPERIMENT_ENV}",
    )
    parser.add_argument("--region", help="AWS region (default: the AWS configuration's)")


def hidden_alias(parser: Any, old: str, dest: str, **kwargs: Any) -> None:
    """An old spelling of an option, still accepted, not shown in --help (it sets `dest` like the new one)."""
    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


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
        raise CliError("no experiment: pass -e/--experiment NAME (or set ROLLOUTS_EXPERIMENT)")
    return Experiment.attach(args.experiment, region=args.region, endpoint_url=args.endpoint_url)


def given_options(args: argparse.Namespace, experiment: Experiment | None = None) -> str:
    """The experiment options this command ran with, as a command line takes them (for hints such as "follow it
    with: rollouts watch ..."), so the hint works where the command did: `-e NAME`, `--region`,
    `--outputs-file`, `--endpoint-url` (also when they came from the environment)."""
    name = args.experiment or (experiment.name if experiment is not None and args.outputs_file is None else None)
    parts: list[str] = []
    if name:
        parts += ["-e", name]
    if args.region:
        parts += ["--region", args.region]
    if args.outputs_file is not None:
        parts += ["--outputs-file", str(args.outputs_file)]
    if args.endpoint_url:
        parts += ["--endpoint-url", args.endpoint_url]
    return shlex.join(parts)
