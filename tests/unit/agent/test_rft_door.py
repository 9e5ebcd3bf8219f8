"""The RFT front door on loopback: feedback recorded per trajectory (first terminal report wins), model calls passed
through with the AWS bearer dropped, `model` rewritten and streamed answers relayed byte for byte as they arrive."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rollout_pipeline.agent.context import RolloutContext
from rollout_pipeline.agent.rft_door import FrontDoor, forwarded_headers, rewrite_model
from rollout_pipeline.agent.testing import FakeModelServer

JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft"
TOKEN = "Bearer sagemaker-api-key-QVdTIGNyZWRlbnRpYWw="
WAIT_S = 10.0


def _ctx(base_url: str, session: str = "s-1", **extra: Any) -> RolloutContext:
    return RolloutContext.from_payload(
        {"_rollout": {"session_id": session, "base_url": base_url, "model_id": "policy-7", **extra}}
    )


def _request(
    door: FrontDoor, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", door.port, timeout=WAIT_S)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    connection.request(method, path, body=data, headers={"Authorization": TOKEN, **(headers or {})})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, payload


@pytest.fixture
def door() -> Iterator[FrontDoor]:
    with FrontDoor() as front:
        yield front


# --- feedback --------------------------------------------------------------------------------------------------------


def test_feedback_is_recorded_and_the_first_terminal_report_wins(door: FrontDoor) -> None:
    record = door.register("s-1", _ctx("http://127.0.0.1:9/v1"), JOB)
    ids = {"JobArn": JOB, "TrajectoryId": "s-1"}

    assert _request(door, "POST", "/complete-rollout", {**ids, "Status": "ready"})[0] == 200
    assert _request(door, "POST", "/update-reward", {**ids, "Rewards": [0.0, 1.0]})[0] == 200
    assert _request(door, "POST", "/complete-rollout", {**ids, "Status": "ready"})[0] == 200, "a repeat is fine"
    status, body = _request(door, "POST", "/complete-rollout", {**ids, "Status": "failed"})
    assert status == 409
    assert b"Cannot transition trajectory" in body
    assert _request(door, "POST", "/update-reward", {**ids, "Rewards": [0.0]})[0] == 409

    assert record.status == "ready"
    assert record.rewards == [0.0, 1.0]
    assert len(record.ignored_reports) == 2


def test_feedback_on_the_rollouts_own_path_and_its_checks(door: FrontDoor) -> None:
    record = door.register("s/odd id", _ctx("http://127.0.0.1:9/v1"), JOB)
    endpoint = door.endpoint_for("s/odd id").removeprefix(door.root_url)

    assert _request(door, "POST", endpoint + "/update-reward", {"Rewards": [1]})[0] == 200
    assert record.rewards == [1.0]
    assert (
        _request(door, "POST", endpoint + "/complete-rollout", {"TrajectoryId": "other", "Status": "ready"})[0] == 400
    )
    assert _request(door, "POST", endpoint + "/complete-rollout", {"Status": "done"})[0] == 400
    for bad in ([], [float("nan")], ["1"], [True], 1.0):
        assert _request(door, "POST", endpoint + "/update-reward", {"Rewards": bad})[0] == 400, bad
    assert record.status is None


def test_an_unknown_trajectory_is_404_which_the_sdk_ignores(door: FrontDoor) -> None:
    assert _request(door, "POST", "/complete-rollout", {"TrajectoryId": "gone", "Status": "ready"})[0] == 404
    door.register("a", _ctx("http://127.0.0.1:9/v1", "a"), JOB)
    door.unregister("a")
    assert _request(door, "POST", "/rollouts/a/update-reward", {"Rewards": [1.0]})[0] == 404


# --- model calls -----------------------------------------------------------------------------------------------------


def test_a_model_call_loses_the_aws_bearer_and_gets_our_key_and_model(
    door: FrontDoor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "model-key")
    with FakeModelServer("42") as model:
        door.register("s-1", _ctx(model.base_url), JOB)
        status, body = _request(
            door,
            "POST",
            "/rollouts/s-1/v1/chat/completions",
            {"model": "default", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Api-Key": "sagemaker-api-key-abc", "X-Amzn-SageMaker-Trajectory-Id": "s-1", "X-Other": "kept"},
        )
        (call,) = model.requests
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "42"
    assert call.body["model"] == "policy-7"
    assert call.header("Authorization") == "Bearer model-key"
    assert call.header("X-Api-Key") is None
    assert "sagemaker-api-key" not in json.dumps(call.headers)
    assert call.header("X-Other") == "kept"
    assert call.path == "/v1/chat/completions"
    assert door.record_of("s-1") is not None
    assert door.record_of("s-1").model_calls == 1  # type: ignore[union-attr]


def test_the_root_finds_the_rollout_by_header_or_as_the_only_one(door: FrontDoor) -> None:
    with FakeModelServer("42") as model:
        door.register("s-1", _ctx(model.base_url), JOB)
        assert _request(door, "POST", "/v1/chat/completions", {"messages": []})[0] == 200
        door.register("s-2", _ctx(model.base_url, "s-2"), JOB)
        assert _request(door, "POST", "/v1/chat/completions", {"messages": []})[0] == 404, "ambiguous"
        headers = {"X-Amzn-SageMaker-Trajectory-Id": "s-2"}
        assert _request(door, "POST", "/v1/chat/completions", {"messages": []}, headers)[0] == 200
        assert _request(door, "GET", "/v1/models", headers=headers)[0] == 200


def test_token_capture_styles_apply_to_the_passed_through_call(door: FrontDoor) -> None:
    with FakeModelServer("42") as model:
        door.register("s-1", _ctx(model.root_url, token_capture="rllm-path"), JOB)
        assert _request(door, "POST", "/rollouts/s-1/v1/chat/completions", {"messages": []})[0] == 200
        assert model.requests[-1].path == "/sessions/s-1/v1/chat/completions"


def test_an_unreachable_model_is_502(door: FrontDoor) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    door.register("s-1", _ctx(f"http://127.0.0.1:{port}/v1"), JOB)
    assert _request(door, "POST", "/rollouts/s-1/v1/chat/completions", {"messages": []})[0] == 502


class _GatedStream:
    """An upstream that streams fixed SSE bytes, holding the last chunk until the test releases it."""

    CHUNKS = (b'data: {"n": 1}\n\n', b'data: {"n": 2, "text": "\\u00e9"}\n\n', b"data: [DONE]\n\n")

    def __init__(self, chunked: bool) -> None:
        self.release = threading.Event()
        gate, chunks = self.release, self.CHUNKS

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if chunked else "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for index, chunk in enumerate(chunks):
                    if index == len(chunks) - 1:
                        gate.wait(WAIT_S)
                    self.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    self.wfile.flush()
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> _GatedStream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
def test_a_stream_is_relayed_byte_for_byte_as_it_arrives(door: FrontDoor, chunked: bool) -> None:
    with _GatedStream(chunked) as upstream:
        door.register("s-1", _ctx(upstream.base_url), JOB)
        connection = http.client.HTTPConnection("127.0.0.1", door.port, timeout=WAIT_S)
        connection.request("POST", "/rollouts/s-1/v1/chat/completions", body=b'{"stream": true}')
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type") == "text/event-stream"
        early = b""
        while len(early) < len(_GatedStream.CHUNKS[0]) + len(_GatedStream.CHUNKS[1]):
            piece = response.read1(1024)
            assert piece, "the stream ended before the held chunk was released"
            early += piece
        # The first two chunks arrived while the upstream still holds the last one: nothing is buffered (a
        # buffering door would deliver nothing until the upstream gives up waiting and ends, then all three).
        assert early == _GatedStream.CHUNKS[0] + _GatedStream.CHUNKS[1]
        assert not upstream.release.is_set()
        upstream.release.set()
        rest = response.read()
        connection.close()
    assert early + rest == b"".join(_GatedStream.CHUNKS)


# --- the pieces ------------------------------------------------------------------------------------------------------


def test_forwarded_headers_drop_every_carrier_of_the_sdk_token() -> None:
    headers = forwarded_headers(
        [
            ("authorization", TOKEN),
            ("X-Token", "x sagemaker-api-key-abc"),
            ("Connection", "keep-alive"),
            ("Content-Length", "3"),
            ("Accept", "application/json"),
            ("x-rllm-session-id", "old"),
        ],
        {"X-RLLM-Session-Id": "s-1"},
        "k",
    )
    assert headers == {"Accept": "application/json", "Authorization": "Bearer k", "X-RLLM-Session-Id": "s-1"}


def test_model_rewrite_touches_json_objects_only() -> None:
    assert json.loads(rewrite_model(b'{"model": "default", "x": 1}', "p")) == {"model": "p", "x": 1}
    assert rewrite_model(b"[1]", "p") == b"[1]"
    assert rewrite_model(b"not json", "p") == b"not json"
    assert rewrite_model(b'{"model": "default"}', None) == b'{"model": "default"}'
