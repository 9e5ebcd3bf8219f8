"""Completion: a result object in the results bucket -> exactly one terminal transition -> events.

Input: the S3 "Object Created" EventBridge event (the completion queue's message body). The key names the attempt
(`ids.parse_result_key`), or, for a warm session (started by the warm pool before its rollout was known:
`ids.parse_warm_result_key`), the session: the result is read first and the attempt it names (ART's copy of the
request, `payload._rollout`: batch, index, attempt; else the claim the dispatch wrote, one read) is accepted only if
the ledger says that attempt runs in that session. Every result must come from the session the ledger records for
its attempt. If that attempt is dispatched: read the result (size-capped), then ONE transaction:
rollout -> succeeded/failed, group and batch counters, outbox {publish, stop}, the session's slot held. Then the
events at once (`outbox.drain`), and only after every record of the SQS batch was published, the stops
(`stops.finish_stops`: they free the slots; a failed stop stays in the outbox). The trainer hears of a result
without waiting for any call budget. Anything else
(unknown key, a late or duplicated result, a result without its attempt's token: `contracts.attempts`) changes
nothing and counts `LateOrUnknownResult`, except that a redelivery finding its attempt terminal with the outbox
still set finishes the side effects.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from enum import StrEnum
from typing import Any

from rollout_pipeline import ids, routing
from rollout_pipeline.contracts import (
    TOKEN_TAIL_BYTES,
    FailureReason,
    ReportedUsage,
    ResultOutcome,
    ResultRead,
    RolloutCost,
    carries_attempt_token,
    iso,
    parse_iso,
    read_result,
    reported_usage,
    text_carries_attempt_token,
)
from rollout_pipeline.ledger.items import RolloutRecord, Terminal
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH, OUTBOX_STOP
from rollout_pipeline.ledger.rollouts import DISPATCHED, FAILED, SUCCEEDED
from rollout_pipeline.lifecycle import costing, outbox, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.metric_names import (
    ESTIMATED_COST,
    LATE_OR_UNKNOWN,
    REWARD,
    failed_metric,
)
from rollout_pipeline.metric_names import (
    FAILED as FAILED_METRIC,
)
from rollout_pipeline.metric_names import (
    SUCCEEDED as SUCCEEDED_METRIC,
)
from rollout_pipeline.observability import bind_log_ids
from rollout_pipeline.ports import ObjectNotFound
from rollout_pipeline.sqs_batch import BatchOutcome, run_partial_batch

log = logging.getLogger(__name__)


class Completion(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RESUMED = "resumed"  # the attempt had already ended; its pending side effects were finished
    LATE_OR_UNKNOWN = "late_or_unknown"
    FOREIGN = "foreign"  # without its attempt's token: not written by the attempt's session; changes nothing


#: How long the stops after a completion batch may wait for call budget when the caller gives no deadline.
DEFAULT_STOP_BUDGET_S = 30.0


def complete_records(
    records: Sequence[Mapping[str, Any]], deps: LifecycleDeps, *, wait_until: float | None = None
) -> BatchOutcome[Completion]:
    """Handle an SQS batch of completion-queue records (`messageId`, `body`); failed ids -> batchItemFailures.
    Records are handled concurrently (up to `deps.dispatch_threads`): results recorded and published first, then
    the sessions stopped, every wait bounded by `wait_until` (monotonic; the Lambda's remaining time)."""
    result: BatchOutcome[Completion] = BatchOutcome()
    if not records:
        return result
    until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_BUDGET_S
    to_stop: list[RolloutRecord] = []

    def one(record: Mapping[str, Any]) -> Completion:
        event = json.loads(record["body"])
        return handle_result_event(event, deps, stops_later=to_stop)

    workers = max(1, min(deps.dispatch_threads, len(records)))
    run_partial_batch(records, one, result, workers=workers, what="complete", logger=log)
    if to_stop:  # results are recorded and published; a failed stop stays in the outbox (sweeper)
        stops_now = sum(len(rec.stop_sessions) for rec in to_stop)
        deps.limits.runtime.stop_pacer.expect(stops_now)  # one schedule write, not one each
        with ThreadPoolExecutor(max_workers=min(workers, len(to_stop)), thread_name_prefix="stop") as pool:
            list(pool.map(lambda rec: _stop_after(rec, deps, until), to_stop))
    return result


def _stop_after(rec: RolloutRecord, deps: LifecycleDeps, wait_until: float) -> None:
    try:
        stops.finish_stops(rec, deps, wait_until)
    except Exception:  # the outbox keeps the stop: the sweeper retries it
        log.exception("stop of %s pending", rec.session_id)
        deps.ledger.outbox.return_outbox(rec, rec.outbox - {OUTBOX_STOP})  # the rest was drained


def _location(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """The bucket and the object key as the event carries it (maybe URL-encoded)."""
    detail = event.get("detail")
    if isinstance(detail, Mapping):
        bucket = (detail.get("bucket") or {}).get("name")
        key = (detail.get("object") or {}).get("key")
        if isinstance(bucket, str) and isinstance(key, str):
            return bucket, key
    return None


def _late(deps: LifecycleDeps, why: str, key: str) -> Completion:
    deps.metrics.count(LATE_OR_UNKNOWN)
    log.info("result %s ignored: %s", key, why)
    return Completion.LATE_OR_UNKNOWN


def handle_result_event(
    event: Mapping[str, Any], deps: LifecycleDeps, *, stops_later: list[RolloutRecord] | None = None
) -> Completion:
    """Process one S3 Object Created event of the results bucket (see the module doc). Raises to be retried.
    `stops_later`: collect the rollouts whose sessions still have to be stopped instead of stopping them here.
    The key is read decoded, and as the event carried it when that differs and the decoded key does not parse or
    is not found (`routing.event_key_candidates`: whichever way S3's events encode keys)."""
    location = _location(event)
    if location is None:
        return _late(deps, "not an S3 Object Created event", str(event)[:200])
    bucket, carried = location
    if bucket != deps.settings.results_bucket:
        return _late(deps, f"bucket {bucket} is not the results bucket", carried)
    parsed: list[tuple[str, ids.ResultRef | ids.WarmResultKey]] = []
    why = ""
    for key in routing.event_key_candidates(carried):
        try:
            parsed.append((key, _parse_key(key)))
        except ids.InvalidId as exc:
            why = why or str(exc)
    if not parsed:
        return _late(deps, why, carried)
    for position, (key, named) in enumerate(parsed):
        last = position == len(parsed) - 1
        if isinstance(named, ids.WarmResultKey):
            done = _handle_warm_result(bucket, key, named, event, deps, stops_later=stops_later, last=last)
        else:
            done = _handle_result(bucket, key, named, event, deps, stops_later=stops_later, last=last)
        if done is not None:
            return done
    return _late(deps, "the result object is gone", carried)


def _parse_key(key: str) -> ids.ResultRef | ids.WarmResultKey:
    """The attempt a result key names, or the warm session it names; `InvalidId` when it is not ours."""
    try:
        return ids.parse_result_key(key)
    except ids.InvalidId:
        try:
            return ids.parse_warm_result_key(key)
        except ids.InvalidId:
            pass
        raise


def _handle_warm_result(
    bucket: str,
    key: str,
    warm: ids.WarmResultKey,
    event: Mapping[str, Any],
    deps: LifecycleDeps,
    *,
    stops_later: list[RolloutRecord] | None,
    last: bool,
) -> Completion | None:
    """A result of a warm session: the attempt is the one the result names (ART's copy of the request), else the
    one the dispatch's claim records; `_handle_result` then accepts it only if that attempt runs in this session."""
    bind_log_ids(session_id=warm.session_id)
    if warm.exp_id != deps.config.name:
        return _late(deps, f"experiment {warm.exp_id} is not {deps.config.name}", key)
    try:
        read = read_result(deps.store, bucket, key, max_bytes=deps.config.result_max_bytes)
    except ObjectNotFound:
        return _late(deps, "the result object is gone", key) if last else None
    named = attempt_named_by(read.outcome.body)
    if named is None:
        claim = deps.ledger.warm.claim_of(warm.session_id)
        named = None if claim is None else (claim.ref.batch_id, claim.ref.index, claim.ref.attempt)
    if named is None:
        return _late(deps, f"no rollout attempt took warm session {warm.session_id}", key)
    batch_id, index, attempt = named
    ref = ids.ResultRef(batch_id, warm.input_id, index, attempt, exp_id=warm.exp_id, session_id=warm.session_id)
    return _handle_result(bucket, key, ref, event, deps, stops_later=stops_later, last=last, read=read)


def attempt_named_by(body: Mapping[str, Any] | None) -> tuple[str, int, int] | None:
    """The attempt (batch, index, attempt) a result names in ART's copy of its request (`payload._rollout`), when
    it names one well-formed; the ledger decides whether it is that attempt's (its session must be the key's)."""
    payload = body.get("payload") if isinstance(body, Mapping) else None
    rollout = payload.get("_rollout") if isinstance(payload, Mapping) else None
    if not isinstance(rollout, Mapping):
        return None
    batch_id, index, attempt = rollout.get("batch_id"), rollout.get("index"), rollout.get("attempt")
    if not isinstance(batch_id, str) or not ids.BATCH_ID_RE.fullmatch(batch_id):
        return None
    if (
        isinstance(index, bool)
        or isinstance(attempt, bool)
        or not isinstance(index, int)
        or not isinstance(attempt, int)
    ):
        return None
    return (batch_id, index, attempt) if index >= 0 and attempt >= 1 else None


def _handle_result(
    bucket: str,
    key: str,
    ref: ids.ResultRef,
    event: Mapping[str, Any],
    deps: LifecycleDeps,
    *,
    stops_later: list[RolloutRecord] | None,
    last: bool,
    read: ResultRead | None = None,
) -> Completion | None:
    """`handle_result_event` for one reading of the key; None when its object is not found and another reading
    is left to try. `read`: the result, when already read."""
    bind_log_ids(batch_id=ref.batch_id, rollout_id=ref.rollout_id, session_id=ref.session_id)
    if ref.exp_id != deps.config.name:
        return _late(deps, f"experiment {ref.exp_id} is not {deps.config.name}", key)
    rec = deps.ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)
    if rec is None:
        return _late(deps, "no such rollout in the ledger", key)
    if rec.attempt == ref.attempt and rec.terminal and rec.outbox:
        if outbox.drain(rec, deps):
            return Completion.RESUMED
        return _late(deps, "its side effects are being finished by another worker", key)
    if rec.state != DISPATCHED or rec.attempt != ref.attempt:
        return _late(deps, f"rollout is {rec.state} (attempt {rec.attempt}), result is of attempt {ref.attempt}", key)
    if rec.session_id != ref.session_id:
        return _late(deps, f"attempt {rec.attempt} runs in session {rec.session_id}, not {ref.session_id}", key)

    try:
        if read is None:
            read = read_result(deps.store, bucket, key, max_bytes=deps.config.result_max_bytes)
        if _foreign(read, bucket, key, ref, deps):
            return Completion.FOREIGN
    except ObjectNotFound:
        return _late(deps, "the result object is gone", key) if last else None
    outcome, body_dict, size = read.outcome, read.outcome.body, read.size
    written_at = parse_iso(event.get("time")) or deps.now()
    usage = reported_usage(body_dict)
    cpu_s = usage.session_cpu_s if usage is not None else None
    warning = _model_warning(usage, key)
    cost = costing.terminal_cost(deps, rec, ended_at=written_at, idle=True, cpu_s=cpu_s)
    terminal = _terminal(outcome, written_at, f"s3://{bucket}/{key}", size, cost=cost, cpu_s=cpu_s, warning=warning)
    after = deps.ledger.rollouts.finish_dispatched(
        rec,
        exp_id=ref.exp_id,
        outcome=terminal,
        outbox=frozenset({OUTBOX_PUBLISH}),
        hold_slot_until=stops.hold_until(deps, rec),
    )
    if after is None:
        after = deps.ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)
        resumable = after is not None and after.attempt == ref.attempt and after.terminal and bool(after.outbox)
        if after is not None and resumable and outbox.drain(after, deps):
            return Completion.RESUMED
        return _late(deps, "another delivery ended this attempt first", key)
    deps.metrics.add(ESTIMATED_COST, cost.usd)
    if terminal.state == SUCCEEDED:
        deps.metrics.count(SUCCEEDED_METRIC)
        if terminal.reward is not None:
            deps.metrics.sample(REWARD, float(terminal.reward))
    else:
        deps.metrics.count(FAILED_METRIC)
        deps.metrics.count(failed_metric(terminal.reason or "unknown"))
    later = stops_later is not None
    outbox.drain(after, deps, owner=True, result=body_dict, stops=not later)
    if later and after.stop_sessions and stops_later is not None:
        stops_later.append(after)
    return Completion.SUCCEEDED if outcome.success else Completion.FAILED


