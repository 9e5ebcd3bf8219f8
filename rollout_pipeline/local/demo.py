"""The demo: drop a dataset into the local pipeline's input bucket and show the pushed events as they arrive.

Exit code 0 only when the batch completed, at least one rollout succeeded, every rollout ended, no session was left
running and no message was dead-lettered. A rollout whose model replies the agent host saw cut short, empty or failed
(its event's `warning`, `agent.replies`) is shown with the warning, and the summary counts them. With a warm pool
(`--warm-sessions N`), the batch is submitted once the pool holds its sessions (the pause of a GRPO step's training
phase): each rollout says whether it started in a warm session, the summary counts them beside the local AgentCore's
own counts (warm-ups the agent host answered, rollouts run in a warm session) and what the warm sessions' idle memory
would cost, and the pool is stopped before the sessions left are counted.
The settings and the dataset are checked before anything starts (one-line errors naming the setting or the user's
file and line); Ctrl-C stops the run at once and prints what was seen so far.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources as package_resources
from pathlib import Path
from typing import Any, Final, TextIO

from rollout_pipeline import ids
from rollout_pipeline.cli.base import clipped
from rollout_pipeline.contracts import (
    BatchAccepted,
    BatchCompleted,
    BudgetExhausted,
    DetailType,
    RolloutCompleted,
    RolloutFailed,
)
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.local.model_server import DEFAULT_MAX_TOKENS
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings, interrupt_on_signals
from rollout_pipeline.report.data import has_signal
from rollout_pipeline.sdk import submission, transport
from rollout_pipeline.sdk.errors import DatasetInvalid
from rollout_pipeline.sdk.events import Group
from rollout_pipeline.sdk.transport import NO_REWARD_SIGNAL

#: Bundled datasets by name: file, and the sampling `max_tokens` their answers need. "arithmetic" (single-digit
#: sums, answered with a number) is one SmolLM2-135M gets right about 30% of the time (README), so its GRPO groups carry
#: signal; "gsm8k" (word problems) is kept for a real policy model (`--model-url`): the 135M model scores ~0 on it.
BUNDLED_DATASETS: Final = {"arithmetic": ("arithmetic_sample.jsonl", 32), "gsm8k": ("gsm8k_sample.jsonl", 256)}
DEFAULT_DATASET: Final = "arithmetic"
#: When the demo's budget runs out it waits (at most this long) for the rollouts in flight to finish, so the pause
#: shows, then raises the budget by this factor, as `rollouts budget set` would.
PAUSE_SHOWN_S: Final = 120.0
BUDGET_RAISE: Final = 100.0


def sample_dataset_path(name: str = DEFAULT_DATASET) -> Path:
    """A sample dataset shipped with the library (`BUNDLED_DATASETS`)."""
    file_name, _ = BUNDLED_DATASETS[name]
    return Path(str(package_resources.files("rollout_pipeline.sample_data").joinpath(file_name)))


def resolve_dataset(value: str | Path | None) -> tuple[Path, int]:
    """`--dataset`: a bundled name (default "arithmetic") or a path -> (file, default `max_tokens` for it: the bundled
    dataset's, else `local up`'s, `DEFAULT_MAX_TOKENS`)."""
    name = str(value) if value is not None else DEFAULT_DATASET
    if name in BUNDLED_DATASETS:
        return sample_dataset_path(name), BUNDLED_DATASETS[name][1]
    return Path(name), DEFAULT_MAX_TOKENS


def first_rows(source: Path, rows: int, directory: Path) -> Path:
    """A copy of a `.jsonl` file up to its `rows`-th non-blank line (same file name): a prefix of it, blank lines
    kept, so a line number in the copy is the same line of the source."""
    target = directory / source.name
    kept = 0
    with source.open("rb") as src, target.open("wb") as dst:
        for line in src:
            if kept >= rows:
                break
            dst.write(line if line.endswith(b"\n") else line + b"\n")
            kept += bool(line.strip())
    return target


def prepare_upload(source: Path, rows: int | None, directory: Path) -> Path:
    """The file the demo uploads: the first `rows` rows of a `.jsonl` file (a copy in `directory`), else the file.

    Checked as `rollouts submit` and ingestion check it (key, reader, rows), before anything starts: a problem raises
    `DatasetInvalid` naming the user's file (never the copy) and the line."""
    if not source.is_file():
        raise DatasetInvalid(str(source), [("", "no such file")])
    try:
        submission.dataset_key(source)
    except ids.InvalidId as exc:
        raise DatasetInvalid(str(source), [("", f"invalid_key: {exc}")]) from None
    upload = first_rows(source, rows, directory) if rows and source.suffix == ".jsonl" else source
    try:
        submission.validate_file(upload)
    except DatasetInvalid as exc:
        if upload == source:
            raise
        raise DatasetInvalid(str(source), exc.problems, exc.total) from None
    return upload


