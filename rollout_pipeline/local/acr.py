"""A local stand-in for Amazon Bedrock AgentCore Runtime: agent processes on loopback, spoken to as ACR does.

ACR gives every session its own microVM running the agent image's HTTP server, and sends it
`POST /invocations` (session id in header `X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`); `GET /ping` tells it
whether the agent is busy (`HealthyBusy`) or idle (`Healthy`); `StopRuntimeSession` terminates the microVM.

`LocalAgentRuntime` does the same with processes: each runs the agent host, as the agent image does
(`python -m rollout_pipeline.agent.host --agent-module MODULE --host 127.0.0.1 --port N`), so an agent module
written the ART way (ending in `app.run()`) runs as it is, however many processes run at once.

- isolation "process" (default, ACR-faithful): one agent process per session, started lazily, at most
  `max_sessions` at once; `warm_processes` spares are kept started so an invoke does not wait for Python to import
  the agent. A new session takes a spare (or starts a process), later invokes of the same session reach the same
  process, and `stop(session)` kills that process (SIGKILL: like a stopped microVM it writes nothing more), so a
  stopped session's work really ends. Processes are never reused across sessions.
- isolation "shared": one process serves every session; `stop` is bookkeeping only (its work runs to the end).
  Cheaper, for tests of everything but stop.

When it is full (`max_sessions` live), sessions whose agent has answered `Healthy` (idle) for longer than
`idle_timeout_s` are stopped (ACR's idle timeout); if none is, `invoke` raises `RuntimeThrottled` (ACR:
ServiceQuotaExceededException). With `max_lifetime_s`, a session's process is killed that long after the session
started, busy or idle (ACR's `maxLifetime`: a rollout still running then never writes its result; `lifetime_ends`
counts them).

The warm pool's warm-up invocations (`config.is_warmup_payload`) go to the session's process like any other and the
agent host answers them itself; the stand-in counts them (`warmups`) and the rollouts that later run in a session
started that way (`warm_reuses`), so a run can show that its rollouts started in warm sessions.

HTTP answers map to the ports' errors: 2xx ok; 429, 402, 409, 502, 503, 504 and connection failures/timeouts
-> `RuntimeThrottled` (retry later); 400, 401, 403, 404, 413, 415, 422 and 500 -> `RuntimeRejected`. A 500 is the
agent's entrypoint failing before it starts work (e.g. ART's "Missing required rollout config field"): retrying
the same payload cannot succeed (real ACR reports it as RuntimeClientError).

An agent process that exits before it is ready, or does not answer `/ping` within `startup_timeout_s`, makes the
session's invoke raise `RuntimeStartFailed` with the tail of the process's output (where AgentCore answers
`RuntimeClientError` "Runtime initialization time exceeded"): the dispatcher fails the rollout at once as
`agent_error`. `start()` raises `AgentStartError` when no warm process could start, so a run whose agent cannot
start stops before anything is submitted.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from rollout_pipeline.agent.host import CANNOT_SERVE
from rollout_pipeline.config import DEFAULT_AGENT_MODULES, is_warmup_payload
from rollout_pipeline.local import forks, lifeline
from rollout_pipeline.local.moto_server import LOOPBACK, free_port
from rollout_pipeline.ports import (
    RuntimeQuotaExceeded,
    RuntimeRateExceeded,
    RuntimeRejected,
    RuntimeStartFailed,
    RuntimeThrottled,
)

logger = logging.getLogger(__name__)

SESSION_HEADER: Final = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
#: The agent a runtime serves when given none: the example math agent (ART).
DEFAULT_AGENT_MODULE: Final = DEFAULT_AGENT_MODULES["art"]
#: The process every agent session runs (as the agent image's start command does).
HOST_MODULE: Final = "rollout_pipeline.agent.host"
#: How long a new agent process may take to answer `/ping` (AgentCore's own limit is 30 s: docs/aws-facts.md).
DEFAULT_STARTUP_TIMEOUT_S: Final = 60.0
#: ACR's limits on the session id (botocore rejects others before sending) and the payload.
MIN_SESSION_ID_LENGTH: Final = 33
MAX_SESSION_ID_LENGTH: Final = 256
MAX_PAYLOAD_BYTES: Final = 100 * 1024 * 1024

THROTTLE_STATUSES: Final = frozenset({402, 409, 429, 502, 503, 504})
Isolation = Literal["process", "shared"]
PingStatus = Literal["Healthy", "HealthyBusy"]


class AgentStartError(RuntimeError):
    """An agent process exited or did not answer `/ping` in time; the message carries its log's tail and
    `summary` what happened in one line (with the log's last line: the agent host's `cannot serve ...`, the
    exception that ended the process)."""

    def __init__(self, what: str, log_tail: str = "") -> None:
        self.what = what
        self.log_tail = log_tail
        super().__init__(f"{what}: {log_tail}" if log_tail.strip() else what)

    @property
    def summary(self) -> str:
        lines = [line.strip() for line in self.log_tail.splitlines() if line.strip()]
        if not lines:
            return self.what
        last = lines[-1]
        return last if last.startswith(CANNOT_SERVE) else f"{self.what}: {last}"


def agent_command(
    module: str = DEFAULT_AGENT_MODULE,
    port: int = 8080,
    host: str = LOOPBACK,
    python: str = sys.executable,
    *,
    kind: str = "auto",
    hosted: bool = True,
) -> list[str]:
    """The command that serves an agent module: the agent host importing it (`hosted`, the default:
    `python -m rollout_pipeline.agent.host --agent-module MODULE --agent-kind KIND --host H --port P`), or the module
    run as it is (`python -m MODULE --host H --port P`: for a module that is itself a server, e.g. the host)."""
    if kind not in ("auto", "art", "rft"):
        raise ValueError(f"agent kind must be auto, art or rft, got {kind!r}")
    if not hosted:
        return [python, "-m", module, "--host", host, "--port", str(port)]
    return [
        python,
        "-m",
        HOST_MODULE,
        "--agent-module",
        module,
        "--agent-kind",
        kind,
        "--host",
        host,
        "--port",
        str(port),
    ]


def agent_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, with the library importable (PYTHONPATH) and unbuffered output."""
    return lifeline.environ({**(extra or {}), "PYTHONUNBUFFERED": "1"})


