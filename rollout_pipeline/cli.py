"""`rollouts`: submit datasets, watch progress, check status, cancel and export batches of an experiment.

Every command attaches to an experiment: by name (`--experiment NAME`, or `ROLLOUTS_EXPERIMENT`) through its
CloudFormation stack `Rollouts-NAME`, or from a `cdk deploy --outputs-file` JSON (`--outputs-file`), or in local
mode (`--endpoint-url http://127.0.0.1:PORT`). Errors print one line on stderr and exit non-zero (no traceback).

Local mode registers its own group: if `rollout_pipeline.local.cli` exists and defines
`register(subparsers, common)`, it is called with this parser's subparsers and the shared experiment options
parser, so `rollouts local ...` appears here without this module knowing about it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from rollout_pipeline import topology
from rollout_pipeline.contracts import BatchAccepted, BatchCompleted, GroupCompleted, RolloutCompleted, RolloutFailed

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130

_DESCRIPTION = """\
Event-driven RL rollouts on Amazon Bedrock AgentCore Runtime.

Submit a dataset, watch its rollouts complete from pushed events, check a batch's status, cancel it, or export
its results as JSON Lines. Region and credentials come from the usual AWS chain (AWS_PROFILE, AWS_REGION, ...).
"""

_EPILOG = """\
examples:
  rollouts submit train.jsonl -e my-exp --group-size 8 --sampling-params '{"temperature": 0.7}'
  rollouts watch -e my-exp --batch train-3f2a9c1b7d4e
  rollouts status -e my-exp --batch train-3f2a9c1b7d4e --json
  rollouts export -e my-exp --batch train-3f2a9c1b7d4e -o results.jsonl
  rollouts report -e my-exp --batch train-3f2a9c1b7d4e -o report.html
  rollouts cancel -e my-exp --batch train-3f2a9c1b7d4e
