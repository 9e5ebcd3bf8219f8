"""Long-lived credentials never travel with rollouts: rows and `_rollout` may not carry them, events redact them,
the agent gets its model key out of band."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_pipeline.agent import credentials
from rollout_pipeline.config import MODEL_SECRET_ENV
from rollout_pipeline.contracts import REDACTED, RowError, parse_row, redact_secrets


@pytest.mark.parametrize(
    "row",
    [
        {"id": "a", "api_key": "sk-live"},
        {"id": "a", "prompt": "p", "_rollout": {"api_key": "sk-live"}},
        {"id": "a", "_rollout": {"OPENAI_API_KEY": "sk-live"}},
        {"id": "a", "Api-Key": "sk-live"},
    ],
)
def test_rows_carrying_a_credential_are_rejected_with_a_clear_error(row: dict[str, Any]) -> None:
    with pytest.raises(RowError) as caught:
        parse_row(json.dumps(row), 1)
    assert caught.value.reason == "secret_field"
    assert "credentials" in str(caught.value)
    assert "sk-live" not in str(caught.value)


def test_rows_without_credentials_still_pass() -> None:
    row = parse_row(json.dumps({"id": "a", "prompt": "p", "_rollout": {"temperature_hint": 1}}), 1)
    assert row.payload == {"prompt": "p"}


def test_a_per_rollout_capture_key_travels_and_reaches_the_agent_as_its_api_key() -> None:
    """ART's gateway keys each rollout's tokens by ART's per-rollout session id, sent as the api key: an id, not a
    credential. It travels as `_rollout.capture_key` and the agent payload carries it where ART agents read it."""
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.contracts import FileOptions, RolloutMessage, build_agent_payload

    sid = "3f2b9a8e-7c41-4d2a-9a55-0c3e1f6b2d10"
    row = parse_row(json.dumps({"id": "g", "q": "1+1", "_rollout": {"capture_key": sid}}), 1)
    config = ExperimentConfig(name="exp")
    message = RolloutMessage(
        exp_id="exp",
        batch_id="b-1",
        input_id="g",
        index=0,
        attempt=1,
        group_size=1,
        submitted_at=datetime.now(UTC),
        payload=row.payload,
    )
    payload = build_agent_payload(
        row_payload=row.payload,
        rollout_overrides=row.rollout_overrides,
        message=message,
        options=FileOptions.defaults(config),
        config=config,
        results_bucket="results",
    )
    assert payload["_rollout"]["api_key"] == sid
    assert "capture_key" not in payload["_rollout"]


@pytest.mark.parametrize("key", ["", "sk live with spaces", "x" * 300, 12345, "-leading-dash"])
def test_a_capture_key_that_is_not_an_id_is_rejected(key: object) -> None:
    with pytest.raises(RowError) as caught:
        parse_row(json.dumps({"id": "a", "_rollout": {"capture_key": key}}), 1)
    assert caught.value.reason == "invalid_rollout"
    assert "capture_key" in str(caught.value)


def test_redaction_reaches_every_depth_and_keeps_the_rest() -> None:
    body = {
        "rewards": 1.0,
        "api_key": "x",
        "payload": {"_rollout": {"api_key": "y", "exp_id": "e"}},
        "l": [{"password": "p"}],
    }
    assert redact_secrets(body) == {
        "rewards": 1.0,
        "api_key": REDACTED,
        "payload": {"_rollout": {"api_key": REDACTED, "exp_id": "e"}},
        "l": [{"password": REDACTED}],
    }


class _Secrets:
    def __init__(self, value: str) -> None:
        self.value = value
        self.asked: list[str] = []

    def get_secret_value(self, SecretId: str) -> dict[str, str]:
        self.asked.append(SecretId)
        return {"SecretString": self.value}


@pytest.mark.parametrize("stored", ["sk-plain", json.dumps({"api_key": "sk-plain"})])
def test_the_agent_reads_its_model_key_from_the_named_secret_at_start(
    monkeypatch: pytest.MonkeyPatch, stored: str
) -> None:
    monkeypatch.setenv(MODEL_SECRET_ENV, "rollouts/model-key")
    # setenv first so monkeypatch restores the variable's absence: the code under test sets it in os.environ.
    monkeypatch.setenv(credentials.API_KEY_ENV, "")
    monkeypatch.delenv(credentials.API_KEY_ENV)
    client = _Secrets(stored)
    assert credentials.load_model_credential(client)
    assert client.asked == ["rollouts/model-key"]
    import os

    assert os.environ[credentials.API_KEY_ENV] == "sk-plain"


def test_a_key_in_the_environment_wins_and_no_secret_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MODEL_SECRET_ENV, "rollouts/model-key")
    monkeypatch.setenv(credentials.API_KEY_ENV, "local-key")
    client = _Secrets("unused")
    assert not credentials.load_model_credential(client)
    assert client.asked == []
