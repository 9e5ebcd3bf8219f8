"""The rollout context: who this rollout is, on `contextvars`, for the duration of one rollout.

`RolloutApp` sets it around every `@app.rollout_entrypoint` call, so agent code, tools and model adapters can ask
"which rollout am I serving?" anywhere in the call stack without passing ids around:

    ctx = current_rollout()            # raises NoRolloutContext outside a rollout
    ctx = get_rollout()                # or None

Context variables follow the code into `await`, `asyncio.create_task`, `asyncio.to_thread` and Strands' tool
threads (both copy the context). A thread you start yourself does not inherit it: use `run_in_thread`,
`submit_with_context` or `with_rollout_context` to carry it over.

This module imports only the standard library.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

#: ACR's session header; ART reads `context.session_id` from it.
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"


class NoRolloutContext(LookupError):
    """`current_rollout()` was called outside a rollout (no context is set in this thread / task)."""


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class RolloutContext:
    """Identity and settings of the rollout being served. Immutable: safe to share between threads.

    Built from the request payload's `_rollout` (ART's keys plus the pipeline's) and ACR's session header.
    Fields the payload does not carry are None (an ART client sends only `exp_id`, `input_id`, `s3_bucket`, ...).
    """

    session_id: str | None = None
    exp_id: str | None = None
    batch_id: str | None = None
    input_id: str | None = None
    rollout_id: str | None = None
    index: int | None = None
    attempt: int | None = None
    group_size: int | None = None
    policy_version: str | None = None
    base_url: str | None = None
    model_id: str | None = None
    api_key: str | None = None
    s3_bucket: str | None = None
    #: Token-capture style requested by the payload (`_rollout.token_capture`), if any.
    token_capture: str | None = None
    #: SageMaker RFT job ARN (`_rollout.job_arn`) for the SageMaker token-capture headers.
    job_arn: str | None = None
    sampling_params: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))
    #: The whole `_rollout` dict as received (read-only), for keys this class does not name.
    raw: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], session_id: str | None = None) -> RolloutContext:
        """Build from an invocation payload. `session_id` is the session header's value; when it is missing the
        payload's `_rollout.session_id` (set by the pipeline) is used."""
        rollout = payload.get("_rollout")
        if not isinstance(rollout, Mapping):
            rollout = {}
        sampling = rollout.get("sampling_params")
        return cls(
            session_id=session_id or _opt_str(rollout.get("session_id")),
            exp_id=_opt_str(rollout.get("exp_id")),
            batch_id=_opt_str(rollout.get("batch_id")),
            input_id=_opt_str(rollout.get("input_id")),
            rollout_id=_opt_str(rollout.get("rollout_id")),
            index=_opt_int(rollout.get("index")),
            attempt=_opt_int(rollout.get("attempt")),
            group_size=_opt_int(rollout.get("group_size")),
            policy_version=_opt_str(rollout.get("policy_version")),
            base_url=_opt_str(rollout.get("base_url")),
            model_id=_opt_str(rollout.get("model_id")),
            api_key=_opt_str(rollout.get("api_key")),
            s3_bucket=_opt_str(rollout.get("s3_bucket")),
            token_capture=_opt_str(rollout.get("token_capture")),
            job_arn=_opt_str(rollout.get("job_arn")),
            sampling_params=_frozen(sampling if isinstance(sampling, Mapping) else None),
            raw=_frozen(rollout),
        )


def _opt_str(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return str(value)


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


_CURRENT: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("rollout_context", default=None)


def get_rollout() -> RolloutContext | None:
    """The current rollout's context, or None outside a rollout."""
    return _CURRENT.get()


def current_rollout() -> RolloutContext:
    """The current rollout's context; raises `NoRolloutContext` outside a rollout."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise NoRolloutContext(
            "no rollout context: call this inside a RolloutApp rollout entrypoint (or `rollout_context(...)`); "
            "threads you start yourself need run_in_thread / submit_with_context"
        )
    return ctx


def set_rollout_context(ctx: RolloutContext) -> contextvars.Token[RolloutContext | None]:
    """Set the context for the current thread / task; pass the token to `clear_rollout_context` when done."""
    return _CURRENT.set(ctx)


def clear_rollout_context(token: contextvars.Token[RolloutContext | None] | None = None) -> None:
    """Restore the value before `set_rollout_context(...)` returned `token`, or clear it when no token is given."""
    if token is None:
        _CURRENT.set(None)
    else:
        _CURRENT.reset(token)


@contextmanager
def rollout_context(ctx: RolloutContext) -> Iterator[RolloutContext]:
    """`with rollout_context(ctx):` sets the context for the block and restores the previous value after."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def with_rollout_context(func: Callable[P, T]) -> Callable[P, T]:
    """Bind `func` to a copy of the caller's context (rollout context included): call it from any thread."""
    snapshot = contextvars.copy_context()

    @functools.wraps(func)
    def bound(*args: P.args, **kwargs: P.kwargs) -> T:
        # A Context may be entered by one thread at a time: run each call in its own copy of the snapshot.
        return snapshot.copy().run(func, *args, **kwargs)

    return bound


def submit_with_context(executor: Executor, func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """`executor.submit(func, ...)` with the caller's context (rollout context included) copied to the worker."""
    snapshot = contextvars.copy_context()
    return executor.submit(functools.partial(snapshot.run, func, *args, **kwargs))


def run_in_thread(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run `func` in a new thread with the caller's context copied, wait for it, and return its result (or raise
    its exception). For many calls prefer a pool with `submit_with_context`."""
    snapshot = contextvars.copy_context()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = snapshot.run(func, *args, **kwargs)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"rollout-{getattr(func, '__name__', 'task')}", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
