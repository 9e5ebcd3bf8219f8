"""What local mode starts dies with the process that started it, even one killed with SIGKILL (no cleanup runs):
a child started through `local.lifeline` ends within a moment of its parent, with its whole process group when it
leads one (an agent process and what it started), alone otherwise (the model server, in its caller's group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollout_pipeline.local import lifeline
from tests.conftest import alive, wait_for

pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[3]

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from rollout_pipeline.local import lifeline

    serve = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"]
    leader = lifeline.popen(serve, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    plain = lifeline.popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(leader.pid, plain.pid, flush=True)
    time.sleep(3600)
    """
)


def test_children_started_through_the_lifeline_die_with_a_parent_killed_with_sigkill() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    children: list[int] = []
    try:
        assert parent.stdout is not None
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(children) == 2
        assert all(alive(pid) for pid in children)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in children), timeout_s=20, what="the children to end")
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_command_wraps_a_module_run_only() -> None:
    assert lifeline.command(["python", "-m", "pkg.mod", "--port", "1"], parent_pid=7) == [
        "python",
        "-m",
        lifeline.MODULE,
        "7",
        "pkg.mod",
        "--port",
        "1",
    ]
    with pytest.raises(ValueError, match="python -m MODULE"):
        lifeline.command(["python", "script.py"])
