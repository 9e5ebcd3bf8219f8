"""The one switch with real agent processes: `Experiment.launch(name, "local", ...)` runs the example agent as
local processes behind the local ACR adapter; a trainer script runs a batch, and `destroy()` leaves no thread and no
child process running."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.sdk import Experiment

pytestmark = pytest.mark.slow


def _reply(_request: RecordedRequest) -> str:
    return "Let me compute.\n#### 42"


def _children() -> set[int]:
    """This process's live child processes (Linux: /proc/self/task/*/children)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _settled(check: object, deadline_s: float = 15.0) -> object:
    """Call `check` until it returns something falsy or the deadline passes; return its last value."""
    assert callable(check)
    deadline = time.monotonic() + deadline_s
    value = check()
    while value and time.monotonic() < deadline:
        time.sleep(0.1)
        value = check()
    return value


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads child processes from /proc")
def test_a_trainer_script_runs_against_local_mode_and_destroy_leaves_nothing_running(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    children_before = _children()
    endpoint_before = os.environ.get("AWS_ENDPOINT_URL")
    rows = tmp_path / "train.jsonl"
    rows.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": "6 * 7?", "answer": "#### 42"}) + "\n" for i in range(2))
    )

    with FakeModelServer(_reply) as model:
        experiment = Experiment.launch(
            "launch-agents",
            "local",
            model_base_url=model.base_url,
            model_id="fake-model",
            group_size=2,
            max_sessions=2,
            local_options={"warm_processes": 1, "sweep_interval_s": 2.0, "work_dir": tmp_path / "work"},
        )
        try:
            agents_running = _children() - children_before
            batch = experiment.submit_file(rows)
            rewards = {g.input_id: g.rewards for g in experiment.groups(batch, timeout=120, poll_wait_s=1)}
        finally:
            experiment.destroy()

    assert agents_running, "the agent ran as child processes"
    assert rewards == {"q0": [1.0, 1.0], "q1": [1.0, 1.0]}
    assert _settled(lambda: _children() - children_before) == set(), "every agent process ended"
    assert _settled(lambda: [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]) == []
    assert os.environ.get("AWS_ENDPOINT_URL") == endpoint_before, "the environment is restored"