@dataclass
class DemoResult:
    """What the demo saw."""

    batch_id: str = ""
    accepted: BatchAccepted | None = None
    completed: BatchCompleted | None = None
    rollouts_ok: int = 0
    rollouts_failed: dict[str, int] = field(default_factory=dict)
    groups: int = 0
    #: Groups whose rewards differ (non-zero GRPO advantages: the groups that carry gradient).
    groups_with_signal: int = 0
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)
    report_path: Path | None = None
    report_error: str | None = None
    notify_latencies_ms: list[float] = field(default_factory=list)
    sessions_left: list[str] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    #: The whole run (start-up included); the batch's own duration is `completed.duration_s`.
    elapsed_s: float = 0.0
    #: Rollouts whose model replies the agent host saw cut short, empty or failed (their event's `warning`).
    model_warnings: int = 0
    budget_warnings: int = 0
    budget_exhaustions: int = 0
    #: Rollouts that ended after dispatch paused on the budget (those already in flight), and those that waited.
    ended_after_pause: int = 0
    waited_on_budget: int = 0
    #: Ctrl-C (or SIGTERM) stopped the run before the batch completed.
    interrupted: bool = False
    #: The warm pool: sessions it held when the batch was submitted, rollouts that started in one, the local
    #: AgentCore's warm-ups and rollouts in warm sessions, the pool's sessions stopped at the end, and the idle
    #: memory of every warm session (GB-s; USD at the experiment's prices, `warm_priced_as`).
    warm_ready: int | None = None
    warm_started: int = 0
    warmups: int = 0
    warm_reuses: int = 0
    warm_stopped: int = 0
    warm_idle_gb_s: float = 0.0
    warm_idle_usd: float = 0.0
    warm_priced_as: str = ""

    @property
    def ok(self) -> bool:
        """The batch completed with at least one rollout succeeded, every rollout ended, every session stopped and
        nothing dead-lettered."""
        return (
            self.completed is not None
            and self.accepted is not None
            and self.rollouts_ok > 0
            and self.rollouts_ok + sum(self.rollouts_failed.values()) == self.accepted.rollouts_enqueued
            and not self.sessions_left
            and not any(self.dead_letters.values())
        )


