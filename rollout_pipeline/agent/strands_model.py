"""A Strands OpenAI model that wires every model call for the rollout it is serving.

One agent (and one model object) is usually built at import time and shared by every concurrent rollout of the
process. SageMaker's RFT adapter injects its headers by mutating the shared model config before each call, so two
rollouts in flight at once can send each other's headers. `RolloutOpenAIModel` never writes shared state: it reads
the rollout context (a context variable, private to each rollout's thread / task) while it builds each request:

- `model`: `_rollout.model_id`, else the configured `model_id`;
- sampling params: `_rollout.sampling_params` over the configured `params`;
- base URL and api key: `_rollout.base_url` (else the configured one), adjusted by the token-capture style
  (`rllm-path` session URL, `art-gateway` session api key), on a client made for that one call;
- token-capture headers (`sagemaker`, `rllm-header`) as per-request `extra_headers`.

Outside a rollout it behaves like `strands.models.openai.OpenAIModel`. In both cases text-only message content is
sent as a plain string (llama.cpp's server and some chat templates reject Strands' list of text parts).
"""

from __future__ import annotations

from typing import Any

from strands.models.openai import OpenAIModel

from rollout_pipeline.agent.context import get_rollout
from rollout_pipeline.agent.inference import (
    TokenCapture,
    TokenCaptureError,
    inference_headers,
    inference_params,
    openai_client_kwargs,
    resolve_style,
)


class RolloutOpenAIModel(OpenAIModel):
    """`OpenAIModel` whose calls carry the current rollout's model id, sampling params and token-capture wiring.

    Args:
        client_args: as for `OpenAIModel` (`base_url`, `api_key`, ...): defaults used when the rollout gives none.
        token_capture: style for every call (`TokenCapture` or its value); None = `_rollout.token_capture`, then env
            `ROLLOUT_TOKEN_CAPTURE`, then none.
        client: a pre-built client (as for `OpenAIModel`); then only header styles can be applied.
        flatten_text_content: send text-only message content as a plain string instead of Strands' list of
            `{"type": "text"}` parts (llama.cpp's and some vLLM chat templates reject lists); default on.
        **model_config: `model_id` (optional: the rollout's `model_id` is used), `params`, `stream`, ...
    """

    def __init__(
        self,
        client_args: dict[str, Any] | None = None,
        *,
        token_capture: TokenCapture | str | None = None,
        client: Any | None = None,
        flatten_text_content: bool = True,
        **model_config: Any,
    ) -> None:
        # The model id may come from each rollout instead; OpenAIModel needs the key to exist.
        model_config.setdefault("model_id", "")
        super().__init__(client=client, client_args=client_args, **model_config)
        self.token_capture = token_capture
        self.flatten_text_content = flatten_text_content

    def format_request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The OpenAI request of `OpenAIModel`, plus the rollout's model id, sampling params and headers."""
        request = super().format_request(*args, **kwargs)
        if self.flatten_text_content:
            request["messages"] = [text_parts_to_string(message) for message in request.get("messages") or []]
        rollout = get_rollout()
        if rollout is None:
            return request
        if rollout.model_id:
            request["model"] = rollout.model_id
        if not request.get("model"):
            raise TokenCaptureError("no model id: set _rollout.model_id or pass model_id= to RolloutOpenAIModel")
        request.update(inference_params(rollout))
        headers = inference_headers(self.token_capture, rollout)
        if headers:
            request["extra_headers"] = {**dict(request.get("extra_headers") or {}), **headers}
        return request

    def _resolve_client_args(self) -> dict[str, Any]:
        """Client kwargs for one call: the rollout's base URL / api key with token capture applied."""
        base_args = super()._resolve_client_args()
        rollout = get_rollout()
        if rollout is None:
            return base_args
        style = resolve_style(self.token_capture, rollout)
        wired = openai_client_kwargs(
            style,
            rollout,
            base_url=rollout.base_url or base_args.get("base_url"),
            api_key=rollout.api_key or base_args.get("api_key"),
        )
        # Headers travel per request (`extra_headers`), so they also reach an injected client.
        wired.pop("default_headers", None)
        return {**base_args, **wired}

    def _custom_client_guard(self) -> None:
        rollout = get_rollout()
        if rollout is None or self._custom_client is None:
            return
        style = resolve_style(self.token_capture, rollout)
        if style in (TokenCapture.RLLM_PATH, TokenCapture.ART_GATEWAY):
            raise TokenCaptureError(
                f"token capture {style.value!r} changes the client's URL or key: it cannot be applied to an injected "
                "client; pass client_args instead"
            )

    async def stream(self, *args: Any, **kwargs: Any) -> Any:
        """`OpenAIModel.stream`, after checking the token-capture style can be applied."""
        self._custom_client_guard()
        async for event in super().stream(*args, **kwargs):
            yield event


def text_parts_to_string(message: dict[str, Any]) -> dict[str, Any]:
    """`{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}` -> `{"content": "ab"}`;
    messages with any non-text part (images, ...) or string content are returned unchanged."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return message
    if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        return message
    return {**message, "content": "".join(str(part.get("text") or "") for part in content)}


def wrap_model(
    model: OpenAIModel, token_capture: TokenCapture | str | None = None, flatten: bool = True
) -> RolloutOpenAIModel:
    """A `RolloutOpenAIModel` with the same configuration and client as `model` (which is left untouched)."""
    if isinstance(model, RolloutOpenAIModel) and token_capture is None:
        return model
    custom_client = getattr(model, "_custom_client", None)
    return RolloutOpenAIModel(
        client_args=None if custom_client is not None else dict(model.client_args),
        token_capture=token_capture,
        flatten_text_content=flatten,
        client=custom_client,
        **dict(model.config),
    )
