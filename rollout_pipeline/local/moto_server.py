"""A moto server on loopback holding the experiment's AWS resources for local mode."""

from __future__ import annotations

import os
import socket
import threading
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


class SerializedDynamoDB:
    """WSGI middleware running DynamoDB requests one at a time.

    moto's TransactWriteItems snapshots every table and restores the snapshot when a condition fails, so a failing
    transaction running concurrently with another request undoes that request's writes. Real DynamoDB never does;
    serialising DynamoDB calls restores its atomicity. Other services stay concurrent (SQS long polls must not
    hold a lock).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if str(environ.get("HTTP_X_AMZ_TARGET", "")).startswith("DynamoDB"):
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


@contextmanager
def moto_server(port: int | None = None) -> Iterator[str]:
    """Start a moto server on 127.0.0.1 (threaded, DynamoDB serialised); yield its endpoint URL; stop it on exit."""
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per AWS call otherwise
    app = SerializedDynamoDB(DomainDispatcherApplication(create_backend_app))
    server = make_server(LOOPBACK, port or free_port(), app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto-server", daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)


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
