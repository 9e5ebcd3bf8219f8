"""Local mode's agent runtimes, by the endpoint URL of the local AWS they serve.

In AWS, anyone holding an experiment's runtime ARN and a client reaches its ACR runtime. In local mode the
"ACR" is a `LocalAgentRuntime` (or the fake) inside the `LocalPipeline`'s process, next to a moto server: the
pipeline registers it here under that server's URL for as long as it runs, so an SDK experiment in the same process
attached to that endpoint (the ART backend, `exp.batches.cancel`) stops sessions where they run. The pipeline's
own handlers never look here: they get their runtime explicitly (`wiring.Wiring.runtime`).
"""

from __future__ import annotations

import threading

from rollout_pipeline.ports import AgentRuntime

_lock = threading.Lock()
_by_endpoint: dict[str, AgentRuntime] = {}


def register_local_runtime(endpoint_url: str, runtime: AgentRuntime | None) -> None:
    """Serve `endpoint_url`'s agent sessions with `runtime` (None: unregister)."""
    with _lock:
        if runtime is None:
            _by_endpoint.pop(endpoint_url, None)
        else:
            _by_endpoint[endpoint_url] = runtime


def local_runtime(endpoint_url: str | None) -> AgentRuntime | None:
    """The runtime a local pipeline of this process registered for `endpoint_url`, or None."""
    if not endpoint_url:
        return None
    with _lock:
        return _by_endpoint.get(endpoint_url)