"""


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


# --------------------------------------------------------------------------------------------------- parsing


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("experiment")
    group.add_argument(
        "-e",
        "--experiment",
        metavar="NAME",
        default=os.environ.get("ROLLOUTS_EXPERIMENT"),
        help="experiment name (stack Rollouts-NAME); default: $ROLLOUTS_EXPERIMENT",
    )
    group.add_argument("--region", help="AWS region (default: the AWS configuration's)")
    group.add_argument(
        "--outputs-file",
        type=Path,
        metavar="FILE",
        help="stack outputs JSON (`cdk deploy --outputs-file`) instead of reading CloudFormation",
    )
    group.add_argument(
        "--endpoint-url",
        default=os.environ.get("ROLLOUTS_ENDPOINT_URL"),
        metavar="URL",
        help="local mode: send every AWS call to this endpoint (default: $ROLLOUTS_ENDPOINT_URL)",
    )
    group.add_argument("-v", "--verbose", action="store_true", help="log what the SDK does")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The `rollouts` argument parser (with the `local` group when local mode provides one)."""
    parser = argparse.ArgumentParser(
        prog="rollouts",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = _common_options()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    submit = sub.add_parser(
        "submit",
        parents=[common],
        help="validate a dataset file and upload it: one batch of rollouts",
        description="Validate a dataset file locally (.jsonl, .jsonl.gz or a .json array), then upload it to the "
        "experiment's input bucket under datasets/. Prints the batch id. Options default to the experiment's.",
    )
    submit.add_argument("file", type=Path, help="dataset file: one JSON object per row; `id` and `_rollout` reserved")
    submit.add_argument("--group-size", type=int, metavar="N", help="rollouts per row (GRPO group size)")
    submit.add_argument("--timeout", type=int, metavar="S", help="deadline of one rollout attempt, seconds")
    submit.add_argument("--max-attempts", type=int, metavar="N", help="attempts per rollout (timeouts are retried)")
    submit.add_argument("--policy-version", metavar="V", help="policy version recorded on every event")
    submit.add_argument("--sampling-params", metavar="JSON", help='e.g. \'{"temperature": 0.7, "max_tokens": 512}\'')
    submit.add_argument("--key", help="object key under datasets/ (default: the file name)")
    submit.add_argument("--watch", action="store_true", help="then watch the batch until it completes")
    submit.add_argument("--poll-wait", type=float, default=5.0, help=argparse.SUPPRESS)
    submit.set_defaults(handler=_cmd_submit)

    watch = sub.add_parser(
        "watch",
        parents=[common],
        help="live progress of a batch (or of every batch) from pushed events",
        description="Show progress from the events the pipeline pushes (never by polling S3). By default events are "
        "read from a private queue subscribed to the event bus, so watching never takes events away from the "
        "trainer; --from-trainer-queue consumes the trainer queue instead (when nobody else reads it).",
    )
    watch.add_argument("--batch", metavar="ID", help="the batch to follow (default: every batch, as a log)")
    watch.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds (default: until done)")
    watch.add_argument(
        "--from-trainer-queue", action="store_true", help="consume the trainer queue instead of a private tap"
    )
    watch.add_argument(
        "--refresh",
        type=float,
        default=15.0,
        metavar="S",
        help="re-read the running/queued split from the ledger every S seconds (0: never; default 15)",
    )
    watch.add_argument("--poll-wait", type=float, default=5.0, help=argparse.SUPPRESS)
    watch.set_defaults(handler=_cmd_watch)

    status = sub.add_parser(
        "status",
        parents=[common],
        help="where a batch stands: queued, running, succeeded, failed by reason, rewards",
        description="Read a batch's counters from the ledger.",
    )
    status.add_argument("--batch", required=True, metavar="ID", help="batch id (printed by submit)")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=_cmd_status)

    cancel = sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a batch: nothing more starts, running sessions are stopped",
        description="Cancel a batch: queued rollouts never start, running ones are stopped, every rollout not yet "
        "finished ends as `Rollout Failed` with reason `cancelled`. Safe to repeat.",
    )
    cancel.add_argument("--batch", required=True, metavar="ID", help="batch id")
    cancel.set_defaults(handler=_cmd_cancel)

    export = sub.add_parser(
        "export",
        parents=[common],
        help="write a batch's results as JSON Lines (one line per rollout)",
        description="Export one line per rollout from the ledger (state, reward, reason, timings) with its result "
        "object from the results bucket.",
    )
    export.add_argument("--batch", required=True, metavar="ID", help="batch id")
    export.add_argument("-o", "--output", default="-", metavar="FILE", help="output file (default: stdout)")
    export.add_argument("--no-results", action="store_true", help="leave out the result objects (ledger only)")
    export.add_argument("--with-payload", action="store_true", help="add each row's payload")
    export.set_defaults(handler=_cmd_export)

    preflight = sub.add_parser(
        "preflight",
        parents=[common],
        help="check, with read calls only, that an experiment can be deployed (run by `make deploy`)",
        description="Check the settings (cdk.json + -c overrides), the model URL, AgentCore in the region, the "
        "account's AgentCore quotas against the limits, and the CDK bootstrap. One line per check; exit 1 on an error.",
    )
    preflight.add_argument(
        "-c",
        "--context",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a CDK context override, as given to `cdk deploy -c` (repeatable)",
    )
    preflight.add_argument("--cdk-dir", type=Path, default=Path(), metavar="DIR", help="where cdk.json is")
    preflight.set_defaults(handler=_cmd_preflight)

    report = sub.add_parser(
        "report",
        parents=[common],
        help="write a batch's report: one self-contained HTML file of charts",
        description="Read a batch from the ledger (status, export rows) and the results bucket, plus recorded "
        "events (--events), and write one HTML file with inline SVG charts (no server, no network to view it). "
        "Needs the `report` extra (matplotlib).",
    )
    report.add_argument("--batch", required=True, metavar="ID", help="batch id")
    report.add_argument("-o", "--output", type=Path, metavar="FILE", help="HTML file (default: report-BATCH.html)")
    report.add_argument(
        "--events",
        type=Path,
        metavar="FILE",
        help="JSON Lines of the batch's event envelopes (result-to-event latency)",
    )
    report.set_defaults(handler=_cmd_report)

    _register_local(sub, common)
    return parser


def _register_local(sub: Any, common: argparse.ArgumentParser) -> None:
    try:
        module = importlib.import_module("rollout_pipeline.local.cli")
    except ModuleNotFoundError as exc:
        if exc.name != "rollout_pipeline.local.cli":
            raise
        return
    register = getattr(module, "register", None)
    if callable(register):
        register(sub, common)


