"""Identifiers and the key scheme.

Every id that reaches an S3 key, a DynamoDB key or an ACR session id is validated here. Session ids are
deterministic per rollout attempt and can be parsed back (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
import zlib
from dataclasses import dataclass
from typing import Final

EXP_ID_RE: Final = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
BATCH_ID_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
INPUT_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+@:-]{0,127}$")
SESSION_ID_MIN: Final = 33
SESSION_ID_MAX: Final = 256
_SESSION_HASH_LEN: Final = 16
_SLUG_RE: Final = re.compile(r"[^a-z0-9]+")
#: Characters an S3 event's object key may carry either URL-encoded or not (`+` is also an encoded space, `%`
#: starts an escape): refused in new input ids and dataset keys, so a key reads the same whether or not the event
#: encoded it.
EVENT_AMBIGUOUS_CHARS: Final = {"+": "'+'", "%": "'%'", " ": "a space"}

#: Namespace of every `event_id` (uuid5). Never change it: consumers de-duplicate on these ids.
EVENT_NAMESPACE: Final = uuid.UUID("6f1c2d52-4b1e-5a8e-9d0a-3c7b1e2f9a41")


class InvalidId(ValueError):
    """An identifier is not safe to use; the message says which one and why."""


def validate_exp_id(value: str) -> str:
    if not isinstance(value, str) or not EXP_ID_RE.fullmatch(value):
        raise InvalidId(f"exp_id {value!r} must match {EXP_ID_RE.pattern}")
    return value


def validate_batch_id(value: str) -> str:
    if not isinstance(value, str) or not BATCH_ID_RE.fullmatch(value):
        raise InvalidId(f"batch_id {value!r} must match {BATCH_ID_RE.pattern}")
    return value


def validate_input_id(value: object, *, accept_plus: bool = False) -> str:
    """Accept a string or an integer id; return it as a string safe for S3 keys and ledger keys.
    A `+` is refused in new ids (see `EVENT_AMBIGUOUS_CHARS`); `accept_plus` for ids read back from messages and
    result keys, which may have been accepted before."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidId(f"id must be a string or an integer, got {type(value).__name__}")
    text = str(value)
    if not INPUT_ID_RE.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidId(
            f"id {shown!r} is not safe in an S3 key: use 1-128 characters from letters, digits and ._=@:- "
            "starting with a letter or digit"
        )
    if ".." in text:
        raise InvalidId(f"id {text!r} must not contain '..'")
    if not accept_plus and "+" in text:
        raise InvalidId(
            f"id {text!r} must not contain '+': S3 event notifications may carry a key's '+' as it is or encoded, "
            "and an encoded space is a '+' too"
        )
    return text


def validate_dataset_key(key: str) -> str:
    """A dataset object key whose S3 events read the same whether or not they URL-encode it: no `+`, `%` or
    space (`InvalidId` names the key and the characters)."""
    found = [name for char, name in EVENT_AMBIGUOUS_CHARS.items() if char in key]
    if found:
        raise InvalidId(
            f"dataset key {key!r} contains {', '.join(found)}: S3 event notifications may carry such a key "
            "URL-encoded or not, so it cannot be read back reliably; rename the file (letters, digits, . _ - = @ :)"
        )
    return key


def derived_input_id(position: int) -> str:
    """The input id of a row without `id`: its 1-based line (or array position)."""
    return f"line-{position}"


def slug(text: str, max_len: int = 24) -> str:
    """Lower-case letters, digits and single hyphens; never empty."""
    cleaned = _SLUG_RE.sub("-", text.lower()).strip("-")[:max_len].strip("-")
    return cleaned or "batch"


def _digest(*parts: object, length: int) -> str:
    return hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()[:length]


def batch_id_for_upload(bucket: str, key: str, version_id: str | None, etag: str | None = None) -> str:
    """Deterministic batch id of one upload: the same upload (any number of events) -> the same id.

    The input bucket is versioned, so a re-upload of the same key gets a new version id and a new batch.
    `etag` is only a fallback for unversioned buckets.
    """
    stem = key.rsplit("/", 1)[-1].split(".", 1)[0]
    # With a version id the etag is ignored: S3 events spell it differently (moto: `eTag`), the uploader sees it
    # quoted, and the version id alone already identifies the upload.
    fallback = "" if version_id else (etag or "")
    return f"{slug(stem)}-{_digest(bucket, key, version_id or '', fallback, length=12)}"


