"""Model calls for the current rollout: sampling params, token-capture headers, OpenAI client settings.

Token capture lets the trainer join each rollout's event with the tokens the model gateway recorded for it. The
gateways in use key their traces by a session id, passed in one of these ways (`TokenCapture`):

| style          | what the agent sends                                                                        |
|----------------|---------------------------------------------------------------------------------------------|
| `none`         | nothing extra                                                                               |
| `sagemaker`    | headers `X-Amzn-SageMaker-Job-Arn: <_rollout.job_arn>`, `X-Amzn-SageMaker-Trajectory-Id: <session>` |
| `rllm-header`  | header `X-RLLM-Session-Id: <session>` (newer rLLM)                                          |
| `rllm-path`    | base URL `{gateway}/sessions/{session}/v1` (rllm-model-gateway 0.1)                         |
| `art-gateway`  | OpenAI api key = session id, i.e. `Authorization: Bearer <session>` (ART 0.2 gateway)         |

The style comes from the argument, else `_rollout.token_capture`, else env `ROLLOUT_TOKEN_CAPTURE`, else `none`.
The session id is the ACR session id of this attempt (new on retry), the same id that names the result object.

`openai` is imported only by `openai_client` / `async_openai_client`.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rollout_pipeline.agent.context import RolloutContext, current_rollout
from rollout_pipeline.config import JOB_ARN_ENV  # env fallback of `_rollout.job_arn`

if TYPE_CHECKING:
    import openai

SAGEMAKER_JOB_ARN_HEADER = "X-Amzn-SageMaker-Job-Arn"
SAGEMAKER_TRAJECTORY_HEADER = "X-Amzn-SageMaker-Trajectory-Id"
RLLM_SESSION_HEADER = "X-RLLM-Session-Id"
#: Env fallbacks for values the payload may not carry.
TOKEN_CAPTURE_ENV = "ROLLOUT_TOKEN_CAPTURE"
#: OpenAI clients refuse an empty key; local OpenAI-compatible servers accept anything.
PLACEHOLDER_API_KEY = "EMPTY"


class TokenCapture(StrEnum):
    """How the session id reaches the model gateway."""

    NONE = "none"
    SAGEMAKER = "sagemaker"
    RLLM_HEADER = "rllm-header"
    RLLM_PATH = "rllm-path"
    ART_GATEWAY = "art-gateway"


class TokenCaptureError(ValueError):
    """The requested token-capture style cannot be applied (unknown style, or a value it needs is missing)."""


def _ctx(ctx: RolloutContext | None) -> RolloutContext:
    return ctx if ctx is not None else current_rollout()


def resolve_style(style: TokenCapture | str | None = None, ctx: RolloutContext | None = None) -> TokenCapture:
    """The token-capture style: the argument, else `_rollout.token_capture`, else env, else `none`."""
    chosen = style or _ctx(ctx).token_capture or os.environ.get(TOKEN_CAPTURE_ENV) or TokenCapture.NONE
    try:
        return TokenCapture(str(chosen).strip().lower().replace("_", "-"))
    except ValueError:
        known = ", ".join(s.value for s in TokenCapture)
        raise TokenCaptureError(f"unknown token-capture style {chosen!r} (known: {known})") from None


def inference_params(ctx: RolloutContext | None = None, **defaults: Any) -> dict[str, Any]:
    """Sampling params of the current rollout (`_rollout.sampling_params`: temperature, top_p, max_tokens, ...)
    over `defaults`; None values are dropped (a None in the rollout keeps the default). Pass the result as
    keyword arguments of a chat completion."""
    given = {key: value for key, value in _ctx(ctx).sampling_params.items() if value is not None}
    merged = {**defaults, **given}
    return {key: value for key, value in merged.items() if value is not None}


def inference_headers(style: TokenCapture | str | None = None, ctx: RolloutContext | None = None) -> dict[str, str]:
    """HTTP headers the model calls of this rollout must carry for `style` (empty for styles that use the URL or
    the api key instead)."""
    rollout = _ctx(ctx)
    chosen = resolve_style(style, rollout)
    if chosen is TokenCapture.SAGEMAKER:
        job_arn = rollout.job_arn or os.environ.get(JOB_ARN_ENV)
        if not job_arn:
            raise TokenCaptureError(f"token capture 'sagemaker' needs _rollout.job_arn or env {JOB_ARN_ENV}")
        return {SAGEMAKER_JOB_ARN_HEADER: job_arn, SAGEMAKER_TRAJECTORY_HEADER: _session(rollout, chosen)}
    if chosen is TokenCapture.RLLM_HEADER:
        return {RLLM_SESSION_HEADER: _session(rollout, chosen)}
    return {}


def _session(rollout: RolloutContext, style: TokenCapture) -> str:
    if not rollout.session_id:
        raise TokenCaptureError(f"token capture {style.value!r} needs the session id (ACR session header)")
    return rollout.session_id


def session_base_url(base_url: str, session_id: str) -> str:
    """rllm-model-gateway's per-session URL: `http://gw:9090[/v1]` -> `http://gw:9090/sessions/{session}/v1`."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return f"{root}/sessions/{session_id}/v1"


