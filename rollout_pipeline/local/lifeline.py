"""`python -m rollout_pipeline.local.lifeline PARENT_PID [--remove=PATH ...] [MODULE ARGS...]`: run MODULE as
`python -m MODULE ARGS` would, and end this process as soon as process PARENT_PID is gone, so nothing local mode
starts (agent processes, the local model server) outlives a `rollouts local up` (or demo, or test) killed with
SIGKILL, which runs no cleanup. Each `--remove` PATH (a temporary file or directory the parent made) is removed
first; without MODULE the process only waits for that (`OwnedPath`: the pipeline's own work directory).

How: a daemon thread compares the process's parent id with PARENT_PID every `CHECK_S` (a process whose parent dies is
given another: init or a subreaper); when they differ, it sends SIGKILL to the process's whole group when it leads
one (an agent process runs in a session of its own: whatever the agent itself started dies with it), else to the
process alone (the model server shares the caller's group, which may hold the caller's own caller: a shell, a test
runner). Linux's PR_SET_PDEATHSIG is not used: it fires when the THREAD that started the child ends (prctl(2)), and
local mode starts agent processes from short-lived threads (spare processes), which would kill them at once. The
watch works the same on macOS.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

MODULE: Final = "rollout_pipeline.local.lifeline"
#: How often the parent is looked at: a child outlives its parent by at most this.
CHECK_S: Final = 0.25
REMOVE: Final = "--remove="
#: The folder that holds the `rollout_pipeline` package.
LIBRARY_ROOT: Final = Path(__file__).resolve().parents[2]
#: Tries at removing a directory that its writers, dying with the same parent, may still add to.
REMOVE_TRIES: Final = 4


def command(argv: Sequence[str], parent_pid: int | None = None, remove: Sequence[Path] = ()) -> list[str]:
    """`argv` (`[python, "-m", MODULE, ARGS...]`) as a command whose process ends with this one (`parent_pid`),
    removing `remove` first."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ValueError(f"not a `python -m MODULE` command: {list(argv)}")
    pid = os.getpid() if parent_pid is None else parent_pid
    return [argv[0], "-m", MODULE, str(pid), *(f"{REMOVE}{path}" for path in remove), *argv[2:]]


def environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, with this library first on PYTHONPATH (a child runs the very code
    of its parent, whatever is installed)."""
    env = {**os.environ, **(extra or {})}
    paths = [str(LIBRARY_ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def popen(argv: Sequence[str], remove: Sequence[Path] = (), **options: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen` of `python -m MODULE ARGS` (`argv`) whose process ends with this one (`command`), removing
    the paths `remove` (files or directories) when it ends that way."""
    process: subprocess.Popen[bytes] = subprocess.Popen(command(argv, remove=remove), **options)
    return process


class OwnedPath:
    """A temporary file or directory this process made, which must not outlive it: `keep()` leaves it (to the user),
    `remove()` removes it; if this process ends without either (SIGKILL, an exit without a stop), a small process of
    its own (a lifeline without a module, in a session of its own so a terminal's Ctrl-C does not end it first)
    removes it at most `CHECK_S` later."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._holder: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", MODULE, str(os.getpid()), f"{REMOVE}{path}"],
                env=environ(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            remove_paths([path])
            raise

    def keep(self) -> None:
        """Leave the path where it is: its holder ends without removing it (idempotent)."""
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.kill()  # SIGKILL: its watch cannot remove anything
            holder.wait()

    def remove(self) -> None:
        """Remove the path now."""
        self.keep()
        remove_paths([self.path])


def remove_paths(paths: Sequence[Path]) -> None:
    """Remove each file or directory (gone already: nothing to do)."""
    for path in paths:
        for _ in range(REMOVE_TRIES):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if not os.path.lexists(path):
                break
            time.sleep(CHECK_S)


def follow(parent_pid: int, check_s: float = CHECK_S, remove: Sequence[Path] = ()) -> threading.Thread:
    """End this process (`end`) once `parent_pid` is no longer its parent; watched from a daemon thread."""
    if os.getppid() != parent_pid:  # gone before this process got here
        end(remove)

    def watch() -> None:
        while True:
            time.sleep(check_s)
            if os.getppid() != parent_pid:
                end(remove)

    thread = threading.Thread(target=watch, name="rollouts-lifeline", daemon=True)
    thread.start()
    return thread


def end(remove: Sequence[Path] = ()) -> None:
    """Remove `remove`, then SIGKILL this process's group when it leads one, else this process."""
    remove_paths(remove)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit():
        raise SystemExit(f"usage: python -m {MODULE} PARENT_PID [{REMOVE}PATH ...] [MODULE [ARGS...]]")
    parent_pid, rest = int(args[0]), args[1:]
    remove: list[Path] = []
    while rest and rest[0].startswith(REMOVE):
        remove.append(Path(rest.pop(0).removeprefix(REMOVE)))
    follow(parent_pid, remove=remove)
    if not rest:  # holds `remove` only, until the parent is gone (`OwnedPath`)
        threading.Event().wait()
        return
    sys.argv = [rest[0], *rest[1:]]
    runpy.run_module(rest[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
