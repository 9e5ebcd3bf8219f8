"""The walk of one upload and one result through the library: how many rooms (modules) a reader visits.

One in-process run on moto (no local mode, no network): a one-row dataset is uploaded and ingested
(`Ingestion.handle_message`, the upload walk), its rollouts are dispatched to the fake AgentCore, and one result
is completed (`lifecycle.completion.complete_records`, the result walk). Each walk runs twice; the second run is
traced with `sys.settrace` (and `threading.settrace`), so lazy imports and client creation do not count.

The figures, per walk:

- functions: distinct library functions the walk enters, leaving out leaf helpers (a function that, in this
  run, never calls another library function than itself: a parser, a key builder, a codec, a property);
- file changes: how often the walk moves from one module to another (a call into, or a return to, a function in
  another file; in-file steps do not count);
- returns: moves into a module the walk had already left (a return to a room already left);
- steps: calls of non-leaf functions;
- batch reads: reads of the batch view (`BatchLedger.read_batch`, one Query each).

Test scaffolding (`local/`, the fake AgentCore, the faithful AWS profile) is not part of the walk. Threads
(thread pools of a stage) are walked separately and their figures added.

The upload walk is measured with the release window on (the default); `--window` adds the upload walk with it
off (`release_window` 0), so both rows come from one command.

Usage: python bench/bench_walk.py [--window]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LIBRARY = REPO / "rollout_pipeline"
#: Library modules that stand in for AWS in this run (not part of what a reader walks through).
SCAFFOLDING = ("local/", "fakes/")

Event = tuple[int, str, str, str]  # thread, "call"/"return", file, function


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
    """The call and return events of library functions while `run()` runs (every thread)."""
    events: list[Event] = []
    lock = threading.Lock()

    def local(frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "return":
            room = _room(frame)
            if room is not None:
                with lock:
                    events.append((threading.get_ident(), "return", room, frame.f_code.co_qualname))
        return local

    def global_(frame: FrameType, event: str, _arg: Any) -> Any:
        if event != "call":
            return None
        room = _room(frame)
        if room is None:
            return None
        frame.f_trace_lines = False
        with lock:
            events.append((threading.get_ident(), "call", room, frame.f_code.co_qualname))
        return local

    threading.settrace(global_)
    sys.settrace(global_)
    try:
        run()
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
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
    for thread in {event[0] for event in events}:
        rooms: list[str] = []
        stack = []
        for _, kind, room, function in (event for event in events if event[0] == thread):
            if (room, function) not in callers:
                continue  # a leaf helper
            if kind == "call":
                stack.append(room)
                walked.add((room, function))
                steps += 1
            elif stack:
                stack.pop()
            if stack and (not rooms or rooms[-1] != stack[-1]):
                rooms.append(stack[-1])
        if os.environ.get("WALK_ROOMS"):
            print(" -> ".join(rooms), file=sys.stderr)
        changes += max(0, len(rooms) - 1)
        returns += sum(1 for i, room in enumerate(rooms) if room in rooms[:i])
    reads = sum(1 for _, kind, room, function in events if kind == "call" and (room, function) == BATCH_READ)
    return WalkFigures(len(walked), changes, returns, steps, reads)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", action="store_true", help="also walk the upload with the release window off")
    args = parser.parse_args(argv)
    rows: list[tuple[str, WalkFigures]] = []
    for window in (None, 0) if args.window else (None,):
        walks = walk(window)
        if window is None:
            rows.append(("upload (window)", walks["upload"]))
            rows.append(("result", walks["result"]))
        else:
            rows.insert(1, ("upload (no window)", walks["upload"]))
    for name, measured in rows:
        print(measured.line(name))


def walk(release_window: int | None) -> dict[str, WalkFigures]:
    """The figures of the second upload and result walks of one run (`release_window`: the setting)."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }.items():
        os.environ[key] = value
    os.environ.pop("AWS_ENDPOINT_URL", None)
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
        wiring = Wiring(resources.settings(), runtime=runtime)
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

        walks: dict[str, list[WalkFigures]] = {"upload": [], "result": []}
        for run in range(2):
            key = f"datasets/walk-{run}.jsonl"
            s3.put_object(Bucket=resources.input_bucket, Key=key, Body=json.dumps({"id": f"q{run}"}).encode() + b"\n")
            (upload,) = receive(resources.ingest_queue_url)
            ingestion = wiring.ingestion()
            body = json.loads(upload["body"])
            owner = upload["messageId"]
            walks["upload"].append(figures(trace(partial(ingestion.handle_message, body, owner=owner))))
            rollouts = receive(resources.rollout_queue_url)
            dispatch_records(rollouts, wiring.lifecycle(), wait_until=time.monotonic() + 30)
            deadline = time.monotonic() + 30
            results: list[dict[str, Any]] = []
            while len(results) < len(rollouts) and time.monotonic() < deadline:
                results += receive(resources.completion_queue_url)
            assert results, "no result reached the completion queue"
            deps = wiring.lifecycle()
            walks["result"].append(figures(trace(partial(complete_records, results[:1], deps))))
            complete_records(results[1:], deps)
        runtime.close()
    return {name: measured[-1] for name, measured in walks.items()}


if __name__ == "__main__":
    main()
