"""A warm parent for agent processes: it imports what an agent process imports, once, then forks each one from it.

An agent process spends about 1.5 s of CPU importing its libraries (Strands and openai, ART's toolkit, uvicorn)
before it serves anything; local mode starts one per session. `ForkServer` starts one parent per agent runtime
(`python -m rollout_pipeline.local.forks MODULE ARGS...`, through `lifeline`): it imports the agent host, and the
installed libraries and the modules of this library that the agent module's source imports in its body
(`agent.modules.top_level_imports`), but never the agent module itself (the host imports it in each process, with
its servers deferred, as before). Each `spawn` then forks a child that runs `python -m MODULE ARGS` as a fresh
process would: a session of its own, its output to its log, the agent host from `__main__` on. What a child does
not share with a fresh process is only what the parent imported.

Fork safety: a child keeps one thread (the one that forked it). The parent starts none of its own while importing;
when an import starts one, the parent says so and `ForkServer.start` returns False (the runtime then starts plain
processes). Only Linux forks (macOS's system libraries are not fork-safe).

Lifetime: the parent runs under `lifeline` (it ends within `lifeline.CHECK_S` of its owner), and each child follows
the parent the same way (`lifeline.follow`): a `kill -9` of the owner ends the parent, then every child, each
removing the files it was given to remove.

Protocol (one JSON object a line): the parent writes `{"ready": true}` (or `{"ready": false, "why": ...}`) once,
then for each request `{"argv": [MODULE, ARG...], "log": PATH, "remove": [PATH...]}` on its stdin the child's
`{"pid": N}`, and for each child that ends `{"exit": N, "code": C}` (`C` as `Popen.returncode`: -SIGNAL when killed).
The parent ends when its stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, NoReturn

from rollout_pipeline.local import lifeline

MODULE: Final = "rollout_pipeline.local.forks"
#: The agent host's own imports, ahead of the agent module's (not the host: each child runs it as `__main__`).
HOST_IMPORTS: Final = (
    "rollout_pipeline.agent.modules",
    "rollout_pipeline.agent.usage",
    "rollout_pipeline.agent.app",
    "rollout_pipeline.agent.rft_host",
    "rollout_pipeline.agent.warmup",
    "uvicorn",
)
#: This library's modules are imported by the parent whatever folder they come from.
LIBRARY_PREFIX: Final = "rollout_pipeline."


def supported() -> bool:
    """Whether agent processes may be forked here (Linux)."""
    return sys.platform == "linux"


def _installed(name: str) -> bool:
    """Whether module `name` comes from an installed distribution (site-packages), found without importing it."""
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(name.partition(".")[0])
        origin = (spec.origin or "") if spec is not None else ""
        return "site-packages" in origin or "dist-packages" in origin
    return False


def imports_for(module: str) -> list[str]:
    """What the parent imports for agent processes serving `module`: the host's imports, then those of the module's
    own imports that are installed libraries or this library's modules (its own folder's modules are left to each
    process: they may open files or connections when imported)."""
    from rollout_pipeline.agent.modules import top_level_imports

    wanted = [name for name in top_level_imports(module) if name.startswith(LIBRARY_PREFIX) or _installed(name)]
    return list(dict.fromkeys([*HOST_IMPORTS, *wanted]))


def preload(names: Sequence[str]) -> str | None:
    """Import `names` (one that fails is skipped: the process importing it reports that); the reason forking is
    unsafe after it, or None."""
    before = set(threading.enumerate())
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    started = [thread.name for thread in threading.enumerate() if thread not in before and thread.is_alive()]
    return f"importing them started threads: {', '.join(started)}" if started else None


# ------------------------------------------------------------------------------------------------ the parent


def _write(message: Mapping[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _write({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(request: Mapping[str, Any], parent: int, wakeup: Sequence[int], startup_cpu_s: float) -> NoReturn:
    """Become `python -m MODULE ARGS` (`request["argv"]`) in a session of its own, its CPU counting the parent's
    start-up (`startup_cpu_s`) as a fresh process's would. Never returns to the parent's loop: the process ends as
    Python ends one (`SystemExit`, or an exception: its traceback in its log), its exit handlers run."""
    from rollout_pipeline.agent import usage

    usage.inherit_cpu(startup_cpu_s)
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for descriptor in wakeup:
        os.close(descriptor)
    log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    nothing = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, nothing), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(nothing)
    lifeline.follow(parent, remove=[Path(path) for path in request.get("remove", [])])
    sys.argv = [str(part) for part in request["argv"]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    sys.exit(0)


def serve(names: Sequence[str]) -> None:
    """The parent: import `names`, say whether it can fork, then fork a child per request until stdin closes."""
    unsafe = preload(names)
    times = os.times()
    startup_cpu_s = times.user + times.system
    _write({"ready": unsafe is None, **({"why": unsafe} if unsafe else {})})
    if unsafe:
        return
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    me = os.getpid()
    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        _reap()
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:  # the owner closed it: nothing to flush or tear down (a child that still runs follows)
            os._exit(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request, me, (wake_read, wake_write), startup_cpu_s)
            _write({"pid": pid})


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m rollout_pipeline.local.forks MODULE [ARGS...]`: a parent for `python -m MODULE ARGS` processes
    (the agent host's: `--agent-module M` names the module whose imports it makes)."""
    args = list(sys.argv[1:] if argv is None else argv)
    agent_module = args[args.index("--agent-module") + 1] if "--agent-module" in args[:-1] else None
    serve(imports_for(agent_module) if agent_module else list(HOST_IMPORTS))


