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
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

#: The `_rollout` key (and a result's top-level key) carrying the token.
ATTEMPT_TOKEN_KEY: Final = "attempt_token"
#: How much of a result's end is read for its token when the result cannot be parsed (not JSON, or over
#: `result_max_bytes`): ART writes the request it received as the result's last key (`AgentCoreRLApp.save_result`,
#: agentcore-rl-toolkit 0.2.0: the user's keys, then `status_code`, `stop_reason`, `input_id`, `s3_bucket`,
#: `result_key`, `payload`, through `json.dumps(indent=2)`), and `_rollout`, with the token, is the request's last key.
TOKEN_TAIL_BYTES: Final = 64 * 1024
#: The token as JSON text (`"attempt_token": "<64 hex>"`, any spacing), found without parsing the object.
_TOKEN_TEXT: Final = re.compile(rb'"' + ATTEMPT_TOKEN_KEY.encode() + rb'"\s*:\s*"([0-9a-f]{64})"')
#: At most this many tokens found in text are compared (the last ones: ART's copy of the request comes last).
_MAX_TEXT_TOKENS: Final = 8


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


def text_carries_attempt_token(texts: Iterable[bytes], key: bytes, exp_id: str, session_id: str) -> bool:
    """Whether raw bytes of a result that cannot be parsed (not JSON, or too large to read whole: its first bytes
    and its tail, `TOKEN_TAIL_BYTES`) carry the token of this attempt as JSON text."""
    expected = attempt_token(key, exp_id, session_id)
    for text in texts:
        found = [match.group(1).decode() for match in _TOKEN_TEXT.finditer(text)][-_MAX_TEXT_TOKENS:]
        if any(hmac.compare_digest(token, expected) for token in found):
            return True
    return False