class _Display:
    """Progress bar plus one line per event, with rich when the output is a terminal, plain lines otherwise."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(file=out, highlight=False, soft_wrap=True)
        self.progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[summary]}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
            disable=not self.console.is_terminal,
        )
        self.task = self.progress.add_task("rollouts", total=None, summary="waiting for Batch Accepted")

    def __enter__(self) -> _Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def line(self, text: str) -> None:
        self.progress.console.print(text)

    def update(self, report: DemoResult, running: int) -> None:
        total = report.accepted.rollouts_enqueued if report.accepted else None
        done = report.rollouts_ok + sum(report.rollouts_failed.values())
        failed = sum(report.rollouts_failed.values())
        queued = max(0, (total or 0) - done - running)
        summary = f"ok {report.rollouts_ok} | failed {failed} | running {running} | queued {queued}"
        self.progress.update(self.task, total=total, completed=done, summary=summary)


def _numbers(values: list[float | None], *, signed: bool = False) -> str:
    return " ".join("  -  " if v is None else (f"{v:+.2f}" if signed else f"{v:.2f}") for v in values)


def _latency_ms(detail: RolloutCompleted | RolloutFailed) -> float | None:
    timings = detail.timings
    if timings.finished_at and timings.notified_at:
        return (timings.notified_at - timings.finished_at).total_seconds() * 1000
    return None


def _not_the_reward_signal_warning(record: logging.LogRecord) -> bool:
    return not getattr(record, NO_REWARD_SIGNAL, False)


def watch_batch(pipeline: LocalPipeline, batch_id: str, report: DemoResult, out: TextIO, timeout_s: float) -> None:
    """Consume the batch's events (pushed to its own subscription, never polled from S3) until Batch Completed.
    The SDK's "no reward signal" warning is left to the summary (`print_summary`)."""
    sdk_log = logging.getLogger(transport.__name__)
    sdk_log.addFilter(_not_the_reward_signal_warning)
    try:
        _watch_batch(pipeline, batch_id, report, out, timeout_s)
    finally:
        sdk_log.removeFilter(_not_the_reward_signal_warning)


def _watch_batch(pipeline: LocalPipeline, batch_id: str, report: DemoResult, out: TextIO, timeout_s: float) -> None:
    stream = pipeline.experiment.events(batch_id=batch_id, timeout=timeout_s)
    prices = pipeline.experiment.price_book()
    with _Display(out) as display, stream:  # the stream's subscription goes while the local endpoint is up
        for event in stream:
            detail: Any = event.detail
            report.events.append(event.envelope)
            if event.detail_type is DetailType.BATCH_ACCEPTED:
                report.accepted = detail
                display.line(
                    f"Batch Accepted   {detail.rows_accepted} rows accepted, {detail.rows_rejected} rejected, "
                    f"{detail.rollouts_enqueued} rollouts queued"
                )
            elif event.detail_type is DetailType.ROLLOUT_COMPLETED:
                report.rollouts_ok += 1
                warm = ", warm session" if detail.timings.session_warmed_at else ""
                display.line(
                    f"Rollout Completed {detail.rollout_id:<14} reward {detail.reward:.2f} (attempt {detail.attempt}"
                    f"{warm})" + (f" cost ${detail.cost.usd:.6f}" if detail.cost is not None else "")
                )
            elif event.detail_type is DetailType.ROLLOUT_FAILED:
                report.rollouts_failed[str(detail.reason)] = report.rollouts_failed.get(str(detail.reason), 0) + 1
                display.line(f"Rollout Failed    {detail.rollout_id:<14} {detail.reason}: {clipped(detail.error)}")
            elif event.detail_type is DetailType.GROUP_COMPLETED:
                report.groups += 1
                advantages = Group(completed=detail).advantages()
                if has_signal(detail.rewards):
                    report.groups_with_signal += 1
                display.line(
                    f"Group Completed   {detail.input_id:<14} rewards [{_numbers(detail.rewards)}] "
                    f"advantages [{_numbers(advantages, signed=True)}]"
                )
            elif event.detail_type is DetailType.BATCH_COMPLETED:
                report.completed = detail
            elif event.detail_type is DetailType.BUDGET_WARNING:
                report.budget_warnings += 1
                display.line(
                    f"Budget Warning    ${detail.spent_usd:.6f} of ${detail.budget_usd:.6f} spent "
                    f"({detail.spent_usd / detail.budget_usd:.0%}): at 100% dispatch pauses"
                )
            elif event.detail_type is DetailType.BUDGET_EXHAUSTED:
                report.budget_exhaustions += 1
                display.line(
                    f"Budget Exhausted  ${detail.spent_usd:.6f} of ${detail.budget_usd:.6f} spent: dispatch paused; "
                    f"{detail.rollouts_in_flight} in flight finish, {detail.rollouts_waiting} wait (queued)"
                )
                _show_pause_then_raise(pipeline, report, detail, display)
            if isinstance(detail, RolloutCompleted | RolloutFailed):
                if detail.warning:
                    report.model_warnings += 1
                    display.line(f"  WARNING {detail.rollout_id}: {detail.warning}")
                _count_warm(report, detail, prices)
                latency = _latency_ms(detail)
                if latency is not None:
                    report.notify_latencies_ms.append(latency)
            display.update(report, running=len(pipeline.active_sessions()))
            if report.completed is not None:
                break


