"""`python -m rollout_pipeline.local.llama_server ARGS`: llama-cpp-python's OpenAI-compatible server (same ARGS as
`python -m llama_cpp.server`) made to serve what real agents send, and to run on any x86 VM.

What agents send that llama-cpp-python 0.3 does not serve as it is (`AgentRequests` rewrites each chat request):

- message content as a list of parts (`[{"type": "text", "text": ...}]`: Strands' `OpenAIModel`, the openai SDK's
  typed messages, LangChain): its chat template concatenates content as a string, so a list is an HTTP 500 (`can
  only concatenate str (not "list") to str`), and when streaming an empty 200. Text-only lists are joined into one
  string; `content: null` (an assistant turn that only called tools) becomes "";
- `max_completion_tokens` (the OpenAI API's newer name) is ignored by the server: it becomes `max_tokens`;
- the `developer` role (the OpenAI API's newer name for `system`) becomes `system`.

Concurrent sessions: the server answers one request at a time, and by default (`interrupt_requests`) it ends a
streaming reply with `[DONE]` mid-way whenever another request waits: with several sessions at once (local mode
runs 4) most streamed replies came back cut short, looking complete. `main` turns it off unless
`--interrupt_requests` is given, so requests queue instead. A stream that ends without `[DONE]` (an error inside the
server after the 200 was sent) gets an `error` event first, which the openai SDK raises: never an empty reply that
looks like one.

llama.cpp's extra CPU buffer types: llama-cpp-python builds llama.cpp with `-march=native`. On a CPU that advertises
AMX (Sapphire Rapids and later) llama.cpp then places weights in its AMX buffer type, and in a VM whose hypervisor
does not enable AMX tile state the first matrix multiply dies with SIGILL (`tileloadd`: invalid opcode; seen on this
project's 2-core CI VM). `use_extra_bufts = False` keeps weights in plain CPU buffers (AVX2/AVX-512 kernels still
apply); for SmolLM2-135M the repacked/AMX kernels make no measurable difference. Set ROLLOUTS_LLAMA_EXTRA_BUFTS=1 to
keep them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final

from rollout_pipeline.agent.warmup import App, AsgiScope, Message, Receive, Send

logger = logging.getLogger(__name__)

#: A chat request larger than this is passed through as it came (llama.cpp's context is far smaller).
MAX_REQUEST_BYTES: Final = 16 * 1024 * 1024
#: What the server says to the client when its stream ended without `[DONE]`.
STREAM_CUT_ERROR: Final = (
    "the local model server ended this reply without finishing it (an error inside llama-cpp-python after the "
    "reply started; its log, model.log in the local pipeline's work directory, has the traceback)"
)


def disable_extra_buffer_types() -> None:
    """Make every `llama_cpp.Llama` created from now on load its weights without extra buffer types (AMX, repack)."""
    import llama_cpp.llama_cpp as low_level

    default = low_level.llama_model_default_params

    def params() -> Any:
        value = default()
        value.use_extra_bufts = False
        return value

    low_level.llama_model_default_params = params


def flatten_content(content: Any) -> Any:
    """A message's content as llama.cpp's templates take it: a list of only text parts joined into one string,
    None as ""; anything else (a string, a list with an image) unchanged."""
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        return "".join(str(part.get("text") or "") for part in content)
    return content


def normalize_chat_request(request: dict[str, Any]) -> dict[str, Any]:
    """A chat completion request as llama-cpp-python serves it (see the module doc); the input is left untouched."""
    normalized = dict(request)
    messages = request.get("messages")
    if isinstance(messages, list):
        normalized["messages"] = [_normalize_message(message) for message in messages]
    if normalized.get("max_tokens") is None and normalized.get("max_completion_tokens") is not None:
        normalized["max_tokens"] = normalized["max_completion_tokens"]
    normalized.pop("max_completion_tokens", None)
    return normalized


def _normalize_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    fixed = {**message, "content": flatten_content(message.get("content"))}
    if fixed.get("role") == "developer":
        fixed["role"] = "system"
    return fixed


class AgentRequests:
    """ASGI middleware in front of llama-cpp-python's app: chat requests normalized (`normalize_chat_request`), and
    a streamed reply that ends without `[DONE]` ended with an `error` event instead (see the module doc)."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path") or "")
        if not path.endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        body, complete = await _read_body(receive, MAX_REQUEST_BYTES)
        if complete:
            body = _normalized_body(body)
            scope = {**scope, "headers": _with_content_length(scope.get("headers") or (), len(body))}
        guard = _StreamGuard(send)
        try:
            await self.app(scope, _body_once(body, receive, complete), guard.send)
        except Exception as exc:
            if not guard.streaming:
                raise
            logger.exception("model server: a streamed reply failed")
            await guard.end_with_error(f"{STREAM_CUT_ERROR}: {type(exc).__name__}: {exc}")
            return
        await guard.finish()


