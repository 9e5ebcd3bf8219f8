"""`RolloutApp`: ART's `AgentCoreRLApp` plus the rollout context, and `serve()` to run an app as a process.

`RolloutApp` changes nothing on the wire: `/invocations`, `/ping`, the immediate `{"status": "processing", ...}`
answer, the result key `{exp_id}/{input_id}/{session_id}.json` and the result body are ART 0.2.0's own code paths
(the body gains one key the host owns, `config.RESULT_USAGE_KEY`: what the session used, `agent.usage`).
It only wraps the user function so that, while it runs, `current_rollout()` returns this rollout's context
(ids, sampling params, model endpoint) and the model helpers can wire every model call for it; the context is
cleared when the function returns or raises (before ART saves the result).

    app = RolloutApp()

    @app.rollout_entrypoint
    def invoke(payload: dict) -> dict:          # or async; (payload, context) also works
        ctx = current_rollout()
        ...
        return {"rewards": 1.0}

    if __name__ == "__main__":
        serve(app)                              # --host/--port; 0.0.0.0 in a container
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from agentcore_rl_toolkit.app import AgentCoreRLApp

from rollout_pipeline.agent.context import RolloutContext, rollout_context
from rollout_pipeline.agent.usage import install as install_usage_reporting

logger = logging.getLogger(__name__)

HOST_ENV = "AGENT_HOST"
PORT_ENV = "AGENT_PORT"
DEFAULT_PORT = 8080


class RolloutApp(AgentCoreRLApp):  # type: ignore[misc]
    """`AgentCoreRLApp` whose `rollout_entrypoint` also sets the rollout context around the user function, and whose
    results carry what the session used (`agent.usage`: CPU seconds, beside the result, for the cost model)."""

    def __init__(self) -> None:
        super().__init__()
        install_usage_reporting()

    def rollout_entrypoint(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """ART's `rollout_entrypoint` (background run, result saved to S3, error result on exception) around
        `func`, with the rollout context set for the duration of each call. Sync and async functions work."""
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            # Generators cannot return the result dict ART saves; keep ART's behaviour for them unchanged.
            return super().rollout_entrypoint(func)  # type: ignore[no-any-return]
        return super().rollout_entrypoint(with_rollout_context_of_request(func, self._takes_context(func)))  # type: ignore[no-any-return]


def with_rollout_context_of_request(func: Callable[..., Any], takes_context: bool) -> Callable[..., Any]:
    """Wrap an ART entry function `(payload[, context])` so the rollout context is set while it runs.

    The wrapper always takes `(payload, context)` (so ART passes the request context) and deliberately has no
    `__wrapped__` (ART inspects the signature to decide what to pass)."""

    def build(payload: Any, context: Any) -> RolloutContext:
        header_session = getattr(context, "session_id", None)
        ctx = RolloutContext.from_payload(payload if isinstance(payload, dict) else {}, header_session)
        declared = ctx.raw.get("session_id")
        if header_session and declared and declared != header_session:
            logger.warning("session header %s differs from _rollout.session_id %s", header_session, declared)
        return ctx

    def call(payload: Any, context: Any) -> Any:
        return func(payload, context) if takes_context else func(payload)

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(func):

        async def async_wrapper(payload: Any, context: Any) -> Any:
            with rollout_context(build(payload, context)):
                return await call(payload, context)

        wrapper = async_wrapper
    else:

        def sync_wrapper(payload: Any, context: Any) -> Any:
            with rollout_context(build(payload, context)):
                return call(payload, context)

        wrapper = sync_wrapper
    wrapper.__name__ = getattr(func, "__name__", wrapper.__name__)
    wrapper.__qualname__ = getattr(func, "__qualname__", wrapper.__qualname__)
    wrapper.__doc__ = func.__doc__
    wrapper.__module__ = func.__module__
    return wrapper


def in_container() -> bool:
    """True inside a container or an ACR microVM as far as we can tell (`/.dockerenv`, `DOCKER_CONTAINER`)."""
    return os.path.exists("/.dockerenv") or bool(os.environ.get("DOCKER_CONTAINER"))


def parse_serve_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`--host` (env AGENT_HOST; 0.0.0.0 in a container, else 127.0.0.1) and `--port` (env AGENT_PORT; 8080)."""
    parser = argparse.ArgumentParser(description="Serve an AgentCore rollout agent (POST /invocations, GET /ping)")
    parser.add_argument("--host", default=os.environ.get(HOST_ENV) or ("0.0.0.0" if in_container() else "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get(PORT_ENV) or DEFAULT_PORT))
    return parser.parse_args(argv)


def serve(app: AgentCoreRLApp, argv: Sequence[str] | None = None) -> None:
    """Run `app` with uvicorn on the host and port from `argv` / env (see `parse_serve_args`). Blocks."""
    args = parse_serve_args(argv)
    logger.info("serving agent on %s:%d", args.host, args.port)
    from rollout_pipeline.agent.credentials import load_model_credential

    load_model_credential()
    app.run(port=args.port, host=args.host)