def _count_warm(report: DemoResult, detail: RolloutCompleted | RolloutFailed, prices: PriceBook) -> None:
    """A rollout that started in a warm session: counted, and its session's wait before it (idle memory, at the
    experiment's `prices`)."""
    warmed, dispatched = detail.timings.session_warmed_at, detail.timings.dispatched_at
    if warmed is None:
        return
    report.warm_started += 1
    if dispatched is not None:
        waited = max(0.0, (dispatched - warmed).total_seconds())
        report.warm_idle_gb_s += prices.memory_gb_s(waited)
        report.warm_idle_usd += prices.memory_usd(waited)


def _warm_lines(report: DemoResult) -> list[str]:
    if report.warm_ready is None:
        return []
    total = report.accepted.rollouts_enqueued if report.accepted else "?"
    return [
        f"  warm pool: {report.warm_started} of {total} rollouts started in a warm session ({report.warm_ready} "
        f"ready at submission); local AgentCore: {report.warmups} warm-ups answered by the agent host, "
        f"{report.warm_reuses} rollouts in a warm session; {report.warm_stopped} warm session(s) stopped at the end",
        f"  warm sessions' idle memory: {report.warm_idle_gb_s:,.0f} GB-s = ${report.warm_idle_usd:.4f} "
        f"({report.warm_priced_as})",
    ]


def _show_pause_then_raise(
    pipeline: LocalPipeline, report: DemoResult, exhausted: BudgetExhausted, display: _Display
) -> None:
    """The budget ran out: wait for the rollouts in flight to finish (nothing new starts), then raise the budget as
    `rollouts budget set` would, so the batch completes."""
    ended_before = pipeline.experiment.batches.status(report.batch_id).terminal
    deadline = time.monotonic() + PAUSE_SHOWN_S
    status = pipeline.experiment.batches.status(report.batch_id)
    while status.running and time.monotonic() < deadline:  # those in flight finish; nothing new starts
        time.sleep(0.5)
        status = pipeline.experiment.batches.status(report.batch_id)
    report.ended_after_pause = status.terminal - ended_before
    report.waited_on_budget = status.queued or 0
    display.line(
        f"  paused: {status.running} running, {status.terminal} ended ({report.ended_after_pause} of them after the "
        f"pause), {status.queued} queued, {status.failed} failed"
    )
    raised = exhausted.budget_usd * BUDGET_RAISE
    pipeline.experiment.cost.set_budget(raised)
    display.line(
        f"  raising the budget to ${raised:.4f}, as `rollouts budget set -e {pipeline.experiment.name} {raised:.4f}` "
        "would: dispatch resumes where it stopped"
    )