def _model_warning(usage: ReportedUsage | None, key: str) -> str | None:
    """The rollout's model-reply warning from the host's usage report (`ModelCalls.warning`), logged."""
    warning = usage.model_calls.warning if usage is not None and usage.model_calls is not None else None
    if warning:
        log.warning("result %s: %s", key, warning)
    return warning


def _foreign(read: ResultRead, bucket: str, key: str, ref: ids.ResultRef, deps: LifecycleDeps) -> bool:
    """The result does not carry its attempt's token (when tokens are checked): counted and logged.

    A result that cannot be parsed (not JSON, or over `result_max_bytes`) is searched for the token as text: in
    what was read and, when it was too large to read whole, in its tail (one ranged GET of `TOKEN_TAIL_BYTES`:
    ART writes the request, with its token, last). Found, it is the attempt's own result: `invalid_result` at once,
    instead of a full `rollout_timeout_s` per attempt and then `timeout`."""
    if deps.attempt_key is None:
        return False
    secret, body = deps.attempt_key(), read.outcome.body
    if body is not None:
        if carries_attempt_token(body, secret, ref.exp_id, ref.session_id):
            return False
    else:
        texts = [read.raw]
        if read.too_large:
            texts.append(deps.store.get_tail(bucket, key, TOKEN_TAIL_BYTES))
        if text_carries_attempt_token(texts, secret, ref.exp_id, ref.session_id):
            return False
    deps.metrics.count(LATE_OR_UNKNOWN)
    unreadable = f" ({read.outcome.error})" if body is None else ""
    log.warning(
        "result %s ignored: it does not carry its attempt's token%s: written by another session, unreadable, "
        "or by an agent that copies neither the request (`payload`) nor `_rollout.attempt_token` into it",
        key,
        unreadable,
    )
    return True


