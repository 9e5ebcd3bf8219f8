"""`rollouts`: submit datasets, watch progress, check status, cancel and export batches of an experiment.

Every command attaches to an experiment: by name (`--experiment NAME`, or `ROLLOUTS_EXPERIMENT`) through its
CloudFormation stack `Rollouts-NAME`, or from a `cdk deploy --outputs-file` JSON (`--outputs-file`), or in local
mode (`--endpoint-url http://127.0.0.1:PORT`). Errors print one line on stderr and exit non-zero (no traceback).

Local mode registers its own group: if `rollout_pipeline.local.cli` exists and defines
`register(subparsers, common)`, it is called with this parser's subparsers and the shared experiment options
parser, so `rollouts local ...` appears here without this module knowing about it.

Modules: `parser` (arguments), `commands` (one function per command), `watch` (the progress model), `base`
(exit codes, `CliError`, attaching). The CLI runs on the SDK only (`rollout_pipeline.sdk`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from rollout_pipeline.cli.base import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    attach,
)
from rollout_pipeline.cli.parser import build_parser
from rollout_pipeline.cli.watch import Progress

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "Progress",
    "attach",
    "build_parser",
    "main",
]


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of `rollouts`; returns the exit code (0 ok, 1 error, 2 usage, 130 interrupted, 141 when the reader
    of stdout went away, as `rollouts export ... | head` does)."""
    from rollout_pipeline.sdk.errors import SdkError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, usage errors
        return int(exc.code or 0) if isinstance(exc.code, int | None) else EXIT_USAGE
    verbose = bool(getattr(args, "verbose", False))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
    stream = out if out is not None else sys.stdout
    try:
        code: int = args.handler(args, stream)
    except (SdkError, CliError) as exc:
        print(f"rollouts: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("rollouts: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Whoever read stdout stopped (`| head`): stop quietly, as `cat` does. Point stdout at /dev/null so that
        # the interpreter's last flush at exit does not raise again.
        if out is None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code