def new_batch_id(name: str = "sdk") -> str:
    """A fresh batch id for an SDK submission."""
    return f"{slug(name)}-{secrets.token_hex(6)}"


def rollout_id(input_id: str, index: int) -> str:
    return f"{input_id}#{index}"


def session_id(exp_id: str, batch_id: str, input_id: str, index: int, attempt: int) -> str:
    """The ACR runtimeSessionId of one rollout attempt: deterministic, 33..256 chars of [a-z0-9-]."""
    if index < 0 or attempt < 1:
        raise InvalidId(f"index must be >= 0 and attempt >= 1, got index={index} attempt={attempt}")
    prefix = f"{batch_id}-{index}-{attempt}-"
    # A short batch id gets a longer hash so the id still reaches ACR's minimum length (same id otherwise).
    length = max(_SESSION_HASH_LEN, SESSION_ID_MIN - len(prefix))
    value = prefix + _digest(exp_id, batch_id, input_id, index, attempt, length=length)
    if not SESSION_ID_MIN <= len(value) <= SESSION_ID_MAX:  # pragma: no cover - guaranteed by the id patterns
        raise InvalidId(f"session id length {len(value)} outside {SESSION_ID_MIN}..{SESSION_ID_MAX}")
    return value


#: A warm session's id: `warm-{nonce}-{h}`, `h = sha256(exp/warm/nonce)[:16]`. Three dash-separated parts where an
#: attempt's session id has at least four (`session_id`), so neither is ever read as the other.
WARM_PREFIX: Final = "warm"
_WARM_NONCE_LEN: Final = 24


def warm_session_id(exp_id: str, nonce: str | None = None) -> str:
    """A new warm session id of experiment `exp_id` (started ahead of its rollout by the warm pool): 46 chars of
    [a-z0-9-], the experiment bound into its hash; `nonce` (24 hex) for a given one."""
    nonce = nonce or secrets.token_hex(_WARM_NONCE_LEN // 2)
    return f"{WARM_PREFIX}-{nonce}-{_digest(exp_id, WARM_PREFIX, nonce, length=_SESSION_HASH_LEN)}"


def is_warm_session_id(value: str, exp_id: str | None = None) -> bool:
    """Whether `value` is a warm session id (of experiment `exp_id`, when given: its hash is checked)."""
    parts = value.split("-")
    if len(parts) != 3 or parts[0] != WARM_PREFIX or len(parts[1]) != _WARM_NONCE_LEN:
        return False
    if exp_id is None:
        return len(parts[2]) == _SESSION_HASH_LEN
    return warm_session_id(exp_id, parts[1]) == value


@dataclass(frozen=True, slots=True)
class WarmResultKey:
    """A result key whose session is a warm session: the experiment, input and session it names. Which attempt
    ran in the session is the ledger's to say (`lifecycle.completion`)."""

    exp_id: str
    input_id: str
    session_id: str


def parse_warm_result_key(key: str) -> WarmResultKey:
    """`{exp_id}/{input_id}/{warm session id}.json`, or `InvalidId` saying why it is not one."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].endswith(".json"):
        raise InvalidId(f"result key {key!r} is not of the form exp_id/input_id/session_id.json")
    exp_id, input_id, file_name = parts
    validate_exp_id(exp_id)
    validate_input_id(input_id, accept_plus=True)
    sid = file_name[: -len(".json")]
    if not is_warm_session_id(sid, exp_id):
        raise InvalidId(f"session id {sid!r} in {key!r} is not a warm session of experiment {exp_id!r}")
    return WarmResultKey(exp_id=exp_id, input_id=input_id, session_id=sid)


def session_attempt(session_id_: str) -> int | None:
    """The attempt a session id of ours names (`session_id`: `{batch}-{index}-{attempt}-{hash}`), else None."""
    pieces = session_id_.rsplit("-", 3)
    if len(pieces) != 4 or not pieces[1].isdigit() or not pieces[2].isdigit():
        return None
    attempt = int(pieces[2])
    return attempt if attempt >= 1 else None


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """One attempt of one rollout, by value: the key of every rollout transition in the ledger. Attempt 0 names a
    rollout that has no attempt yet (cancelled before its first dispatch)."""

    batch_id: str
    input_id: str
    index: int
    attempt: int

    @property
    def rollout_id(self) -> str:
        return rollout_id(self.input_id, self.index)


@dataclass(frozen=True, slots=True)
class ResultRef(AttemptRef):
    """The attempt a result object belongs to, with the experiment and session its key names."""

    exp_id: str
    session_id: str


def result_key(exp_id: str, input_id: str, session_id_: str) -> str:
    """ART's result key."""
    return f"{exp_id}/{input_id}/{session_id_}.json"


def parse_result_key(key: str) -> ResultRef:
    """Map a result object key back to its rollout attempt, or raise `InvalidId` saying why it is not ours."""
    parts = key.split("/")
    if len(parts) != 3 or not parts[2].endswith(".json"):
        raise InvalidId(f"result key {key!r} is not of the form exp_id/input_id/session_id.json")
    exp_id, input_id, file_name = parts
    validate_exp_id(exp_id)
    validate_input_id(input_id, accept_plus=True)
    sid = file_name[: -len(".json")]
    pieces = sid.rsplit("-", 3)
    if len(pieces) != 4 or not pieces[1].isdigit() or not pieces[2].isdigit():
        raise InvalidId(f"session id {sid!r} in {key!r} is not one of ours")
    batch_id, index_text, attempt_text, _digest_text = pieces
    validate_batch_id(batch_id)
    index, attempt = int(index_text), int(attempt_text)
    if attempt < 1 or session_id(exp_id, batch_id, input_id, index, attempt) != sid:
        raise InvalidId(f"session id {sid!r} does not belong to input {input_id!r} of experiment {exp_id!r}")
    return ResultRef(batch_id=batch_id, input_id=input_id, index=index, attempt=attempt, exp_id=exp_id, session_id=sid)


def event_id(detail_type: str, exp_id: str, batch_id: str, input_id: str = "", index: int | None = None) -> str:
    """Stable id of an event: the same logical event always gets the same id, whoever publishes it."""
    name = f"{detail_type}|{exp_id}|{batch_id}|{input_id}|{'' if index is None else index}"
    return str(uuid.uuid5(EVENT_NAMESPACE, name))


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key); `InvalidId` for anything else."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not key:
        raise InvalidId(f"not an s3:// URI: {uri!r}")
    return bucket, key


