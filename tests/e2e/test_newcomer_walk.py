"""A newcomer's walk, as the README tells it: `rollouts local up` in one shell (real agent processes, one per
session); from a second shell the block it printed, pasted as it is, with rows of the documented shape; at the same
time a trainer in Python (the printed Python line) and the example trainer; then a cancel from the shell while
rollouts run (their sessions stopped by the `up` process's AgentCore, counted truthfully); then Ctrl-C.

Only what the README's reader cannot have is substituted: a fake OpenAI-compatible model (`--model-url`; the real
one is `make demo`'s minutes-long build) and a free port (`--port`, so the suite never collides with a pipeline
a developer runs on 4580)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest
from rollout_pipeline.local.moto_server import free_port

pytestmark = pytest.mark.slow

REPO: Final = Path(__file__).resolve().parents[2]
BIN: Final = REPO / ".venv" / "bin"
UP_TIMEOUT_S: Final = 180
WALK_TIMEOUT_S: Final = 300
#: Rows shaped as the README and docs/datasets.md document them.
ROWS: Final = [
    {"id": "q1", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "q2", "question": "What is 7 + 6?", "answer": "13"},
]
#: Bounded wait for Ctrl-C to stop `rollouts local up` (consumers' grace, agent processes; a loaded machine).
STOP_TIMEOUT_S: Final = 120
SLOW_ROWS: Final = [{"id": "slow-1", "question": "SLOW: what is 1 + 1?", "answer": "2"}]


@dataclass
class Up:
    process: subprocess.Popen[str]
    log: Path
    port: int
    paste: list[str]
    python: list[str]


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    release = threading.Event()

    def reply(request: RecordedRequest) -> str:
        text = str((request.body.get("messages") or [{}])[-1].get("content", ""))
        if "SLOW" in text:
            release.wait(60)  # still answering when the batch is cancelled
        numbers = [int(n) for n in re.findall(r"\d+", text)][:2]
        return f"#### {sum(numbers)}"

    with FakeModelServer(reply) as server:
        yield server
        release.set()


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ROLLOUTS_", "AWS_"))}
    # faulthandler: a process that has to be aborted writes every thread's stack to its log first
    path = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}


@pytest.fixture
def up(model: FakeModelServer, tmp_path: Path) -> Iterator[Up]:
    port = free_port()
    log = tmp_path / "up.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(BIN / "rollouts"), "local", "up", "--port", str(port), "--model-url", model.base_url],
            stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=_env(),
        )  # fmt: skip
    try:
        yield Up(process, log, port, *_printed_block(log, process))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def _printed_block(log: Path, process: subprocess.Popen[str]) -> tuple[list[str], list[str]]:
    """The shell lines and the Python lines `rollouts local up` printed for a second process."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "Ctrl-C stops the pipeline." not in log.read_text():
        assert process.poll() is None, f"rollouts local up exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no block printed in {UP_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)
    lines = log.read_text().splitlines()
    shell_at = lines.index("Drive it from another shell (paste):")
    python_at = lines.index("or from Python:")
    end = next(n for n in range(python_at, len(lines)) if lines[n].startswith("Ctrl-C"))
    shell = [line.strip() for line in lines[shell_at + 1 : python_at]]
    python = [line.strip() for line in lines[python_at + 1 : end]]
    return shell, python


def _write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(name: str, process: subprocess.Popen[str]) -> str:
    try:
        out, err = process.communicate(timeout=WALK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"{name} ran over {WALK_TIMEOUT_S} s:\n{out}\n{err}") from None
    assert process.returncode == 0, f"{name} exited {process.returncode}:\n{out}\n{err}"
    assert "Traceback" not in err, f"{name}:\n{err}"
    return out + err