def _http_json(
    method: str, url: str, body: bytes | None, headers: Mapping[str, str], timeout: float
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")[:500]


class AgentProcess:
    """One agent server process on 127.0.0.1: start it, wait for `/ping`, invoke it, stop it.

    `kind` ("auto", "art", "rft") is the agent host's `--agent-kind`; `hosted=False` runs `python -m MODULE` as it
    is (see `agent_command`). Its output goes to `log_path`; without one, to a temporary file of its own, removed
    when the process is stopped (or, if this process is killed first, when the agent process ends with it). Given a
    `parent` (`forks.ForkServer`, started for the same command), it is forked from it instead of started afresh."""

    def __init__(
        self,
        module: str = DEFAULT_AGENT_MODULE,
        *,
        kind: str = "auto",
        hosted: bool = True,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        log_path: Path | None = None,
        python: str = sys.executable,
        cwd: str | None = None,
        parent: forks.ForkServer | None = None,
    ) -> None:
        self.module = module
        self.kind = kind
        self.hosted = hosted
        self.port = port or free_port()
        #: A log of its own (no `log_path` given) goes with the process; a caller's stays.
        self._owns_log = log_path is None
        if log_path is None:
            descriptor, name = tempfile.mkstemp(prefix="agent-", suffix=".log")
            os.close(descriptor)
            log_path = Path(name)
        self.log_path = log_path
        self._env = agent_environ(env)
        self._python = python
        self._cwd = cwd
        self._parent = parent
        self._process: subprocess.Popen[bytes] | forks.ForkedProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> AgentProcess:
        """Start the process (does not wait: see `wait_ready`): forked from `parent` when given one (afresh when
        the parent cannot fork it)."""
        if self._process is not None:
            return self
        command = agent_command(self.module, self.port, LOOPBACK, self._python, kind=self.kind, hosted=self.hosted)
        remove = [self.log_path] if self._owns_log else []
        if self._parent is not None:
            try:
                self._process = self._parent.spawn(command, self.log_path, remove=remove)
                return self
            except OSError as exc:
                logger.warning("agent %s could not be forked (%s): started afresh", self.module, exc)
        with self.log_path.open("ab") as log:
            self._process = lifeline.popen(  # ends with this process, even killed with SIGKILL
                command,
                remove=remove,
                env=self._env,
                cwd=self._cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def ping(self, timeout: float = 2.0) -> PingStatus | None:
        """`Healthy` / `HealthyBusy` from `/ping`, or None if it does not answer."""
        try:
            status, body = _http_json("GET", f"{self.base_url}/ping", None, {}, timeout)
        except OSError:
            return None
        if status != 200 or not isinstance(body, dict):
            return None
        value = body.get("status")
        return value if value in ("Healthy", "HealthyBusy") else None

    def exit_code(self) -> int | None:
        """The process's exit code once it has ended, else None."""
        return None if self._process is None else self._process.poll()

    def exited_error(self) -> AgentStartError:
        """The error of a process that has ended, with its log's tail."""
        return AgentStartError(f"agent {self.module} exited with code {self.exit_code()}", self.log_tail())

    def wait_ready(self, timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> None:
        """Poll `/ping` until the agent answers (bounded); raise `AgentStartError` if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise self.exited_error()
            if self.ping(timeout=1.0) is not None:
                return
            time.sleep(0.1)
        raise AgentStartError(f"agent {self.module} did not answer /ping within {timeout_s:g} s", self.log_tail())

    def invoke(self, session_id: str, payload: Mapping[str, Any] | bytes, timeout: float = 30.0) -> tuple[int, Any]:
        """POST `/invocations` with the session header; return (HTTP status, decoded body). OSError if unreachable."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", SESSION_HEADER: session_id}
        return _http_json("POST", f"{self.base_url}/invocations", body, headers, timeout)

    def stop(self, grace_s: float = 0.0) -> None:
        """End the process: SIGTERM with `grace_s` to exit, else SIGKILL (immediately when `grace_s` is 0); then
        remove its log if it is its own (no `log_path` given)."""
        self._end(grace_s)
        if self._owns_log:
            self.log_path.unlink(missing_ok=True)

    def _end(self, grace_s: float) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if grace_s > 0:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=grace_s)
                    return
                except subprocess.TimeoutExpired:
                    pass
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def log_tail(self, max_chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def __enter__(self) -> AgentProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class _Session:
    process: AgentProcess
    started_at: float
    idle_since: float | None = None
    invocations: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Ends the session at its maximum lifetime (`LocalAgentRuntime.max_lifetime_s`).
    lifetime: threading.Timer | None = None


class LocalAgentRuntime:
    """`ports.AgentRuntime` over local agent processes (see the module docstring for what `stop` means).

    Args:
        module: the agent module to serve (through the agent host, `rollout_pipeline.agent.host`).
        kind: the agent host's `--agent-kind`: "auto" (told from the module's source), "art" or "rft".
        env: extra environment for the agent processes (e.g. `AWS_ENDPOINT_URL` of the moto server, fake
            credentials, `AWS_DEFAULT_REGION`); the rest is inherited.
        max_sessions: sessions (processes, in "process" isolation) alive at once.
        warm_processes: started spares kept ready ("process" isolation).
        isolation: "process" (one process per session) or "shared" (one process, stop is bookkeeping).
        idle_timeout_s: when full, sessions idle (`Healthy`) longer than this are stopped.
        startup_timeout_s / invoke_timeout_s: bounds on waiting for `/ping` (a process not ready by then fails its
            session's rollout: `RuntimeStartFailed`) and for `/invocations`.
        log_dir: where agent logs go (by default a temporary directory of its own, removed at `close`, or when this
            process is killed before).
        new_sessions_per_s: the local account's new-session quota (AgentCore's is one per account, every
            experiment's sessions on this runtime together: local mode runs several experiments on one); over it
            in any sliding second an invoke that opens a session is refused as AgentCore refuses it
            (`RuntimeRateExceeded`) and counted in `throttles`. None: no rate quota.
        max_lifetime_s: every session ends this long after it started, busy or idle (AgentCore's `maxLifetime`);
            None: never.
        forked: in "process" isolation, fork each agent process from one warm parent that imported the agent's
            libraries once (`local.forks`: a session's process is ready in a fraction of the CPU), where that is
            safe (Linux, and nothing the parent imports starts a thread); else start each afresh.
    """

    def __init__(
        self,
        module: str = DEFAULT_AGENT_MODULE,
        *,
        kind: str = "auto",
        env: Mapping[str, str] | None = None,
        max_sessions: int = 4,
        warm_processes: int = 1,
        isolation: Isolation = "process",
        idle_timeout_s: float = 900.0,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        invoke_timeout_s: float = 30.0,
        log_dir: Path | None = None,
        python: str = sys.executable,
        cwd: str | None = None,
        new_sessions_per_s: float | None = None,
        max_lifetime_s: float | None = None,
        forked: bool = True,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if isolation not in ("process", "shared"):
            raise ValueError(f"isolation must be 'process' or 'shared', got {isolation!r}")
        agent_command(module, kind=kind)  # checks the kind now
        self.module = module
        self.kind = kind
        self.max_sessions = max_sessions
        self.warm_processes = max(0, warm_processes) if isolation == "process" else 0
        self.isolation: Isolation = isolation
        self.idle_timeout_s = idle_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.invoke_timeout_s = invoke_timeout_s
        #: A log directory of its own (no `log_dir` given) goes at `close`; a caller's stays.
        self._own_log_dir: lifeline.OwnedPath | None = None
        if log_dir is None:
            self._own_log_dir = lifeline.OwnedPath(Path(tempfile.mkdtemp(prefix="local-acr-")))
            log_dir = self._own_log_dir.path
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._env = dict(env or {})
        self._python = python
        self._cwd = cwd
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._reserved = 0
        self._spares: list[AgentProcess] = []
        self._launching: set[AgentProcess] = set()
        self._starting_spares = 0
        self._shared: AgentProcess | None = None
        self.forked = forked and isolation == "process" and forks.supported()
        #: The warm parent of the agent processes (`forked`), started with the first of them.
        self._forks: forks.ForkServer | None = None
        self._forks_lock = threading.Lock()
        self._counter = 0
        self._closed = False
        #: The last start failure of a warm spare: raised by `start`, logged (once) after it.
        self._spare_error: AgentStartError | None = None
        self._started = False
        #: The most recently stopped session ids, oldest first (for tests and diagnostics).
        self.stopped_sessions: deque[str] = deque(maxlen=10_000)
        #: Warm-up invocations answered, sessions started by one, and rollouts run in such a session.
        self.warmups = 0
        self.warmed_sessions: set[str] = set()
        self.warm_reuses = 0
        self.new_sessions_per_s = new_sessions_per_s
        self._new_sessions: deque[float] = deque()
        #: New sessions refused by the account's new-session quota (AgentCore's ThrottlingException), and started.
        self.throttles = 0
        self.started_sessions = 0
        self.max_lifetime_s = max_lifetime_s
        #: What ends a session at its maximum lifetime (a test gives one it fires itself).
        self.timer = threading.Timer
        #: Sessions ended at their maximum lifetime.
        self.lifetime_ends = 0
        _open_runtimes.add(self)

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> LocalAgentRuntime:
        """Start the shared process or the warm spares now and wait for them (optional: invoke starts lazily).

        Raises `AgentStartError` (the process's output's tail in the message, one line in `summary`) when the shared
        process, or every warm spare, failed to start: the agent cannot start, so nothing should be submitted."""
        if self.isolation == "shared":
            self._shared_process()
            return self
        self._fill_spares(wait=True)
        with self._lock:
            failed = self._spare_error if self.warm_processes and not self._spares else None
        if failed is not None:
            raise failed
        self._started = True
        return self

    def close(self) -> None:
        """Stop every process (sessions, spares, the shared one). The runtime cannot be used after."""
        with self._lock:
            self._closed = True
            processes = [s.process for s in self._sessions.values()] + self._spares + list(self._launching)
            for session in self._sessions.values():
                if session.lifetime is not None:
                    session.lifetime.cancel()
            if self._shared is not None:
                processes.append(self._shared)
            self._sessions.clear()
            self._spares.clear()
            self._shared = None
        for process in processes:
            process.stop()
        with self._forks_lock:
            parent, self._forks = self._forks, None
        if parent is not None:
            parent.close()
        if self._own_log_dir is not None:
            self._own_log_dir.remove()

    def __enter__(self) -> LocalAgentRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------------------------------------- AgentRuntime

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """Start `payload` in session `session_id` (a new session gets its own agent process).

        Raises `RuntimeThrottled` (full, agent unreachable or answering 429/402/409/5xx) or `RuntimeRejected`
        (bad session id or payload, agent answered 4xx/500)."""
        _validate_session_id(session_id)
        try:
            body = json.dumps(payload).encode()
        except (TypeError, ValueError) as exc:
            raise RuntimeRejected(f"ValidationException: payload is not JSON-serialisable: {exc}") from None
        if len(body) > MAX_PAYLOAD_BYTES:
            raise RuntimeRejected(f"ValidationException: payload is {len(body)} bytes (max {MAX_PAYLOAD_BYTES})")
        session, is_new = self._session_for(session_id)
        try:
            with session.lock:
                session.invocations += 1
                session.idle_since = None
                status, answer = session.process.invoke(session_id, body, timeout=self.invoke_timeout_s)
        except OSError as exc:
            if is_new:
                self._discard(session_id)
                if session.process.exit_code() is not None:  # it died between its /ping and this first call
                    raise RuntimeStartFailed(str(session.process.exited_error())) from exc
            raise RuntimeThrottled(f"agent for session {session_id} unreachable: {exc}") from exc
        if 200 <= status < 300:
            self._count(session_id, payload)
            return
        if is_new:
            self._discard(session_id)
        detail = f"agent answered HTTP {status}: {answer}"[:1000]
        if status in THROTTLE_STATUSES:
            raise RuntimeThrottled(detail)
        raise RuntimeRejected(detail)

    def _count(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """Count an answered warm-up, or a rollout run in a session a warm-up started."""
        with self._lock:
            if is_warmup_payload(payload):
                self.warmups += 1
                self.warmed_sessions.add(session_id)
            elif session_id in self.warmed_sessions:
                self.warm_reuses += 1

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession: end the session ("process": kill its process; "shared": forget it). Idempotent."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                self.stopped_sessions.append(session_id)
        self._end(session)

    def _end_of_life(self, session_id: str, session: _Session) -> None:
        """The session reached its maximum lifetime: it ends (its process is killed), whatever it was doing."""
        with self._lock:
            ended = self._sessions.get(session_id) is session
            if ended:
                del self._sessions[session_id]
                self.lifetime_ends += 1
        if ended:
            logger.info("session %s reached its maximum lifetime (%s s): ended", session_id, self.max_lifetime_s)
            self._end(session)

    def _end(self, session: _Session | None) -> None:
        if session is None:
            return
        if session.lifetime is not None:
            session.lifetime.cancel()
        if self.isolation == "process":
            session.process.stop()

    # ------------------------------------------------------------------------------------------------ inspection

    @property
    def parent_pid(self) -> int | None:
        """The process id of the warm parent the agent processes are forked from (`forked`) while it runs."""
        parent = self._forks
        return None if parent is None else parent.pid

    def sessions(self) -> list[str]:
        """Ids of the sessions alive now."""
        with self._lock:
            return list(self._sessions)

    def process_of(self, session_id: str) -> AgentProcess | None:
        """The process serving `session_id`, if the session is alive."""
        with self._lock:
            session = self._sessions.get(session_id)
        return None if session is None else session.process

    def ping(self, session_id: str) -> PingStatus | None:
        """`/ping` of the session's agent (`Healthy` = idle, `HealthyBusy` = working), None if the session is gone.
        In "shared" isolation the status is the whole process's."""
        process = self.process_of(session_id)
        return None if process is None else process.ping()

    def wait_idle(self, session_id: str, timeout_s: float = 60.0, interval_s: float = 0.1) -> bool:
        """Wait (bounded) until the session's agent answers `Healthy`; False on timeout or if the session is gone."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.ping(session_id)
            if status is None:
                return False
            if status == "Healthy":
                return True
            time.sleep(interval_s)
        return False

    # ---------------------------------------------------------------------------------------------- internals

    def _session_for(self, session_id: str) -> tuple[_Session, bool]:
        with self._lock:
            if self._closed:
                raise RuntimeRejected("local runtime is closed")
            existing = self._sessions.get(session_id)
            if existing is not None:
                return existing, False
            full = len(self._sessions) + self._reserved >= self.max_sessions
        if full:
            self._reap_idle()
        with self._lock:
            if len(self._sessions) + self._reserved >= self.max_sessions:
                raise RuntimeQuotaExceeded(
                    f"ServiceQuotaExceededException: {self.max_sessions} local sessions are active"
                )
            self._take_new_session()
            self._reserved += 1
            spare = self._spares.pop(0) if self._spares else None
        try:
            process = spare if spare is not None and spare.is_alive() else self._new_process(wait=True)
        except AgentStartError as exc:
            with self._lock:
                self._reserved -= 1
                closed = self._closed
            if closed:  # stopped under it: the runtime is going away, the agent is not at fault
                raise RuntimeThrottled("local runtime is closed") from exc
            raise RuntimeStartFailed(str(exc)) from exc
        session = _Session(process=process, started_at=time.monotonic())
        with self._lock:
            self._reserved -= 1
            raced = self._sessions.get(session_id)
            if raced is None:
                self._sessions[session_id] = session
        if raced is not None:  # two first invokes of one session at once: keep the first process
            if self.isolation == "process":
                process.stop()
            return raced, False
        if self.max_lifetime_s is not None:
            session.lifetime = self.timer(self.max_lifetime_s, self._end_of_life, (session_id, session))
            session.lifetime.daemon = True
            session.lifetime.start()
        if self.isolation == "process":
            self._fill_spares(wait=False)
        return session, True

    def _take_new_session(self) -> None:
        """Count a new session against the account's new-session quota (under the lock); refuse it over the quota."""
        now = time.monotonic()
        window = self._new_sessions
        while window and window[0] <= now - 1.0:
            window.popleft()
        if self.new_sessions_per_s is not None and len(window) + 1 > self.new_sessions_per_s:
            self.throttles += 1
            raise RuntimeRateExceeded("ThrottlingException: new session creation rate exceeded (local account)")
        window.append(now)
        self.started_sessions += 1

    def _new_process(self, wait: bool) -> AgentProcess:
        if self.isolation == "shared":
            return self._shared_process()
        parent = self._fork_parent()
        with self._lock:
            self._counter += 1
            number = self._counter
        process = AgentProcess(
            self.module,
            kind=self.kind,
            env=self._env,
            log_path=self.log_dir / f"agent-{number}.log",
            python=self._python,
            cwd=self._cwd,
            parent=parent,
        )
        try:
            with self._lock:
                if self._closed:
                    raise AgentStartError("local runtime is closed")
                self._launching.add(process)  # so close() also stops processes still starting
                process.start()
            if wait:
                process.wait_ready(self.startup_timeout_s)
        except AgentStartError:
            process.stop()
            raise
        finally:
            with self._lock:
                self._launching.discard(process)
        return process

    def _fork_parent(self) -> forks.ForkServer | None:
        """The warm parent to fork agent processes from (started by the first caller), or None: start them afresh."""
        with self._forks_lock:
            if self._forks is not None and self._forks.pid is None:
                logger.warning("the agent processes' parent ended (%s): starting another", self._forks.why_not)
                self._forks.close()
                self._forks = None
            if self._forks is None and self.forked:
                parent = forks.ForkServer(
                    [self._python, "-m", HOST_MODULE, "--agent-module", self.module, "--agent-kind", self.kind],
                    env=agent_environ(self._env),
                    cwd=self._cwd,
                    log=self.log_dir / "agent-parent.log",
                )
                if parent.start(self.startup_timeout_s):
                    self._forks = parent
                else:
                    self.forked = False
                    logger.info("agent processes start afresh, not forked: %s", parent.why_not)
            with self._lock:
                closed = self._closed
            if closed and self._forks is not None:
                self._forks.close()
                self._forks = None
            return self._forks

    def _shared_process(self) -> AgentProcess:
        with self._lock:
            process = self._shared
            if process is None:
                process = AgentProcess(
                    self.module,
                    kind=self.kind,
                    env=self._env,
                    log_path=self.log_dir / "agent-shared.log",
                    python=self._python,
                    cwd=self._cwd,
                ).start()
                self._shared = process
        process.wait_ready(self.startup_timeout_s)
        return process

    def _fill_spares(self, wait: bool) -> None:
        with self._lock:
            missing = self.warm_processes - len(self._spares) - self._starting_spares
            room = self.max_sessions - len(self._sessions) - self._reserved - len(self._spares)
            count = max(0, min(missing, room - self._starting_spares))
            self._starting_spares += count
        threads = [threading.Thread(target=self._start_spare, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        if wait:
            for thread in threads:
                thread.join(self.startup_timeout_s + 5)

    def _start_spare(self) -> None:
        try:
            process = self._new_process(wait=True)
        except AgentStartError as exc:
            with self._lock:
                self._starting_spares -= 1
                closed = self._closed
                first = self._spare_error is None
                self._spare_error = exc
                quiet = closed or not self._started or not first
            (logger.debug if quiet else logger.warning)("could not start a spare agent process: %s", exc.summary)
            return
        with self._lock:
            self._starting_spares -= 1
            keep = not self._closed
            if keep:
                self._spares.append(process)
        if not keep:
            process.stop()

    def _reap_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            candidates = list(self._sessions.items())
        for session_id, session in candidates:
            if session.lock.locked():
                continue
            status = session.process.ping(timeout=1.0)
            if status == "Healthy":
                session.idle_since = session.idle_since or now
                if now - session.idle_since >= self.idle_timeout_s:
                    logger.info("stopping idle session %s", session_id)
                    self.stop(session_id)
            elif status is None and not session.process.is_alive():
                self.stop(session_id)
            else:
                session.idle_since = None

    def _discard(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        self._end(session)


#: Runtimes not yet closed: their processes are stopped when the interpreter exits (a safety net for `close()`).
_open_runtimes: weakref.WeakSet[LocalAgentRuntime] = weakref.WeakSet()


@atexit.register
def _close_open_runtimes() -> None:
    for runtime in list(_open_runtimes):
        with contextlib.suppress(Exception):
            runtime.close()


def _validate_session_id(session_id: str) -> None:
    if not isinstance(session_id, str) or not MIN_SESSION_ID_LENGTH <= len(session_id) <= MAX_SESSION_ID_LENGTH:
        length = len(session_id) if isinstance(session_id, str) else "?"
        raise RuntimeRejected(
            f"ValidationException: runtimeSessionId must be {MIN_SESSION_ID_LENGTH}-{MAX_SESSION_ID_LENGTH} "
            f"characters (got {length})"
        )


def start_agent(
    module: str = DEFAULT_AGENT_MODULE,
    *,
    kind: str = "auto",
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    log_path: Path | None = None,
) -> AgentProcess:
    """Start one agent process on 127.0.0.1 and wait for its `/ping`. Stop it with `.stop()` (or use `with`)."""
    process = AgentProcess(module, kind=kind, env=env, port=port, log_path=log_path).start()
    try:
        process.wait_ready(timeout_s)
    except BaseException:
        process.stop()
        raise
    return process


__all__: Sequence[str] = (
    "DEFAULT_AGENT_MODULE",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "HOST_MODULE",
    "SESSION_HEADER",
    "AgentProcess",
    "AgentStartError",
    "LocalAgentRuntime",
    "agent_command",
    "agent_environ",
    "free_port",
    "start_agent",
)
