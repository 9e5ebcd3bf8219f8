"""Rollouts as data: `export` (JSON Lines, or the rollout dataset in Parquet), `rescore` (a new reward function over
stored results) and `stats` (rewards, groups with signal, pass@k). Each runs on the SDK only."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from rollout_pipeline.cli.base import EXIT_ERROR, EXIT_OK, CliError, attach


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `export`, `rescore` and `stats` to the `rollouts` subcommands."""
    _add_export(sub, common)
    _add_rescore(sub, common)
    _add_stats(sub, common)


def _batches(parser: argparse.ArgumentParser, *, every: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--batch", action="append", metavar="ID", help="a batch id (repeatable)")
    if every:
        group.add_argument("--all-batches", action="store_true", help="every batch of the experiment")


def _dataset_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("dataset (Parquet)")
    group.add_argument(
        "--variance-only",
        action="store_true",
        help="only groups whose rewards differ (the groups a GRPO trainer learns from)",
    )
    group.add_argument("--succeeded-only", action="store_true", help="only succeeded rollouts")
    group.add_argument("--min-reward", type=float, metavar="X", help="only rollouts with reward >= X")
    group.add_argument(
        "--result-field",
        action="append",
        default=[],
        metavar="NAME",
        help="a top-level field of the result objects to add as column result_NAME (repeatable)",
    )
    group.add_argument("--overwrite", action="store_true", help="write into a directory that is not empty")


def _add_export(sub: Any, common: argparse.ArgumentParser) -> None:
    export = sub.add_parser(
        "export",
        parents=[common],
        help="export batches: JSON Lines, or the rollout dataset in Parquet (one row per rollout)",
        description="Export one row per rollout from the ledger (state, reward, typed failure reason, timings) with "
        "its result object from the results bucket. --format jsonl (default) writes JSON Lines to a file or "
        "stdout; --format parquet writes the rollout dataset (docs/datasets.md) to a directory: data/BATCH.parquet "
        "per batch and a dataset card README.md, loadable as they are with pyarrow, pandas, polars and Hugging Face "
        "datasets (needs pyarrow: pip install 'rollout-pipeline[data]').",
    )
    export.set_defaults(handler=cmd_export)
    _batches(export, every=True)
    export.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl", help="default: jsonl")
    export.add_argument(
        "-o", "--output", metavar="PATH", help="jsonl: a file (default: stdout); parquet: a directory (required)"
    )
    export.add_argument("--no-results", action="store_true", help="leave out the result objects (ledger only)")
    export.add_argument("--with-payload", action="store_true", help="jsonl: add each row's payload")
    _dataset_options(export)


def _add_rescore(sub: Any, common: argparse.ArgumentParser) -> None:
    rescore = sub.add_parser(
        "rescore",
        parents=[common],
        help="apply a new reward function to stored results and write the dataset with both rewards",
        description="Call REWARD (module:function or file.py:function) with each succeeded rollout's dataset row "
        "(with `payload` parsed) and its result object; it returns a number or a per-turn list. Group statistics "
        "and GRPO advantages are recomputed from the new rewards and the dataset is written as `export --format "
        "parquet` writes it, with the agent's rewards beside the new ones (original_*). No agent runs; the ledger, "
        "the buckets and the events are left as they are. A row whose function raised is marked (rescore_error) "
        "and the run goes on.",
    )
    rescore.set_defaults(handler=cmd_rescore)
    _batches(rescore, every=True)
    rescore.add_argument("--reward", required=True, metavar="MODULE:FUNCTION", help="the reward function")
    rescore.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="the dataset's directory")
    _dataset_options(rescore)


def _add_stats(sub: Any, common: argparse.ArgumentParser) -> None:
    stats = sub.add_parser(
        "stats",
        parents=[common],
        help="a batch's rewards, groups with reward variance, and pass@k per input",
        description="Read a batch's groups from the ledger: rollouts and rewards, the groups whose rewards differ, "
        "and with --pass-k the unbiased pass@k estimator of Chen et al. 2021 (1 - C(n-c, k) / C(n, k) per input, "
        "n samples of which c pass, averaged over the inputs with n >= k).",
    )
    stats.set_defaults(handler=cmd_stats)
    _batches(stats, every=False)
    stats.add_argument("--pass-k", metavar="K,K,...", help="e.g. 1,4,8")
    stats.add_argument(
        "--pass-threshold",
        type=float,
        default=1.0,
        metavar="X",
        help="a sample passes when its reward >= X (default: 1.0)",
    )
    stats.add_argument(
        "--failures",
        choices=["exclude", "fail"],
        default="exclude",
        help="failed rollouts: not samples (exclude, default) or samples that did not pass (fail)",
    )
    stats.add_argument("--json", action="store_true", help="print JSON (one object per batch)")