def openai_client_kwargs(
    style: TokenCapture | str | None = None,
    ctx: RolloutContext | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    default_headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for `openai.OpenAI(...)` / `AsyncOpenAI(...)` wired for this rollout: `base_url`
    (`_rollout.base_url` unless given), `api_key`, and `default_headers` with the token-capture headers.

    Precedence: explicit arguments < token capture (the gateway's contract must win: `rllm-path` rewrites the URL,
    `art-gateway` sets the key). Without a key anywhere, `_rollout.api_key`, env `OPENAI_API_KEY`, then "EMPTY".
    """
    rollout = _ctx(ctx)
    chosen = resolve_style(style, rollout)
    url = base_url or rollout.base_url
    if not url:
        raise TokenCaptureError("no model base URL: set _rollout.base_url or pass base_url=")
    key = api_key or rollout.api_key or os.environ.get("OPENAI_API_KEY") or PLACEHOLDER_API_KEY
    if chosen is TokenCapture.RLLM_PATH:
        url = session_base_url(url, _session(rollout, chosen))
    elif chosen is TokenCapture.ART_GATEWAY:
        key = _session(rollout, chosen)
    headers = {**(default_headers or {}), **inference_headers(chosen, rollout)}
    kwargs: dict[str, Any] = {"base_url": url, "api_key": key}
    if headers:
        kwargs["default_headers"] = headers
    return kwargs


def model_id(ctx: RolloutContext | None = None, default: str | None = None) -> str:
    """The model to ask for: `_rollout.model_id`, else `default`."""
    chosen = _ctx(ctx).model_id or default
    if not chosen:
        raise TokenCaptureError("no model id: set _rollout.model_id or pass default=")
    return chosen


def openai_client(
    style: TokenCapture | str | None = None, ctx: RolloutContext | None = None, **kwargs: Any
) -> openai.OpenAI:
    """A synchronous OpenAI client for this rollout (see `openai_client_kwargs`; extra kwargs go to the client)."""
    import openai

    return openai.OpenAI(**_client_args(style, ctx, kwargs))


def async_openai_client(
    style: TokenCapture | str | None = None, ctx: RolloutContext | None = None, **kwargs: Any
) -> openai.AsyncOpenAI:
    """An async OpenAI client for this rollout (see `openai_client_kwargs`; extra kwargs go to the client)."""
    import openai

    return openai.AsyncOpenAI(**_client_args(style, ctx, kwargs))


def _client_args(style: TokenCapture | str | None, ctx: RolloutContext | None, extra: dict[str, Any]) -> dict[str, Any]:
    wired = openai_client_kwargs(
        style,
        ctx,
        base_url=extra.pop("base_url", None),
        api_key=extra.pop("api_key", None),
        default_headers=extra.pop("default_headers", None),
    )
    return {**extra, **wired}