# -------------------------------------------------------------------------------------------------- commands


def _cmd_preflight(args: argparse.Namespace, out: TextIO) -> int:
    import boto3

    from rollout_pipeline import preflight

    if not args.experiment:
        raise CliError("no experiment: pass --experiment NAME (or set ROLLOUTS_EXPERIMENT)")
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


def attach(args: argparse.Namespace) -> Any:
    """The experiment the common options name."""
    from rollout_pipeline.sdk import Experiment

    if args.outputs_file is not None:
        return Experiment.from_outputs(
            _read_outputs(args.outputs_file, args.experiment), region=args.region, endpoint_url=args.endpoint_url
        )
    if not args.experiment:
        raise CliError("no experiment: pass --experiment NAME (or set ROLLOUTS_EXPERIMENT)")
    return Experiment.attach(args.experiment, region=args.region, endpoint_url=args.endpoint_url)


def _read_outputs(path: Path, name: str | None) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"cannot read outputs file {path}: {exc}") from None
    if isinstance(data, dict) and "TrainerQueueUrl" not in data:  # cdk's {stack: {outputs}} form
        stacks = {k: v for k, v in data.items() if isinstance(v, dict)}
        wanted = topology.stack_name(name) if name else None
        if wanted and wanted in stacks:
            data = stacks[wanted]
        elif len(stacks) == 1:
            data = next(iter(stacks.values()))
        else:
            raise CliError(f"{path} holds several stacks ({', '.join(stacks)}): pass --experiment")
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a JSON object of stack outputs")
    return {str(k): str(v) for k, v in data.items()}


