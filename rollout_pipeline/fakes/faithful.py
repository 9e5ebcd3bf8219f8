"""The faithful AWS profile: make moto answer the way real AWS does where moto does not (tests and local mode).

Switched on with `activate(FaithfulProfile(...))` (a context manager), `aws_profile="faithful"` in local mode, or
`ROLLOUTS_AWS_PROFILE=faithful`. It sits at the boto3 boundary as botocore event handlers registered on every
session created in this process (`botocore.handlers.BUILTIN_HANDLERS`, like moto itself), so the pipeline's
clients (`adapters.clients`), the SDK's and a test's own all see it. Behaviour (the facts and their public sources:
docs/aws-facts.md):

- DynamoDB transactions hold their items while in flight: for `hold_ms` from the start of `TransactWriteItems`
  (about a real transaction's latency; moto's own duration, which grows with load, is not AWS's).
  A plain `PutItem`/`UpdateItem`/`DeleteItem` from another thread on a held item
  fails with `TransactionConflictException`; another transaction touching it is cancelled with reason
  `TransactionConflict` at that item's index. A single process cannot reproduce the other Lambda invocations that
  keep a busy item permanently in some transaction on AWS, so items touched by at least `hot_threshold`
  transactions within `hot_window_s` are "hot", and any write on a hot item meets a conflict with probability
  `conflict_rate` (seeded: `seed`), at most `max_streak` times in a row per item (conflicts are transient).
- S3 `GetObject`/`HeadObject` of a missing key answers 403 AccessDenied unless the calling role has
  `s3:ListBucket` on that bucket and prefix (`access.LIST_GRANTS`, the same table the stack grants from). The role
  is `acting_as(...)` when set, else derived from the calling code (the handler module on the stack, as each runs
  in its own Lambda with its own role); SDK and CLI code runs as the trainer, who may list.
- S3 -> EventBridge: `detail.object.key` of `aws.s3` events received from SQS arrives URL-encoded (`quote_plus`).

`stats` counts what the profile injected (benchmarks print it).
"""

from __future__ import annotations

import contextvars
import json
import os
import random
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote_plus

from rollout_pipeline import access

#: Environment variable selecting the profile of local mode and the test suites ("faithful" or "moto").
PROFILE_ENV: Final = "ROLLOUTS_AWS_PROFILE"
FAITHFUL: Final = "faithful"
MOTO: Final = "moto"

_PLAIN_WRITES: Final = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
_KEY_ATTRIBUTES: Final = ("pk", "sk")

#: Handler modules (prefixes) and the role their Lambda runs with; the innermost match on the stack wins.
_ROLE_MODULES: Final = (
    ("rollout_pipeline.ingest", access.INGEST),
    ("lambdas.ingest", access.INGEST),
    ("rollout_pipeline.lifecycle.dispatch", access.DISPATCH),
    ("lambdas.dispatch", access.DISPATCH),
    ("rollout_pipeline.lifecycle.completion", access.COMPLETION),
    ("lambdas.completion", access.COMPLETION),
    ("rollout_pipeline.lifecycle.sweeper", access.SWEEPER),
    ("lambdas.sweeper", access.SWEEPER),
)
#: Code that runs with the trainer's credentials whatever it calls (the SDK runs ingestion in-process).
_TRAINER_MODULES: Final = ("rollout_pipeline.sdk", "rollout_pipeline.cli")

_acting_as: contextvars.ContextVar[str | None] = contextvars.ContextVar("faithful_acting_as", default=None)


@dataclass
class FaithfulStats:
    """What the profile injected since activation."""

    plain_conflicts: int = 0
    transaction_conflicts: int = 0
    access_denied: int = 0
    keys_encoded: int = 0