# ------------------------------------------------------------------------------------------------- commands


def _batch_selection(args: argparse.Namespace) -> list[str] | None:
    return None if getattr(args, "all_batches", False) else list(args.batch)


def _dataset_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "variance_only": args.variance_only,
        "succeeded_only": args.succeeded_only,
        "min_reward": args.min_reward,
        "result_fields": tuple(args.result_field),
        "overwrite": args.overwrite,
    }


def _parquet_only(args: argparse.Namespace) -> list[str]:
    given = {
        "--variance-only": args.variance_only,
        "--succeeded-only": args.succeeded_only,
        "--min-reward": args.min_reward is not None,
        "--result-field": bool(args.result_field),
        "--overwrite": args.overwrite,
    }
    return [name for name, on in given.items() if on]


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    batches = _batch_selection(args)
    if args.format == "jsonl":
        wrong = _parquet_only(args)
        if wrong:
            raise CliError(f"{', '.join(wrong)}: only with --format parquet")
        experiment = attach(args)
        target: Any = out if args.output in (None, "-") else args.output
        count = experiment.data.export(
            batches, target, include_results=not args.no_results, include_payload=args.with_payload
        )
        where = "stdout" if args.output in (None, "-") else args.output
        print(f"exported {count} rollout(s) to {where}", file=sys.stderr)
        return EXIT_OK
    if args.output in (None, "-"):
        raise CliError("--format parquet writes a directory: pass -o DIR")
    if args.with_payload:
        raise CliError("--with-payload: the Parquet dataset always has payload_json (for payloads stored inline)")
    experiment = attach(args)
    export = experiment.data.export_dataset(
        batches, Path(args.output), include_results=not args.no_results, **_dataset_kwargs(args)
    )
    _print_written(export, out)
    return EXIT_OK


def _print_written(export: Any, out: TextIO) -> None:
    for batch_id, rows in export.rows_by_batch.items():
        print(f"{batch_id}: {rows} row(s) -> {Path(export.directory) / 'data' / (batch_id + '.parquet')}", file=out)
    print(
        f"wrote {export.rows} row(s) of {len(export.rows_by_batch)} batch(es) to {export.directory} "
        f"(dataset card: {Path(export.directory) / 'README.md'})",
        file=out,
    )


def cmd_rescore(args: argparse.Namespace, out: TextIO) -> int:
    experiment = attach(args)
    export = experiment.data.rescore(_batch_selection(args), args.reward, args.output, **_dataset_kwargs(args))
    _print_written(export, out)
    print(f"re-scored {export.rescored} rollout(s) with {args.reward}", file=out)
    if export.failed:
        print(f"the function failed on {export.failed} row(s) (column rescore_error; their reward is null):", file=out)
        for rollout, error in export.errors.items():
            print(f"  {rollout}: {error}", file=out)
        if export.failed > len(export.errors):
            print(f"  ... and {export.failed - len(export.errors)} more", file=out)
    if export.failed and not export.rescored:
        print(f"rollouts: error: {args.reward} failed on every row it was given", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.sdk.stats import parse_ks

    try:
        ks = parse_ks(args.pass_k) if args.pass_k else ()
    except ValueError as exc:
        raise CliError(f"--pass-k: {exc}") from None
    experiment = attach(args)
    for batch_id in args.batch:
        stats = experiment.data.stats(batch_id, pass_k=ks, threshold=args.pass_threshold, failures=args.failures)
        if args.json:
            print(json.dumps(stats.as_dict()), file=out)
            continue
        mean = "-" if stats.reward_mean is None else f"{stats.reward_mean:.4f}"
        incomplete = stats.groups - stats.complete_groups
        lines = [
            f"batch      {stats.batch_id}",
            f"inputs     {stats.groups}{f' ({incomplete} not complete yet: left out below)' if incomplete else ''}",
            f"rollouts   {stats.rollouts}: {stats.succeeded} succeeded, {stats.failed} failed; reward mean {mean}",
            f"variance   {stats.groups_with_variance} of {stats.complete_groups} complete group(s) have rewards that "
            "differ",
        ]
        if stats.pass_at:
            counted = "failed rollouts count as samples that did not pass" if stats.failures == "fail" else (
                "failed rollouts are not samples"
            )  # fmt: skip
            lines.append(f"pass@k     a sample passes when reward >= {stats.threshold:g}; {counted}")
            for p in stats.pass_at:
                if p.value is None:
                    lines.append(f"  pass@{p.k:<4} -       no input has {p.k} samples")
                else:
                    lines.append(f"  pass@{p.k:<4} {p.value:.4f}  over {p.inputs} input(s)")
        print("\n".join(lines), file=out)
    return EXIT_OK
