"""An in-process fake of AgentCore Runtime (ports.AgentRuntime) for tests, the benchmark and local dry runs.

It behaves like ACR hosting an unmodified ART agent: `invoke` returns at once and the "agent" writes its result
object later (ART's key `{exp_id}/{input_id}/{session_id}.json` and body) to the results bucket through the
ObjectStore port (so in tests it lands on the completion queue through S3 -> EventBridge -> SQS). What each call
does is decided by a behaviour: succeed (scalar or per-turn rewards), raise in the agent, write garbage or an
invalid result, hang (never write), wait for the test (`manual`), throttle or reject the invoke, answer slowly.
Every call is recorded with its wall-clock time, and running/stopped sessions are tracked, so tests can check the
TPS limit and the session limit.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rollout_pipeline.ports import ObjectStore, RuntimeRejected, RuntimeThrottled

BehaviourKind = Literal["success", "agent_error", "garbage", "invalid", "hang", "manual", "throttle", "reject"]


@dataclass(frozen=True)
class AgentBehaviour:
    """What one invocation does.

    - success: writes `{**extra, "rewards": rewards}` with status 200 after `delay_s`.
    - agent_error: writes ART's exception body (status_code 500, stop_reason = `error`, a traceback).
    - garbage: writes `body` (default: bytes that are not JSON). invalid: status 200 without rewards.
    - hang: the agent never writes. manual: nothing until `FakeAgentRuntime.finish(session_id)`.
    - throttle / reject: the invoke itself raises RuntimeThrottled / RuntimeRejected (no session starts).
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
    outcome: str  # "started", "reinvoked", "throttled", "rejected", "stopped", "unknown"


Behaviour = AgentBehaviour | Callable[[FakeInvocation], AgentBehaviour]


class FakeAgentRuntime:
    """In-process fake ACR. Thread-safe. Call `close()` to cancel pending result writes."""

    def __init__(self, store: ObjectStore | None = None, behaviour: Behaviour | None = None) -> None:
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

    # ---------------------------------------------------------------------------------------------- the port

    def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
        """InvokeAgentRuntime: record, decide by the behaviour, start the session, schedule the result."""
        now = time.time()
        with self._lock:
            call_no = sum(1 for c in self.calls if c.op == "invoke")
            inv = FakeInvocation(call_no, session_id, payload, self.invoked[session_id])
        behaviour = self.behaviour(inv) if callable(self.behaviour) else self.behaviour
        if behaviour.invoke_latency_s > 0:
            time.sleep(behaviour.invoke_latency_s)
        with self._lock:
            if behaviour.kind == "throttle":
                self.calls.append(FakeCall(now, "invoke", session_id, "throttled"))
                raise RuntimeThrottled(f"ThrottlingException: rate exceeded for {session_id}")
            if behaviour.kind == "reject":
                self.calls.append(FakeCall(now, "invoke", session_id, "rejected"))
                raise RuntimeRejected(f"ValidationException: session {session_id} rejected")
            outcome = "reinvoked" if self.invoked[session_id] else "started"
            self.calls.append(FakeCall(now, "invoke", session_id, outcome))
            self.invoked[session_id] += 1
            self.payloads[session_id] = payload
            self.stopped.discard(session_id)
            self.running.add(session_id)
            self.max_running = max(self.max_running, len(self.running))
            timer: threading.Timer | None = None
            if behaviour.kind not in ("hang", "manual") and behaviour.delay_s > 0:
                timer = threading.Timer(behaviour.delay_s, self._write, args=(session_id, behaviour))
                timer.daemon = True
            if behaviour.kind != "hang":
                self._pending[session_id] = (behaviour, timer)
        if timer is not None:
            timer.start()
        elif behaviour.kind not in ("hang", "manual"):
            self._write(session_id, behaviour)

    def stop(self, session_id: str) -> None:
        """StopRuntimeSession: the session ends; a result not yet written never will be."""
        with self._lock:
            known = session_id in self.running
            self.calls.append(FakeCall(time.time(), "stop", session_id, "stopped" if known else "unknown"))
            self.running.discard(session_id)
            self.stopped.add(session_id)
            pending = self._pending.pop(session_id, None)
        if pending is not None and pending[1] is not None:
            pending[1].cancel()

    def sessions(self) -> list[str]:
        """Ids of the sessions running now (as `LocalAgentRuntime.sessions`)."""
        with self._lock:
            return sorted(self.running)

    # ------------------------------------------------------------------------------------------- test hooks

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
            if not force and session_id not in self.running:
                return None  # stopped before the agent finished
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
        return key