def print_summary(report: DemoResult, out: TextIO) -> None:
    done = report.completed
    if done is not None:
        duration = "?" if done.duration_s is None else f"{done.duration_s:.1f} s"
        head = f"COMPLETED in {duration} (the whole run, start-up included: {report.elapsed_s:.1f} s)"
    elif report.interrupted:
        head = f"INTERRUPTED after {report.elapsed_s:.1f} s (the local pipeline was stopped)"
    else:
        head = f"NOT COMPLETED after {report.elapsed_s:.1f} s"
    lines = ["", f"batch {report.batch_id}: {head}"]
    if done is None:
        ended = report.rollouts_ok + sum(report.rollouts_failed.values())
        total = "?" if report.accepted is None else str(report.accepted.rollouts_enqueued)
        lines.append(
            f"  rollouts ended so far: {ended} of {total}: {report.rollouts_ok} succeeded, "
            f"{sum(report.rollouts_failed.values())} failed {report.rollouts_failed or ''}".rstrip()
        )
    if done is not None:
        mean = "n/a" if done.reward_mean is None else f"{done.reward_mean:.3f}"
        std = "n/a" if done.reward_std is None else f"{done.reward_std:.3f}"
        lines.append(
            f"  rollouts {done.rollouts_total}: {done.succeeded} succeeded, {done.failed} failed "
            f"{dict(done.failed_by_reason) or ''}".rstrip()
        )
        lines.append(f"  reward mean {mean} (std {std}, over {done.reward_count} rollouts)")
    if report.groups:
        share = 100 * report.groups_with_signal / report.groups
        lines.append(
            f"  groups {report.groups}: {report.groups_with_signal} ({share:.0f}%) with rewards that differ "
            "(non-zero GRPO advantages: the groups a trainer learns from)"
        )
    if report.notify_latencies_ms:
        values = sorted(report.notify_latencies_ms)
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        lines.append(
            f"  result written -> event published: median {statistics.median(values):.0f} ms, p95 {p95:.0f} ms"
        )
    lines += _warm_lines(report)
    if done is not None and done.cost is not None:
        cost = done.cost
        per = cost.usd / cost.rollouts if cost.rollouts else 0.0
        lines.append(
            f"  cost ${cost.usd:.6f} (${per:.6f} per rollout; AgentCore memory ${cost.agentcore_memory_usd:.6f}, "
            f"CPU ${cost.agentcore_cpu_usd:.6f} measured for {cost.cpu_measured} of {cost.rollouts}, pipeline "
            f"${cost.pipeline_usd:.6f}): what this run would cost on AgentCore (docs/costs.md)"
        )
    if report.budget_exhaustions:
        lines.append(
            f"  budget: {report.budget_warnings} warning, {report.budget_exhaustions} exhausted; dispatch paused with "
            f"{report.waited_on_budget} rollouts queued, resumed when the budget was raised"
        )
    if report.model_warnings:
        lines.append(
            f"  WARNING model replies: {report.model_warnings} rollout(s) computed their result from a reply the "
            "agent host saw cut short, empty or failed (each rollout's `warning` above; the agents' logs in the work "
            "directory have each reply)"
        )
    warning = done.reward_signal_warning if done is not None else None
    if warning:
        lines.append(f"  WARNING {warning}")
    if done is not None and report.rollouts_ok == 0:
        lines.append("  FAILED no rollout succeeded: see the errors above (and the agents' logs in the work directory)")
    if report.interrupted:
        lines.append(f"  sessions running when interrupted: {len(report.sessions_left)} (stopped with the pipeline)")
    else:
        lines.append(f"  sessions left running: {len(report.sessions_left)}")
    lines.append(f"  dead-lettered messages: {sum(report.dead_letters.values())}")
    if report.report_path is not None:
        lines.append(f"  report: {report.report_path}")
    elif report.report_error:
        lines.append(f"  report not written: {report.report_error}")
    print("\n".join(lines), file=out, flush=True)


