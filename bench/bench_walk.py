"""The walk of one upload and one result through the library: how many rooms (modules) a reader visits.

One in-process run on moto (no local mode, no network): a one-row dataset is uploaded and ingested
(`Ingestion.handle_message`, the upload walk), its rollouts are dispatched to the fake AgentCore, and one result
is completed (`lifecycle.completion.complete_records`, the result walk, its session's stop included). Each walk
runs twice; the second run is traced with `sys.settrace`, so lazy imports and client creation do not count. The
upload is walked with the release window on (the default) and off (`release_window` 0).

The figures, per walk:

- functions: distinct library functions the walk enters, leaving out leaf helpers (a function that, in this
  run, never calls another library function than itself: a parser, a key builder, a codec, a property);
- file changes: how often the walk moves from one module to another (a call into, or a return to, a function in
  another file; in-file steps do not count);
- returns: moves into a module the walk had already left (a return to a room already left);
- steps: calls of non-leaf functions;
- batch reads: reads of the batch view (`BatchLedger.read_batch`, one Query each).

Test scaffolding (`local/`, the fake AgentCore) is not part of the walk. The walk does not depend on timing: the
pipeline runs on a clock that moves only when it sleeps (`StillTime`), and only the thread that carries the walk
is traced, with each piece of work it hands to a pool as a strand of its own (walked separately, figures added);
threads it does not wait for (renewals in the background, the fake AgentCore's agents) are not.

`tests/integration/house/test_walk.py` holds the walks under their ceilings and docs/benchmarks.md's table to what they
measure; `--write-docs` rewrites that table. `WALK_ROOMS=1` prints the rooms of each strand (stderr).

Usage: python bench/bench_walk.py [--write-docs]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, tzinfo
from functools import partial
from pathlib import Path
from types import FrameType, FunctionType, SimpleNamespace
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LIBRARY = REPO / "rollout_pipeline"
#: Library modules that stand in for AWS in this run (not part of what a reader walks through).
SCAFFOLDING = ("local/", "fakes/")

if TYPE_CHECKING:
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.limits.pacing import Clocks
    from rollout_pipeline.ports import Clock
    from rollout_pipeline.wiring import Wiring
    from tests.doubles import ManualClock

Event = tuple[int, str, str, str]  # strand, "call"/"return", file, function


#: The read of the batch view.
BATCH_READ = ("ledger/batches.py", "BatchLedger.read_batch")


@dataclass(frozen=True)
class WalkFigures:
    functions: int
    file_changes: int
    returns: int
    steps: int
    batch_reads: int = 0

    def line(self, name: str) -> str:
        return (
            f"{name:<19} functions {self.functions:>3}   file changes {self.file_changes:>3}   "
            f"returns to a room already left {self.returns:>3}   steps {self.steps:>4}   "
            f"batch reads {self.batch_reads}"
        )


def _room(frame: FrameType) -> str | None:
    path = frame.f_code.co_filename
    if not path.startswith(str(LIBRARY)):
        return None
    relative = path[len(str(LIBRARY)) + 1 :]
    if relative.startswith(SCAFFOLDING) or frame.f_code.co_name.startswith("<"):
        return None
    return relative


def trace(run: Callable[[], Any]) -> list[Event]:
    """The call and return events of library functions while `run()` runs: in the calling thread, and in any pool
    worker while it runs work that traced code submitted (`ThreadPoolExecutor.submit`, so `map` too). Each such work
    item is a strand of its own (the events' first field; the calling thread's is 0), whichever worker runs it;
    threads the walk does not hand work to (renewals in the background, pollers, the fake AgentCore's agents) are
    not traced."""
    events: list[Event] = []
    lock = threading.Lock()
    strands = itertools.count(1)
    current = threading.local()

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "return":
            room = _room(frame)
            if room is not None:
                with lock:
                    events.append((current.strand, "return", room, frame.f_code.co_qualname))
        return local

    def global_(frame: FrameType, event: str, _arg: Any) -> Any:
        if event != "call":
            return None
        room = _room(frame)
        if room is None:
            return None
        frame.f_trace_lines = False
        with lock:
            events.append((current.strand, "call", room, frame.f_code.co_qualname))
        return local

    def traced(strand: int, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        current.strand, previous = strand, sys.gettrace()
        sys.settrace(global_)
        try:
            return work(*args, **kwargs)
        finally:
            sys.settrace(previous)
            current.strand = None

    submit = ThreadPoolExecutor.submit

    def submit_traced(pool: ThreadPoolExecutor, work: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if getattr(current, "strand", None) is None:  # work of a thread the walk does not follow
            return submit(pool, work, *args, **kwargs)
        return submit(pool, traced, next(strands), work, *args, **kwargs)

    ThreadPoolExecutor.submit = submit_traced  # type: ignore[method-assign,assignment]
    try:
        traced(0, run)
    finally:
        ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]
    return events


def figures(events: list[Event]) -> WalkFigures:
    """The walk's figures (see the module doc) from its events."""
    callers: set[tuple[str, str]] = set()
    stacks: dict[int, list[tuple[str, str]]] = {}
    for thread, kind, room, function in events:
        stack = stacks.setdefault(thread, [])
        if kind == "call":
            if stack and stack[-1] != (room, function):  # recursion alone does not make a helper a caller
                callers.add(stack[-1])
            stack.append((room, function))
        elif stack:
            stack.pop()
    walked: set[tuple[str, str]] = set()
    changes = returns = steps = 0
    for thread in sorted({event[0] for event in events}):
        rooms: list[str] = []
        in_rooms: list[str] = []
        for _, kind, room, function in (event for event in events if event[0] == thread):
            if (room, function) not in callers:
                continue  # a leaf helper
            if kind == "call":
                in_rooms.append(room)
                walked.add((room, function))
                steps += 1
            elif in_rooms:
                in_rooms.pop()
            if in_rooms and (not rooms or rooms[-1] != in_rooms[-1]):
                rooms.append(in_rooms[-1])
        if os.environ.get("WALK_ROOMS"):
            print(" -> ".join(rooms), file=sys.stderr)
        changes += max(0, len(rooms) - 1)
        returns += sum(1 for i, room in enumerate(rooms) if room in rooms[:i])
    reads = sum(1 for _, kind, room, function in events if kind == "call" and (room, function) == BATCH_READ)
    return WalkFigures(len(walked), changes, returns, steps, reads)


def measure() -> dict[str, WalkFigures]:
    """The rows of the docs' table (`ROWS`): the upload walk with the release window on (the default) and off, and
    the result walk. Needs moto and fake credentials (`main` sets them)."""
    on, off = walk(None), walk(0)
    return {WINDOW_ON: on["upload"], WINDOW_OFF: off["upload"], RESULT: on["result"]}


#: The rows of the walk's table in `DOCS`, by the name its first column gives them.
WINDOW_ON, WINDOW_OFF, RESULT = "upload, window on", "upload, window off", "result"
ROWS = (WINDOW_ON, WINDOW_OFF, RESULT)
#: The docs that show the walk's figures: this table, and only this one.
DOCS = REPO / "docs" / "benchmarks.md"
TABLE_HEADER = "| walk | functions | file changes | returns to a room already left | batch view reads |"


def table(rows: dict[str, WalkFigures]) -> str:
    """The walk's table in `DOCS` (header, rule and one line per row)."""
    lines = [TABLE_HEADER, "|---|---|---|---|---|"]
    for name in ROWS:
        f = rows[name]
        lines.append(f"| {name} | {f.functions} | {f.file_changes} | {f.returns} | {f.batch_reads} |")
    return "\n".join(lines)


def documented(text: str) -> str:
    """The walk's table as `text` (the docs) has it: the header line and every table line after it."""
    lines = text.splitlines()
    if TABLE_HEADER not in lines:
        raise ValueError(f"{DOCS.name} has no walk table (a line {TABLE_HEADER!r})")
    start = lines.index(TABLE_HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def write_docs(rows: dict[str, WalkFigures]) -> bool:
    """Put `rows` in the walk's table of `DOCS`; True if the file changed."""
    text = DOCS.read_text()
    updated = text.replace(documented(text), table(rows), 1)
    if updated == text:
        return False
    DOCS.write_text(updated)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write-docs", action="store_true", help=f"write the figures into {DOCS.relative_to(REPO)}")
    args = parser.parse_args(argv)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }.items():
        os.environ[key] = value
    os.environ.pop("AWS_ENDPOINT_URL", None)
    rows = measure()
    for name, measured in rows.items():
        print(measured.line(name))
    if args.write_docs:
        changed = write_docs(rows)
        print(f"{DOCS.relative_to(REPO)}: {'updated' if changed else 'already up to date'}")


@dataclass(frozen=True)
class StillTime:
    """Time that moves only when the pipeline sleeps or the walk advances it (`manual`, monotonic seconds; wall
    clock `offset` seconds ahead), so no wait, reservation or renewal depends on the machine's speed. `library` is
    the library's own `ports.SystemClock` code over that time (the same code objects, given other `time` and
    `datetime`), so the walk counts its calls to the clock as in production; `pacing` the limits' schedules'
    clocks (the system's builtins in production). Other clocks in the process (another test's threads) keep real
    time."""

    manual: ManualClock
    offset: float
    library: Clock
    pacing: Clocks

    @classmethod
    def start(cls) -> StillTime:
        from rollout_pipeline import ports
        from rollout_pipeline.limits.pacing import Clocks
        from tests.doubles import ManualClock

        manual = ManualClock(start=time.monotonic())
        offset = int(time.time()) - manual.t

        class StillDatetime(datetime):
            @classmethod
            def now(cls, tz: tzinfo | None = None) -> StillDatetime:
                return cls.fromtimestamp(manual.t + offset, tz)

        still = {**vars(ports), "time": SimpleNamespace(monotonic=manual.monotonic, sleep=manual.sleep)}
        still["datetime"] = StillDatetime
        methods = {
            name: FunctionType(getattr(ports.SystemClock, name).__code__, still, name)
            for name in ("now", "monotonic", "sleep")
        }
        library: Clock = type("StillSystemClock", (), methods)()
        pacing = Clocks(wall=lambda: manual.t + offset, monotonic=manual.monotonic, sleep=manual.sleep)
        return cls(manual, offset, library, pacing)

    def lifecycle(self, wiring: Wiring) -> LifecycleDeps:
        """`wiring.new_lifecycle()` with everything that keeps time on this time: the wiring's clock (`library`,
        given to it), the limits' schedules (`pacing`) and the release window's age of its view."""
        from rollout_pipeline.limits.facade import Limits
        from rollout_pipeline.limits.pacing import Clocks
        from rollout_pipeline.metric_names import MetricsRecorder

        assert wiring.clock is self.library, "the wiring runs on another clock"
        wiring.feed().releases.monotonic = self.manual.monotonic
        metrics = MetricsRecorder()
        limits = Limits(
            wiring.ledger().limits,
            wiring.settings.experiment,
            wiring.agent_runtime(),
            pool=wiring.pool(),
            clocks=Clocks(
                wall=lambda: self.library.now().timestamp(), monotonic=self.library.monotonic, sleep=self.library.sleep
            ),
            pacing=self.pacing,
            metrics=metrics,
        )
        return wiring.new_lifecycle(limits=limits, metrics=metrics)


#: How long (still time) each rollout of the walk runs before its result is completed: within the release window's
#: trust in this process's last view of it (`feed.window.NOTHING_PENDING_TRUST_S`), as in a steady flow of results.
#: A lone result that comes later reads the window once more (10 file changes more).
ROLLOUT_S = 1.0


def walk(release_window: int | None) -> dict[str, WalkFigures]:
    """The figures of the second upload and result walks of one run (`release_window`: the setting), on
    `StillTime`."""
    from moto import mock_aws

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.fakes.acr import FakeAgentRuntime
    from rollout_pipeline.lifecycle.completion import complete_records
    from rollout_pipeline.lifecycle.dispatch import dispatch_records
    from rollout_pipeline.local.moto_server import patch_moto
    from rollout_pipeline.local.resources import create_resources
    from rollout_pipeline.wiring import Wiring

    patch_moto()
    clients.reset()
    still = StillTime.start()
    clock = still.manual
    with mock_aws():
        config = ExperimentConfig(
            name="walk-exp",
            group_size=2,
            max_attempts=2,
            tps_limit=50,
            max_sessions=20,
            release_window=release_window,
        )
        resources = create_resources(config, region="us-east-1", client=clients.client)
        runtime = FakeAgentRuntime()
        wiring = Wiring(resources.settings(), runtime=runtime, clock=still.library)
        deps = still.lifecycle(wiring)
        s3, sqs = clients.client("s3"), clients.client("sqs")

        def receive(queue_url: str) -> list[dict[str, Any]]:
            messages: list[dict[str, Any]] = []
            for _ in range(20):
                got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
                if not got.get("Messages"):
                    break
                for m in got["Messages"]:
                    messages.append({"messageId": m["MessageId"], "body": m["Body"], "attributes": {}})
                    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
            return messages

        walks: dict[str, WalkFigures] = {}

        def walked(name: str, run: int, step: Callable[[], Any]) -> None:
            """The first run warms up (lazy imports, clients); the second is walked."""
            if run:
                walks[name] = figures(trace(step))
            else:
                step()

        for run in range(2):
            key = f"datasets/walk-{run}.jsonl"
            s3.put_object(Bucket=resources.input_bucket, Key=key, Body=json.dumps({"id": f"q{run}"}).encode() + b"\n")
            (upload,) = receive(resources.ingest_queue_url)
            ingestion = wiring.ingestion()
            body = json.loads(upload["body"])
            owner = upload["messageId"]
            walked("upload", run, partial(ingestion.handle_message, body, owner=owner))
            rollouts = receive(resources.rollout_queue_url)
            dispatch_records(rollouts, deps, wait_until=clock.monotonic() + 30)
            deadline = time.monotonic() + 30  # the fake agents answer in real time
            results: list[dict[str, Any]] = []
            while len(results) < len(rollouts) and time.monotonic() < deadline:
                results += receive(resources.completion_queue_url)
            assert len(results) == len(rollouts), f"{len(results)} of {len(rollouts)} results reached the queue"
            results.sort(key=lambda record: json.loads(record["body"])["detail"]["object"]["key"])  # not as they came
            clock.advance(ROLLOUT_S)
            until = clock.monotonic() + 30
            walked("result", run, partial(complete_records, results[:1], deps, wait_until=until))
            if not run:
                complete_records(results[1:], deps, wait_until=until)
            clock.advance(ROLLOUT_S)
        runtime.close()
    clients.reset()  # the clients of this mock go with it
    return walks


if __name__ == "__main__":
    main()
