"""Lazily created, cached boto3 clients.

Handlers import this module, not boto3: the first call pays for `import boto3` (~180 ms) and the client, later
calls in the same container reuse them. `AWS_ENDPOINT_URL` (honoured by boto3 itself) points everything at a local
moto server in local mode.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

_lock = threading.Lock()


@cache
def _session() -> Any:
    import boto3

    return boto3.session.Session()


def client(service: str, **kwargs: Any) -> Any:
    """A cached boto3 client for `service` (thread-safe: boto3 clients may be shared across threads)."""
    key = (service, tuple(sorted(kwargs.items())))
    with _lock:
        cached = _clients.get(key)
        if cached is None:
            from botocore.config import Config

            config = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=50)
            cached = _session().client(service, config=config, **kwargs)
            _clients[key] = cached
        return cached


_clients: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}


def register_hook(event_name: str, handler: Any) -> None:
    """Register a botocore event handler (e.g. "before-call") on every cached client and on clients made later.

    Clients copy the session's event hooks when they are created, so both are needed.
    """
    with _lock:
        _session().events.register(event_name, handler)
        for cached in _clients.values():
            cached.meta.events.register(event_name, handler)


def reset() -> None:
    """Forget every cached client and the session (tests switch credentials and endpoints)."""
    with _lock:
        _clients.clear()
        _session.cache_clear()
