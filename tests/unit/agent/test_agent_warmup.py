"""The agent host's answer to the warm pool (`agent.warmup.WarmupGate`): a warm-up invocation is answered by the
host and never reaches the agent; every rollout, and anything else, passes through unchanged. No dataset row and
no message can mark a rollout as a warm-up."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from rollout_pipeline import ids
from rollout_pipeline.agent.app import RolloutApp
from rollout_pipeline.agent.warmup import MAX_WARMUP_BYTES, WarmupGate
from rollout_pipeline.config import WARMUP_KEY, ExperimentConfig, is_warmup_payload, warmup_payload
from rollout_pipeline.contracts import FileOptions, RolloutMessage, RowError, build_agent_payload, parse_row, utcnow

SESSION = "warm-" + "0" * 24 + "-" + "1" * 16
HEADER = {"X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": SESSION}


def _app(calls: list[dict[str, Any]]) -> RolloutApp:
    app = RolloutApp()

    @app.rollout_entrypoint
    def invoke(payload: dict[str, Any]) -> dict[str, Any]:
        calls.append(payload)
        return {"rewards": 1.0}

    return app


def test_a_warm_up_is_answered_by_the_host_and_never_reaches_the_agent() -> None:
    calls: list[dict[str, Any]] = []
    gate = WarmupGate(_app(calls))
    with TestClient(gate) as client:
        answer = client.post("/invocations", json=warmup_payload("exp", SESSION), headers=HEADER)
        assert answer.status_code == 200
        assert answer.json() == {"status": "warm", "session_id": SESSION}
        assert client.get("/ping").json()["status"] == "Healthy"  # nothing runs: the session stays idle
    assert calls == []
    assert gate.warmups == 1


def test_a_rollout_passes_through_unchanged() -> None:
    calls: list[dict[str, Any]] = []
    gated, plain = WarmupGate(_app(calls)), _app([])
    payload = {"question": "2+2?"}  # no result trio: ART saves nothing
    with TestClient(gated) as through, TestClient(plain) as direct:
        answer = through.post("/invocations", json=payload, headers=HEADER)
        expected = direct.post("/invocations", json=payload, headers=HEADER)
    assert (answer.status_code, answer.json().keys()) == (expected.status_code, expected.json().keys())
    assert answer.json()["status"] == "processing"
    assert gated.warmups == 0


def test_a_large_body_is_passed_through_without_being_read_as_a_warm_up() -> None:
    calls: list[dict[str, Any]] = []
    gate = WarmupGate(_app(calls))
    big = {"text": "x" * (MAX_WARMUP_BYTES * 4), **warmup_payload("exp", SESSION)}
    with TestClient(gate) as client:
        answer = client.post("/invocations", content=json.dumps(big), headers=HEADER)
    assert answer.json()["status"] == "processing"  # the agent got it (the host never parses a large body)
    assert gate.warmups == 0


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"_rollout": {"warmup": true}}', b""])
def test_anything_else_reaches_the_app(body: bytes) -> None:
    gate = WarmupGate(_app([]))
    with TestClient(gate, raise_server_exceptions=False) as client:
        client.post("/invocations", content=body, headers=HEADER)
    assert gate.warmups == 0


def test_no_dataset_row_can_mark_itself_a_warm_up() -> None:
    with pytest.raises(RowError, match=f"_rollout may not set {WARMUP_KEY}"):
        parse_row({"question": "q", "_rollout": {WARMUP_KEY: {"exp_id": "exp"}}}, 1)


def test_the_dispatcher_never_sends_a_warm_up_mark_a_message_carries() -> None:
    """A message sent to the rollout queue by other means than ingestion may carry any `_rollout`: the pipeline's own
    keys in it are dropped, so a rollout is never answered as a warm-up nor carries another attempt's token."""
    config = ExperimentConfig(name="exp")
    message = RolloutMessage(
        exp_id="exp",
        batch_id="batch-1",
        input_id="q1",
        index=0,
        attempt=1,
        group_size=1,
        submitted_at=utcnow(),
        payload={"question": "q"},
        rollout_overrides={WARMUP_KEY: {"exp_id": "exp"}, "attempt_token": "forged", "reward_mode": "strict"},
    )
    payload = build_agent_payload(
        row_payload={"question": "q"},
        rollout_overrides=message.rollout_overrides,
        message=message,
        options=FileOptions.defaults(config),
        config=config,
        results_bucket="results",
        attempt_token="real",
        session_id=SESSION,
    )
    assert not is_warmup_payload(payload)
    assert payload["_rollout"]["attempt_token"] == "real"
    assert payload["_rollout"]["reward_mode"] == "strict"
    assert payload["_rollout"]["session_id"] == SESSION


def test_warm_session_ids_are_never_read_as_an_attempts_and_name_their_experiment() -> None:
    warm = ids.warm_session_id("exp")
    assert ids.SESSION_ID_MIN <= len(warm) <= ids.SESSION_ID_MAX
    assert ids.is_warm_session_id(warm, "exp")
    assert not ids.is_warm_session_id(warm, "other")
    with pytest.raises(ids.InvalidId):
        ids.parse_result_key(f"exp/q1/{warm}.json")
    assert ids.parse_warm_result_key(f"exp/q1/{warm}.json").session_id == warm
    with pytest.raises(ids.InvalidId):
        ids.parse_warm_result_key(f"other/q1/{warm}.json")
    cold = ids.session_id("exp", "warm-batch", "q1", 0, 1)  # a batch named "warm-...": still an attempt's
    assert not ids.is_warm_session_id(cold)
    assert ids.parse_result_key(f"exp/q1/{cold}.json").batch_id == "warm-batch"