def _rollouts(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """`rollouts ARGS` in the second shell: its stdout, exit 0 required."""
    done = subprocess.run(["rollouts", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"rollouts {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _agent_processes(port: int) -> list[int]:
    """Processes (agents) whose environment points at the walk's local AWS endpoint."""
    marker = f"AWS_ENDPOINT_URL=http://127.0.0.1:{port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_newcomers_walk(up: Up, tmp_path: Path) -> None:
    home = tmp_path / "second-shell"
    home.mkdir()
    (home / "examples").symlink_to(REPO / "examples")
    _write_rows(home / "my_rows.jsonl", ROWS)
    _write_rows(home / "sdk_rows.jsonl", [{**ROWS[0], "id": "sdk-q1"}])
    _write_rows(home / "example_rows.jsonl", [{**ROWS[1], "id": "ex-q2"}])
    export, cli_line = up.paste[0], up.paste[1].split("#", 1)[0].strip()
    assert cli_line == "rollouts submit my_rows.jsonl --watch"
    endpoint = re.search(r"^export ROLLOUTS_ENDPOINT_URL=(\S+)", export)
    experiment = re.search(r"ROLLOUTS_EXPERIMENT=(\S+)", export)
    assert endpoint, up.paste
    assert experiment, up.paste
    pasted = {**_env(), "ROLLOUTS_ENDPOINT_URL": endpoint.group(1), "ROLLOUTS_EXPERIMENT": experiment.group(1)}

    # The second shell pastes the block as printed; a trainer runs the printed Python line; the example runs too.
    cli = _run(["bash", "-e", "-c", f"{export}\n{cli_line}\n"], home, _env())
    sdk_code = "\n".join(
        [
            *up.python,
            'batch = exp.submit_file("sdk_rows.jsonl", group_size=2)',
            "for group in exp.groups(batch, timeout=240):",
            "    print('group', group.input_id, group.rewards, group.advantages())",
            "print('status', exp.status(batch).status)",
        ]
    )
    sdk = _run([str(BIN / "python"), "-c", sdk_code], home, _env())
    example = _run(
        [str(BIN / "python"), "examples/grpo_consumer.py", "example_rows.jsonl", "--group-size", "2"], home, pasted
    )
    cli_out, sdk_out, example_out = _finish("the CLI", cli), _finish("the SDK", sdk), _finish("the example", example)

    assert re.search(r"8/8 done: 8 succeeded, 0 failed", cli_out), cli_out  # local up's group size: 4
    assert "follow it with: rollouts watch -e local-demo --endpoint-url http://127.0.0.1:" in cli_out
    assert re.findall(r"^group (sdk-q\d) \[1\.0, 1\.0\]", sdk_out, re.MULTILINE) == ["sdk-q1"], sdk_out
    assert "status completed" in sdk_out, sdk_out
    assert "done: 2 succeeded, 0 failed, reward mean 1.0" in example_out, example_out

    # Cancel from the shell while the batch runs: its sessions stop in the `up` process, and the counts say so.
    slow = _write_rows(home / "slow.jsonl", SLOW_ROWS)
    batch = _rollouts(["submit", str(slow), "--group-size", "2"], home, pasted).strip()
    deadline = time.monotonic() + 120
    while (status := json.loads(_rollouts(["status", "--batch", batch, "--json"], home, pasted)))["running"] < 2:
        assert time.monotonic() < deadline, f"the slow batch never ran: {status}"
        time.sleep(0.5)
    cancelled = _rollouts(["cancel", "--batch", batch], home, pasted)
    assert "2 rollout(s) ended as cancelled, 0 had finished before" in cancelled, cancelled
    stopped = re.search(r"running sessions: (\d+) stopped", cancelled)
    assert stopped, cancelled
    assert int(stopped.group(1)) == 2, cancelled
    assert "not stopped yet" not in cancelled, cancelled
    final = json.loads(_rollouts(["status", "--batch", batch, "--json"], home, pasted))
    assert (final["status"], final["failed_by_reason"]) == ("cancelled", {"cancelled": 2})

    # Ctrl-C: the pipeline stops, and every agent process with it.
    up.process.send_signal(signal.SIGINT)
    try:
        code = up.process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        up.process.send_signal(signal.SIGABRT)  # its threads' stacks go to the log
        up.process.wait(10)
        pytest.fail(f"rollouts local up still running {STOP_TIMEOUT_S} s after Ctrl-C:\n{up.log.read_text()[-12000:]}")
    assert code in (0, 130)
    text = up.log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "not been implemented" not in text, "a stop went to moto instead of the local AgentCore"
    deadline = time.monotonic() + 10
    while _agent_processes(up.port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _agent_processes(up.port) == [], "agent processes outlived rollouts local up"
