"""`rollouts watch`: live progress of a batch from pushed events, over a ledger baseline read through the SDK."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rollout_pipeline.cli.base import EXIT_ERROR, EXIT_OK, CliError, clipped
from rollout_pipeline.contracts import BatchAccepted, BatchCompleted, GroupCompleted, RolloutCompleted, RolloutFailed

if TYPE_CHECKING:
    from rollout_pipeline.sdk import Experiment

#: How long `rollouts watch --batch ID` waits for a batch the ledger does not hold (an upload that ingestion has not
#: read yet takes seconds) before it says there is no such batch. `submit --watch` waits for its own upload.
MISSING_BATCH_GRACE_S = 20.0
#: How long `rollouts watch --batch ID --events FILE` waits, after the batch's end, for rollouts' events that come
#: after `Batch Completed` (two last rollouts ending together publish in either order; usually well under a second).
EVENTS_GRACE_S = 10.0


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

    def baseline(self, experiment: Experiment) -> bool:
        """Start from the ledger: totals and every rollout already terminal (so events are not counted twice).
        False when the batch is not in the ledger (yet)."""
        from rollout_pipeline.sdk.errors import BatchNotFound

        try:
            status = experiment.batches.status(self.batch_id)
        except BatchNotFound:  # just uploaded: ingestion has not created it yet; Batch Accepted will tell
            return False
        self.total = status.rollouts_total
        if status.status in ("rejected",):
            self.done = True
        self.running = 0
        for rollout in experiment.batches.rollout_states(self.batch_id):
            key = (str(rollout.input_id), rollout.index or 0)
            if rollout.state == "dispatched":
                self.running += 1
            elif rollout.state in ("succeeded", "failed") and key not in self.counted:
                self.counted.add(key)
                if rollout.state == "succeeded":
                    self.succeeded += 1
                    if rollout.reward is not None:
                        self.reward_sum += rollout.reward
                        self.reward_count += 1
                else:
                    self.failed += 1
                    self.failed_by_reason[rollout.reason or "unknown"] += 1
        self._check_done(status.rollouts_total is not None and status.status != "ingesting")
        return True

    def refresh_running(self, experiment: Experiment) -> None:
        """Re-read how many rollouts are running (a states-only read of the batch's rollouts)."""
        states = experiment.batches.rollout_states(self.batch_id, states_only=True)
        self.running = sum(1 for rollout in states if rollout.state == "dispatched")

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


class EventLog:
    """`--events FILE`: every event received, one envelope per line (JSON Lines), appended as it arrives; the file
    `rollouts report --events` reads (`report.data.read_events`)."""

    def __init__(self, handle: TextIO | None) -> None:
        self._handle = handle
        self._seen: set[str] = set()

    @property
    def active(self) -> bool:
        """True when the events are written to a file."""
        return self._handle is not None

    def write(self, event: Any) -> None:
        """Append `event` (an SDK `Event`) once: a redelivered copy of an event already written is skipped."""
        if self._handle is None or event is None or event.event_id in self._seen:
            return
        self._seen.add(event.event_id)
        self._handle.write(json.dumps(event.envelope, separators=(",", ":"), default=str) + "\n")
        self._handle.flush()


@contextlib.contextmanager
def event_log(path: Path | None) -> Iterator[EventLog]:
    """An `EventLog` appending to `path` (created with its folder), or one that writes nothing."""
    if path is None:
        yield EventLog(None)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        yield EventLog(handle)


def watch(experiment: Experiment, args: argparse.Namespace, out: TextIO) -> int:
    """Follow one batch (`args.batch`) to its end with a progress bar, or log every batch's events; with
    `--from-start`, log every event of the batch from its first (those before, rebuilt from the ledger) to its end;
    with `--events FILE`, every event received is also appended to FILE."""
    with event_log(getattr(args, "events", None)) as log:
        return _watch(experiment, args, out, log)


def _watch(experiment: Experiment, args: argparse.Namespace, out: TextIO, log: EventLog) -> int:
    timeout: float | None = args.timeout
    poll_wait = float(getattr(args, "poll_wait", 5.0))
    from_start = bool(getattr(args, "from_start", False))
    if from_start and args.batch is None:
        raise CliError("--from-start needs --batch: the batch whose events to start from")
    if from_start and args.from_trainer_queue:
        raise CliError("--from-start reads a stream of the batch's own: not with --from-trainer-queue")
    if from_start:
        stream_cm: Any = experiment.events(batch_id=args.batch, timeout=timeout, poll_wait_s=poll_wait, from_start=True)
    elif args.from_trainer_queue:
        stream_cm = experiment.events(
            batch_id=args.batch, timeout=timeout, poll_wait_s=poll_wait, from_trainer_queue=True
        )
    else:
        stream_cm = experiment.events.tap(batch_id=args.batch, timeout=timeout, poll_wait_s=poll_wait)
    with stream_cm as stream:
        if args.batch is None:
            return _watch_all(stream, out, log)
        if from_start:
            return _watch_from_start(stream, args.batch, out, log)
        progress = Progress(args.batch)
        found = progress.baseline(experiment)  # after the tap exists: nothing falls between the two
        if not found:
            print(f"batch {args.batch} is not in the ledger yet: waiting for its events", file=sys.stderr)
        missing = _MissingBatch(
            experiment, progress, None if found else getattr(args, "missing_batch_grace", MISSING_BATCH_GRACE_S)
        )
        refresh = float(getattr(args, "refresh", 15.0))
        render = _renderer(progress)
        try:
            last_refresh = time.monotonic()
            while not progress.done:
                budget = max(poll_wait, 0.5)
                remaining = stream.remaining()
                delivery = stream.next_delivery(budget if remaining is None else min(budget, remaining))
                if delivery is not None and delivery.event is not None:
                    log.write(delivery.event)
                    progress.apply(delivery.event.detail)
                    stream.ack(delivery)
                if missing.waiting():
                    missing.check()
                elif refresh > 0 and time.monotonic() - last_refresh >= refresh and not progress.done:
                    progress.refresh_running(experiment)
                    last_refresh = time.monotonic()
                render(False)
                if stream.expired():
                    break
            if progress.done:
                _drain(stream, log, progress)
        finally:
            render(True)
    print(progress.summary or f"batch {args.batch}: {progress.line()}", file=out)
    return EXIT_OK if progress.done else EXIT_ERROR


class _MissingBatch:
    """A batch the ledger did not hold when the watch began: after `grace_s` (None: never) without its events, one
    more look at the ledger, then `CliError` naming the batches the experiment has."""

    def __init__(self, experiment: Experiment, progress: Progress, grace_s: float | None) -> None:
        self.experiment, self.progress, self.grace_s = experiment, progress, grace_s
        self.since = time.monotonic()

    def waiting(self) -> bool:
        return self.grace_s is not None and self.progress.total is None

    def check(self) -> None:
        if self.grace_s is None or time.monotonic() - self.since < self.grace_s:
            return
        if not self.progress.baseline(self.experiment):
            raise CliError(no_such_batch(self.experiment, self.progress.batch_id, self.grace_s))
        self.grace_s = None


def no_such_batch(experiment: Experiment, batch_id: str, waited_s: float) -> str:
    """The error for a batch the experiment does not hold, with the closest of its recent batches."""
    import difflib

    from rollout_pipeline.sdk.errors import SdkError

    head = f"no batch {batch_id!r} in experiment {experiment.name!r} (none arrived within {waited_s:.0f} s)"
    try:
        recent = experiment.batches.recent()
    except SdkError:  # a role that may not list batches: the error without the list
        return head
    close = difflib.get_close_matches(batch_id, recent, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    listed = f"its newest: {', '.join(recent[:5])}" if recent else "it has no batches yet"
    return f"{head}: {hint}{listed}"


def _drain(stream: Any, log: EventLog, progress: Progress) -> None:
    """Log the events delivered after the batch's end: a queue keeps no order, and the batch's last two rollouts can
    end together, one publishing `Batch Completed` before the other's own event. With `--events`, wait (at most
    `EVENTS_GRACE_S`, within the watch's timeout) for each rollout whose end the watch has not seen yet; else take
    only what is already there."""
    deadline = time.monotonic() + EVENTS_GRACE_S
    for _ in range(1000):
        unseen = 0 if progress.total is None else progress.total - len(progress.counted)
        wait = max(0.0, deadline - time.monotonic()) if log.active and unseen > 0 else 0.0
        remaining = stream.remaining()
        delivery = stream.next_delivery(wait if remaining is None else min(wait, remaining))
        if delivery is None:
            return
        if delivery.event is not None:
            log.write(delivery.event)
            detail = delivery.event.detail
            if isinstance(detail, RolloutCompleted | RolloutFailed):  # counted by `Batch Completed` already
                progress.counted.add((detail.input_id, detail.index))
        stream.ack(delivery)


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


def _watch_all(stream: Any, out: TextIO, log: EventLog) -> int:
    """Every batch: one log line per batch-level event, per completed group and per failed rollout."""
    for event in stream:
        log.write(event)
        text = event_line(event.detail, rollouts=False)
        if text is not None:
            print(f"{event.detail.batch_id} {text}", file=out, flush=True)
    return EXIT_OK


def _watch_from_start(stream: Any, batch_id: str, out: TextIO, log: EventLog) -> int:
    """One batch from its first event: one log line per event (those before the watch rebuilt from the ledger,
    marked `(from the ledger)`), until `Batch Completed`; then the summary line."""
    progress = Progress(batch_id)
    while not progress.done:
        delivery = stream.next_delivery(stream.remaining())
        if delivery is None:
            if stream.expired() or stream.closed:
                break
            continue
        event = delivery.event
        log.write(event)
        text = event_line(event.detail, rollouts=True)
        if text is not None:
            origin = " (from the ledger)" if not delivery.receipt else ""
            print(f"{event.detail_type.value:<17} {text}{origin}", file=out, flush=True)
        progress.apply(event.detail)
        stream.ack(delivery)
    if progress.done:
        _drain(stream, log, progress)
    print(progress.summary or f"batch {batch_id}: {progress.line()}", file=out)
    return EXIT_OK if progress.done else EXIT_ERROR


def event_line(detail: Any, *, rollouts: bool) -> str | None:
    """One log line of an event (without its batch); rollout completions only with `rollouts`, else None."""
    if isinstance(detail, BatchAccepted):
        text = (
            f"rejected: {detail.error}"
            if detail.error
            else f"accepted: {detail.rows_accepted} rows ({detail.rows_rejected} rejected), "
            f"{detail.rollouts_enqueued} rollouts"
        )
        return text + "".join(f"\n  warning: {warning}" for warning in detail.warnings)
    if isinstance(detail, GroupCompleted):
        mean = "-" if detail.reward_mean is None else f"{detail.reward_mean:.4f}"
        return f"group {detail.input_id}: {detail.succeeded}/{detail.group_size} succeeded, reward mean {mean}"
    if isinstance(detail, BatchCompleted):
        mean = "-" if detail.reward_mean is None else f"{detail.reward_mean:.4f}"
        return f"completed: {detail.succeeded} succeeded, {detail.failed} failed, reward mean {mean}"
    if isinstance(detail, RolloutFailed):
        return f"rollout {detail.rollout_id} failed: {detail.reason.value}: {clipped(detail.error, 200)}"
    if isinstance(detail, RolloutCompleted) and rollouts:
        return f"rollout {detail.rollout_id} reward {detail.reward:.4f} (attempt {detail.attempt})"
    return None
