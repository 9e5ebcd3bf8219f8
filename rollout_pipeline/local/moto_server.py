"""A moto server on loopback holding the experiment's AWS resources for local mode."""

from __future__ import annotations

import copy
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


class _TablesNotCopied:
    """Stands in for the `copy` module inside moto's DynamoDB models: deep copies of anything but a whole table."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        from moto.dynamodb.models.table import Table

        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


_patch_lock = threading.Lock()


def cheap_moto_transactions() -> None:
    """Make moto's TransactWriteItems cost O(items in the transaction), not O(table size); keep it atomic.

    moto deep-copies every table a transaction names, for every item, to restore them if the transaction fails:
    local mode slowed down with every rollout it recorded. Instead, snapshot only the items the transaction touches
    and put exactly those back when it fails (conditions, validation errors, anything), so a cancelled transaction
    still changes nothing; moto's own implementation does the rest (its cancellation reasons included).
    Idempotent; applies to in-process moto and to the moto server of this process.
    """
    from moto.dynamodb import models
    from moto.dynamodb.models.dynamo_type import DynamoType

    with _patch_lock:
        if getattr(models.DynamoDBBackend.transact_write_items, "rollouts_patched", False):
            return

        original = models.DynamoDBBackend.transact_write_items

        def transact(self: Any, transact_items: list[dict[str, Any]]) -> None:
            snapshot: list[tuple[Any, Any, Any, Any]] = []
            for entry in transact_items[:100]:
                op_type, op = next(iter(entry.items()))
                table = self.tables.get(op.get("TableName"))
                key = op.get("Item") if op_type == "Put" else op.get("Key")
                if table is None or not key or table.hash_key_attr not in key:
                    continue
                hash_value = DynamoType(key[table.hash_key_attr])
                range_attr = table.range_key_attr
                range_value = DynamoType(key[range_attr]) if range_attr and range_attr in key else None
                if range_attr and range_value is None:
                    continue
                current = table.get_item(hash_value, range_value)
                snapshot.append((table, hash_value, range_value, copy.deepcopy(current)))
            try:
                original(self, transact_items)
            except BaseException:
                for table, hash_value, range_value, old in reversed(snapshot):
                    _restore(table, hash_value, range_value, old)
                raise

        transact.rollouts_patched = True  # type: ignore[attr-defined]
        models.copy = _TablesNotCopied  # type: ignore[assignment,attr-defined]
        models.DynamoDBBackend.transact_write_items = transact  # type: ignore[method-assign]


def _restore(table: Any, hash_value: Any, range_value: Any, old: Any) -> None:
    """Put one item of a moto table back as it was (`old` None: the item did not exist)."""
    if range_value is None:
        if old is None:
            table.items.pop(hash_value, None)
        else:
            table.items[hash_value] = old
        return
    if old is None:
        if hash_value in table.items:
            table.items[hash_value].pop(range_value, None)
    else:
        table.items[hash_value][range_value] = old


@contextmanager
def moto_server(port: int | None = None) -> Iterator[str]:
    """Start a moto server on 127.0.0.1 (threaded, DynamoDB serialised); yield its endpoint URL; stop it on exit."""
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per AWS call otherwise
    cheap_moto_transactions()
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
