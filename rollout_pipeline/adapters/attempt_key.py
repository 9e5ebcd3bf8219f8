"""The stack's attempt-token key (`contracts.attempts`), read from Secrets Manager once per container.

The stack generates the secret and gives its ARN (`topology.ATTEMPT_KEY_ENV`) and read access only to the
functions that issue or check tokens; the value is read on first use (the first invoke or result), not at import.
"""

from __future__ import annotations

import threading
from typing import Any


class SecretAttemptKey:
    """A zero-argument callable returning the key: GetSecretValue of `secret_id` on the first call, then cached."""

    def __init__(self, secret_id: str, secretsmanager: Any) -> None:
        self.secret_id = secret_id
        self._client = secretsmanager
        self._lock = threading.Lock()
        self._key: bytes | None = None

    def __call__(self) -> bytes:
        with self._lock:
            if self._key is None:
                resp = self._client.get_secret_value(SecretId=self.secret_id)
                value = resp.get("SecretString")
                key = value.encode() if isinstance(value, str) else bytes(resp.get("SecretBinary") or b"")
                if len(key) < 16:
                    raise ValueError(f"secret {self.secret_id} holds no usable attempt key ({len(key)} bytes)")
                self._key = key
            return self._key
