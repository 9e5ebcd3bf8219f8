"""The commands: each takes the parsed arguments and the output stream, runs on the SDK, and returns an exit code."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TextIO

from rollout_pipeline.cli.base import EXIT_ERROR, EXIT_OK, CliError, attach, given_options
from rollout_pipeline.cli.watch import watch


def cmd_preflight(args: argparse.Namespace, out: TextIO) -> int:
    import boto3

    from rollout_pipeline.ops import preflight

    if not args.experiment:
        raise CliError("no experiment: pass -e/--experiment NAME (or set ROLLOUTS_EXPERIMENT)")
    overrides: dict[str, str] = {"experiment": args.experiment}
    for item in args.context:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-c {item!r}: expected KEY=VALUE")
        overrides[key] = value
    session = boto3.session.Session(region_name=args.region)
    region = session.region_name
    if not region:
        raise CliError("no region: pass --region or set AWS_REGION")
    checks = preflight.run(
        preflight.load_context(args.cdk_dir, overrides),
        client=lambda service: session.client(service, region_name=region),
        region=region,
    )
    for check in checks:
        print(check.line(), file=out)
    return EXIT_ERROR if preflight.worst(checks) == "error" else EXIT_OK


def cmd_submit(args: argparse.Namespace, out: TextIO) -> int:
    sampling = None
    if args.sampling_params:
        try:
            sampling = json.loads(args.sampling_params)
        except json.JSONDecodeError as exc:
            raise CliError(f"--sampling-params is not valid JSON: {exc.msg}") from None
        if not isinstance(sampling, dict):
            raise CliError("--sampling-params must be a JSON object")
    experiment = attach(args)
    batch_id = experiment.batches.submit_file(
        args.file,
        group_size=args.group_size,
        sampling_params=sampling,
        timeout_s=args.rollout_timeout,
        max_attempts=args.max_attempts,
        policy_version=args.policy_version,
        key=args.key,
        budget_usd=args.budget_usd,
    )
    print(batch_id, file=out)
    print(
        f"submitted {args.file} to experiment {experiment.name} as batch {batch_id}; "
        f"follow it with: rollouts watch {given_options(args, experiment)} --batch {batch_id}",
        file=sys.stderr,
    )
    if args.watch:
        watch_args = argparse.Namespace(
            batch=batch_id,
            timeout=None,
            from_trainer_queue=False,
            refresh=15.0,
            poll_wait=args.poll_wait,
            missing_batch_grace=None,  # its own upload: ingestion will create it
        )
        return watch(experiment, watch_args, out)
    return EXIT_OK


def cmd_capacity(args: argparse.Namespace, out: TextIO) -> int:
    view = attach(args).capacity()
    if args.json:
        print(json.dumps(dataclasses.asdict(view), indent=2, default=str), file=out)
        return EXIT_OK
    print("\n".join(view.lines()), file=out)
    return EXIT_OK


def cmd_cost(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.sdk.cost import format_cost

    if args.limit < 1:
        raise CliError(f"--limit must be at least 1, got {args.limit}")
    report = attach(args).cost(args.batch, limit=args.limit)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2), file=out)
    else:
        print(format_cost(report), file=out)
    return EXIT_OK


def cmd_budget_show(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.sdk.cost import usd

    report = attach(args).cost(limit=1)
    if report.budget_usd is None:
        print(f"experiment {report.experiment}: no budget; spent {usd(report.spent_usd)}", file=out)
    else:
        used = report.budget_used or 0.0
        print(
            f"experiment {report.experiment}: budget {usd(report.budget_usd)}, spent {usd(report.spent_usd)} "
            f"({used:.0%}){'; dispatch paused' if used >= 1 else ''}",
            file=out,
        )
    return EXIT_OK


def cmd_budget_set(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.sdk.cost import usd

    if not args.usd > 0:
        raise CliError(f"the budget must be a positive number of US dollars, got {args.usd}")
    experiment = attach(args)
    experiment.cost.set_budget(args.usd, batch=args.batch)
    if args.batch is not None:
        (batch,) = experiment.cost(args.batch).batches
        spent = batch.published.usd if batch.published is not None else 0.0
        what = f"batch {args.batch}"
    else:
        report = experiment.cost(limit=1)
        spent, what = report.spent_usd, f"experiment {report.experiment}"
    note = "dispatch resumes within a minute" if spent < args.usd else "still spent: dispatch stays paused"
    print(f"{what}: budget {usd(args.usd)}, spent {usd(spent)} ({note})", file=out)
    return EXIT_OK


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    status = attach(args).status(args.batch)
    if args.json:
        print(json.dumps(status.as_dict(), indent=2), file=out)
        return EXIT_OK
    total = "?" if status.rollouts_total is None else str(status.rollouts_total)
    done = ", done" if status.done and status.status != "completed" else ""
    lines = [
        f"batch      {status.batch_id} ({status.status}{done})",
        f"rollouts   {total} total: {status.queued if status.queued is not None else '?'} queued, "
        f"{status.running} running, {status.succeeded} succeeded, {status.failed} failed",
    ]
    if status.failed_by_reason:
        lines.append("failed     " + ", ".join(f"{k} {v}" for k, v in sorted(status.failed_by_reason.items())))
    if status.reward_mean is not None:
        lines.append(
            f"reward     mean {status.reward_mean:.4f}, std {status.reward_std or 0:.4f} (n={status.reward_count})"
        )
    lines.append(f"rows       {status.rows_accepted} accepted, {status.rows_rejected} rejected")
    if status.errors_uri:
        lines.append(f"errors     {status.errors_uri}")
    if status.error:
        lines.append(f"error      {status.error}")
    print("\n".join(lines), file=out)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    experiment = attach(args)
    report = experiment.batches.cancel(args.batch)
    # What the batch holds now (every rollout is terminal once cancel returns), whoever ended each one: this
    # command, or a dispatcher of the pipeline that saw the cancel flag first.
    status = experiment.batches.status(args.batch)
    ended_cancelled = status.failed_by_reason.get("cancelled", 0)
    before = status.terminal - ended_cancelled
    print(
        f"batch {args.batch} cancelled: {ended_cancelled} rollout(s) ended as cancelled, {before} had finished "
        f"before ({status.succeeded} succeeded, {status.failed - ended_cancelled} failed)",
        file=out,
    )
    if report.sessions_stopped or report.stops_pending:
        line = f"running sessions: {report.sessions_stopped} stopped"
        if report.stops_pending:
            line += (
                f", {report.stops_pending} not stopped yet: the pipeline's sweeper retries their stops (within about "
                "a minute; AgentCore's idle timeout ends them at the latest)"
            )
        print(line, file=out)
    if report.drain_errors:
        print(
            f"{len(report.drain_errors)} side effect(s) left to retry (first: {report.drain_errors[0]}): run "
            f"`rollouts cancel {given_options(args, experiment)} --batch {args.batch}` again",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.report import ReportUnavailable, read_events, write_report

    events = []
    if args.events is not None:
        try:
            events = read_events(args.events)
        except OSError as exc:
            raise CliError(f"cannot read events file {args.events}: {exc}") from None
    output = args.output or Path(f"report-{args.batch}.html")
    try:
        data = write_report(attach(args), args.batch, output, events)
    except ReportUnavailable as exc:
        raise CliError(str(exc)) from None
    print(f"report of batch {args.batch} ({len(data.rows)} rollouts) written to {output}", file=out)
    return EXIT_OK


def cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    return watch(attach(args), args, out)


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def duration(text: str) -> float:
    """`90m`, `24h`, `7d`, `30s` or plain seconds, as seconds (argparse type)."""
    raw = text.strip().lower()
    unit = _DURATION_UNITS.get(raw[-1:]) if raw else None
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90m, 24h, 7d or seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration cannot be negative")
    return value


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def cmd_subscriptions_list(args: argparse.Namespace, out: TextIO) -> int:
    import time

    now = time.time()
    found = attach(args).subscriptions.list()
    for sub in found:
        missing = " (rule gone)" if sub.rule_arn is None else " (queue gone)" if sub.queue_url is None else ""
        print(f"{sub.name}  {sub.kind}  {sub.owner}  last seen {_age(sub.age_s(now))} ago{missing}", file=out)
    print(f"{len(found)} subscription(s)", file=sys.stderr)
    return EXIT_OK


def cmd_subscriptions_prune(args: argparse.Namespace, out: TextIO) -> int:
    import time

    now = time.time()
    results = attach(args).subscriptions.prune(args.older_than, dry_run=args.dry_run, kinds=args.kind)
    failed = 0
    for result in results:
        sub = result.subscription
        failed += result.action.startswith("failed")
        print(
            f"{result.action:<12} {sub.name}  {sub.kind}  {sub.owner}  last seen {_age(sub.age_s(now))} ago", file=out
        )
    removed = sum(r.action in ("removed", "would remove") for r in results)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {removed} of {len(results)} subscription(s)", file=sys.stderr)
    return EXIT_ERROR if failed else EXIT_OK


def cmd_smoke(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.ops.smoke import run_smoke

    checks = run_smoke(attach(args), rows=args.rows, timeout_s=args.timeout, poll_wait_s=args.poll_wait, out=out)
    return EXIT_ERROR if any(check.status == "fail" for check in checks) else EXIT_OK
