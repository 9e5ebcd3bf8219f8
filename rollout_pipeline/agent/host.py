"""The agent host: the one process every agent session runs, in the agent image and in local mode.

    python -m rollout_pipeline.agent.host [--agent-module MODULE[:APP]] [--agent-kind auto|art|rft]
                                          [--host H] [--port P]

The module comes from `--agent-module`, else env `ROLLOUTS_AGENT_MODULE` (the stack sets it from
`-c agent_module=...`), else the example agent of the kind; the kind from `--agent-kind`, else env
`ROLLOUTS_AGENT_KIND`, else `auto` (read from the module's source: `modules.agent_kind_of`). Host and port:
`--host/--port`, else env `AGENT_HOST`/`AGENT_PORT`, else 127.0.0.1 (0.0.0.0 in a container) and 8080.

1. The author's module is imported by name with its server deferred (`modules.load_entrypoint`), so a module
   written the ART way, ending in `if __name__ == "__main__": app.run()` or in a bare `app.run()`, runs as it is
   (run itself, `app.run()` binds port 8080 whatever the process is told).
2. Its app is served on the host and port given: an ART `AgentCoreRLApp` (or `RolloutApp`) as it is; any other
   `BedrockAgentCoreApp` entrypoint (SageMaker RFT agents, ART's `AgentCoreRuntimeApp`, a plain `@app.entrypoint`)
   through the RFT adapter (`rft_host`), which answers at once and writes the result object. For kind `rft` the
   adapter's front door starts before the import (the SDK may read `RFT_RUNTIME_ENDPOINT` when it is imported).
3. Every request of the session enters through `serve`, whatever the kind: a warm-up invocation of the pipeline's
   warm pool is answered there and never reaches the agent (`warmup.WarmupGate`); rollouts pass through unchanged.
4. Every result object the session's ART app saves carries what the session used (`agent.usage`: its CPU seconds,
   for the cost model), installed before the module is imported; the module is not touched.

A module that cannot be served ends the process (exit code 1) with the last line
`agent host: cannot serve MODULE: <why>` on stderr: the local ACR adapter fails the session's rollout with it
(AgentCore itself answers such a session `RuntimeClientError` "Runtime initialization time exceeded").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline.agent.modules import AgentModuleError, Entrypoint, agent_kind_of, load_entrypoint
from rollout_pipeline.config import AGENT_KIND_ENV, AGENT_MODULE_ENV, DEFAULT_AGENT_MODULES, AgentKind

logger = logging.getLogger(__name__)

#: The kinds `--agent-kind` takes: `auto` (told from the module's source) or one of the deployable kinds.
KINDS: Final = ("auto", *DEFAULT_AGENT_MODULES)
#: The last line of the process's stderr when the module cannot be served starts with this.
CANNOT_SERVE: Final = "agent host: cannot serve"
EXIT_CANNOT_SERVE: Final = 1


@dataclass
class ServedAgent:
    """The app the host serves for the author's module, and the RFT front door when the adapter needs one."""

    app: Any
    entry: Entrypoint
    kind: AgentKind
    door: Any = None

    def close(self) -> None:
        if self.door is not None:
            self.door.stop()


def resolve_kind(module: str, kind: str) -> AgentKind:
    """`art` or `rft` for `kind` (`auto`: told from the module's source)."""
    wanted = kind.strip().lower()
    if wanted not in KINDS:
        raise ValueError(f"{AGENT_KIND_ENV} must be one of {', '.join(KINDS)}, got {kind!r}")
    if wanted == "auto":
        return agent_kind_of(module)
    return "rft" if wanted == "rft" else "art"


def load(
    module: str, kind: str = "auto", argv: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> ServedAgent:
    """Import the author's module (servers deferred) and build the app to serve for it (see the module doc)."""
    from rollout_pipeline.agent import rft_host

    resolved = resolve_kind(module, kind)
    if resolved == "rft":
        app, door, entry = rft_host.start_host(module, environ=environ, argv=argv)
        return ServedAgent(app=app, entry=entry, kind=resolved, door=door)
    entry = load_entrypoint(module, argv)
    if entry.is_art_rollout_app:
        return ServedAgent(app=entry.app, entry=entry, kind=resolved)
    # A plain `BedrockAgentCoreApp` entrypoint, served as it is, would answer only when the rollout ends and write
    # no result object: the RFT adapter serves it (its front door starts now; the module is already imported).
    door = rft_host.start_front_door()
    return ServedAgent(app=rft_host.rft_app(entry, door, environ), entry=entry, kind=resolved, door=door)


def serve(app: Any, host: str, port: int) -> None:
    """Run `app` on `host:port` until the process ends, as `BedrockAgentCoreApp.run` would (uvicorn, access log
    and info level only in debug). Every request of the session enters here: `/invocations` and `/ping` alike; the
    warm pool's warm-up invocations are answered here (`warmup.WarmupGate`), everything else reaches `app`."""
    import uvicorn

    from rollout_pipeline.agent.warmup import WarmupGate

    debug = bool(getattr(app, "debug", False))
    uvicorn.run(WarmupGate(app), host=host, port=port, access_log=debug, log_level="info" if debug else "warning")


def authors_traceback(exc: BaseException) -> str:
    """The traceback of an error raised while importing the author's module, from the first frame outside the
    host and importlib (the author's own code first)."""
    ours = (__file__, sys.modules[load_entrypoint.__module__].__file__ or "")
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename not in ours and "importlib" not in filename:
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the agent module (see the module doc); `argv` defaults to the process's arguments."""
    from rollout_pipeline.agent.app import parse_serve_args
    from rollout_pipeline.agent.credentials import load_model_credential

    parser = argparse.ArgumentParser(prog="python -m rollout_pipeline.agent.host", add_help=False)
    parser.add_argument("--agent-module", default=os.environ.get(AGENT_MODULE_ENV) or None)
    parser.add_argument("--agent-kind", default=os.environ.get(AGENT_KIND_ENV) or "auto")
    known, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    kind = str(known.agent_kind).strip().lower()
    if kind not in KINDS:
        raise SystemExit(f"{AGENT_KIND_ENV} must be one of {', '.join(KINDS)}, got {known.agent_kind!r}")
    module = known.agent_module or DEFAULT_AGENT_MODULES["rft" if kind == "rft" else "art"]
    address = parse_serve_args(rest)
    logging.basicConfig(level=logging.INFO)
    load_model_credential()
    from rollout_pipeline.agent.usage import install

    install()  # every ART app of the session reports what it used beside its result (`agent.usage`)
    try:
        served = load(module, kind, ["--host", address.host, "--port", str(address.port)])
    except Exception as exc:
        why = str(exc) if isinstance(exc, AgentModuleError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, AgentModuleError):
            print(authors_traceback(exc), file=sys.stderr, end="")
        print(f"{CANNOT_SERVE} {module}: {why}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CANNOT_SERVE) from None
    logger.info(
        "agent host: %s:%s (%s) on %s:%d",
        served.entry.module,
        served.entry.app_name,
        served.kind,
        address.host,
        address.port,
    )
    try:
        serve(served.app, address.host, address.port)
    finally:
        served.close()


if __name__ == "__main__":
    main()
