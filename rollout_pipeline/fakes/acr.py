"""An in-process fake of AgentCore Runtime (ports.AgentRuntime) for tests, the benchmark and local dry runs.

It behaves like ACR hosting an unmodified ART agent: `invoke` returns at once and the "agent" writes its result
object later (ART's key `{exp_id}/{input_id}/{session_id}.json` and body) to the results bucket through the
ObjectStore port (so in tests it lands on the completion queue through S3 -> EventBridge -> SQS). What each call
does is decided by a behaviour: succeed (scalar or per-turn rewards), raise in the agent, write garbage or an
invalid result, hang (never write), wait for the test (`manual`), throttle or reject the invoke, answer slowly.
Every call is recorded with its wall-clock time, and running/stopped sessions are tracked, so tests can check the
TPS limit and the session limit.

With an `AcrProfile` (`FakeAgentRuntime(profile=AcrProfile(...))`, or `AcrProfile.realistic()`) it also holds the
pipeline to AgentCore's real behaviour (docs/aws-facts.md): ONE new-session rate per account shared by every runtime
and endpoint (25/s, any sliding one-second window; optionally, as before August 2026, also a quota per endpoint: a
token bucket of `new_sessions_per_minute`) and a shared data-plane TPS, active sessions per
account where a session counts until stopped or idle for `idle_timeout_s` (a written but unstopped session keeps
counting), ThrottlingException / ServiceQuotaExceededException when exceeded, cold-start `RuntimeClientError`
(424) on a share of first invokes (the session exists anyway; the same id succeeds after `cold_start_ready_s`),
stops answering ResourceNotFound (sometimes while the session keeps running), Conflict or throttling, and slow
invoke responses. Seeded: the same seed gives the same faults.

Sessions, as AgentCore keeps them: a session's first invoke pays its cold start (`AcrProfile.first_invoke_s`: the
response comes that much later), later invokes of the same id reach the same session with no new-session charge,
a session idle for `idle_timeout_s` is reaped, every session ends `max_lifetime_s` after its start, busy or idle (a
busy rollout's result is then never written: `lifetime_ends_busy`), and (with a profile) an invoke of a session that
was stopped, reaped or ended answers ResourceNotFoundException (`RuntimeRejected`, as the ACR adapter maps it). The
warm pool's warm-up invocation (`config.is_warmup_payload`) is answered as the agent host answers it: at once,
nothing written, the agent's behaviour not consulted (`warmup_behaviour` may fail it); the session is idle from then
on. `warmups` and `warm_reuses` count them, `rollouts_in` counts the rollouts each session ran (a warm session runs
one at most).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from rollout_pipeline import ids
from rollout_pipeline.config import is_warmup_payload
from rollout_pipeline.ports import (
    ObjectStore,
    RuntimeColdStart,
    RuntimeQuotaExceeded,
    RuntimeRateExceeded,
    RuntimeRejected,
    RuntimeSessionNotFound,
    RuntimeStartFailed,
    RuntimeThrottled,
)

BehaviourKind = Literal[
    "success", "agent_error", "garbage", "invalid", "hang", "manual", "throttle", "reject", "cannot_start"
]
#: What AgentCore answers a session whose container exited or never became healthy (docs/aws-facts.md).
CANNOT_START_MESSAGE: Final = (
    "RuntimeClientError (424): Runtime initialization time exceeded. Please make sure that initialization completes "
    "in 30s."
)


@dataclass(frozen=True)
class AgentBehaviour:
    """What one invocation does.

    - success: writes `{**extra, "rewards": rewards}` with status 200 after `delay_s`.
    - agent_error: writes ART's exception body (status_code 500, stop_reason = `error`, a traceback).
    - garbage: writes `body` (default: bytes that are not JSON). invalid: status 200 without rewards.
    - hang: the agent never writes. manual: nothing until `FakeAgentRuntime.finish(session_id)`.
    - throttle / reject: the invoke itself raises RuntimeThrottled / RuntimeRejected (no session starts).
    - cannot_start: the session's container never becomes ready: the invoke raises RuntimeStartFailed
      (`CANNOT_START_MESSAGE`); the microVM was made, so it counts until stopped.
    `invoke_latency_s` makes the InvokeAgentRuntime call itself slow.
    """

    kind: BehaviourKind = "success"
    rewards: float | list[float] = 1.0
    delay_s: float = 0.0
    error: str = "agent raised RuntimeError: boom"
    body: bytes | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    invoke_latency_s: float = 0.0


@dataclass(frozen=True)
class FakeInvocation:
    """What a behaviour function sees: the n-th invoke overall (0-based), the session, the payload."""

    call_no: int
    session_id: str
    payload: Mapping[str, Any]
    session_invocations: int  # how many times this session id was invoked before (0 = first)


@dataclass(frozen=True)
class FakeCall:
    at: float  # time.time() when the call reached the fake
    op: Literal["invoke", "stop"]
    session_id: str
    #: invoke: "started", "reinvoked", "throttled", "quota_exceeded", "cold_start", "rejected", "cannot_start",
    #: "not_found" (a stopped or reaped session), "warmup" (a new session's warm-up), "keepalive" (a warm-up of a
    #: running session); stop: "stopped", "unknown", "throttled", "conflict", "not_found_running"
    outcome: str
    endpoint: int = 0
    #: The warm pool's own invocation (`config.is_warmup_payload`), not a rollout.
    warmup: bool = False


@dataclass(frozen=True)
class AcrProfile:
    """AgentCore Runtime's quotas and failure modes, as the fake enforces them (defaults: docs/aws-facts.md)."""

    #: New sessions per second per account (every runtime and endpoint together), over any sliding one-second window.
    account_new_sessions_per_s: float = 25.0
    #: ALSO a new-session quota per endpoint, per minute (token bucket refilled continuously, one second of burst):
    #: how AgentCore's quota page described it before the account-wide pool. None: the account pool only.
    new_sessions_per_minute: float | None = None
    #: Data-plane calls (invoke + stop) per second per account, over any sliding one-second window.
    data_plane_tps: float = 1000.0
    #: Active sessions per account (a session counts until stopped or idle for `idle_timeout_s`).
    max_active_sessions: int = 1000
    idle_timeout_s: float = 900.0
    #: AgentCore ends every session this long after its start (`maxLifetime`), busy or idle; None: never.
    max_lifetime_s: float | None = None
    #: Runtime endpoints sessions are spread over (`ids.endpoint_index`).
    endpoints: int = 1
    #: Share of first invokes of a session answered RuntimeClientError (424); the session exists anyway.
    cold_start_share: float = 0.0
    #: A cold session answers 424 until this long after its first invoke.
    cold_start_ready_s: float = 1.0
    #: A new session's first successful invoke answers this much later: its microVM's cold start (AgentCore:
    #: ~1.3 s for direct code, 0.4-3.3 s for containers; docs/aws-facts.md). Later invokes of it pay nothing.
    first_invoke_s: float = 0.0
    #: An invoke of a session that ended (stopped, or reaped at its idle timeout): "not_found" answers
    #: ResourceNotFoundException; "restarts" starts a new microVM under the same id, as a new session (the
    #: new-session rate, a cold start), and answers 200: what a public measurement saw (docs/aws-facts.md).
    ended_session_invoke: Literal["not_found", "restarts"] = "not_found"
    #: Share of stops that fail: ResourceNotFound while the session keeps running, Conflict or throttling (in
    #: equal parts). A failed stop leaves the session running; the next stop of it succeeds (after
    #: `stop_failures_in_a_row` failures).
    stop_failure_share: float = 0.0
    #: How many stops of a session chosen to fail fail in a row (a runaway: AgentCore refusing for minutes).
    stop_failures_in_a_row: int = 1
    #: What a failing stop answers (chosen at random among them).
    stop_failure_kinds: tuple[str, ...] = ("not_found_running", "conflict", "throttled")
    #: The InvokeAgentRuntime response takes this long (uniform between the two).
    invoke_latency_s: tuple[float, float] = (0.0, 0.0)
    seed: int = 0

    @classmethod
    def realistic(cls, **overrides: Any) -> AcrProfile:
        """The profile tests and benches use for "real AgentCore": 5% cold starts, 2% failing stops, 20-80 ms
        invoke responses; override anything."""
        values: dict[str, Any] = {
            "cold_start_share": 0.05,
            "stop_failure_share": 0.02,
            "invoke_latency_s": (0.02, 0.08),
        }
        values.update(overrides)
        return cls(**values)


