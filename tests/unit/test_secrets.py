"""Long-lived credentials never travel with rollouts: rows and `_rollout` may not carry them, events redact them,
the agent gets its model key out of band."""

from __future__ import annotations

import json
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