def _terminal(
    outcome: ResultOutcome,
    written_at: datetime,
    result_uri: str,
    size: int,
    *,
    cost: RolloutCost | None = None,
    cpu_s: float | None = None,
    warning: str | None = None,
) -> Terminal:
    """The terminal outcome a result records (the agent wrote it: its session is idle from `written_at` on)."""
    succeeded = outcome.success
    return Terminal(
        state=SUCCEEDED if succeeded else FAILED,
        finished_at=written_at,
        reason=None if succeeded else (outcome.reason or FailureReason.INVALID_RESULT).value,
        error=None if succeeded else outcome.error,
        reward=outcome.reward,
        rewards=outcome.rewards,
        result_uri=result_uri,
        result_size=size,
        warning=warning,
        cost=cost,
        idle=True,
        cpu_s=cpu_s,
    )


def complete_if_written(rec: RolloutRecord, deps: LifecycleDeps) -> Completion | None:
    """The sweeper's check before expiring an attempt: if the attempt's result object exists (its event is late
    or was lost), complete the attempt from it now. None when there is no result (the attempt may expire).
    (A missing object answers 403 without s3:ListBucket; the S3 adapter maps what it knows to ObjectNotFound.)"""
    if not rec.session_id or not rec.exp_id:
        return None
    bucket = deps.settings.results_bucket
    key = ids.result_key(rec.exp_id, rec.input_id, rec.session_id)
    try:
        info = deps.store.head(bucket, key)
    except ObjectNotFound:
        return None
    event = {
        "detail": {"bucket": {"name": bucket}, "object": {"key": key}},
        "time": iso(info.last_modified) if info.last_modified is not None else None,
    }
    done = handle_result_event(event, deps)
    return None if done is Completion.FOREIGN else done  # not the attempt's result: it may expire
