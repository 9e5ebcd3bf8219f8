"""The model replies of each rollout as the agent host sees them: a reply cut short or empty is never silent.

A reward is only as good as the replies it scored. A reply that came back cut short (a stream that ended before the
model finished: no `finish_reason`), empty (no text and no tool call) or as an HTTP error, and that the agent scored
anyway, is a reward a trainer would learn from. The agent host watches every OpenAI-compatible model call its agent
makes over httpx (the openai SDK, so Strands' `OpenAIModel` and LiteLLM's OpenAI path) as the reply goes by,
unchanged, and counts per rollout (`ReplyTally`):

- `calls`: chat and text completions answered;
- `cut`: a reply whose stream ended before the model said why it stopped (`finish_reason`);
- `empty`: a reply with no text and no tool call;
- `errors`: an HTTP error status, or an `error` event in the stream;
- `max_tokens`: replies that stopped at `max_tokens` (`finish_reason: "length"`): the policy's outcome at the
  sampling settings given, counted but not warned about.

Each `/invocations` request runs with its own tally (`begin_rollout`, called by the host's `WarmupGate` in the
request's context, which ART's background task, Bedrock AgentCore's worker threads and Strands' threads copy);
model calls made outside any request's context go to the process's own tally, reported by the rollouts of the
process. The host's usage report beside each result carries the tally (`agent.usage`, key `model_calls`), the
agent's log has one WARNING line per bad reply, and completion turns the counts into the rollout's `warning`
(`contracts.ModelCalls`): on its event, in the batch report and in `rollouts local demo`.

Calls through other HTTP clients (requests, aiohttp, boto3 for Bedrock models) are not watched. A watcher that
cannot make sense of a reply stays silent: it never changes or fails the agent's call.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

logger = logging.getLogger(__name__)

#: Paths of the model calls watched (OpenAI's chat and text completions, under any base URL).
WATCHED_SUFFIXES: Final = ("/chat/completions", "/completions")
#: A non-streamed reply larger than this is counted as a call but not read.
MAX_JSON_BYTES: Final = 8 * 1024 * 1024
#: An SSE line longer than this is skipped.
MAX_LINE_BYTES: Final = 1024 * 1024


@dataclass
class ReplyTally:
    """What one rollout's model calls came back as (see the module doc); thread-safe."""

    calls: int = 0
    cut: int = 0
    empty: int = 0
    errors: int = 0
    max_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note(self, outcome: str | None) -> None:
        """Count one call that ended as `outcome` (None: a complete reply)."""
        with self._lock:
            self.calls += 1
            if outcome in ("cut", "empty", "errors", "max_tokens"):
                setattr(self, outcome, getattr(self, outcome) + 1)

    def as_dict(self) -> dict[str, int]:
        """The counts, as the usage report carries them."""
        with self._lock:
            return {
                "calls": self.calls,
                "cut": self.cut,
                "empty": self.empty,
                "errors": self.errors,
                "max_tokens": self.max_tokens,
            }


_CURRENT: contextvars.ContextVar[ReplyTally | None] = contextvars.ContextVar("rollout_replies", default=None)
#: Calls made outside any request's context (a thread the agent started without copying its context).
_PROCESS = ReplyTally()


def begin_rollout() -> contextvars.Token[ReplyTally | None]:
    """Give the current context (one `/invocations` request) a new tally; pass the token to `end_rollout`."""
    return _CURRENT.set(ReplyTally())


def end_rollout(token: contextvars.Token[ReplyTally | None]) -> None:
    """Restore the request context's tally as it was before `begin_rollout` (copies made since keep theirs)."""
    _CURRENT.reset(token)


def current_tally() -> ReplyTally:
    """The tally of the rollout this context serves, else the process's."""
    return _CURRENT.get() or _PROCESS


