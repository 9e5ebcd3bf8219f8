"""The agent host sees each rollout's model replies go by (`agent.replies`): one cut short, empty or failed is counted
for the rollout whose request made it, whichever client made it (sync or async httpx, streamed or not), and the
agent's call is never changed."""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Iterator

import httpx
import pytest

from rollout_pipeline.agent import replies
from rollout_pipeline.agent.replies import ReplyTally, ReplyWatch
from rollout_pipeline.agent.testing import Cut, FakeModelServer, RecordedRequest, ToolCall, Truncated
from rollout_pipeline.contracts import ModelCalls, reported_usage

REPLIES = {"ok": "The answer is 5", "cut": Cut("The ans"), "empty": "", "long": Truncated("The answer is")}


def _reply(request: RecordedRequest) -> str | Cut | Truncated | ToolCall:
    kind = str(request.body["messages"][-1]["content"])
    return ToolCall("calculator", {"expression": "2 + 3"}) if kind == "tool" else REPLIES[kind]


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    replies.install()
    with FakeModelServer(_reply) as server:
        yield server


def _ask(client: httpx.Client, model: FakeModelServer, kind: str, *, stream: bool) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": kind}], "stream": stream}
    with client.stream("POST", f"{model.base_url}/chat/completions", json=body) as response:
        return b"".join(response.iter_bytes()).decode()


def _in_a_rollout(func: object) -> ReplyTally:
    """Run `func` in a context of its own, as the host runs each `/invocations` request; its tally."""

    def run() -> ReplyTally:
        replies.begin_rollout()
        func()  # type: ignore[operator]
        return replies.current_tally()

    return contextvars.copy_context().run(run)


@pytest.mark.parametrize("stream", [True, False])
def test_each_kind_of_reply_is_counted_for_its_rollout(model: FakeModelServer, stream: bool) -> None:
    with httpx.Client() as client:
        texts: list[str] = []
        tally = _in_a_rollout(lambda: texts.extend(_ask(client, model, k, stream=stream) for k in (*REPLIES, "tool")))
    cut = 1 if stream else 0  # not streamed, a `Cut` is an ordinary reply: only a stream can end early
    assert tally.as_dict() == {"calls": 5, "cut": cut, "empty": 1, "errors": 0, "max_tokens": 1}
    assert "The ans" in texts[1]  # the agent got each reply as it was sent
    assert replies.current_tally() is not tally  # outside the rollout: the process's own tally


def test_an_async_client_is_watched_too(model: FakeModelServer) -> None:
    async def ask() -> ReplyTally:
        replies.begin_rollout()
        async with httpx.AsyncClient() as client:
            for kind in ("ok", "cut"):
                body = {"model": "m", "messages": [{"role": "user", "content": kind}], "stream": True}
                async with client.stream("POST", f"{model.base_url}/chat/completions", json=body) as response:
                    async for _ in response.aiter_bytes():
                        pass
        return replies.current_tally()

    tally = asyncio.run(ask())
    assert (tally.calls, tally.cut) == (2, 1)


def test_the_openai_sdk_stopping_at_done_still_counts_the_reply(model: FakeModelServer) -> None:
    """The SDK stops reading at `[DONE]` and closes the response: the reply is classified all the same."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=model.base_url, api_key="EMPTY")

    def ask() -> None:
        for kind in ("ok", "cut"):
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": kind}], stream=True
            )
            "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    tally = _in_a_rollout(ask)
    assert (tally.calls, tally.cut) == (2, 1)


def test_an_http_error_is_counted_and_other_requests_are_not_watched(model: FakeModelServer) -> None:
    def ask() -> None:
        with httpx.Client() as client:
            client.post(f"{model.base_url}/chat/completions", content=b"{not json")  # 400
            client.get(f"{model.base_url}/models")  # not a model call

    tally = _in_a_rollout(ask)
    assert (tally.calls, tally.errors) == (1, 1)


def _watch(chunks: list[bytes], *, streaming: bool = True) -> str | None:
    content_type = "text/event-stream" if streaming else "application/json"
    watch = ReplyWatch("http://m/v1/chat/completions", 200, content_type, ReplyTally())
    for chunk in chunks:
        watch.feed(chunk)
    return watch.finish(whole=True)


def _event(delta: dict[str, object], finish: str | None = None) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def test_a_stream_split_anywhere_reads_the_same() -> None:
    whole = _event({"content": "4"}) + _event({}, "stop") + b"data: [DONE]\n\n"
    assert _watch([whole]) is None
    assert _watch([whole[i : i + 7] for i in range(0, len(whole), 7)]) is None
    assert _watch([_event({"content": "4"}), b"data: [DONE]\n\n"]) == "cut"
    assert _watch([b"data: [DONE]\n\n"]) == "empty"
    assert _watch([_event({"content": "4"}), b'data: {"error": {"message": "boom"}}\n\n']) == "errors"
    assert _watch([b"{not json"], streaming=False) is None  # unreadable: counted, not judged
    watch = ReplyWatch("http://m/v1/chat/completions", 200, "text/event-stream", ReplyTally())
    watch.feed(_event({"content": "4"}))
    assert watch.finish(whole=False) is None  # the agent stopped reading before the end: not judged


def test_the_usage_report_carries_the_counts_and_completion_reads_a_warning() -> None:
    body = {"_rollout_usage": {"cpu_s": 1.0, "rollouts": 1, "model_calls": {"calls": 3, "cut": 1, "empty": 1}}}
    usage = reported_usage(body)
    assert usage is not None
    assert usage.model_calls == ModelCalls(calls=3, cut=1, empty=1)
    assert usage.model_calls.warning is not None
    assert "1 cut short, 1 empty of 3 call(s)" in usage.model_calls.warning
    assert ModelCalls(calls=2, max_tokens=2).warning is None  # stopped at max_tokens: the policy's outcome
    bad = reported_usage({"_rollout_usage": {"cpu_s": 1.0, "model_calls": {"calls": "x"}}})
    assert bad is not None
    assert bad.model_calls is None