def _cmd_submit(args: argparse.Namespace, out: TextIO) -> int:
    sampling = None
    if args.sampling_params:
        try:
            sampling = json.loads(args.sampling_params)
        except json.JSONDecodeError as exc:
            raise CliError(f"--sampling-params is not valid JSON: {exc.msg}") from None
        if not isinstance(sampling, dict):
            raise CliError("--sampling-params must be a JSON object")
    experiment = attach(args)
    batch_id = experiment.submit_file(
        args.file,
        group_size=args.group_size,
        sampling_params=sampling,
        timeout_s=args.timeout,
        max_attempts=args.max_attempts,
        policy_version=args.policy_version,
        key=args.key,
    )
    print(batch_id, file=out)
    print(
        f"submitted {args.file} to experiment {experiment.name} as batch {batch_id}; "
        f"follow it with: rollouts watch -e {experiment.name} --batch {batch_id}",
        file=sys.stderr,
    )
    if args.watch:
        watch_args = argparse.Namespace(
            batch=batch_id, timeout=None, from_trainer_queue=False, refresh=15.0, poll_wait=args.poll_wait
        )
        return _watch(experiment, watch_args, out)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    status = attach(args).status(args.batch)
    if args.json:
        print(json.dumps(status.as_dict(), indent=2), file=out)
        return EXIT_OK
    total = "?" if status.rollouts_total is None else str(status.rollouts_total)
    lines = [
        f"batch      {status.batch_id} ({status.status}{', done' if status.done else ''})",
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


def _cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    report = attach(args).cancel(args.batch)
    print(
        f"batch {args.batch} cancelled: {report.cancelled} rollout(s) cancelled "
        f"({report.sessions_stopped} running session(s) stopped), {report.already_terminal} already finished",
        file=out,
    )
    if report.drain_errors:
        print(f"{len(report.drain_errors)} side effect(s) left to retry: run cancel again", file=sys.stderr)
    return EXIT_OK


def _cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    experiment = attach(args)
    target = out if args.output == "-" else args.output
    count = experiment.export(
        args.batch, target, include_results=not args.no_results, include_payload=args.with_payload
    )
    where = "stdout" if args.output == "-" else args.output
    print(f"exported {count} rollout(s) of batch {args.batch} to {where}", file=sys.stderr)
    return EXIT_OK


def _cmd_report(args: argparse.Namespace, out: TextIO) -> int:
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


def _cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    return _watch(attach(args), args, out)


# ----------------------------------------------------------------------------------------------------- watch


class Progress:
    """Counts of one batch, from a ledger baseline plus pushed events (each rollout counted once)."""

    def __init__(self, batch_id: str) -> None:
        self.batch_id = batch_id
        self.total: int | None = None
        self.succeeded = 0
        self.failed = 0
        self.failed_by_reason: Counter[str] = Counter()
        self.running = 0
        self.reward_sum = 0.0
        self.reward_count = 0
        self.done = False
        self.counted: set[tuple[str, int]] = set()
        self.summary: str | None = None

    @property
    def terminal(self) -> int:
        return self.succeeded + self.failed

    @property
    def pending(self) -> int | None:
        return None if self.total is None else max(0, self.total - self.terminal)

    @property
    def queued(self) -> int | None:
        pending = self.pending
        return None if pending is None else max(0, pending - self.running)

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None

    def baseline(self, experiment: Any) -> None:
        """Start from the ledger: totals and every rollout already terminal (so events are not counted twice)."""
        from rollout_pipeline.ledger.batches import attr
        from rollout_pipeline.sdk.errors import BatchNotFound
        from rollout_pipeline.sdk.status import iter_rollout_items

        try:
            status = experiment.status(self.batch_id)
        except BatchNotFound:  # just uploaded: ingestion has not created it yet; Batch Accepted will tell
            print(f"batch {self.batch_id} is not in the ledger yet: waiting for its events", file=sys.stderr)
            return
        self.total = status.rollouts_total
        if status.status in ("rejected",):
            self.done = True
        self.running = 0
        for item in iter_rollout_items(experiment.client("dynamodb"), experiment.table_name, self.batch_id):
            state = attr(item, "state")
            key = (str(attr(item, "input_id")), int(attr(item, "index", 0)))
            if state == "dispatched":
                self.running += 1
            elif state in ("succeeded", "failed") and key not in self.counted:
                self.counted.add(key)
                if state == "succeeded":
                    self.succeeded += 1
                    reward = attr(item, "reward")
                    if reward is not None:
                        self.reward_sum += float(reward)
                        self.reward_count += 1
                else:
                    self.failed += 1
                    self.failed_by_reason[str(attr(item, "reason") or "unknown")] += 1
        self._check_done(status.rollouts_total is not None and status.status != "ingesting")

    def refresh_running(self, experiment: Any) -> None:
        from rollout_pipeline.ledger.batches import attr
        from rollout_pipeline.sdk.status import iter_rollout_items

        items = iter_rollout_items(experiment.client("dynamodb"), experiment.table_name, self.batch_id, "#state")
        self.running = sum(1 for item in items if attr(item, "state") == "dispatched")

    def apply(self, detail: Any) -> None:
        """Update from one event detail of this batch."""
        if isinstance(detail, RolloutCompleted | RolloutFailed):
            key = (detail.input_id, detail.index)
            if key in self.counted:
                return
            self.counted.add(key)
            self.running = max(0, self.running - 1)
            if isinstance(detail, RolloutCompleted):
                self.succeeded += 1
                self.reward_sum += detail.reward
                self.reward_count += 1
            else:
                self.failed += 1
                self.failed_by_reason[detail.reason.value] += 1
        elif isinstance(detail, BatchAccepted):
            self.total = detail.rollouts_enqueued
            if detail.error:
                self.summary = f"batch {self.batch_id} rejected: {detail.error}"
                self.done = True
        elif isinstance(detail, BatchCompleted):
            self.total = detail.rollouts_total
            self.succeeded, self.failed = detail.succeeded, detail.failed
            self.failed_by_reason = Counter(detail.failed_by_reason)
            if detail.reward_mean is not None:
                self.reward_sum, self.reward_count = detail.reward_mean * detail.reward_count, detail.reward_count
            self.running = 0
            self.done = True
        self._check_done(False)

    def _check_done(self, ingestion_ended: bool) -> None:
        if ingestion_ended and self.total is not None and self.terminal >= self.total:
            self.done = True

    def line(self) -> str:
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.failed_by_reason.items()))
        mean = "-" if self.reward_mean is None else f"{self.reward_mean:.4f}"
        total = "?" if self.total is None else str(self.total)
        queued = "?" if self.queued is None else str(self.queued)
        return (
            f"{self.terminal}/{total} done: {self.succeeded} succeeded, {self.failed} failed"
            f"{f' ({reasons})' if reasons else ''}, {self.running} running, {queued} queued, reward mean {mean}"
        )


