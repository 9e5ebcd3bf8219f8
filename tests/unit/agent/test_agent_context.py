"""Rollout context (contextvars), inference params and token-capture wiring, RolloutApp's wrapper, and the Strands
model adapter's isolation between concurrent rollouts (threads, asyncio, Strands tool threads)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from rollout_pipeline import contracts
from rollout_pipeline.agent import inference
from rollout_pipeline.agent.context import (
    NoRolloutContext,
    RolloutContext,
    clear_rollout_context,
    current_rollout,
    get_rollout,
    rollout_context,
    run_in_thread,
    set_rollout_context,
    submit_with_context,
    with_rollout_context,
)
from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest, ToolCall
from rollout_pipeline.config import ExperimentConfig, SamplingParams

SESSION_A = "batch-a-0-1-" + "a" * 24
SESSION_B = "batch-b-1-1-" + "b" * 24


def pipeline_payload(**overrides: Any) -> dict[str, Any]:
    """A payload exactly as the dispatcher builds it."""
    config = ExperimentConfig(name="exp-1", model_base_url="http://gw:9090/v1", model_id="policy")
    message = contracts.RolloutMessage(
        exp_id="exp-1",
        batch_id="gsm8k-0123456789ab",
        input_id="gsm-001",
        index=3,
        attempt=2,
        group_size=8,
        submitted_at=datetime.now(UTC),
        payload={"question": "q"},
        rollout_overrides=overrides,
    )
    options = contracts.FileOptions(
        group_size=8,
        rollout_timeout_s=60,
        max_attempts=2,
        sampling_params=SamplingParams(temperature=0.7, top_p=0.9, max_tokens=256),
        policy_version="v42",
    )
    return contracts.build_agent_payload(
        row_payload={"question": "q"},
        rollout_overrides=overrides,
        message=message,
        options=options,
        config=config,
        results_bucket="results",
    )


def make_ctx(session_id: str = SESSION_A, **rollout: Any) -> RolloutContext:
    base = {"exp_id": "exp-1", "input_id": "in-1", "base_url": "http://gw:9090/v1", "model_id": "policy"}
    return RolloutContext.from_payload({"_rollout": {**base, **rollout}}, session_id)


# ------------------------------------------------------------------------------------------------------ context


def test_context_from_a_pipeline_payload_carries_every_id_and_setting() -> None:
    payload = pipeline_payload(sampling_params={"temperature": 0.2})
    ctx = RolloutContext.from_payload(payload, session_id="header-session-" + "x" * 20)
    assert (ctx.exp_id, ctx.batch_id, ctx.input_id) == ("exp-1", "gsm8k-0123456789ab", "gsm-001")
    assert (ctx.rollout_id, ctx.index, ctx.attempt, ctx.group_size) == ("gsm-001#3", 3, 2, 8)
    assert ctx.session_id == "header-session-" + "x" * 20  # the ACR header wins
    assert ctx.policy_version == "v42"
    assert (ctx.base_url, ctx.model_id, ctx.s3_bucket) == ("http://gw:9090/v1", "policy", "results")
    assert dict(ctx.sampling_params) == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 256}
    # Without the header, the pipeline's own `_rollout.session_id` is used.
    assert RolloutContext.from_payload(payload).session_id == payload["_rollout"]["session_id"]


def test_context_is_read_only() -> None:
    ctx = RolloutContext.from_payload(pipeline_payload())
    with pytest.raises(TypeError):
        ctx.sampling_params["temperature"] = 2.0  # type: ignore[index]
    with pytest.raises(AttributeError):
        ctx.exp_id = "other"  # type: ignore[misc]


def test_an_art_client_payload_without_our_keys_still_works() -> None:
    ctx = RolloutContext.from_payload({"prompt": "hi", "_rollout": {"exp_id": "e", "input_id": "i", "s3_bucket": "b"}})
    assert (ctx.exp_id, ctx.batch_id, ctx.attempt, dict(ctx.sampling_params)) == ("e", None, None, {})
    assert RolloutContext.from_payload({"prompt": "no _rollout at all"}) == RolloutContext()


def test_context_is_set_for_the_block_and_cleared_after() -> None:
    assert get_rollout() is None
    with pytest.raises(NoRolloutContext):
        current_rollout()
    outer, inner = make_ctx(SESSION_A), make_ctx(SESSION_B)
    with rollout_context(outer):
        assert current_rollout() is outer
        with rollout_context(inner):
            assert current_rollout() is inner
        assert current_rollout() is outer
    assert get_rollout() is None
    token = set_rollout_context(outer)
    assert get_rollout() is outer
    clear_rollout_context(token)
    assert get_rollout() is None


def test_context_is_cleared_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), rollout_context(make_ctx()):
        raise RuntimeError("agent failed")
    assert get_rollout() is None


def test_asyncio_tasks_each_see_their_own_rollout() -> None:
    async def rollout(ctx: RolloutContext, seen: list[str | None]) -> None:
        with rollout_context(ctx):
            for _ in range(5):
                await asyncio.sleep(0.001)
                seen.append(current_rollout().session_id)
                child = await asyncio.create_task(asyncio.sleep(0, result=current_rollout().session_id))
                seen.append(child)
                seen.append(await asyncio.to_thread(lambda: current_rollout().session_id))

    async def main() -> tuple[list[str | None], list[str | None]]:
        seen_a: list[str | None] = []
        seen_b: list[str | None] = []
        await asyncio.gather(rollout(make_ctx(SESSION_A), seen_a), rollout(make_ctx(SESSION_B), seen_b))
        return seen_a, seen_b

    seen_a, seen_b = asyncio.run(main())
    assert seen_a == [SESSION_A] * 15
    assert seen_b == [SESSION_B] * 15


def test_threads_get_the_context_only_through_the_helpers() -> None:
    def session() -> str | None:
        ctx = get_rollout()
        return None if ctx is None else ctx.session_id

    with rollout_context(make_ctx(SESSION_A)):
        plain: list[str | None] = []
        thread = threading.Thread(target=lambda: plain.append(session()))
        thread.start()
        thread.join(5)
        assert plain == [None]  # a bare thread starts with an empty context

        assert run_in_thread(session) == SESSION_A
        with ThreadPoolExecutor(2) as pool:
            assert submit_with_context(pool, session).result(5) == SESSION_A
            bound = with_rollout_context(session)
        # The bound function keeps the rollout even when called after the block, from any thread.
    assert get_rollout() is None
    with ThreadPoolExecutor(2) as pool:
        assert [f.result(5) for f in [pool.submit(bound), pool.submit(bound)]] == [SESSION_A, SESSION_A]


def test_run_in_thread_propagates_exceptions() -> None:
    def boom() -> None:
        raise KeyError("inside the thread")

    with rollout_context(make_ctx()), pytest.raises(KeyError):
        run_in_thread(boom)


# --------------------------------------------------------------------------------------- params and token capture


def test_inference_params_come_from_the_rollout_over_defaults() -> None:
    ctx = make_ctx(sampling_params={"temperature": 0.3, "max_tokens": 64, "top_p": None})
    assert inference.inference_params(ctx, temperature=1.0, top_p=0.95, seed=7) == {
        "temperature": 0.3,
        "max_tokens": 64,
        "top_p": 0.95,
        "seed": 7,
    }
    with rollout_context(ctx):
        assert inference.inference_params()["temperature"] == 0.3


@pytest.mark.parametrize(
    ("style", "headers", "base_url", "api_key"),
    [
        ("none", {}, "http://gw:9090/v1", "EMPTY"),
        ("rllm-header", {"X-RLLM-Session-Id": SESSION_A}, "http://gw:9090/v1", "EMPTY"),
        ("rllm-path", {}, f"http://gw:9090/sessions/{SESSION_A}/v1", "EMPTY"),
        ("art-gateway", {}, "http://gw:9090/v1", SESSION_A),
        (
            "sagemaker",
            {
                "X-Amzn-SageMaker-Job-Arn": "arn:aws:sagemaker:us-west-2:1:job/x",
                "X-Amzn-SageMaker-Trajectory-Id": SESSION_A,
            },
            "http://gw:9090/v1",
            "EMPTY",
        ),
    ],
)
def test_each_token_capture_style(
    style: str, headers: dict[str, str], base_url: str, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ctx = make_ctx(job_arn="arn:aws:sagemaker:us-west-2:1:job/x")
    assert inference.inference_headers(style, ctx) == headers
    kwargs = inference.openai_client_kwargs(style, ctx)
    assert kwargs["base_url"] == base_url
    assert kwargs["api_key"] == api_key
    assert kwargs.get("default_headers", {}) == headers


def test_style_comes_from_the_argument_then_the_payload_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(inference.TOKEN_CAPTURE_ENV, "art-gateway")
    assert inference.resolve_style(None, make_ctx()) is inference.TokenCapture.ART_GATEWAY
    assert inference.resolve_style(None, make_ctx(token_capture="rllm_header")) is inference.TokenCapture.RLLM_HEADER
    assert (
        inference.resolve_style("rllm-path", make_ctx(token_capture="rllm-header")) is inference.TokenCapture.RLLM_PATH
    )
    with pytest.raises(inference.TokenCaptureError, match="unknown token-capture style"):
        inference.resolve_style("carrier-pigeon", make_ctx())


def test_sagemaker_style_needs_a_job_arn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(inference.JOB_ARN_ENV, raising=False)
    with pytest.raises(inference.TokenCaptureError, match="job_arn"):
        inference.inference_headers("sagemaker", make_ctx())
    monkeypatch.setenv(inference.JOB_ARN_ENV, "arn:env")
    assert inference.inference_headers("sagemaker", make_ctx())["X-Amzn-SageMaker-Job-Arn"] == "arn:env"


def test_session_styles_need_a_session_id() -> None:
    no_session = RolloutContext.from_payload({"_rollout": {"base_url": "http://gw/v1"}})
    for style in ("rllm-header", "rllm-path", "art-gateway"):
        with pytest.raises(inference.TokenCaptureError, match="session id"):
            inference.openai_client_kwargs(style, no_session)


def test_session_base_url_accepts_a_gateway_root_or_its_v1_url() -> None:
    assert inference.session_base_url("http://gw:9090", "s") == "http://gw:9090/sessions/s/v1"
    assert inference.session_base_url("http://gw:9090/v1/", "s") == "http://gw:9090/sessions/s/v1"


def test_openai_client_is_wired_for_the_current_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with rollout_context(make_ctx(token_capture="rllm-header")):
        client = inference.openai_client(timeout=5.0)
        assert str(client.base_url).rstrip("/") == "http://gw:9090/v1"
        assert client.default_headers["X-RLLM-Session-Id"] == SESSION_A
        assert inference.model_id() == "policy"
        art = inference.async_openai_client("art-gateway")
        assert art.api_key == SESSION_A
    with pytest.raises(NoRolloutContext):
        inference.openai_client()


# ------------------------------------------------------------------------------------------- RolloutApp wrapper


def test_rollout_app_sets_the_context_around_sync_and_async_functions() -> None:
    from rollout_pipeline.agent.app import with_rollout_context_of_request

    payload = pipeline_payload()
    request_context = SimpleNamespace(session_id=SESSION_A)
    seen: list[RolloutContext] = []

    def sync_fn(payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(current_rollout())
        return {"rewards": 1.0}

    async def async_fn(payload: dict[str, Any], context: Any) -> dict[str, Any]:
        assert context is request_context
        seen.append(current_rollout())
        return {"rewards": 0.0}

    def failing(payload: dict[str, Any]) -> None:
        seen.append(current_rollout())
        raise RuntimeError("agent bug")

    assert with_rollout_context_of_request(sync_fn, False)(payload, request_context) == {"rewards": 1.0}
    wrapped_async = with_rollout_context_of_request(async_fn, True)
    assert asyncio.iscoroutinefunction(wrapped_async)
    assert wrapped_async.__name__ == "async_fn"
    assert not hasattr(wrapped_async, "__wrapped__")  # ART inspects the wrapper's own (payload, context)
    assert asyncio.run(wrapped_async(payload, request_context)) == {"rewards": 0.0}
    with pytest.raises(RuntimeError):
        with_rollout_context_of_request(failing, False)(payload, request_context)
    assert [ctx.session_id for ctx in seen] == [SESSION_A] * 3
    assert all(ctx.rollout_id == "gsm-001#3" for ctx in seen)
    assert get_rollout() is None


def test_rollout_app_passes_the_request_context_to_arts_entrypoint() -> None:
    from rollout_pipeline.agent.app import RolloutApp

    app = RolloutApp()

    @app.rollout_entrypoint
    def without_context(payload: dict[str, Any]) -> dict[str, Any]:
        return {"rewards": 1.0}

    registered = app.handlers["main"]
    assert app._takes_context(registered)  # ART hands (payload, context) to its wrapper


def test_serve_args_default_to_loopback_outside_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_pipeline.agent import app as app_module

    monkeypatch.delenv("AGENT_HOST", raising=False)
    monkeypatch.delenv("AGENT_PORT", raising=False)
    monkeypatch.setattr(app_module, "in_container", lambda: False)
    args = app_module.parse_serve_args([])
    assert (args.host, args.port) == ("127.0.0.1", 8080)
    monkeypatch.setattr(app_module, "in_container", lambda: True)
    assert app_module.parse_serve_args([]).host == "0.0.0.0"
    monkeypatch.setenv("AGENT_PORT", "9001")
    assert app_module.parse_serve_args(["--host", "127.0.0.1"]).port == 9001


# ------------------------------------------------------------------------------------ Strands model isolation


@pytest.fixture
def overlap_model() -> Iterator[FakeModelServer]:
    """A model server whose first two requests must be in flight at the same time (a barrier): proves overlap."""
    barrier = threading.Barrier(2, timeout=20)
    calls = {"n": 0}
    lock = threading.Lock()

    def reply(request: RecordedRequest) -> str:
        with lock:
            calls["n"] += 1
            first_two = calls["n"] <= 2
        if first_two:
            barrier.wait()
        return f"temperature was {request.body.get('temperature')} #### 42"

    with FakeModelServer(reply) as server:
        yield server


def _rollout_ctx(server: FakeModelServer, session_id: str, temperature: float, style: str) -> RolloutContext:
    return RolloutContext.from_payload(
        {
            "_rollout": {
                "base_url": server.base_url,
                "model_id": f"model-{session_id[:7]}",
                "sampling_params": {"temperature": temperature, "max_tokens": 32},
                "token_capture": style,
                "job_arn": "arn:job",
            }
        },
        session_id,
    )


def _assert_isolated(server: FakeModelServer) -> None:
    requests = server.requests
    assert len(requests) == 2
    by_session = {r.header("X-RLLM-Session-Id"): r for r in requests}
    assert set(by_session) == {SESSION_A, SESSION_B}
    assert by_session[SESSION_A].body["temperature"] == 0.1
    assert by_session[SESSION_B].body["temperature"] == 0.9
    assert by_session[SESSION_A].body["model"] == f"model-{SESSION_A[:7]}"
    assert by_session[SESSION_B].body["model"] == f"model-{SESSION_B[:7]}"
    assert all(r.body["max_tokens"] == 32 for r in requests)


def test_shared_strands_model_isolates_concurrent_rollouts_in_threads(overlap_model: FakeModelServer) -> None:
    from strands import Agent

    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

    shared_model = RolloutOpenAIModel(client_args={"base_url": "http://unused.invalid/v1"}, stream=False)

    def rollout(session_id: str, temperature: float) -> str:
        with rollout_context(_rollout_ctx(overlap_model, session_id, temperature, "rllm-header")):
            return str(Agent(model=shared_model, callback_handler=None)("solve"))

    with ThreadPoolExecutor(2) as pool:
        texts = list(pool.map(rollout, [SESSION_A, SESSION_B], [0.1, 0.9]))
    assert "temperature was 0.1" in texts[0]
    assert "temperature was 0.9" in texts[1]
    _assert_isolated(overlap_model)
    assert shared_model.config.get("params") is None  # nothing written into the shared model


def test_shared_strands_model_isolates_concurrent_rollouts_in_asyncio(overlap_model: FakeModelServer) -> None:
    from strands import Agent

    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

    shared_model = RolloutOpenAIModel(model_id="fallback")  # streaming, as Strands defaults

    async def rollout(session_id: str, temperature: float) -> str:
        with rollout_context(_rollout_ctx(overlap_model, session_id, temperature, "rllm-header")):
            return str(await Agent(model=shared_model, callback_handler=None).invoke_async("solve"))

    async def main() -> list[str]:
        return list(await asyncio.gather(rollout(SESSION_A, 0.1), rollout(SESSION_B, 0.9)))

    texts = asyncio.run(main())
    assert "temperature was 0.1" in texts[0]
    assert "temperature was 0.9" in texts[1]
    _assert_isolated(overlap_model)


@pytest.mark.parametrize("style", ["rllm-path", "art-gateway", "sagemaker"])
def test_strands_model_applies_each_token_capture_style(style: str) -> None:
    from strands import Agent

    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

    with FakeModelServer("#### 1") as server:
        model = RolloutOpenAIModel(stream=False)
        with rollout_context(_rollout_ctx(server, SESSION_A, 0.5, style)):
            Agent(model=model, callback_handler=None)("hi")
        (request,) = server.requests
    if style == "rllm-path":
        assert request.path == f"/sessions/{SESSION_A}/v1/chat/completions"
    elif style == "art-gateway":
        assert request.header("Authorization") == f"Bearer {SESSION_A}"
    else:
        assert request.header("X-Amzn-SageMaker-Trajectory-Id") == SESSION_A
        assert request.header("X-Amzn-SageMaker-Job-Arn") == "arn:job"
    assert request.body["temperature"] == 0.5


def test_strands_model_outside_a_rollout_is_a_plain_openai_model() -> None:
    from strands import Agent
    from strands.models.openai import OpenAIModel

    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel, wrap_model

    with FakeModelServer("#### 1") as server:
        plain = OpenAIModel(client_args={"base_url": server.base_url, "api_key": "k"}, model_id="m", stream=False)
        model = wrap_model(plain)
        assert isinstance(model, RolloutOpenAIModel)
        Agent(model=model, callback_handler=None)("hi")
        (request,) = server.requests
    assert request.body["model"] == "m"
    assert request.header("Authorization") == "Bearer k"
    assert "temperature" not in request.body


def test_text_only_content_is_flattened_to_a_string() -> None:
    from rollout_pipeline.agent.strands_model import text_parts_to_string

    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert text_parts_to_string(parts) == {"role": "user", "content": "ab"}
    image = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}
    assert text_parts_to_string(image) is image
    assert text_parts_to_string({"role": "assistant", "content": None, "tool_calls": []})["content"] is None


def test_an_injected_client_gets_header_styles_and_refuses_url_or_key_styles() -> None:
    import openai
    from strands import Agent

    from rollout_pipeline.agent.inference import TokenCaptureError
    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

    with FakeModelServer("#### 1") as server:
        model = RolloutOpenAIModel(client=openai.AsyncOpenAI(base_url=server.base_url, api_key="k"), stream=False)
        with rollout_context(_rollout_ctx(server, SESSION_A, 0.5, "rllm-header")):
            Agent(model=model, callback_handler=None)("hi")
        with rollout_context(_rollout_ctx(server, SESSION_B, 0.5, "rllm-path")), pytest.raises(TokenCaptureError):
            Agent(model=model, callback_handler=None)("hi")
        (request,) = server.requests
    assert request.header("X-RLLM-Session-Id") == SESSION_A
    assert request.header("Authorization") == "Bearer k"


def test_strands_tool_threads_see_their_own_rollout() -> None:
    """Sync Strands tools run in worker threads; each must see the rollout that called it, even concurrently."""
    from strands import Agent, tool

    from rollout_pipeline.agent.strands_model import RolloutOpenAIModel

    seen: list[tuple[str, str | None, str]] = []
    barrier = threading.Barrier(2, timeout=20)

    @tool
    def whoami(tag: str) -> str:
        """Report which rollout is running.

        Args:
            tag: any text.
        """
        barrier.wait()  # both tools run at the same time
        seen.append((tag, current_rollout().session_id, threading.current_thread().name))
        return "ok"

    def reply(request: RecordedRequest) -> str | ToolCall:
        messages = request.body.get("messages") or []
        if any(m.get("role") == "tool" for m in messages):
            return "#### 42"
        return ToolCall("whoami", {"tag": request.header("X-RLLM-Session-Id") or "?"})

    with FakeModelServer(reply) as server:
        model = RolloutOpenAIModel(stream=False)

        def rollout(session_id: str) -> str:
            with rollout_context(_rollout_ctx(server, session_id, 0.5, "rllm-header")):
                return str(Agent(model=model, tools=[whoami], callback_handler=None)("go"))

        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(rollout, [SESSION_A, SESSION_B]))
    assert all("#### 42" in text for text in texts)
    assert sorted((tag, session) for tag, session, _ in seen) == [(SESSION_A, SESSION_A), (SESSION_B, SESSION_B)]
    assert all(name != "MainThread" for _, _, name in seen)


def test_contextvars_copy_is_what_the_helpers_rely_on() -> None:
    """Guard: a copied context keeps the rollout; a fresh one does not (documents the thread rule)."""
    with rollout_context(make_ctx(SESSION_B)):
        copied = contextvars.copy_context()
    assert copied.run(get_rollout) is not None
    assert contextvars.Context().run(get_rollout) is None
