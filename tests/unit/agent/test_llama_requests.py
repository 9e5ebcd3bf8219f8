"""The local model server serves what agents send (`local.llama_server.AgentRequests`): content as a list of text
parts, `max_completion_tokens`, the `developer` role; requests queue instead of cutting each other's streams; and a
stream the server ends without `[DONE]` ends with an error event the openai SDK raises, never as an empty reply."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rollout_pipeline.local.llama_server import (
    STREAM_CUT_ERROR,
    AgentRequests,
    normalize_chat_request,
    server_argv,
)

STRANDS_REQUEST = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 3?"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "5"}]},
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
    ],
    "max_completion_tokens": 64,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def test_requests_are_normalized_as_llama_cpp_serves_them() -> None:
    fixed = normalize_chat_request(STRANDS_REQUEST)
    assert [m["content"] for m in fixed["messages"][:5]] == ["Solve it.", "What is 2 + 3?", "", "5", "Be brief."]
    assert fixed["messages"][2]["tool_calls"] == [{"id": "c1", "type": "function"}]  # kept
    assert fixed["messages"][4]["role"] == "system"
    assert fixed["messages"][5] == STRANDS_REQUEST["messages"][5]  # an image part is left for the server to refuse
    assert fixed["max_tokens"] == 64
    assert "max_completion_tokens" not in fixed
    assert STRANDS_REQUEST["messages"][1]["content"][0]["type"] == "text"  # the input is untouched
    assert normalize_chat_request({"max_tokens": 8, "max_completion_tokens": 64})["max_tokens"] == 8


def test_interrupting_streams_is_off_unless_asked_for() -> None:
    assert server_argv(["--model", "x"]) == ["--model", "x", "--interrupt_requests", "False"]
    assert server_argv(["--interrupt_requests", "True"]) == ["--interrupt_requests", "True"]
    assert server_argv(["--interrupt_requests=True"]) == ["--interrupt_requests=True"]


def _run(app: Any, body: bytes, path: str = "/v1/chat/completions") -> tuple[list[dict[str, Any]], bytes]:
    sent: list[dict[str, Any]] = []
    chunks = [body[:10], body[10:]]

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"1")]}
    asyncio.run(AgentRequests(app)(scope, receive, send))
    return sent, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


class StreamingApp:
    """An app that records the request it got and streams `events`, then `[DONE]` unless `done` is False, or raises
    part-way (`fail`)."""

    def __init__(self, *, done: bool = True, fail: bool = False) -> None:
        self.done, self.fail = done, fail
        self.request: dict[str, Any] = {}
        self.headers: dict[bytes, bytes] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message["body"], message["more_body"]
        self.request = json.loads(body)
        self.headers = dict(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"choices": []}\n\n', "more_body": True})
        if self.fail:
            raise RuntimeError("Requested tokens exceed context window")
        await send(
            {"type": "http.response.body", "body": b"data: [DONE]\n\n" if self.done else b"", "more_body": False}
        )


def test_the_app_gets_the_normalized_request_with_its_length() -> None:
    app = StreamingApp()
    body = json.dumps(STRANDS_REQUEST).encode()
    _, text = _run(app, body)
    assert app.request["messages"][1]["content"] == "What is 2 + 3?"
    assert int(app.headers[b"content-length"]) == len(json.dumps(app.request).encode())
    assert text.endswith(b"data: [DONE]\n\n")
    assert b"error" not in text


def test_a_stream_ended_without_done_ends_with_an_error_event() -> None:
    for app in (StreamingApp(done=False), StreamingApp(fail=True)):
        sent, text = _run(app, json.dumps({"messages": [], "stream": True}).encode())
        event = json.loads(text.split(b"data: ")[-1])
        assert event["error"]["message"].startswith(STREAM_CUT_ERROR)
        assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert "Requested tokens exceed context window" in event["error"]["message"]


def test_other_requests_pass_through_untouched() -> None:
    app = StreamingApp()
    _run(app, b'{"prompt": [1], "stream": true}', path="/v1/embeddings")
    assert app.request == {"prompt": [1], "stream": True}
    assert app.headers[b"content-length"] == b"1"