def run_demo(
    settings: LocalSettings,
    *,
    dataset: Path | None = None,
    rows: int | None = 6,
    timeout_s: float = 900.0,
    write_html_report: bool = True,
    report_path: Path | None = None,
    out: TextIO,
) -> DemoResult:
    """Start the local pipeline, submit the dataset through the input bucket, watch it to the end, stop.

    With `write_html_report`, the batch's HTML report (as `rollouts report` writes it) goes to `report_path`
    (default: `report-BATCH.html` in the run's work directory) once the batch completed."""
    report = DemoResult()
    source = dataset or sample_dataset_path()
    started = time.monotonic()
    settings.validate()  # a bad setting is one line (`ConfigError`), before anything starts
    with interrupt_on_signals(), tempfile.TemporaryDirectory(prefix="rollouts-demo-") as tmp:
        upload = prepare_upload(source, rows, Path(tmp))  # a bad dataset too (`DatasetInvalid`, the user's file)
        print(f"starting the local pipeline (experiment {settings.experiment!r}) ...", file=out, flush=True)
        with LocalPipeline(settings) as pipeline:
            print(
                f"  AWS (moto) {pipeline.endpoint_url} | model {pipeline.model_url} ({settings.model_id}) | "
                f"agent {settings.agent_module} ({settings.agent_kind}) | logs {pipeline.work_dir}",
                file=out,
                flush=True,
            )
            if settings.warm_sessions:
                report.warm_ready = _wait_for_warm_pool(pipeline, settings, out, timeout_s)
            report.batch_id = pipeline.experiment.batches.submit_file(upload, group_size=settings.group_size)
            print(f"uploaded {upload.name} to the input bucket: batch {report.batch_id}", file=out, flush=True)
            try:
                watch_batch(pipeline, report.batch_id, report, out, timeout_s)
            except KeyboardInterrupt:
                report.interrupted = True
                report.sessions_left = pipeline.active_sessions()  # running now: they end with the pipeline
                print("interrupted: stopping the local pipeline ...", file=out, flush=True)
                pipeline.begin_stop()  # every consumer told to stop now, before anything they call goes away
            report.elapsed_s = time.monotonic() - started
            if settings.warm_sessions and not report.interrupted:
                _stop_warm_pool(pipeline, report)
            if not report.interrupted:
                report.sessions_left = _sessions_after_grace(pipeline)
            report.dead_letters = pipeline.dead_letters()
            if write_html_report and report.completed is not None:
                _write_report(pipeline, report, report_path or pipeline.work_dir / f"report-{report.batch_id}.html")
    print_summary(report, out)
    return report


def _wait_for_warm_pool(pipeline: LocalPipeline, settings: LocalSettings, out: TextIO, timeout_s: float) -> int:
    """Wait (bounded by `timeout_s`) until the warm pool holds what it aims at (`--warm-sessions`, at most
    `--max-sessions`); returns how many idle warm sessions it holds. The submission comes after: a step's batch
    after its training phase."""
    wanted = (
        settings.max_sessions
        if settings.warm_sessions == "auto"
        else min(int(settings.warm_sessions), settings.max_sessions)
    )
    capped = settings.warm_sessions != "auto" and int(settings.warm_sessions) > settings.max_sessions
    print(
        f"warm pool: starting {wanted} session(s) ahead of the batch"
        + (f" ({settings.warm_sessions} asked: capped by --max-sessions {settings.max_sessions})" if capped else "")
        + " ...",
        file=out,
        flush=True,
    )
    deadline = time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline:
        idle = pipeline.experiment.capacity.warm_pool().idle
        if idle >= wanted:
            break
        time.sleep(0.5)
    print(f"warm pool: {idle} session(s) ready (each warm-up answered by the agent host); submitting", file=out)
    return idle


def _stop_warm_pool(pipeline: LocalPipeline, report: DemoResult) -> None:
    """Stop the pool's sessions (refilled while the batch ran: nothing else would use them) and read the counts."""
    report.warm_stopped = pipeline.experiment.capacity.stop_warm_pool(runtime=pipeline.runtime)
    status = pipeline.experiment.capacity.warm_pool()
    report.warm_idle_gb_s += status.idle_gb_s
    report.warm_idle_usd += status.idle_usd
    report.warm_priced_as = status.prices.label
    report.warmups = int(getattr(pipeline.runtime, "warmups", 0))
    report.warm_reuses = int(getattr(pipeline.runtime, "warm_reuses", 0))


def _write_report(pipeline: LocalPipeline, report: DemoResult, path: Path) -> None:
    from rollout_pipeline.report import ReportUnavailable, write_report

    try:
        data = write_report(pipeline.experiment, report.batch_id, path, report.events)
    except ReportUnavailable as exc:
        report.report_error = str(exc)
        return
    # What the report was drawn from, to redraw it later (`render(ReportData.from_json(...))`) once moto is gone.
    path.with_suffix(".json").write_text(data.to_json(), encoding="utf-8")
    report.report_path = path


def _sessions_after_grace(pipeline: LocalPipeline, grace_s: float = 5.0) -> list[str]:
    """Sessions still running a little after the last event (the stop call follows the event closely)."""
    deadline = time.monotonic() + grace_s
    while True:
        left = pipeline.active_sessions()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
