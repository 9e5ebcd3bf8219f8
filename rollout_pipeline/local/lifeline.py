"""`python -m rollout_pipeline.local.lifeline PARENT_PID MODULE ARGS...`: run MODULE as `python -m MODULE ARGS`
would, and end this process as soon as process PARENT_PID is gone, so nothing local mode starts (agent processes,
the local model server) outlives a `rollouts local up` (or demo, or test) killed with SIGKILL, which runs no cleanup.

How: a daemon thread compares the process's parent id with PARENT_PID every `CHECK_S` (a process whose parent dies is
given another: init or a subreaper); when they differ, it sends SIGKILL to the process's whole group when it leads
one (an agent process runs in a session of its own: whatever the agent itself started dies with it), else to the
process alone (the model server shares the caller's group, which may hold the caller's own caller: a shell, a test
runner). Linux's PR_SET_PDEATHSIG is not used: it fires when the THREAD that started the child ends (prctl(2)), and
local mode starts agent processes from short-lived threads (spare processes), which would kill them at once. The
watch works the same on macOS.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

MODULE: Final = "rollout_pipeline.local.lifeline"
#: How often the parent is looked at: a child outlives its parent by at most this.
CHECK_S: Final = 0.25


def command(argv: Sequence[str], parent_pid: int | None = None) -> list[str]:
    """`argv` (`[python, "-m", MODULE, ARGS...]`) as a command whose process ends with this one (`parent_pid`)."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ValueError(f"not a `python -m MODULE` command: {list(argv)}")
    return [argv[0], "-m", MODULE, str(os.getpid() if parent_pid is None else parent_pid), *argv[2:]]


def popen(argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` of `python -m MODULE ARGS` (`argv`) whose process ends with this one (`command`)."""
    process: subprocess.Popen[bytes] = subprocess.Popen(command(argv), **options)
    return process


def follow(parent_pid: int, check_s: float = CHECK_S) -> threading.Thread:
    """End this process (`end`) once `parent_pid` is no longer its parent; watched from a daemon thread."""
    if os.getppid() != parent_pid:  # gone before this process got here
        end()

    def watch() -> None:
        while True:
            time.sleep(check_s)
            if os.getppid() != parent_pid:
                end()

    thread = threading.Thread(target=watch, name="rollouts-lifeline", daemon=True)
    thread.start()
    return thread


def end() -> None:
    """SIGKILL this process's group when it leads one, else this process."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or not args[0].isdigit():
        raise SystemExit(f"usage: python -m {MODULE} PARENT_PID MODULE [ARGS...]")
    follow(int(args[0]))
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
