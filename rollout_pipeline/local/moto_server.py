"""A moto server on loopback holding the experiment's AWS resources for local mode."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOOPBACK = "127.0.0.1"
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_SESSION_TOKEN": "local",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def local_aws_environ(endpoint_url: str, region: str) -> dict[str, str]:
    """Environment that points boto3 (in this process or a child) at the local moto server."""
    return {
        **LOCAL_CREDENTIALS,
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
    }


@contextmanager
def moto_server(port: int | None = None) -> Iterator[str]:
    """Start `moto.server.ThreadedMotoServer` on 127.0.0.1; yield its endpoint URL; stop it on exit."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per AWS call otherwise
    server: Any = ThreadedMotoServer(ip_address=LOOPBACK, port=port or free_port(), verbose=False)
    server.start()
    try:
        host, bound_port = server.get_host_and_port()
        yield f"http://{host}:{bound_port}"
    finally:
        server.stop()


@contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, restoring the previous values after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
