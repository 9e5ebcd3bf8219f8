"""A local stand-in of verl's agent framework and agent gateway, for `examples/verl_gateway.py` and its test.

verl's `OpenAICompatibleAgentFramework` (`verl/experimental/agent_framework/framework.py`) and its gateway
(`verl/experimental/agent_gateway/gateway.py`) exist only in pull requests of github.com/verl-project/verl (#5926,
head cc53db79eb38e7b381682d5c0e0a055ff3df6328, April 2026; moved to `verl/agent/` in #6299): the version on the
package index (verl 0.9.1) ships neither, and its main branch had not merged them. This module follows their
interface and control flow, written anew (no verl code), so the route (`trainers.verl`) is driven the way verl
would drive it:

- the framework: per sample, `create_session(id)` -> `await agent_runner(raw_prompt=, session=SessionHandle(id,
  base_url), sample_index=)` -> `wait_for_completion(id, completion_timeout)` when
  `wait_for_completion_after_agent_run` -> `finalize_session(id)` -> `reward_fn(SessionRewardContext)`; any
  exception aborts the session. Sessions are named `session-{index}-{uuid hex}` as verl names them. Unlike #5926
  (one failed session fails the batch), a failed session is dropped and counted, as #6299 does.
- the gateway: `POST /sessions/{id}/v1/chat/completions` (404 unknown session, 409 once it is not active, 400 for
  malformed messages), which forwards the messages to an OpenAI-compatible backend and records the trajectory's
  prompt ids, response ids, mask (1 for generated tokens, 0 for the tool and user turns appended in between) and
  log-probs; `POST /sessions/{id}/complete {"reward_info": {...}}` (404 unknown, 200 again while completed: verl
  accepts retries). Token ids here are UTF-8 bytes (no tokenizer), log-probs 0: what verl's own tokenizer and
  backend give is out of scope. Listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class SessionHandle:
    session_id: str
    base_url: str | None = None


@dataclass
class Trajectory:
    uid: str
    session_id: str
    trajectory_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    reward_score: float | None = None
    num_turns: int = 0


@dataclass
class SessionRewardContext:
    trajectories: list[Trajectory]
    sample_fields: dict[str, Any] = field(default_factory=dict)


class Phase(StrEnum):
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    FINALIZED = "FINALIZED"
    ABORTED = "ABORTED"


@dataclass
class _GatewaySession:
    handle: SessionHandle
    phase: Phase = Phase.ACTIVE
    history: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)
    reward_info: dict[str, Any] = field(default_factory=dict)
    completed: threading.Event = field(default_factory=threading.Event)
    completed_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def encode(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """The stand-in tokenizer: the messages' role and content as UTF-8 bytes."""
    return list("".join(f"<{m.get('role')}>{m.get('content') or ''}" for m in messages).encode())


_ROUTE = re.compile(r"^/sessions/([^/]+)/(v1/chat/completions|complete)$")


