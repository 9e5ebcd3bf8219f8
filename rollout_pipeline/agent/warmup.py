"""The agent host's answer to the warm pool (docs/lifecycle.md, "The warm pool"): a `POST /invocations` whose body is a
warm-up (`config.warmup_payload`) is answered at once, 200 `{"status": "warm", "session_id": ...}`, and never reaches
the agent; everything else passes through unchanged, a rollout's invocation with a tally of its own for its model
replies (`agent.replies`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from rollout_pipeline.agent import replies
from rollout_pipeline.config import is_warmup_payload

logger = logging.getLogger(__name__)

#: A body larger than this is a rollout: passed through (replayed) without being parsed.
MAX_WARMUP_BYTES: Final = 4096
#: AgentCore's session header (as ASGI presents it: lower case).
SESSION_HEADER: Final = b"x-amzn-bedrock-agentcore-runtime-session-id"

#: An ASGI connection scope (its type, method, path and headers).
AsgiScope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[AsgiScope, Receive, Send], Awaitable[None]]


class WarmupGate:
    """ASGI middleware answering warm-up invocations; `warmups` counts them."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.warmups = 0

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") != "/invocations":
            await self.app(scope, receive, send)
            return
        body, more, messages = await _read_body(receive, MAX_WARMUP_BYTES)
        if not more and _is_warmup(body):
            self.warmups += 1
            await _answer_warm(send, _header(scope, SESSION_HEADER).decode("latin-1"))
            return
        await _as_a_rollout(self.app, scope, _replay(messages, receive), send)


async def _as_a_rollout(app: App, scope: AsgiScope, receive: Receive, send: Send) -> None:
    """Pass a rollout's invocation to `app` with a tally of its own for its model replies (in the request's context,
    which ART's background task and the agent's threads copy)."""
    token = replies.begin_rollout()
    try:
        await app(scope, receive, send)
    finally:
        replies.end_rollout(token)


def _header(scope: AsgiScope, wanted: bytes) -> bytes:
    """A request header's value (b"" when absent)."""
    for name, value in scope.get("headers") or ():
        if name == wanted:
            return bytes(value)
    return b""


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool, list[Message]]:
    """The request's body up to `limit` bytes, whether more is left, and the messages read (to replay)."""
    messages: list[Message] = []
    body = b""
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            return body, True, messages
        body += message.get("body", b"")
        more = bool(message.get("more_body"))
        if not more or len(body) > limit:
            return body, more or len(body) > limit, messages


def _is_warmup(body: bytes) -> bool:
    try:
        return is_warmup_payload(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        return False


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives the messages already read, then the rest as they come."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _answer_warm(send: Send, session_id: str) -> None:
    body = json.dumps({"status": "warm", "session_id": session_id}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
