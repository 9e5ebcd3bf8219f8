"""Nothing left behind (docs/lifecycle.md, "Nothing left behind"): `rollouts local up` with real agent processes, a
trainer streaming its batch (a stream and a tap of its own) and `rollouts watch`, all killed with SIGKILL mid-batch
(no cleanup runs): no subscription survives the next sweep, and no process nor temporary file survives `up` (every
agent process ends with it, and the work directory it made goes). What it measures is printed: how long each took.

Substituted as in the newcomer's walk: a fake OpenAI-compatible model (`--model-url`), which holds its replies so the
batch is mid-flight when the processes are killed, and a free port."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.local.moto_server import free_port
from rollout_pipeline.sdk import Experiment
from tests.conftest import wait_for

pytestmark = pytest.mark.slow

REPO: Final = Path(__file__).resolve().parents[2]
BIN: Final = REPO / ".venv" / "bin"
UP_TIMEOUT_S: Final = 180
#: The bounds the test waits within (on a loaded 2-core machine): local mode sweeps every 10 s.
SWEEP_BOUND_S: Final = 60
PROCESS_BOUND_S: Final = 30

TRAINER: Final = textwrap.dedent(
    """
    import sys, time
    from rollout_pipeline.sdk import Experiment

    endpoint, name = sys.argv[1:3]
    exp = Experiment.local(endpoint, name=name)
    batch = exp.submit([{"id": f"q{i}", "question": "HOLD: what is 1 + 1?", "answer": "2"} for i in range(3)])
    print("batch", batch, flush=True)
    with exp.tap(poll_wait_s=1):
        for event in exp.events(batch_id=batch, poll_wait_s=1):
            print("event", event.detail_type, flush=True)
    time.sleep(3600)
    """
)


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    release = threading.Event()

    def reply(request: RecordedRequest) -> str:
        text = str((request.body.get("messages") or [{}])[-1].get("content", ""))
        if "HOLD" in text:
            release.wait(120)  # still answering when everything is killed
        return "#### 2"

    with FakeModelServer(reply) as server:
        yield server
        release.set()


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ROLLOUTS_", "AWS_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}


def _processes_of(port: int) -> list[int]:
    """Live processes whose environment points at the pipeline's local AWS endpoint (its agent processes)."""
    marker = f"AWS_ENDPOINT_URL=http://127.0.0.1:{port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def _line(path: Path, pattern: str, process: subprocess.Popen[str], timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, path.read_text(), re.MULTILINE)
        if found:
            return found
        assert process.poll() is None, f"{process.args} exited:\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in {timeout_s} s:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)


def _kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL


def test_sigkill_of_everything_a_user_started_leaves_nothing_running(model: FakeModelServer, tmp_path: Path) -> None:
    port = free_port()
    logs = {name: tmp_path / f"{name}.log" for name in ("up", "trainer", "watch")}
    started: list[subprocess.Popen[str]] = []

    def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        with logs[name].open("w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
        started.append(process)
        return process

    try:
        up = start("up", [str(BIN / "rollouts"), "local", "up", "--port", str(port), "--model-url", model.base_url],
                   _env())  # fmt: skip
        endpoint = _line(logs["up"], r"ROLLOUTS_ENDPOINT_URL=(\S+)", up, UP_TIMEOUT_S).group(1)
        name = _line(logs["up"], r"ROLLOUTS_EXPERIMENT=(\S+)", up, UP_TIMEOUT_S).group(1)
        work_dir = Path(_line(logs["up"], r"logs in (\S+)$", up, UP_TIMEOUT_S).group(1))
        _line(logs["up"], r"^Ctrl-C stops the pipeline", up, UP_TIMEOUT_S)
        assert work_dir.name.startswith("rollouts-local-"), "a work directory of its own"
        assert (work_dir / "agents").is_dir(), "with the agents' logs"
        experiment = Experiment.local(endpoint, name=name)
        shell = {**_env(), "ROLLOUTS_ENDPOINT_URL": endpoint, "ROLLOUTS_EXPERIMENT": name}

        trainer = start("trainer", [sys.executable, "-c", TRAINER, endpoint, name], {**shell, "PYTHONPATH": str(REPO)})
        batch = _line(logs["trainer"], r"^batch (\S+)", trainer, 60).group(1)
        watch = start("watch", [str(BIN / "rollouts"), "watch", "--batch", batch], shell)
        _line(logs["trainer"], r"^event ", trainer, 60)  # streaming: its first event (Batch Accepted) arrived
        wait_for(lambda: len(experiment.list_subscriptions()) == 3, timeout_s=60, what="stream, tap and watch")
        wait_for(lambda: _processes_of(port), timeout_s=60, what="the agent processes")
        assert not experiment.status(batch).done, "mid-batch"

        killed_at = time.monotonic()
        _kill(trainer)
        _kill(watch)
        wait_for(lambda: not experiment.list_subscriptions(), timeout_s=SWEEP_BOUND_S, what="the sweep")
        print(f"subscriptions: 0 left {time.monotonic() - killed_at:.1f} s after the SIGKILLs (local sweep: 10 s)")

        agents = _processes_of(port)
        assert agents, "rollouts in flight run in agent processes"
        killed_at = time.monotonic()
        _kill(up)
        wait_for(lambda: not _processes_of(port), timeout_s=PROCESS_BOUND_S, what="every agent process to end")
        print(f"processes: 0 of {len(agents)} agent processes left {time.monotonic() - killed_at:.1f} s after it")
        wait_for(lambda: not work_dir.exists(), timeout_s=PROCESS_BOUND_S, what="its work directory to go")
        print(f"files: its work directory gone {time.monotonic() - killed_at:.1f} s after it")
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
        for pid in _processes_of(port):
            os.kill(pid, signal.SIGKILL)
        for name, log in logs.items():
            if log.exists():
                print(f"--- {name}\n{log.read_text()[-1500:]}")