def _normalized_body(body: bytes) -> bytes:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body  # the server's own validation answers it
    if not isinstance(request, dict):
        return body
    return json.dumps(normalize_chat_request(request)).encode()


def _with_content_length(headers: Sequence[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name.lower() not in (b"content-length", b"transfer-encoding")]
    return [*kept, (b"content-length", str(length).encode())]


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool]:
    """The request body, and whether it is whole (False: larger than `limit`, or the client went away)."""
    body = b""
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return body, False
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body, True
        if len(body) > limit:
            return body, False


def _body_once(body: bytes, receive: Receive, complete: bool) -> Receive:
    """A `receive` that gives `body` first (whole, or the part read so far), then whatever the client sends next."""
    sent = [False]

    async def replay() -> Message:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": not complete}
        return await receive()

    return replay


class _StreamGuard:
    """Forwards the app's response; for an event stream, notes whether `[DONE]` passed, and ends a stream that
    closes without it with an `error` event (the OpenAI API's shape, which the openai SDK raises)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.streaming = False
        self._done = False
        self._closed = False
        self._tail = b""

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            headers = dict(message.get("headers") or ())
            self.streaming = b"text/event-stream" in headers.get(b"content-type", b"")
        elif kind == "http.response.body" and self.streaming:
            chunk = bytes(message.get("body", b""))
            self._done = self._done or b"[DONE]" in self._tail + chunk
            self._tail = chunk[-16:]
            if not message.get("more_body"):
                if not self._done:
                    await self.end_with_error(STREAM_CUT_ERROR, chunk)
                    return
                self._closed = True
        await self._send(message)

    async def end_with_error(self, text: str, pending: bytes = b"") -> None:
        """Send what the app sent last (`pending`), then an `error` event, and close the stream."""
        if self._closed:
            return
        self._closed = True
        logger.warning("model server: %s", text)
        event = json.dumps({"error": {"message": text, "type": "server_error", "code": 500}})
        await self._send({"type": "http.response.body", "body": pending + f"data: {event}\n\n".encode()})
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    async def finish(self) -> None:
        """After the app returned: a stream it left open without `[DONE]` is ended with the error event."""
        if self.streaming and not self._closed and not self._done:
            await self.end_with_error(STREAM_CUT_ERROR)


def server_argv(argv: Sequence[str]) -> list[str]:
    """The server's arguments: `argv`, with `--interrupt_requests False` unless `argv` sets it (module doc)."""
    args = list(argv)
    if not any(arg.split("=", 1)[0] == "--interrupt_requests" for arg in args):
        args += ["--interrupt_requests", "False"]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Run llama-cpp-python's server (arguments from the command line), its app behind `AgentRequests`."""
    if os.environ.get("ROLLOUTS_LLAMA_EXTRA_BUFTS") != "1":
        disable_extra_buffer_types()
    from llama_cpp.server import __main__ as server

    create_app: Callable[..., App] = getattr(server, "create_app")  # noqa: B009 - the module does not export it

    def create_agent_app(*args: Any, **kwargs: Any) -> App:
        return AgentRequests(create_app(*args, **kwargs))

    setattr(server, "create_app", create_agent_app)  # noqa: B010 - what `server.main` calls
    sys.argv = [sys.argv[0], *server_argv(sys.argv[1:] if argv is None else argv)]
    # Typed here: llama_cpp's own `main` has no annotations, and the package is absent where `make demo` never ran.
    serve: Callable[[], None] = server.main
    serve()


if __name__ == "__main__":
    main()