def _watch(experiment: Any, args: argparse.Namespace, out: TextIO) -> int:
    timeout: float | None = args.timeout
    poll_wait = float(getattr(args, "poll_wait", 5.0))
    if args.from_trainer_queue:
        stream_cm: Any = experiment.events(batch_id=args.batch, timeout=timeout, poll_wait_s=poll_wait)
    else:
        stream_cm = experiment.tap(batch_id=args.batch, timeout=timeout, poll_wait_s=poll_wait)
    with stream_cm as stream:
        if args.batch is None:
            return _watch_all(stream, out)
        progress = Progress(args.batch)
        progress.baseline(experiment)  # after the tap exists: nothing falls between the two
        refresh = float(getattr(args, "refresh", 15.0))
        render = _renderer(progress)
        try:
            last_refresh = time.monotonic()
            while not progress.done:
                budget = max(poll_wait, 0.5)
                remaining = stream.remaining()
                delivery = stream.next_delivery(budget if remaining is None else min(budget, remaining))
                if delivery is not None and delivery.event is not None:
                    progress.apply(delivery.event.detail)
                    stream.ack(delivery)
                if refresh > 0 and time.monotonic() - last_refresh >= refresh and not progress.done:
                    progress.refresh_running(experiment)
                    last_refresh = time.monotonic()
                render(False)
                if stream.expired():
                    break
        finally:
            render(True)
    print(progress.summary or f"batch {args.batch}: {progress.line()}", file=out)
    return EXIT_OK if progress.done else EXIT_ERROR


def _renderer(progress: Progress) -> Callable[[bool], None]:
    """A rich progress bar on a terminal (stderr); nothing otherwise (the summary line is printed at the end)."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress
    except ImportError:  # pragma: no cover - rich is a dependency of the CLI
        return _no_render
    console = Console(stderr=True)
    if not console.is_terminal:
        return _no_render
    bar = RichProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    task = bar.add_task(progress.batch_id, total=progress.total, info="")
    bar.start()

    def render(final: bool) -> None:
        reasons = sum(progress.failed_by_reason.values())
        mean = "-" if progress.reward_mean is None else f"{progress.reward_mean:.3f}"
        info = (
            f"[green]{progress.succeeded} ok[/] [red]{reasons or progress.failed} failed[/] "
            f"[yellow]{progress.running} running[/] {progress.queued if progress.queued is not None else '?'} queued "
            f"reward {mean}"
        )
        bar.update(task, total=progress.total, completed=progress.terminal, info=info)
        if final:
            bar.stop()

    return render


def _no_render(final: bool) -> None:
    del final


def _watch_all(stream: Any, out: TextIO) -> int:
    """Every batch: one log line per batch-level event and per completed group."""
    for event in stream:
        detail = event.detail
        if isinstance(detail, BatchAccepted):
            text = (
                f"accepted: {detail.rows_accepted} rows ({detail.rows_rejected} rejected), "
                f"{detail.rollouts_enqueued} rollouts"
            )
            if detail.error:
                text = f"rejected: {detail.error}"
        elif isinstance(detail, GroupCompleted):
            mean = "-" if detail.reward_mean is None else f"{detail.reward_mean:.4f}"
            text = f"group {detail.input_id}: {detail.succeeded}/{detail.group_size} succeeded, reward mean {mean}"
        elif isinstance(detail, BatchCompleted):
            mean = "-" if detail.reward_mean is None else f"{detail.reward_mean:.4f}"
            text = f"completed: {detail.succeeded} succeeded, {detail.failed} failed, reward mean {mean}"
        elif isinstance(detail, RolloutFailed):
            text = f"rollout {detail.rollout_id} failed: {detail.reason.value}: {detail.error[:200]}"
        else:
            continue
        print(f"{detail.batch_id} {text}", file=out, flush=True)
    return EXIT_OK


# ------------------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Entry point of `rollouts`; returns the exit code (0 ok, 1 error, 2 usage, 130 interrupted)."""
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
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