#: Claim checks (payloads too large to travel inline) live under this prefix of the input bucket.
CLAIMS_PREFIX: Final = "claims/"


def claim_key(batch_id: str, input_id: str) -> str:
    """Key (in the input bucket) of a payload too large to travel inline."""
    return f"{CLAIMS_PREFIX}{batch_id}/{input_id}.json"


def errors_key(dataset_key: str) -> str:
    """Key of the errors object written next to a dataset (its suffix is never ingested)."""
    return f"{dataset_key}.errors.ndjson"


#: ACR's endpoint an unqualified InvokeAgentRuntime targets; endpoints 1..N-1 are `rollouts_{i}`.
DEFAULT_ENDPOINT_NAME: Final = "DEFAULT"
#: Local mode's runtime ARN ends with this (a real runtime id is `{name}-{10 characters}`, names have no hyphen).
LOCAL_RUNTIME_SUFFIX: Final = "-local"


def runtime_region(runtime_arn: str) -> str | None:
    """The region an AgentCore runtime ARN names (`arn:aws:bedrock-agentcore:REGION:...`), else None."""
    parts = runtime_arn.split(":")
    return parts[3] if len(parts) > 4 and parts[0] == "arn" and parts[3] else None


def is_local_runtime(runtime_arn: str) -> bool:
    """Whether the runtime ARN is local mode's stand-in (`LOCAL_RUNTIME_SUFFIX`)."""
    return runtime_arn.endswith(LOCAL_RUNTIME_SUFFIX)


def endpoint_index(session_id: str, endpoints: int) -> int:
    """The runtime endpoint (0..endpoints-1) a session is opened on: a hash of its id, so the session's grant,
    its invokes and its stop all follow the same endpoint without storing it anywhere."""
    if endpoints <= 1:
        return 0
    return zlib.crc32(session_id.encode()) % endpoints


def endpoint_name(index: int) -> str:
    """The ACR qualifier (endpoint name) of endpoint `index`."""
    return DEFAULT_ENDPOINT_NAME if index == 0 else f"rollouts_{index}"