class _Quota:
    """The fake's quota state (under the fake's lock)."""

    def __init__(self, profile: AcrProfile) -> None:
        self.profile = profile
        rate = profile.new_sessions_per_minute / 60.0 if profile.new_sessions_per_minute is not None else 0.0
        self.bucket_rate = rate
        self.tokens = [max(1.0, rate)] * profile.endpoints
        self.refilled = [0.0] * profile.endpoints
        self.new_sessions: deque[float] = deque()
        self.data_plane: deque[float] = deque()

    @staticmethod
    def _window(calls: deque[float], now: float) -> int:
        while calls and calls[0] <= now - 1.0:
            calls.popleft()
        return len(calls)

    def data_plane_call(self, now: float) -> bool:
        if self._window(self.data_plane, now) + 1 > self.profile.data_plane_tps:
            return False
        self.data_plane.append(now)
        return True

    def new_session(self, now: float, endpoint: int) -> bool:
        if self.profile.new_sessions_per_minute is None:
            if self._window(self.new_sessions, now) + 1 > self.profile.account_new_sessions_per_s:
                return False
            self.new_sessions.append(now)
            return True
        burst = max(1.0, self.bucket_rate)
        if self.refilled[endpoint] == 0.0:
            self.refilled[endpoint] = now
        self.tokens[endpoint] = min(burst, self.tokens[endpoint] + (now - self.refilled[endpoint]) * self.bucket_rate)
        self.refilled[endpoint] = now
        if self.tokens[endpoint] < 1.0:
            return False
        if self._window(self.new_sessions, now) + 1 > self.profile.account_new_sessions_per_s:
            return False
        self.tokens[endpoint] -= 1.0
        self.new_sessions.append(now)
        return True


