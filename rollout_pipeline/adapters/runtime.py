"""Which `AgentRuntime` the handlers use: boto3's ACR client by default, another one when installed.

Lambda handlers call `agent_runtime(settings)`; local mode (and tests) call `install_agent_runtime(...)` first,
so the very same handler code talks to a local agent process (or the fake) instead of ACR.
"""

from __future__ import annotations

import threading

from rollout_pipeline.config import HandlerSettings
from rollout_pipeline.ports import AgentRuntime


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed: AgentRuntime | None = None
        self.default: AgentRuntime | None = None


_registry = _Registry()


def install_agent_runtime(runtime: AgentRuntime | None) -> None:
    """Use `runtime` for every handler in this process (None restores the ACR default)."""
    with _registry.lock:
        _registry.installed = runtime
        _registry.default = None


def installed_agent_runtime() -> AgentRuntime | None:
    """The runtime `install_agent_runtime` put in place in this process (local mode), or None (ACR)."""
    with _registry.lock:
        return _registry.installed


def agent_runtime(settings: HandlerSettings) -> AgentRuntime:
    """The installed runtime, or the boto3 ACR adapter for `settings.runtime_arn` (created once)."""
    with _registry.lock:
        if _registry.installed is not None:
            return _registry.installed
        if _registry.default is None:
            from rollout_pipeline.adapters.acr import AcrAgentRuntime

            _registry.default = AcrAgentRuntime(settings.runtime_arn, endpoints=settings.experiment.endpoints)
        return _registry.default