@dataclass
class FaithfulProfile:
    """Settings of the faithful profile (see the module docstring)."""

    seed: int = 0
    hold_ms: float = 15.0
    conflict_rate: float = 0.0
    hot_threshold: int = 3
    hot_window_s: float = 1.0
    max_streak: int = 2
    stats: FaithfulStats = field(default_factory=FaithfulStats)
    #: bucket name -> (bucket kind, experiment name), from `note_buckets`.
    buckets: dict[str, tuple[access.BucketKind, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        # item -> (owner thread, held until monotonic seconds)
        self._held: dict[tuple[str, str], tuple[int, float]] = {}
        self._touches: dict[tuple[str, str], deque[float]] = {}
        self._streak: dict[tuple[str, str], int] = {}
        #: Writes that went through, per item: plain writes and transactional ones (which cost 2 WCU each).
        self.plain_writes: Counter[str] = Counter()
        self.transaction_writes: Counter[str] = Counter()

    # ---------------------------------------------------------------------------------------------- DynamoDB

    def _hot(self, item: tuple[str, str], now: float) -> bool:
        touches = self._touches.get(item)
        if not touches:
            return False
        while touches and touches[0] < now - self.hot_window_s:
            touches.popleft()
        return len(touches) >= self.hot_threshold

    def _conflicts(self, item: tuple[str, str], now: float, me: int) -> bool:
        """Whether a write on `item` meets a transaction now (caller holds the lock)."""
        held = self._held.get(item)
        if held is not None:
            owner, until = held
            if now < until and owner != me:
                return True
            if now >= until:
                del self._held[item]
        if self.conflict_rate > 0 and self._hot(item, now):
            streak = self._streak.get(item, 0)
            if streak < self.max_streak and self._rng.random() < self.conflict_rate:
                self._streak[item] = streak + 1
                return True
        self._streak.pop(item, None)
        return False

    def before_plain_write(self, table: str, key: Mapping[str, Any]) -> bool:
        """True when this plain write must fail with TransactionConflictException."""
        item = (table, key_text(key))
        with self._lock:
            conflict = self._conflicts(item, time.monotonic(), threading.get_ident())
            if conflict:
                self.stats.plain_conflicts += 1
            else:
                self.plain_writes[item[1]] += 1
            return conflict

    def begin_transaction(self, items: list[tuple[str, str]]) -> int | None:
        """Index of the first item that conflicts (the transaction is cancelled), else hold the items: None."""
        now, me = time.monotonic(), threading.get_ident()
        with self._lock:
            for index, item in enumerate(items):
                if self._conflicts(item, now, me):
                    self.stats.transaction_conflicts += 1
                    return index
            until = now + self.hold_ms / 1000
            for item in items:
                self._held[item] = (me, until)
                self._touches.setdefault(item, deque()).append(now)
                self.transaction_writes[item[1]] += 1
        return None

    # ------------------------------------------------------------------------------------------------------ S3

    def may_see_not_found(self, bucket: str, key: str) -> bool:
        """Whether the calling role has s3:ListBucket covering `key` (so a missing key answers 404, not 403)."""
        role = current_role()
        if role == access.TRAINER:
            return True
        known = self.buckets.get(bucket)
        if known is None:
            return True  # not one of the experiment's buckets: nothing to model
        kind, exp = known
        return any(g.bucket == kind and key.startswith(g.resolve(exp)) for g in access.LIST_GRANTS.get(role, ()))


def key_text(key: Mapping[str, Any]) -> str:
    """The identity of a ledger item as the profile tracks it (its `pk`/`sk`)."""
    return json.dumps({name: key.get(name) for name in _KEY_ATTRIBUTES}, sort_keys=True)


def _transaction_items(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    for entry in params.get("TransactItems") or []:
        for op, body in entry.items():
            key = body.get("Item") if op == "Put" else body.get("Key")
            items.append((str(body.get("TableName")), key_text(key or {})))
    return items


# --------------------------------------------------------------------------------------------------- roles


def current_role() -> str:
    """The role the calling code runs with: `acting_as`, else the innermost handler module on the stack."""
    forced = _acting_as.get()
    if forced is not None:
        return forced
    frame = sys._getframe(1)
    role: str | None = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(_TRAINER_MODULES):
            return access.TRAINER
        if role is None:
            for prefix, name in _ROLE_MODULES:
                if module.startswith(prefix):
                    role = name
                    break
        frame = frame.f_back  # type: ignore[assignment]
    return role or access.TRAINER


@contextmanager
def acting_as(role: str) -> Iterator[None]:
    """Run the block as `role` (one of `access`'s role names) for the S3 rules."""
    token = _acting_as.set(role)
    try:
        yield
    finally:
        _acting_as.reset(token)


# ------------------------------------------------------------------------------------------ botocore hooks


class _State:
    active: FaithfulProfile | None = None
    installed = False
    lock = threading.Lock()


def active() -> FaithfulProfile | None:
    """The active profile, or None (plain moto)."""
    return _State.active


def _response(status: int, code: str, message: str, **extra: Any) -> tuple[Any, dict[str, Any]]:
    from botocore.awsrequest import AWSResponse

    http = AWSResponse("https://faithful.invalid", status, {}, None)
    parsed: dict[str, Any] = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0},
        **extra,
    }
    return http, parsed


def _remember_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    if _State.active is not None:
        context["faithful_params"] = params


def _dynamodb_before_call(model: Any, context: dict[str, Any], **_: Any) -> Any:
    profile = _State.active
    if profile is None:
        return None
    params = context.get("faithful_params") or {}
    name = model.name
    if name in _PLAIN_WRITES:
        key = params.get("Item") if name == "PutItem" else params.get("Key")
        if profile.before_plain_write(str(params.get("TableName")), key or {}):
            return _response(
                400,
                "TransactionConflictException",
                "Transaction is ongoing for the item (faithful profile)",
            )
    elif name == "TransactWriteItems":
        items = _transaction_items(params)
        index = profile.begin_transaction(items)
        if index is not None:
            reasons = [{"Code": "None"} for _ in items]
            reasons[index] = {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            return _response(
                400,
                "TransactionCanceledException",
                "Transaction cancelled, please refer cancellation reasons for specific reasons "
                f"[{', '.join(r['Code'] for r in reasons)}]",
                CancellationReasons=reasons,
            )
    return None


def _s3_after_call(http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    profile = _State.active
    if profile is None or http_response is None or http_response.status_code != 404:
        return
    params = context.get("faithful_params") or {}
    if profile.may_see_not_found(str(params.get("Bucket")), str(params.get("Key"))):
        return
    profile.stats.access_denied += 1
    http_response.status_code = 403
    parsed["Error"] = {"Code": "AccessDenied", "Message": "Access Denied"}
    parsed.setdefault("ResponseMetadata", {})["HTTPStatusCode"] = 403
    context["error_code_override"] = "AccessDenied"


def encode_s3_event_key(body: str) -> str | None:
    """The body of an SQS message with an `aws.s3` event's `detail.object.key` URL-encoded as AWS sends it, or None
    when the body is not such an event."""
    if '"aws.s3"' not in body:
        return None
    try:
        event = json.loads(body)
        obj = event["detail"]["object"]
        if event.get("source") != "aws.s3":
            return None
        obj["key"] = quote_plus(str(obj["key"]), safe="/")
    except (ValueError, KeyError, TypeError):
        return None
    return json.dumps(event)


def _sqs_after_receive(parsed: dict[str, Any], **_: Any) -> None:
    profile = _State.active
    if profile is None:
        return
    for message in parsed.get("Messages") or []:
        encoded = encode_s3_event_key(str(message.get("Body") or ""))
        if encoded is not None:
            message["Body"] = encoded
            profile.stats.keys_encoded += 1


_HANDLERS: Final = (
    ("before-parameter-build.dynamodb", _remember_params),
    ("before-parameter-build.s3.GetObject", _remember_params),
    ("before-parameter-build.s3.HeadObject", _remember_params),
    ("before-call.dynamodb", _dynamodb_before_call),
    ("after-call.s3.GetObject", _s3_after_call),
    ("after-call.s3.HeadObject", _s3_after_call),
    ("after-call.sqs.ReceiveMessage", _sqs_after_receive),
)


def _install() -> None:
    """Register the handlers on every botocore session created from now on (inactive handlers do nothing)."""
    with _State.lock:
        if _State.installed:
            return
        from botocore.handlers import BUILTIN_HANDLERS

        from rollout_pipeline.adapters import clients

        BUILTIN_HANDLERS.extend(_HANDLERS)
        clients.reset()  # cached clients were made without the handlers
        _State.installed = True


@contextmanager
def activate(profile: FaithfulProfile | None = None) -> Iterator[FaithfulProfile]:
    """Make `profile` (default settings when None) the active profile for the block."""
    _install()
    previous = _State.active
    current = _State.active = profile or FaithfulProfile()
    try:
        yield current
    finally:
        _State.active = previous


def note_buckets(exp: str, *, input_bucket: str, results_bucket: str) -> None:
    """Tell the active profile (if any) which buckets are the experiment's input and results buckets."""
    if _State.active is not None:
        _State.active.buckets[input_bucket] = ("input", exp)
        _State.active.buckets[results_bucket] = ("results", exp)


def profile_from_env(default: str = MOTO) -> str:
    """`ROLLOUTS_AWS_PROFILE` ("faithful" or "moto"), else `default`."""
    value = os.environ.get(PROFILE_ENV, default).strip().lower() or default
    if value not in (FAITHFUL, MOTO):
        raise ValueError(f"{PROFILE_ENV}={value!r}: use {FAITHFUL!r} or {MOTO!r}")
    return value