Behaviour = AgentBehaviour | Callable[[FakeInvocation], AgentBehaviour]


class FakeAgentRuntime:
    """In-process fake ACR. Thread-safe. Call `close()` to cancel pending result writes."""

    def __init__(
        self,
        store: ObjectStore | None = None,
        behaviour: Behaviour | None = None,
        *,
        profile: AcrProfile | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if store is None:
            from rollout_pipeline.adapters.s3 import S3ObjectStore

            store = S3ObjectStore()
        self.store = store
        self.behaviour: Behaviour = behaviour or AgentBehaviour()
        self._lock = threading.Lock()
        self.calls: list[FakeCall] = []
        self.running: set[str] = set()
        self.stopped: set[str] = set()
        self.invoked: Counter[str] = Counter()
        self.payloads: dict[str, Mapping[str, Any]] = {}
        self.written: dict[str, str] = {}  # session id -> result key
        self.max_running = 0
        self._pending: dict[str, tuple[AgentBehaviour, threading.Timer | None]] = {}
        self.write_errors: list[str] = []
        self.profile = profile
        self._clock = clock
        self._quota = _Quota(profile) if profile is not None else None
        self._rng = random.Random(profile.seed if profile is not None else 0)
        #: Profile state: when each live session was last busy (None = its agent is still working), when a cold
        #: session becomes ready, sessions a failed stop left running, and the peak of active sessions.
        self.last_active: dict[str, float | None] = {}
        self.cold_until: dict[str, float] = {}
        self.stop_failed_running: set[str] = set()
        #: Failed stops so far, by session (a session fails `stop_failures_in_a_row` stops once chosen).
        self.stop_failures: Counter[str] = Counter()
        self.reaped: set[str] = set()
        self.max_active = 0
        #: Warm-ups (`config.is_warmup_payload`): their behaviour (None: answered), how many, the sessions warmed,
        #: rollouts run in a session that was warmed first, and rollouts per session.
        self.warmup_behaviour: Behaviour | None = None
        self.warmups = 0
        self.warmed: set[str] = set()
        self.warm_reuses = 0
        self.rollouts_in: Counter[str] = Counter()
        #: Ended sessions an invoke started again (`AcrProfile.ended_session_invoke` "restarts").
        self.restarted: set[str] = set()
        #: When each session started (its `maxLifetime` counts from then), the sessions it ended, and of those the
        #: ones a rollout was still running in (its result is never written).
        self.born: dict[str, float] = {}
        self.lifetime_ends: set[str] = set()
        self.lifetime_ends_busy: set[str] = set()

    # ---------------------------------------------------------------------------------------------- the port

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """InvokeAgentRuntime: record, decide by the behaviour, start the session, schedule the result."""
        now = self._clock()
        warmup = is_warmup_payload(payload)
        with self._lock:
            call_no = sum(1 for c in self.calls if c.op == "invoke")
            inv = FakeInvocation(call_no, session_id, payload, self.invoked[session_id])
        chosen = self.warmup_behaviour if warmup else self.behaviour
        behaviour = (chosen(inv) if callable(chosen) else chosen) or AgentBehaviour()
        latency = behaviour.invoke_latency_s
        if self.profile is not None:
            with self._lock:
                low, high = self.profile.invoke_latency_s
                latency += self._rng.uniform(low, high) if high > 0 else 0.0
        endpoint = ids.endpoint_index(session_id, self.profile.endpoints) if self.profile is not None else 0
        with self._lock:
            if self.profile is not None:
                self._enforce_invoke(now, session_id, endpoint, warmup)
            new = not self.invoked[session_id]
            if behaviour.kind == "throttle":
                self.calls.append(FakeCall(now, "invoke", session_id, "throttled", endpoint, warmup))
                raise RuntimeThrottled(f"ThrottlingException: rate exceeded for {session_id}")
            if behaviour.kind == "reject":
                self.calls.append(FakeCall(now, "invoke", session_id, "rejected", endpoint, warmup))
                raise RuntimeRejected(f"ValidationException: session {session_id} rejected")
            if behaviour.kind == "cannot_start":
                self.calls.append(FakeCall(now, "invoke", session_id, "cannot_start", endpoint, warmup))
                self.invoked[session_id] += 1
                self._alive(session_id, now)
                self.last_active[session_id] = now
                raise RuntimeStartFailed(CANNOT_START_MESSAGE)
            if new and self.profile is not None:
                latency += self.profile.first_invoke_s
            if warmup:
                self._warm_up(now, session_id, endpoint)
            else:
                self._start_rollout(now, session_id, endpoint, payload)
            timer: threading.Timer | None = None
            if warmup:
                behaviour = AgentBehaviour(kind="hang")  # the host answered: nothing runs, nothing is written
            if behaviour.kind not in ("hang", "manual") and behaviour.delay_s > 0:
                timer = threading.Timer(behaviour.delay_s, self._write, args=(session_id, behaviour))
                timer.daemon = True
            if behaviour.kind != "hang":
                self._pending[session_id] = (behaviour, timer)
        if latency > 0:  # the response is slow; the session is already working
            time.sleep(latency)
        if timer is not None:
            timer.start()
        elif behaviour.kind not in ("hang", "manual"):
            self._write(session_id, behaviour)

    def _warm_up(self, now: float, session_id: str, endpoint: int) -> None:
        """A warm-up (under the lock): answered by the agent host; the session runs, idle from now."""
        self.calls.append(
            FakeCall(now, "invoke", session_id, "keepalive" if self.invoked[session_id] else "warmup", endpoint, True)
        )
        self.invoked[session_id] += 1
        self.warmups += 1
        self.warmed.add(session_id)
        self.stopped.discard(session_id)
        self._alive(session_id, now)
        if self.last_active.get(session_id, now) is not None:  # a busy session stays busy
            self.last_active[session_id] = now
        self.max_running = max(self.max_running, len(self.running))

    def _start_rollout(self, now: float, session_id: str, endpoint: int, payload: Mapping[str, Any]) -> None:
        """A rollout's invoke (under the lock): the agent works from now on."""
        outcome = "reinvoked" if self.invoked[session_id] else "started"
        self.calls.append(FakeCall(now, "invoke", session_id, outcome, endpoint))
        self.invoked[session_id] += 1
        self.rollouts_in[session_id] += 1
        if session_id in self.warmed:
            self.warm_reuses += 1
        self.payloads[session_id] = payload
        self.stopped.discard(session_id)
        self._alive(session_id, now)
        self.last_active[session_id] = None
        self.max_running = max(self.max_running, len(self.running))

    def _enforce_invoke(self, now: float, session_id: str, endpoint: int, warmup: bool = False) -> None:
        """AgentCore's quotas and cold starts for one invoke (under the lock); raises what AgentCore raises."""
        assert self._quota is not None
        assert self.profile is not None
        if not self._quota.data_plane_call(now):
            self.calls.append(FakeCall(now, "invoke", session_id, "throttled", endpoint, warmup))
            raise RuntimeRateExceeded("ThrottlingException: data-plane rate exceeded")
        cold_until = self.cold_until.get(session_id)
        if cold_until is not None:
            if now < cold_until:
                self.calls.append(FakeCall(now, "invoke", session_id, "cold_start", endpoint, warmup))
                raise RuntimeColdStart(f"RuntimeClientError (424): session {session_id} is still starting")
            del self.cold_until[session_id]
            return
        self._active_sessions(now)  # reaps the sessions idle past the timeout
        if self.invoked[session_id] and session_id not in self.running:
            if self.profile.ended_session_invoke == "not_found":
                self.calls.append(FakeCall(now, "invoke", session_id, "not_found", endpoint, warmup))
                raise RuntimeRejected(
                    f"ResourceNotFoundException: session {session_id} is not running (stopped or idle)"
                )
            self.invoked[session_id] = 0  # a new microVM under the same id: a new session from here on
            self.warmed.discard(session_id)
            self.restarted.add(session_id)
        if session_id in self.running or self.invoked[session_id]:
            return  # an existing session: no new-session quota
        if self._active_sessions(now) >= self.profile.max_active_sessions:
            self.calls.append(FakeCall(now, "invoke", session_id, "quota_exceeded", endpoint, warmup))
            raise RuntimeQuotaExceeded(
                f"ServiceQuotaExceededException: {self.profile.max_active_sessions} active sessions (maxVms)"
            )
        if not self._quota.new_session(now, endpoint):
            self.calls.append(FakeCall(now, "invoke", session_id, "throttled", endpoint, warmup))
            raise RuntimeRateExceeded(f"ThrottlingException: new session creation rate exceeded (endpoint {endpoint})")
        if self._rng.random() < self.profile.cold_start_share:
            # The microVM exists (it counts and must be stopped) but the agent is not up yet.
            self.calls.append(FakeCall(now, "invoke", session_id, "cold_start", endpoint, warmup))
            self.invoked[session_id] += 1
            self._alive(session_id, now)
            self.last_active[session_id] = now
            self.max_running = max(self.max_running, len(self.running))
            self.cold_until[session_id] = now + self.profile.cold_start_ready_s
            self.max_active = max(self.max_active, self._active_sessions(now))
            raise RuntimeColdStart(f"RuntimeClientError (424): session {session_id} is still starting")
        self.max_active = max(self.max_active, self._active_sessions(now) + 1)

    def active_sessions(self, now: float | None = None) -> int:
        """Sessions counting against the active-session quota now: running and busy, or idle for less than
        `idle_timeout_s` (AgentCore reaps them after that; a reaped session leaves `running` on the next call)."""
        now = self._clock() if now is None else now
        with self._lock:
            return self._active_sessions(now)

    def _alive(self, session_id: str, now: float) -> None:
        """The session runs (under the lock): a session that was not running starts a life of its own now."""
        if session_id not in self.running:
            self.born[session_id] = now
            self.running.add(session_id)

    def _active_sessions(self, now: float) -> int:
        """`active_sessions` under the lock (it walks `running` and reaps the sessions idle past the timeout or past
        their maximum lifetime from it)."""
        if self.profile is None:
            return len(self.running)
        idle_timeout, lifetime = self.profile.idle_timeout_s, self.profile.max_lifetime_s
        for sid in list(self.running):
            last = self.last_active.get(sid)
            if lifetime is not None and now - self.born.get(sid, now) >= lifetime:
                self.lifetime_ends.add(sid)
                if last is None:  # its rollout was running: it never writes its result
                    self.lifetime_ends_busy.add(sid)
            elif last is None or now - last < idle_timeout:
                continue
            self.running.discard(sid)
            self.reaped.add(sid)
        return len(self.running)

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession: the session ends; a result not yet written never will be. With a profile: the
        data-plane rate applies, an unknown session answers ResourceNotFound, and a share of stops fail."""
        now = self._clock()
        endpoint = ids.endpoint_index(session_id, self.profile.endpoints) if self.profile is not None else 0
        with self._lock:
            if self.profile is not None:
                self._active_sessions(now)  # a session past its lifetime is gone
            known = session_id in self.running
            if self.profile is not None:
                assert self._quota is not None
                if not self._quota.data_plane_call(now):
                    self.calls.append(FakeCall(now, "stop", session_id, "throttled", endpoint))
                    raise RuntimeRateExceeded("ThrottlingException: data-plane rate exceeded")
                failing = 0 < self.stop_failures[session_id] < self.profile.stop_failures_in_a_row
                if known and (
                    failing
                    or (
                        session_id not in self.stop_failed_running
                        and self._rng.random() < self.profile.stop_failure_share
                    )
                ):
                    self.stop_failed_running.add(session_id)
                    self.stop_failures[session_id] += 1
                    kind = self._rng.choice(self.profile.stop_failure_kinds)
                    self.calls.append(FakeCall(now, "stop", session_id, kind, endpoint))
                    if kind == "not_found_running":
                        raise RuntimeSessionNotFound(f"ResourceNotFoundException: session {session_id}")
                    if kind == "conflict":
                        raise RuntimeThrottled(f"ConflictException: session {session_id} is busy")
                    raise RuntimeThrottled("ThrottlingException: rate exceeded")
                if not known:
                    self.calls.append(FakeCall(now, "stop", session_id, "unknown", endpoint))
                    raise RuntimeSessionNotFound(f"ResourceNotFoundException: session {session_id} not found")
            self.calls.append(FakeCall(now, "stop", session_id, "stopped" if known else "unknown", endpoint))
            self.running.discard(session_id)
            self.stopped.add(session_id)
            self.last_active.pop(session_id, None)
            self.cold_until.pop(session_id, None)
            pending = self._pending.pop(session_id, None)
        if pending is not None and pending[1] is not None:
            pending[1].cancel()

    def sessions(self) -> list[str]:
        """Ids of the sessions running now (as `LocalAgentRuntime.sessions`)."""
        with self._lock:
            return sorted(self.running)

    # ------------------------------------------------------------------------------------------- test hooks

    def lose(self, session_id: str) -> None:
        """The session dies on AgentCore's side (its microVM is gone, as after the idle timeout): its next invoke
        answers ResourceNotFoundException (with a profile) and a stop of it ResourceNotFound."""
        with self._lock:
            self.running.discard(session_id)
            self.reaped.add(session_id)
            self.last_active.pop(session_id, None)

    def finish(self, session_id: str, behaviour: AgentBehaviour | None = None) -> str | None:
        """Write the result of a `manual` (or any pending) session now; returns the key, None if not running."""
        with self._lock:
            pending = self._pending.get(session_id)
        if pending is None and behaviour is None:
            return None
        chosen = behaviour or (pending[0] if pending else AgentBehaviour())
        if chosen.kind == "manual":
            chosen = AgentBehaviour(rewards=chosen.rewards, extra=chosen.extra)
        return self._write(session_id, chosen, force=True)

    def close(self) -> None:
        """Cancel every pending result write."""
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for _behaviour, timer in pending:
            if timer is not None:
                timer.cancel()

    def running_sessions(self) -> set[str]:
        """A snapshot of the sessions running now (safe while other threads invoke and stop)."""
        with self._lock:
            return set(self.running)

    def invocations(self, outcome: str | None = None) -> list[FakeCall]:
        with self._lock:
            return [c for c in self.calls if c.op == "invoke" and (outcome is None or c.outcome == outcome)]

    def stops(self) -> list[FakeCall]:
        with self._lock:
            return [c for c in self.calls if c.op == "stop"]

    def calls_per_second(self) -> Counter[int]:
        """ACR calls (invoke + stop, including throttled and rejected ones) per epoch second."""
        with self._lock:
            return Counter(int(c.at) for c in self.calls)

    def max_calls_per_second(self) -> int:
        per_second = self.calls_per_second()
        return max(per_second.values()) if per_second else 0

    # ---------------------------------------------------------------------------------------------- writing

    def _write(self, session_id: str, behaviour: AgentBehaviour, force: bool = False) -> str | None:
        with self._lock:
            self._active_sessions(self._clock())  # a session whose lifetime ended writes nothing
            if not force and session_id not in self.running:
                return None  # stopped (or ended) before the agent finished
            self._pending.pop(session_id, None)
            payload = self.payloads.get(session_id) or {}
        rollout = payload.get("_rollout") or {}
        exp_id, input_id, bucket = rollout.get("exp_id"), rollout.get("input_id"), rollout.get("s3_bucket")
        if not (exp_id and input_id and bucket):
            return None  # ART saves nothing without the trio
        key = f"{exp_id}/{input_id}/{session_id}.json"
        meta = {"input_id": input_id, "s3_bucket": bucket, "result_key": key, "payload": dict(payload)}
        if behaviour.kind == "garbage":
            body = behaviour.body if behaviour.body is not None else b"\x00not json{"
        elif behaviour.kind == "agent_error":
            traceback = (
                f'Traceback (most recent call last):\n  File "agent.py", line 1\nRuntimeError: {behaviour.error}'
            )
            body = json.dumps(
                {"status_code": 500, "stop_reason": behaviour.error, "traceback": traceback, **meta}, indent=2
            ).encode()
        elif behaviour.kind == "invalid":
            body = json.dumps({**behaviour.extra, "status_code": 200, "stop_reason": "end_turn", **meta}).encode()
        else:
            user = {**behaviour.extra, "rewards": behaviour.rewards}
            body = json.dumps({**user, "status_code": 200, "stop_reason": "end_turn", **meta}, indent=2).encode()
        try:
            self.store.put_bytes(bucket, key, body)
        except Exception as exc:  # a timer thread must not die silently: tests assert on write_errors
            with self._lock:
                self.write_errors.append(f"{key}: {exc}")
            return None
        with self._lock:
            self.written[session_id] = key
            if session_id in self.running:
                self.last_active[session_id] = self._clock()  # idle from now on: counts until stopped or reaped
        return key