# ------------------------------------------------------------------------------------------------- the owner


class ForkedProcess:
    """A child of a `ForkServer`, with the part of `subprocess.Popen` agent processes use: `pid`, `poll`, `wait`."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid

    def poll(self) -> int | None:
        """Its exit code once it has ended (as `Popen.returncode`), else None."""
        return self._server.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end; `subprocess.TimeoutExpired` after `timeout` seconds."""
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
        return code


class ForkServer:
    """The owner's side of a warm parent (see the module doc): `start` it, `spawn` processes from it, `close` it.

    `argv` is the parent's command as its children's would start (`[python, "-m", MODULE, ARGS...]`: the agent
    host's with `--agent-module`, without a port); `env` and `cwd` are theirs too; the parent's output goes to `log`."""

    def __init__(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None, log: Path | None = None
    ) -> None:
        self._argv = list(argv)
        self._env = dict(env)
        self._cwd = cwd
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._replies: list[int] = []
        self._exits: dict[int, int] = {}
        self._ended = False
        self.why_not: str | None = None

    def start(self, timeout_s: float) -> bool:
        """Start the parent and wait (bounded) until it has imported everything; False (and `why_not`) when it
        cannot fork: then nothing of it runs."""
        with contextlib.ExitStack() as stack:
            log: IO[bytes] | int = stack.enter_context(self._log.open("ab")) if self._log else subprocess.DEVNULL
            self._process = lifeline.popen(
                [self._argv[0], "-m", MODULE, *self._argv[2:]],
                env=self._env,
                cwd=self._cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        first: list[Any] = []
        reader = threading.Thread(
            target=self._read, args=(self._process.stdout, first), name="agent-forks", daemon=True
        )
        reader.start()
        with self._changed:
            self._changed.wait_for(lambda: first or self._ended, timeout=timeout_s)
        hello = first[0] if first else {}
        if hello.get("ready") is True:
            return True
        self.why_not = str(hello.get("why") or self.why_not or f"not ready within {timeout_s:g} s")
        self.close()
        return False

    def _read(self, replies: IO[bytes], first: list[Any]) -> None:
        for line in replies:
            message = json.loads(line)
            with self._changed:
                if "ready" in message:
                    first.append(message)
                elif "pid" in message:
                    self._replies.append(int(message["pid"]))
                elif "exit" in message:
                    self._exits[int(message["exit"])] = int(message["code"])
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self.why_not = self.why_not or "it ended"
            self._changed.notify_all()

    def spawn(
        self, argv: Sequence[str], log: Path, remove: Sequence[Path] = (), timeout_s: float = 10.0
    ) -> ForkedProcess:
        """Fork a child running `argv` (`[python, "-m", MODULE, ARGS...]`: the python is the parent's); its output
        goes to `log`, and `remove` goes with it if the parent dies. OSError when the parent is gone or does not
        answer."""
        request = {"argv": list(argv[2:]), "log": str(log), "remove": [str(path) for path in remove]}
        with self._lock:  # one request at a time: the parent answers them in order
            process = self._process
            if process is None or process.stdin is None:
                raise OSError("the agent processes' parent is not running")
            try:
                process.stdin.write((json.dumps(request) + "\n").encode())
                process.stdin.flush()
            except (BrokenPipeError, ValueError) as exc:
                raise OSError(f"the agent processes' parent is gone: {exc}") from exc
            with self._changed:
                if not self._changed.wait_for(lambda: self._replies or self._ended, timeout=timeout_s):
                    raise OSError(f"the agent processes' parent did not fork within {timeout_s:g} s")
                if not self._replies:
                    raise OSError("the agent processes' parent is gone")
                return ForkedProcess(self, self._replies.pop(0))

    @property
    def pid(self) -> int | None:
        """The parent's process id while it runs (None before it started, once it ended or was closed)."""
        with self._changed:
            process = self._process
            return None if process is None or self._ended else process.pid

    def exit_code(self, pid: int) -> int | None:
        """The exit code of child `pid` once it has ended; -SIGKILL once the parent is gone (its children end with
        it, within `lifeline.CHECK_S`)."""
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            return -signal.SIGKILL if self._ended else None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        """Wait (bounded by `timeout`) for child `pid`'s exit code; None on timeout."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._ended, timeout=timeout)
        return self.exit_code(pid)

    def close(self) -> None:
        """End the parent (its children, if any still run, end with it). Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


if __name__ == "__main__":
    main()
