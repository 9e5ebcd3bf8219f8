"""A fake OpenAI-compatible model server for tests and offline demos (standard library only).

    with FakeModelServer(reply="The answer is #### 42") as model:
        base_url = model.base_url           # http://127.0.0.1:<port>/v1
        ...
        model.requests                      # every request: path, headers, JSON body

It answers `POST .../chat/completions` on any path prefix (so `/v1/...` and rllm's `/sessions/{id}/v1/...` both
work), streaming (SSE) or not, and `GET .../models`. `reply` is a fixed text or a function of the request giving
a text, a tool call (`ToolCall`), a truncated text (`Truncated`) or a stream cut short (`Cut`). It listens on
127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from rollout_pipeline.agent.loopback import JsonRequestHandler, LoopbackServer


@dataclass(frozen=True)
class ToolCall:
    """A reply that asks the agent to call a tool."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Truncated:
    """A text reply cut off by the token limit (`finish_reason: "length"`)."""

    text: str


@dataclass(frozen=True)
class RecordedRequest:
    """One request the fake model received."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float = field(default_factory=time.monotonic)

    def header(self, name: str) -> str | None:
        """Header value by case-insensitive name."""
        lowered = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lowered), None)


@dataclass(frozen=True)
class Cut:
    """A streamed reply cut short: its text, then `[DONE]` with no `finish_reason` (as llama-cpp-python's server
    ends a stream when another request waits and `interrupt_requests` is on). Not streamed: an ordinary reply."""

    text: str


Reply = str | ToolCall | Truncated | Cut
ReplyFunction = Callable[[RecordedRequest], Reply]


class FakeModelServer(LoopbackServer):
    """OpenAI-compatible chat completions on 127.0.0.1, recording what it receives. Use as a context manager."""

    def __init__(self, reply: Reply | ReplyFunction = "#### 42", *, delay_s: float = 0.0, port: int = 0) -> None:
        self._reply = reply
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        super().__init__(self._handler_class(), port=port, thread_name="fake-model")

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>/v1`: the OpenAI base URL."""
        return f"{self.root_url}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Chat-completion requests received so far (a copy)."""
        with self._lock:
            return list(self._requests)

    def _answer(self, request: RecordedRequest) -> Reply:
        return self._reply(request) if callable(self._reply) else self._reply

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(JsonRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                try:
                    body = json.loads(self.read_body() or b"{}")
                except json.JSONDecodeError:
                    self.send_json(400, {"error": {"message": "invalid JSON"}})
                    return
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                request = RecordedRequest("POST", self.path, dict(self.headers.items()), body)
                server._record(request)
                if server.delay_s:
                    time.sleep(server.delay_s)
                reply = server._answer(request)
                model = str(body.get("model") or "fake-model")
                if body.get("stream"):
                    self._stream(model, reply)
                else:
                    self.send_json(200, _completion(model, reply))

            def _stream(self, model: str, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                chunks = _chunks(model, reply)
                for chunk in chunks[:1] if isinstance(reply, Cut) else chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        return Handler


_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _message(reply: Reply) -> tuple[dict[str, Any], str]:
    """The assistant message of `reply` and its finish reason (`tool_calls`, `length` or `stop`)."""
    if isinstance(reply, ToolCall):
        call = {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": reply.name, "arguments": json.dumps(reply.arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    if isinstance(reply, Truncated):
        return {"role": "assistant", "content": reply.text}, "length"
    return {"role": "assistant", "content": reply.text if isinstance(reply, Cut) else reply}, "stop"


def _completion(model: str, reply: Reply) -> dict[str, Any]:
    message, finish = _message(reply)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _USAGE,
    }


def _chunks(model: str, reply: Reply) -> list[dict[str, Any]]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk", "model": model}
    message, finish = _message(reply)
    # A streamed tool call carries its index; a streamed text has no `content: None` to send.
    delta = {key: value for key, value in message.items() if value is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": 0, **call} for call in delta["tool_calls"]]
    return [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {**base, "choices": [], "usage": _USAGE},
    ]