class LocalGateway:
    """verl's gateway, standing in (see the module doc): an HTTP server and verl's `SessionRuntime` methods."""

    def __init__(self, backend_url: str, *, model: str = "default") -> None:
        self.backend_url = backend_url.rstrip("/")
        self.model = model
        self._sessions: dict[str, _GatewaySession] = {}
        self._lock = threading.Lock()
        #: Every `/complete` received: (session id, reward_info, epoch seconds).
        self.completions: list[tuple[str, dict[str, Any], float]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LocalGateway:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True, name="gateway")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------------------------- SessionRuntime

    async def create_session(self, session_id: str, **_: Any) -> SessionHandle:
        with self._lock:
            if session_id in self._sessions:
                raise RuntimeError(f"Session {session_id} already exists")
            handle = SessionHandle(session_id, f"{self.url}/sessions/{session_id}/v1")
            self._sessions[session_id] = _GatewaySession(handle)
        return handle

    async def wait_for_completion(self, session_id: str, timeout: float | None = None) -> None:
        session = self._sessions.get(session_id)
        if session is None or session.phase is Phase.COMPLETED:
            return
        if not await asyncio.to_thread(session.completed.wait, timeout):
            raise TimeoutError(f"session {session_id}: no /complete within {timeout} s")
        if session.phase is Phase.ABORTED:
            raise RuntimeError(f"Session {session_id} is aborted")

    async def finalize_session(self, session_id: str) -> list[Trajectory]:
        session = self._get(session_id)
        with session.lock:
            if session.phase in (Phase.ABORTED, Phase.FINALIZED):
                raise RuntimeError(f"Session {session_id} is {session.phase.value.lower()}")
            self._materialize(session)
            session.phase = Phase.FINALIZED
            session.completed.set()
            with self._lock:
                self._sessions.pop(session_id, None)
            return [replace(t, reward_info=dict(session.reward_info)) for t in session.trajectories]

    async def abort_session(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return
        with session.lock:
            session.phase = Phase.ABORTED
            session.completed.set()
            with self._lock:
                self._sessions.pop(session_id, None)

    def _get(self, session_id: str) -> _GatewaySession:
        session = self._sessions.get(session_id)
        if session is None:
            raise KeyError(f"Unknown session_id: {session_id}")
        return session

    # ------------------------------------------------------------------------------------------ HTTP

    def complete(self, session_id: str, reward_info: dict[str, Any] | None) -> int:
        session = self._sessions.get(session_id)
        if session is None:
            return 404
        with session.lock:
            if session.phase not in (Phase.ACTIVE, Phase.COMPLETED):
                return 409
            if reward_info is not None:
                session.reward_info = dict(reward_info)
            session.phase = Phase.COMPLETED
            session.completed_at = time.time()
            session.completed.set()
        self.completions.append((session_id, dict(reward_info or {}), time.time()))
        return 200

    def chat(self, session_id: str, payload: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        session = self._sessions.get(session_id)
        if session is None:
            return 404, {"detail": f"Unknown session_id: {session_id}"}
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return 400, {"detail": "messages must be non-empty"}
        with session.lock:
            if session.phase is not Phase.ACTIVE:
                return 409, {"detail": f"Session {session_id} is {session.phase.value.lower()}"}
            plain = [{"role": m.get("role"), "content": _text(m.get("content"))} for m in messages]
            if session.prompt_ids is None:
                session.prompt_ids = encode(plain)
            elif plain[: len(session.history)] == session.history:
                added = encode(plain[len(session.history) :])
                session.response_ids += added
                session.response_mask += [0] * len(added)
            else:  # a new context: the current trajectory is done, a new one starts
                self._materialize(session)
                session.prompt_ids = encode(plain)
            sampling = {k: v for k, v in payload.items() if k not in ("messages", "model", "tools")}
            text = self._generate(plain, sampling)
            generated = list(text.encode())
            session.response_ids += generated
            session.response_mask += [1] * len(generated)
            session.history = [*plain, {"role": "assistant", "content": text}]
        reply = {"role": "assistant", "content": text}
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "model": self.model,
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": len(session.prompt_ids or []),
                "completion_tokens": len(generated),
                "total_tokens": len(session.prompt_ids or []) + len(generated),
            },
        }

    def _generate(self, messages: list[dict[str, Any]], sampling: Mapping[str, Any]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, **sampling, "stream": False}).encode()
        request = urllib.request.Request(
            f"{self.backend_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            return str(json.loads(answer.read())["choices"][0]["message"].get("content") or "")

    def _materialize(self, session: _GatewaySession) -> None:
        if session.prompt_ids is None:
            return
        session.trajectories.append(
            Trajectory(
                uid=session.handle.session_id,
                session_id=session.handle.session_id,
                trajectory_id=len(session.trajectories),
                prompt_ids=session.prompt_ids,
                response_ids=session.response_ids,
                response_mask=session.response_mask,
                response_logprobs=[0.0] * len(session.response_ids),
                num_turns=sum(1 for m in session.history if m.get("role") in ("user", "assistant")) + 1,
            )
        )
        session.prompt_ids, session.response_ids, session.response_mask = None, [], []

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: ARG002 - quiet
                return

            def do_POST(self) -> None:
                found = _ROUTE.match(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    payload = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    payload = None
                if found is None or not isinstance(payload, dict):
                    self._send(404 if found is None else 400, {"detail": "not found" if found is None else "bad JSON"})
                elif found.group(2) == "complete":
                    status = gateway.complete(found.group(1), payload.get("reward_info"))
                    self._send(status, {"status": "ok"} if status == 200 else {"detail": f"status {status}"})
                else:
                    self._send(*gateway.chat(found.group(1), payload))

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


AgentRunner = Callable[..., Awaitable[None]]
RewardFn = Callable[[SessionRewardContext], Any]


@dataclass
class Generated:
    """What `generate_sequences` returns here (verl packs it into a DataProto): the scored trajectories, and the
    sessions that failed with why."""

    trajectories: list[Trajectory]
    failed: dict[str, str]


class OpenAICompatibleAgentFramework:
    """verl's framework, standing in (see the module doc). `samples`: each a dict with `raw_prompt` and the
    sample's other fields (verl's non-tensor batch)."""

    def __init__(
        self,
        session_runtime: LocalGateway,
        agent_runner: AgentRunner,
        reward_fn: RewardFn,
        *,
        completion_timeout: float | None = 30.0,
        wait_for_completion_after_agent_run: bool = False,
    ) -> None:
        self.session_runtime = session_runtime
        self.agent_runner = agent_runner
        self.reward_fn = reward_fn
        self.completion_timeout = completion_timeout
        self.wait_for_completion_after_agent_run = wait_for_completion_after_agent_run

    async def generate_sequences(self, samples: Sequence[Mapping[str, Any]]) -> Generated:
        outcomes = await asyncio.gather(
            *(self._run_session(sample, index) for index, sample in enumerate(samples)), return_exceptions=True
        )
        generated = Generated([], {})
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                generated.failed[f"sample-{index}"] = f"{type(outcome).__name__}: {outcome}"
            else:
                generated.trajectories.extend(outcome)
        return generated

    async def _run_session(self, sample: Mapping[str, Any], sample_index: int) -> list[Trajectory]:
        session_id = f"session-{sample_index}-{uuid.uuid4().hex}"
        fields = {k: v for k, v in sample.items() if k != "raw_prompt"}
        session = await self.session_runtime.create_session(session_id)
        try:
            await self.agent_runner(
                raw_prompt=sample["raw_prompt"], session=session, sample_index=sample_index, **fields
            )
            if self.wait_for_completion_after_agent_run:
                await self.session_runtime.wait_for_completion(session_id, timeout=self.completion_timeout)
            trajectories = await self.session_runtime.finalize_session(session_id)
        except Exception:
            await self.session_runtime.abort_session(session_id)
            raise
        scores = self.reward_fn(SessionRewardContext(trajectories, dict(fields)))
        if asyncio.iscoroutine(scores):
            scores = await scores
        return [replace(t, reward_score=float(s)) for t, s in zip(trajectories, scores, strict=True)]
