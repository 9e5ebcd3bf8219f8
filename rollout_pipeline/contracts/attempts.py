"""The attempt token: proof that a result object was written by the session dispatched for its attempt.

The dispatcher puts `_rollout.attempt_token` = HMAC-SHA256(key, "{exp_id}/{session_id}") (hex) into every agent
request; the key is the stack's (a generated Secrets Manager secret that only the dispatcher, completion and
sweeper functions may read; local mode makes a random one) and never reaches a model or a trainer credential.
A result counts only if it carries the token of the attempt its key names: where ART puts it, inside the copy of
the whole request it writes into every result (`payload._rollout.attempt_token`), or at the top level
(`attempt_token`) for an agent that writes its result itself. The session id names the attempt (a new one per
retry), so a token is good for one attempt of one rollout: an agent that knows its own token cannot make another's.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

#: The `_rollout` key (and a result's top-level key) carrying the token.
ATTEMPT_TOKEN_KEY: Final = "attempt_token"


def attempt_token(key: bytes, exp_id: str, session_id: str) -> str:
    """The token of the attempt whose session is `session_id` (hex HMAC-SHA256 under the stack's key)."""
    return hmac.new(key, f"{exp_id}/{session_id}".encode(), hashlib.sha256).hexdigest()


def result_attempt_token(body: Mapping[str, Any] | None) -> str | None:
    """The token a result object carries: `payload._rollout.attempt_token` (ART's copy of the request), else a
    top-level `attempt_token`; None when it carries none."""
    if not isinstance(body, Mapping):
        return None
    payload = body.get("payload")
    rollout = payload.get("_rollout") if isinstance(payload, Mapping) else None
    found = rollout.get(ATTEMPT_TOKEN_KEY) if isinstance(rollout, Mapping) else None
    if found is None:
        found = body.get(ATTEMPT_TOKEN_KEY)
    return found if isinstance(found, str) else None


def carries_attempt_token(body: Mapping[str, Any] | None, key: bytes, exp_id: str, session_id: str) -> bool:
    """Whether a result body carries the token of this attempt (compared in constant time)."""
    found = result_attempt_token(body)
    return found is not None and hmac.compare_digest(found, attempt_token(key, exp_id, session_id))
