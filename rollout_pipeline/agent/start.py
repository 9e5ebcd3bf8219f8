"""The agent image's start command: serve the configured agent module the way its kind needs.

    python -m rollout_pipeline.agent.start [--host 0.0.0.0 --port 8080]

Env `ROLLOUTS_AGENT_KIND` (`art` default, or `rft`) and `ROLLOUTS_AGENT_MODULE` (default: the kind's example agent),
set on the runtime by the stack from `-c agent_kind=...` / `-c agent_module=...`:

- `art`: the module runs as `python -m MODULE --host H --port P` would run it (its `__main__` serves an ART app),
  its results reporting what the session used (`agent.usage`: installed on ART's app class first);
- `rft`: the RFT host (`rollout_pipeline.agent.rft_host`) imports the module and serves its `@app.entrypoint`.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from rollout_pipeline.config import AGENT_KIND_ENV, AGENT_MODULE_ENV, DEFAULT_AGENT_MODULES


def main(argv: Sequence[str] | None = None) -> None:
    """Serve `ROLLOUTS_AGENT_MODULE` as `ROLLOUTS_AGENT_KIND` says; `argv` (--host/--port) goes to the server."""
    args = list(sys.argv[1:] if argv is None else argv)
    kind = (os.environ.get(AGENT_KIND_ENV) or "art").strip().lower()
    if kind not in DEFAULT_AGENT_MODULES:
        raise SystemExit(f"{AGENT_KIND_ENV} must be one of {', '.join(DEFAULT_AGENT_MODULES)}, got {kind!r}")
    module = os.environ.get(AGENT_MODULE_ENV) or DEFAULT_AGENT_MODULES[kind]
    if kind == "rft":
        from rollout_pipeline.agent.rft_host import main as host_main

        host_main(["--agent-module", module, *args])
        return
    from rollout_pipeline.agent.usage import install

    install()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
