"""What the agent package's loopback HTTP servers share (the RFT front door, the fake model server): a threaded
server on 127.0.0.1 in a daemon thread, and a request handler that reads bodies and answers JSON."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Self

LOOPBACK: Final = "127.0.0.1"


class JsonRequestHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, silent access log; `read_body` (Content-Length or chunked) and `send_json`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: ARG002 - access logs are off by default
        return

    def read_body(self) -> bytes:
        """The request body, whole (a chunked body is de-chunked)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, payload: dict[str, Any]) -> None:
        """Answer `payload` as JSON; a client that went away before the answer is not an error of the server."""
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class LoopbackServer:
    """A `ThreadingHTTPServer` on 127.0.0.1 (`port` 0: any free one) served by a daemon thread once started; a
    context manager."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, port: int = 0, thread_name: str) -> None:
        self._server = ThreadingHTTPServer((LOOPBACK, port), handler)
        self._server.daemon_threads = True
        self._thread_name = thread_name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        """`http://127.0.0.1:<port>`."""
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, args=(0.1,), name=self._thread_name, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
