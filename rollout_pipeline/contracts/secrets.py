"""The secrets rule (every audience): long-lived credentials never travel in rows, payloads, the ledger, queues,
result objects or events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: Field names of long-lived credentials. They never travel in rows, `_rollout`, the ledger, queues, result objects
#: or events: the agent gets its model credential out of band (`ExperimentConfig.model_secret_name`, read by the
#: agent at start; local mode: the agent's environment). Values under these names are redacted from anything the
#: pipeline inlines into events (`redact_secrets`).
SECRET_FIELDS: Final = frozenset(
    {"api_key", "apikey", "openai_api_key", "aws_secret_access_key", "secret_access_key", "password", "client_secret"}
)
REDACTED: Final = "[redacted]"


def is_secret_field(name: str) -> bool:
    """True for a field name that holds a long-lived credential (case and `-`/`_` insensitive)."""
    return name.lower().replace("-", "_") in SECRET_FIELDS


def redact_secrets(value: Any) -> Any:
    """A copy of `value` with the values of every secret field (at any depth) replaced by `REDACTED`."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_field(str(k)) else redact_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(v) for v in value]
    return value