class ReplyWatch:
    """One model call's reply, fed the body's bytes as they go by; `finish` classifies it once."""

    def __init__(self, url: str, status: int, content_type: str, tally: ReplyTally) -> None:
        self.url = url
        self.status = status
        self.streaming = "text/event-stream" in content_type
        self.tally = tally
        self._buffer = b""
        self._readable = True
        self._finished = False
        self.finish_reason: str | None = None
        self.text_chars = 0
        self.tool_calls = 0
        self.chunks = 0
        self.error: str | None = None
        #: The stream's `[DONE]` went by (the openai SDK stops reading there and closes the response).
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if not self._readable:
            return
        self._buffer += chunk
        if not self.streaming:
            if len(self._buffer) > MAX_JSON_BYTES:
                self._readable, self._buffer = False, b""
            return
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line.strip())
        if len(self._buffer) > MAX_LINE_BYTES:
            self._buffer = b""

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        if not data:
            return
        self._choice_data(_json(data))

    def _choice_data(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        if data.get("error"):
            error = data["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error)[:300]
            return
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            self.chunks += 1
            part = choice.get("delta") or choice.get("message") or {}
            part = part if isinstance(part, dict) else {}
            text = part.get("content") or part.get("reasoning_content") or choice.get("text") or ""
            self.text_chars += len(text) if isinstance(text, str) else 0
            self.tool_calls += len(part.get("tool_calls") or ()) + bool(part.get("function_call"))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def finish(self, *, whole: bool) -> str | None:
        """Classify the reply (`whole`: its body was read to the end, or to its `[DONE]`; a reply the agent stopped
        reading before is only counted) and count it; returns the outcome (None: complete)."""
        if self._finished:
            return None
        self._finished = True
        outcome = self._outcome(whole)
        self.tally.note(outcome)
        if outcome in ("cut", "empty", "errors"):
            logger.warning("model reply %s: %s", _WORDS[outcome], self.describe())
        return outcome

    def _outcome(self, whole: bool) -> str | None:
        if self.status >= 400:
            return "errors"
        if not (whole or self.done) or not self._readable:
            return None
        if not self.streaming:
            body = _json(self._buffer)
            if not isinstance(body, dict):
                return None  # not a completion: counted, not judged
            self._choice_data(body)
        elif self._buffer.strip():
            self._line(self._buffer.strip())
        if self.error is not None:
            return "errors"
        if self.streaming and self.chunks == 0:
            return "empty"
        if self.streaming and self.finish_reason is None:
            return "cut"
        if self.text_chars == 0 and self.tool_calls == 0:
            return "empty"
        if self.finish_reason == "length":
            return "max_tokens"
        return None

    def describe(self) -> str:
        """One line on the reply, for the agent's log."""
        kind = "streamed" if self.streaming else "answered"
        said = f"error {self.error!r}" if self.error else f"finish_reason {self.finish_reason!r}"
        return (
            f"POST {self.url} -> HTTP {self.status}, {kind} {self.chunks} choice chunk(s), {self.text_chars} "
            f"character(s) of text, {self.tool_calls} tool call(s), {said}"
        )


_WORDS: Final = {"cut": "cut short", "empty": "empty", "errors": "failed"}


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def watch_for(method: str, url: Any, status: int, headers: Any) -> ReplyWatch | None:
    """A watch for a model call's reply (POST to a completions path, an identity-encoded body), else None."""
    path = str(getattr(url, "path", "") or "").rstrip("/")
    if method.upper() != "POST" or not path.endswith(WATCHED_SUFFIXES):
        return None
    encoding = str(headers.get("content-encoding") or "identity").lower()
    if encoding not in ("", "identity"):
        return None
    return ReplyWatch(str(url), status, str(headers.get("content-type") or ""), current_tally())


class _Watching:
    """What both watched streams share: feeding the watch and classifying once, never failing the agent's call."""

    def __init__(self, inner: Any, watch: ReplyWatch) -> None:
        self._inner = inner
        self._watch = watch
        self._whole = False

    def _feed(self, chunk: bytes) -> None:
        try:
            self._watch.feed(chunk)
        except Exception:  # a watcher never fails the agent's call
            logger.debug("reply watch failed", exc_info=True)

    def _finish(self) -> None:
        try:
            self._watch.finish(whole=self._whole)
        except Exception:
            logger.debug("reply watch failed", exc_info=True)


def _streams() -> tuple[type[Any], type[Any]]:
    """httpx's response stream types with a watch (httpx's client checks the transport's stream type)."""
    import httpx

    class WatchedStream(_Watching, httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._inner:
                self._feed(chunk)
                yield chunk
            self._whole = True
            self._finish()

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._finish()

    class AsyncWatchedStream(_Watching, httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._inner:
                self._feed(chunk)
                yield chunk
            self._whole = True
            self._finish()

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._finish()

    return WatchedStream, AsyncWatchedStream


def _watched(request: Any, response: Any, stream_type: type[Any]) -> Any:
    try:
        watch = watch_for(request.method, request.url, response.status_code, response.headers)
    except Exception:
        logger.debug("reply watch failed", exc_info=True)
        return response
    if watch is not None:
        response.stream = stream_type(response.stream, watch)
    return response


_install_lock = threading.Lock()


def install() -> None:
    """Watch every model call this process makes over httpx (idempotent; see the module doc). Without httpx
    installed there is nothing to watch."""
    try:
        import httpx
    except ImportError:
        return

    with _install_lock:
        if getattr(httpx.HTTPTransport, "_rollout_replies_installed", False):
            return
        handle = httpx.HTTPTransport.handle_request
        handle_async = httpx.AsyncHTTPTransport.handle_async_request
        sync_stream, async_stream = _streams()

        def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
            return _watched(request, handle(self, request), sync_stream)  # type: ignore[no-any-return]

        async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
            return _watched(request, await handle_async(self, request), async_stream)  # type: ignore[no-any-return]

        httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]
        httpx.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
        httpx.HTTPTransport._rollout_replies_installed = True  # type: ignore[attr-defined]
