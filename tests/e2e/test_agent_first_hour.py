"""A newcomer's first hour with local mode, the agent's side: an agent module that cannot start fails its rollouts at
once (and `rollouts local demo` stops with one line), and Ctrl-C stops a demo at once with what it saw so far.
(An ART module written the ART way, ending in `app.run()`: tests/e2e/test_local_pipeline.py.)"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.cli import EXIT_ERROR, EXIT_INTERRUPTED, main
from rollout_pipeline.contracts import DetailType
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

pytestmark = pytest.mark.slow

MISSING = "no_such_agent_module"
WAIT_S = 120.0


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer("15") as server:
        yield server


def test_rollouts_of_an_agent_that_cannot_start_fail_at_once_as_agent_errors(
    model: FakeModelServer, tmp_path: Path
) -> None:
    """No warm process (so the run starts): each rollout's session fails to start, and the rollout fails on the spot
    with the agent host's own line, instead of being requeued as throttled for hours."""
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": f"q{n}", "question": "7 + 8", "answer": "15"}) + "\n" for n in (1, 2)))
    settings = LocalSettings(
        experiment="e2e-nostart",
        group_size=2,
        model_url=model.base_url,
        max_sessions=2,
        warm_processes=0,
        max_attempts=2,
        sweep_interval_s=2.0,
        work_dir=tmp_path / "work",
        agent_module=MISSING,
    )
    with LocalPipeline(settings) as pipeline:
        batch_id = pipeline.experiment.submit_file(dataset)
        events = []
        for event in pipeline.experiment.events(batch_id=batch_id, timeout=WAIT_S):
            events.append(event)
            if event.detail_type is DetailType.BATCH_COMPLETED:
                break
        left = pipeline.active_sessions()
    failed = [e.detail for e in events if e.detail_type is DetailType.ROLLOUT_FAILED]
    assert len(failed) == 4, [e.detail_type for e in events]
    for detail in failed:
        assert detail.reason.value == "agent_error"
        assert detail.attempts_used == 1  # not retried: no attempt can start it
        assert f"agent host: cannot serve {MISSING}: no module named '{MISSING}'" in detail.error
    (done,) = [e.detail for e in events if e.detail_type is DetailType.BATCH_COMPLETED]
    assert (done.succeeded, done.failed) == (0, 4)
    assert left == []


def test_the_demo_stops_with_one_line_when_the_agent_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run's own work directory goes
    code = main(["local", "demo", "--agent-module", MISSING, "--model-url", "http://127.0.0.1:9/v1"])
    captured = capsys.readouterr()
    assert code == EXIT_ERROR
    assert captured.err.splitlines() == [
        f"rollouts: error: the agent did not start: agent host: cannot serve {MISSING}: no module named '{MISSING}' "
        f"on the agent's PYTHONPATH ({os.pathsep.join(_agent_pythonpath())})"
    ]
    assert "uploaded" not in captured.out  # nothing was submitted
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("rollouts-local-")], "its work dir is removed"


def _agent_pythonpath() -> list[str]:
    from rollout_pipeline.local.acr import agent_environ

    return [p for p in agent_environ().get("PYTHONPATH", "").split(os.pathsep) if p]


def _slow(request: RecordedRequest) -> str:
    del request
    time.sleep(1.0)  # rollouts stay in flight long enough to be interrupted
    return "15"


#: `rollouts` as a terminal runs it: Ctrl-C raises KeyboardInterrupt (a test runner may have SIGINT ignored, and a
#: child inherits that).
CTRL_C_ABLE_CLI = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from rollout_pipeline.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_ctrl_c_stops_the_demo_at_once_with_what_it_saw(tmp_path: Path) -> None:
    """Ctrl-C mid-batch: the consumers' waits end while moto is still up, so no traceback; the summary of what was
    seen is printed, and the exit code is 130."""
    with FakeModelServer(_slow) as slow_model:
        argv = ["local", "demo", "--model-url", slow_model.base_url, "--rows", "6", "--group-size", "4"]
        argv += ["--work-dir", str(tmp_path / "work"), "--no-report"]
        process = subprocess.Popen(
            [sys.executable, "-c", CTRL_C_ABLE_CLI, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout or []], daemon=True)
        reader.start()
        seen: list[str] = []
        deadline = time.monotonic() + WAIT_S
        try:
            while not any(line.startswith("Rollout Completed") for line in seen):
                assert time.monotonic() < deadline, "".join(seen)
                try:
                    seen.append(lines.get(timeout=1))
                except queue.Empty:
                    assert process.poll() is None, "".join(seen)
            interrupted_at = time.monotonic()
            process.send_signal(signal.SIGINT)
            code = process.wait(timeout=60)
            stopped_s = time.monotonic() - interrupted_at
        finally:
            if process.poll() is None:
                process.kill()
        reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get())
    output = "".join(seen)
    print(f"Ctrl-C to exit: {stopped_s:.1f} s, {len(seen)} lines")  # a figure for the report, not a bound
    assert code == EXIT_INTERRUPTED, output
    assert "Traceback" not in output
    assert "INTERRUPTED after" in output
    assert "rollouts ended so far: " in output
