"""The dispatcher: rollout-queue messages -> one ACR session per rollout attempt, under the global limits.

Per message: read the batch (options, cancel flag) -> one transaction takes a session slot and moves the rollout to
dispatched(attempt) -> a TPS token -> InvokeAgentRuntime with the message's session id -> `invoked_at`.
A redelivery finds the attempt already dispatched: with `invoked_at` it is acknowledged; without, after a grace
period (the first delivery crashed between the transaction and the invoke), the SAME session id is invoked again.
A full limit waits (polling, jittered) until the wait budget ends, then the message is re-sent fresh and
acknowledged: never dropped, never dead-lettered because of a limit; but a rollout re-sent more than
`max_limit_requeues` times or waiting longer than `max_limit_wait_s` fails loudly (`Rollout Failed`, `throttled`).
A cold start (RuntimeClientError 424) is retried on the SAME session id (`cold_start_retries` x
`cold_start_wait_s`, tps budget only: the session exists); then the attempt ends through the normal "attempts
left?" path and its session is stopped. An agent that cannot start (RuntimeClientError "Runtime initialization time
exceeded": `RuntimeStartFailed`) fails the rollout at once as `agent_error` (no retry can help) and its session is
stopped. A read timeout after sending is never re-sent (the deadline decides).
An invoke is started only if it can end inside the invocation (`wait_until` minus the runtime's longest call,
`LifecycleDeps.invoke_time_s`): waits for a slot or a budget end that much earlier, and a message left without
that time is re-sent fresh (counted as a limit wait), never dropped.
With the warm pool on, an SQS batch first receives an offer of an idle warm session for each of its messages (the
warm queue, `lifecycle.warm`), and a message takes one: no slot wait and no new-session budget (the session holds its
slot, and exists), the same payload and result key form; a dead one is dropped and the attempt goes on with a new
session as above (`_drop_warm`). An SQS batch with an offer for each message books its takes' `tps` starts in one
write (`limits.pacing.Pacer.expect`), not one each.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import Any

from rollout_pipeline import ids
from rollout_pipeline.contracts import FailureReason, FileOptions, RolloutMessage, build_agent_payload, iso
from rollout_pipeline.ledger.items import BatchView, RolloutRecord
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.rollouts import DISPATCHED, QUEUED, DispatchStart
from rollout_pipeline.lifecycle import budget, costing, outbox, stops
from rollout_pipeline.lifecycle.cancel import cancel_rollout
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.failures import end_attempt, fail_rollout
from rollout_pipeline.lifecycle.warm import WarmOffer, WarmOffers
from rollout_pipeline.limits.admission import Held
from rollout_pipeline.limits.pacing import NoCallBudget, retry_pause
from rollout_pipeline.metric_names import (
    COLD_START_RETRIED,
    IN_FLIGHT,
    LIMIT_WAITS,
    NEW_SESSIONS,
    WARM_DROPPED,
    WARM_STARTS,
)
from rollout_pipeline.metric_names import (
    DISPATCHED as DISPATCHED_METRIC,
)
from rollout_pipeline.observability import bind_log_ids
from rollout_pipeline.ports import (
    RuntimeColdStart,
    RuntimeOutcomeUnknown,
    RuntimeRejected,
    RuntimeSessionNotFound,
    RuntimeStartFailed,
    RuntimeThrottled,
)
from rollout_pipeline.sqs_batch import BatchOutcome, message_id, run_partial_batch

log = logging.getLogger(__name__)

#: Payload claim checks bigger than this are refused (rows are capped at 1 MiB at ingestion).
MAX_CLAIM_BYTES = 8 * 1024 * 1024


class Dispatch(StrEnum):
    """What happened to one message (every value but a raised exception acknowledges it)."""

    INVOKED = "invoked"  # a new session was started
    WARM = "warm"  # started in a warm session of the pool
    REINVOKED = "reinvoked"  # crash recovery: the same session id invoked again
    DUPLICATE = "duplicate"  # this attempt is already running
    STALE = "stale"  # the rollout has moved on (later attempt or terminal)
    CANCELLED = "cancelled"  # the batch is cancelled: the rollout ended as cancelled
    REJECTED = "rejected"  # ACR refused for good: Rollout Failed (invoke_rejected)
    REQUEUED_LIMIT = "requeued_limit"  # still waiting for a limit at the end of the budget: re-sent fresh
    REQUEUED_THROTTLED = "requeued_throttled"  # ACR kept throttling: slot freed, re-sent fresh
    REQUEUED_NO_TIME = "requeued_no_time"  # too little time left for an invoke to end in it: re-sent fresh
    STOPPED_LATE = "stopped_late"  # invoked, but the rollout was cancelled/ended meanwhile: session stopped
    HELD_BUDGET = "held_budget"  # its budget (the experiment's or its batch's) is spent: re-sent to come back later
    THROTTLED = "throttled"  # waited for limits too often or too long: Rollout Failed (throttled)
    COLD_START_FAILED = "cold_start_failed"  # kept answering 424: attempt ended (retried or failed), session stopped
    START_FAILED = "start_failed"  # the agent cannot start: Rollout Failed (agent_error), session stopped


def dispatch_records(
    records: Sequence[Mapping[str, Any]], deps: LifecycleDeps, *, wait_until: float
) -> BatchOutcome[Dispatch]:
    """Dispatch an SQS batch concurrently (up to `deps.dispatch_threads`). `wait_until` (monotonic) bounds every
    wait for a limit; records are SQS records (`messageId`, `body`). Returns each message's `Dispatch`; failed ids go
    to the partial batch response."""
    result: BatchOutcome[Dispatch] = BatchOutcome()
    if not records:
        return result
    workers = max(1, min(deps.dispatch_threads, len(records)))
    batches = BatchReads(deps)
    budgets = budget.Budgets(deps)
    ordered = sorted(((_record_order(r), r) for r in records), key=lambda pair: pair[0])  # a group's together
    parsed = [(message_id(r), key) for (poison, key), r in ordered if not poison]
    # On the admission board from receipt on, so other dispatchers rank these before deciding (a burst's start);
    # unless the batch holds a warm offer for each: those take no slot and never wait in the gate, so only the ones
    # that end up taking a new session go on the board, when they do (two writes per SQS batch less).
    offers = deps.warm.offers(len(parsed))
    warm_first = bool(parsed) and len(offers) >= len(parsed)
    holds = (
        {}
        if warm_first
        else dict(zip([m for m, _k in parsed], deps.limits.gate.hold([k for _m, k in parsed]), strict=True))
    )
    if warm_first:  # the takes' `tps` starts, booked in one write
        deps.limits.runtime.tps.expect(len(parsed))
    budgets.experiment()  # read once here, before the threads: none of them waits on it ahead of the gate

    def handle(record: Mapping[str, Any]) -> Dispatch:
        held = holds.get(message_id(record))
        try:
            return dispatch_body(
                str(record["body"]),
                deps,
                wait_until=wait_until,
                batches=batches,
                held=held,
                budgets=budgets,
                hold_if_new=warm_first,
                offers=offers,
            )
        finally:
            if held is not None:
                held.leave()

    try:
        run_partial_batch([r for _o, r in ordered], handle, result, workers=workers, what="dispatch", logger=log)
    finally:
        offers.close()  # the offers used or stale deleted, the rest given back
    deps.feed.after_dispatch(batches.views())  # the queue drained: the release window may have room
    deps.metrics.sample(IN_FLIGHT, deps.limits.shards.in_flight())
    return result


def _record_order(record: Mapping[str, Any]) -> tuple[int, str]:
    try:
        return (0, admission_key(parse_message(str(record["body"]))))
    except Exception:  # a poison message keeps its place at the end; dispatch_body reports it
        return (1, "")


def parse_message(body: str) -> RolloutMessage:
    """A rollout-queue body; raises (ValueError) for a poison message, which is then retried and dead-lettered."""
    return RolloutMessage.model_validate_json(body)


class BatchReads:
    """Batch items read once per SQS batch, shared by its dispatcher threads (its messages are mostly of one
    batch). A cancel after the read is still honoured: the dispatch transaction itself refuses a cancelled batch.
    The experiment's policy version comes from a read that began after the dispatch did (`policy_version`)."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self._deps = deps
        self._items: dict[str, BatchView | None] = {}
        self._lock = threading.Lock()
        self._policy_read = threading.Lock()  # one policy read at a time: the others wait for it and use it
        self._dispatch = threading.local()  # when this thread's dispatch began (monotonic s)

    def get(self, batch_id: str) -> BatchView | None:
        with self._lock:
            if batch_id not in self._items:
                self._items[batch_id] = self._deps.ledger.batches.read_batch(batch_id)
            return self._items[batch_id]

    def views(self) -> list[BatchView]:
        """The batch views read so far (as read: their counters may be behind)."""
        with self._lock:
            return [view for view in self._items.values() if view is not None]

    def begin(self) -> None:
        """This thread's dispatch of a message begins now: its policy version is read after this."""
        self._dispatch.began = self._deps.clock.monotonic()

    def policy_version(self, batch_default: str | None) -> str | None:
        """The version to dispatch with: the experiment's current one, else the batch's; from a read (strongly
        consistent) that began after this thread's dispatch began (`begin`), so a version the trainer set before it
        is the one stamped. A poll of the process's admission gate that let the rollout through serves (it reads the
        `LIMIT` partition, the version's item with it: no request of its own); else one read, shared by every
        dispatch of the process that began before it."""
        shards = self._deps.limits.shards
        since = getattr(self._dispatch, "began", 0.0)
        with self._policy_read:
            seen = shards.policy
            if seen is None or seen[0] < since:
                began = self._deps.clock.monotonic()
                shards.saw_policy(began, self._deps.ledger.experiment.current_policy_version())
                seen = shards.policy
        assert seen is not None
        return seen[1] or batch_default


def dispatch_body(
    body: str,
    deps: LifecycleDeps,
    *,
    wait_until: float,
    batches: BatchReads | None = None,
    held: Held | None = None,
    budgets: budget.Budgets | None = None,
    hold_if_new: bool = False,
    offers: WarmOffers | None = None,
) -> Dispatch:
    """Dispatch one rollout-queue message body (see the module doc). Raises to have the message redelivered.
    `held`: the message's place on the admission board since receipt (`SlotGate.hold`), left once the rollout's
    session start is booked (`LimitedRuntime.invoke`'s `on_booked`), not merely past the gate: between the two, a
    rollout let through is neither on the board nor in the schedule, so another process's gate would see its room
    free and let a later group book ahead of it (what decides the order its sessions start in). Every other way out
    leaves it too (`dispatch_records`).
    `budgets`: the SQS batch's budget reads (`lifecycle.budget`): a rollout whose budget is spent is held, not run.
    `hold_if_new`: the message was received without a place on the board (its SQS batch held a warm offer for each
    message): if it takes a new session after all, it goes on the board then, for as long as it would have been.
    `offers`: the SQS batch's warm offers (`lifecycle.warm`); None: this message receives its own."""
    message = parse_message(body)
    bind_log_ids(batch_id=message.batch_id, rollout_id=message.rollout_id, session_id=message.session_id)
    batches = batches or BatchReads(deps)
    batches.begin()
    batch = batches.get(message.batch_id)
    if batch is None:
        raise LookupError(f"batch {message.batch_id} not found in the ledger")
    options = batch.options or FileOptions.defaults(deps.config)
    if batch.cancelled:
        return _cancelled(message, deps, options)
    budgets = budgets or budget.Budgets(deps)
    if _held_on_budget(message, deps, budgets, batch, held):
        return Dispatch.HELD_BUDGET
    message = budget.after_hold(message, deps)
    row_payload = _row_payload(message, deps)
    # Before any ledger write: a key that cannot be read (Secrets Manager down, throttled, denied) raises here and
    # the message is redelivered, instead of after `begin_dispatch`, where it burnt an attempt and a slot until the
    # rollout's deadline.
    token = deps.attempt_token(message.exp_id, message.session_id)
    own = offers is None
    offers = deps.warm.offers(1) if offers is None else offers
    try:
        warm = _dispatch_warm(message, deps, options, row_payload, batches, offers=offers, wait_until=wait_until)
    finally:
        if own:
            offers.close()
    if warm is not None:
        if held is not None:
            held.leave()
        return warm
    deps.warm.note("demand_at")
    late = deps.limits.gate.hold([admission_key(message)])[0] if held is None and hold_if_new else None
    try:
        return _dispatch_new(
            message,
            deps,
            options,
            row_payload,
            token,
            batches=batches,
            budgets=budgets,
            batch=batch,
            held=late or held,
            wait_until=wait_until,
        )
    finally:
        if late is not None:
            late.leave()


def _dispatch_new(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    token: str | None,
    *,
    batches: BatchReads,
    budgets: budget.Budgets,
    batch: BatchView,
    held: Held | None,
    wait_until: float,
) -> Dispatch:
    """The attempt in a new session of its own: through the gate (slot and session budget, in group order), the
    dispatch transaction, the invoke (see the module doc)."""
    start_by = deps.invoke_start_by(wait_until)  # every wait before an invoke ends by then
    waited = _through_the_gate(message, deps, start_by, budgets=budgets, batch=batch, held=held)
    if waited is not None:
        return waited
    booked = (lambda _start: held.leave()) if held is not None else None
    for _ in range(20):
        shard = deps.limits.shards.choose()
        start = _begin(message, deps, options, batches, slot_shard=shard)
        if start is DispatchStart.STARTED:
            deps.limits.shards.taken(shard)
            return _invoke(
                message, deps, options, row_payload, token, wait_until=wait_until, reinvoke=False, booked=booked
            )
        if start is DispatchStart.CANCELLED:
            return _cancelled(message, deps, options)
        if start is DispatchStart.NO_SLOT:
            deps.limits.shards.full(shard)
            if deps.limits.shards.room() > 0:
                continue  # another counter has room by this process's view
            waited = _wait_for_slot(message, deps, start_by, budgets=budgets, batch=batch, held=held)
            if waited is not None:
                return waited
            continue
        decided = _decide_existing(message, deps, options, row_payload, wait_until=wait_until, booked=booked)
        if decided is not None:
            return decided
    raise LedgerError(f"rollout {message.rollout_id} of {message.batch_id}: dispatch kept racing")


def _begin(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    batches: BatchReads,
    *,
    slot_shard: int = 0,
    warm: WarmOffer | None = None,
) -> DispatchStart:
    """The dispatch transaction of this attempt: a slot on `slot_shard` and the attempt's own session, or `warm`."""
    return deps.ledger.rollouts.begin_dispatch(
        exp_id=message.exp_id,
        batch_id=message.batch_id,
        input_id=message.input_id,
        index=message.index,
        attempt=message.attempt,
        session_id=message.session_id if warm is None else warm.session_id,
        submitted_at=iso(message.submitted_at),
        deadline=int((deps.now() + timedelta(seconds=options.rollout_timeout_s)).timestamp()),
        max_sessions=deps.max_sessions(),
        policy_version=batches.policy_version(options.policy_version),
        batch_policy_version=options.policy_version,
        slot_shard=slot_shard,
        warmed_at=None if warm is None else warm.warmed_at,
    )


def _decide_existing(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    *,
    wait_until: float,
    booked: Callable[[float], None] | None = None,
) -> Dispatch | None:
    """The attempt was not dispatchable: read it and decide (`_existing`); a re-invoke goes to the session the
    attempt was dispatched into (its token that session's). None: it is queued for this attempt (try the
    transaction again)."""
    rec = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    decided = _existing(message, rec, deps)
    if decided is Dispatch.REINVOKED and rec is not None:
        session = rec.session_id or message.session_id
        token = deps.attempt_token(message.exp_id, session)
        return _invoke(
            message,
            deps,
            options,
            row_payload,
            token,
            wait_until=wait_until,
            reinvoke=True,
            booked=booked,
            session=session,
        )
    return decided


def _dispatch_warm(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    batches: BatchReads,
    *,
    offers: WarmOffers,
    wait_until: float,
) -> Dispatch | None:
    """Start this attempt in a warm session on offer (`lifecycle.warm`). None: no offer (or the session taken was
    dead and dropped, the attempt queued again): the caller dispatches a new session."""
    if deps.clock.monotonic() >= deps.invoke_start_by(wait_until):
        return None
    while (offer := offers.next()) is not None:
        token = deps.attempt_token(message.exp_id, offer.session_id)  # before any ledger write, as for a new session
        start = _begin(message, deps, options, batches, warm=offer)
        if start is DispatchStart.WARM_TAKEN:  # the session is no longer in the pool: another offer
            offers.refused(offer)
            continue
        if start is not DispatchStart.STARTED:
            offers.give_back(offer)
            if start is DispatchStart.CANCELLED:
                return _cancelled(message, deps, options)
            return _decide_existing(message, deps, options, row_payload, wait_until=wait_until)
        offers.taken(offer)
        deps.warm.note("took_at")
        return _invoke_warm(
            message,
            deps,
            options,
            row_payload,
            session_id=offer.session_id,
            attempt_token=token,
            wait_until=wait_until,
        )
    return None


class _WarmDead(Exception):
    """The warm session taken cannot run the rollout (see `_call_warm`)."""


def _invoke_warm(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    *,
    session_id: str,
    attempt_token: str | None,
    wait_until: float,
) -> Dispatch | None:
    """InvokeAgentRuntime of a dispatched attempt in the warm session it took (an existing session: the `tps`
    budget only, its start booked with its SQS batch's when they were `expect`ed). None when the session was dead and
    dropped (`_drop_warm`): the attempt is queued again."""
    payload = _agent_payload(message, deps, options, row_payload, session_id=session_id, attempt_token=attempt_token)
    try:
        _call_warm(session_id, payload, deps, deps.invoke_start_by(wait_until))
    except RuntimeStartFailed as exc:
        return _start_failed(message, deps, str(exc), wait_until)
    except _WarmDead as dead:
        return _drop_warm(message, deps, session_id, str(dead), wait_until)
    if not deps.ledger.rollouts.mark_invoked(message.ref):
        return _stop_late(message, deps, wait_until, session_id)
    deps.metrics.count(DISPATCHED_METRIC)
    deps.metrics.count(WARM_STARTS)
    return Dispatch.WARM


def _call_warm(session_id: str, payload: Mapping[str, Any], deps: LifecycleDeps, start_by: float) -> None:
    """Invoke the rollout in warm session `session_id`, throttles retried as for any invoke. Raises `_WarmDead`
    when it cannot run there: NotFound or rejected (stopped, idled out, lost), 424 (it is starting again: not the
    session that was warmed), throttled past the retries, or no budget in time (no call was made);
    RuntimeStartFailed as it is. An outcome unknown returns (it may be running: the deadline decides)."""
    for attempt in range(deps.invoke_retries + 1):
        try:
            deps.limits.runtime.invoke(session_id, payload, wait_until=start_by, new_session=False)
            return
        except RuntimeOutcomeUnknown as exc:
            log.warning("invoke of warm session %s: outcome unknown (%s); the deadline decides", session_id, exc)
            return
        except NoCallBudget as exc:
            raise _WarmDead(str(exc)) from exc
        except RuntimeThrottled as exc:
            backoff = retry_pause(attempt)
            if attempt == deps.invoke_retries or deps.clock.monotonic() + backoff > start_by:
                raise _WarmDead(f"kept throttling: {exc}") from exc
            deps.clock.sleep(backoff)
        except (RuntimeRejected, RuntimeColdStart, RuntimeSessionNotFound) as exc:
            raise _WarmDead(str(exc)) from exc


def _drop_warm(
    message: RolloutMessage, deps: LifecycleDeps, session_id: str, why: str, wait_until: float
) -> Dispatch | None:
    """The warm session cannot run the rollout: the attempt goes back to queued (the same attempt: none is lost)
    with the warm session's stop in its outbox and its slot held until the stop is confirmed; the stop is tried at
    once (`stops.finish_stops`; a failed one stays for the sweeper). None: the caller dispatches a new session;
    STALE when the attempt moved on meanwhile (cancelled: the cancel stops the session)."""
    log.warning(
        "warm session %s of %s/%s is dead (%s): the rollout takes a new session",
        session_id,
        message.batch_id,
        message.rollout_id,
        why[:300],
    )
    deps.metrics.count(WARM_DROPPED)
    try:
        deps.ledger.warm.add_totals(dropped=1)  # `exp.capacity.warm_pool().dropped`
    except Exception:
        log.warning("could not count the dead warm session %s", session_id, exc_info=True)
    after = deps.ledger.rollouts.drop_warm(
        message.ref, session_id, next_session_id=message.session_id, hold_slot_until=stops.hold_until(deps)
    )
    if after is None:
        return Dispatch.STALE
    try:
        stops.finish_stops(after, deps, wait_until)
    except Exception:  # the outbox keeps the stop: the sweeper retries it
        log.warning("stop of dead warm session %s pending", session_id, exc_info=True)
    return None


def _through_the_gate(
    message: RolloutMessage,
    deps: LifecycleDeps,
    start_by: float,
    *,
    budgets: budget.Budgets,
    batch: BatchView,
    held: Held | None,
) -> Dispatch | None:
    """Wait at the slot gate when earlier groups wait or the session rate binds (`_wait_for_slot`), else look at the
    budget. The outcome when the message may not go on (re-sent or held), None when it may."""
    if deps.clock.monotonic() >= start_by:
        return _requeue(message, deps, Dispatch.REQUEUED_NO_TIME)
    if deps.limits.gate.must_queue(admission_key(message)):  # earlier groups wait, or the session rate binds
        return _wait_for_slot(message, deps, start_by, budgets=budgets, batch=batch, held=held)
    if _held_on_budget(message, deps, budgets, batch, held):
        return Dispatch.HELD_BUDGET
    return None


def _held_on_budget(
    message: RolloutMessage, deps: LifecycleDeps, budgets: budget.Budgets, batch: BatchView, held: Held | None
) -> bool:
    """Hold the rollout (`budget.hold`) when its experiment's or its batch's budget is spent, unless its attempt is
    already running (a redelivery to finish, never held)."""
    spent = budgets.spent(batch)
    if spent is None or _running(message, deps):
        return False
    if held is not None:
        held.leave()
    budget.hold(message, deps)
    log.info("rollout %s/%s held: the %s budget is spent", message.batch_id, message.rollout_id, spent)
    return True


def _running(message: RolloutMessage, deps: LifecycleDeps) -> bool:
    """The message's attempt is already dispatched (a redelivery that may have to re-invoke its session)."""
    rec = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    return rec is not None and rec.state == DISPATCHED and rec.attempt == message.attempt


def _existing(message: RolloutMessage, rec: RolloutRecord | None, deps: LifecycleDeps) -> Dispatch | None:
    """Decide about a message whose rollout is not queued for its attempt. None = try the transaction again;
    REINVOKED = invoke the same session again (the first delivery crashed before recording the invoke)."""
    if rec is None:
        return None
    if rec.terminal:
        if rec.outbox:
            outbox.drain(rec, deps)
        return Dispatch.STALE
    if rec.attempt != message.attempt:
        return Dispatch.STALE
    if rec.state == DISPATCHED:
        if rec.invoked_at:
            return Dispatch.DUPLICATE
        dispatched = rec.dispatched_at
        if dispatched is None or (deps.now() - dispatched).total_seconds() >= deps.reinvoke_grace_s:
            return Dispatch.REINVOKED
        return Dispatch.DUPLICATE
    if rec.state == QUEUED:
        return None
    return Dispatch.STALE


def _row_payload(message: RolloutMessage, deps: LifecycleDeps) -> dict[str, Any]:
    if message.payload is not None:
        return dict(message.payload)
    if not message.payload_ref:
        return {}
    bucket, key = ids.parse_s3_uri(message.payload_ref)
    body, size = deps.store.get_bytes(bucket, key, MAX_CLAIM_BYTES)
    if size > MAX_CLAIM_BYTES:
        raise ValueError(f"payload {message.payload_ref} is {size} bytes; the limit is {MAX_CLAIM_BYTES}")
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise ValueError(f"payload {message.payload_ref} is not a JSON object")
    return payload


def admission_key(message: RolloutMessage) -> str:
    """Group order as a string that sorts the same in every process: earlier batches first, then the group's line
    in its file (submission order; 0 for a message without one), a group's rollouts together (then by index)."""
    submitted_us = int(message.submitted_at.timestamp() * 1e6)
    return f"{submitted_us:017d}|{message.batch_id}|{message.line or 0:09d}|{message.input_id}|{message.index:05d}"


def _wait_for_slot(
    message: RolloutMessage,
    deps: LifecycleDeps,
    start_by: float,
    *,
    budgets: budget.Budgets,
    batch: BatchView,
    held: Held | None,
) -> Dispatch | None:
    """Wait (see `limits.SlotGate`: one poller per process, jittered 0.2-1 s, waiters in group order across every
    dispatcher through the admission board) until a slot looks free for this rollout, then look at the budget again,
    read afresh: the rollout whose end freed the slot may have spent it. The outcome when the message may not go
    on (re-sent or held), None when it may."""
    if not deps.limits.gate.wait(start_by, admission_key(message)):
        return _requeue(message, deps, Dispatch.REQUEUED_LIMIT)
    budgets.after_wait()
    if _held_on_budget(message, deps, budgets, batch, held):
        return Dispatch.HELD_BUDGET
    return None


def _requeue(message: RolloutMessage, deps: LifecycleDeps, why: Dispatch) -> Dispatch:
    """Re-send the message as a fresh one (its receive count starts over) so the original can be acknowledged;
    counted in the message, and failed loudly (`throttled`) beyond `max_limit_requeues` or `max_limit_wait_s`."""
    now = deps.now()
    since = message.waiting_since or now
    count = message.limit_requeues + 1
    waited = (now - since).total_seconds()
    if count > deps.config.max_limit_requeues or waited > deps.config.max_limit_wait_s:
        return _throttled(message, deps, f"re-sent {count - 1} times over {waited:.0f} s waiting for limits ({why})")
    fresh = message.model_copy(update={"limit_requeues": count, "waiting_since": since})
    deps.feed.resend(fresh)
    deps.metrics.count(LIMIT_WAITS)
    log.info("rollout %s/%s attempt %s re-sent (%s)", message.batch_id, message.rollout_id, message.attempt, why)
    return why


def _throttled(message: RolloutMessage, deps: LifecycleDeps, error: str) -> Dispatch:
    """The rollout could not start within the configured bounds: Rollout Failed (throttled), never a silent spin."""
    rec = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    if rec is not None and (rec.terminal or rec.attempt != message.attempt or rec.state != QUEUED):
        return Dispatch.STALE
    after = fail_rollout(
        deps,
        message.ref,
        exp_id=message.exp_id,
        from_state=None if rec is None else QUEUED,
        reason=FailureReason.THROTTLED,
        error=error,
        outbox=frozenset({OUTBOX_PUBLISH}),
        session_id=message.session_id if rec is None else None,
        rec=rec,
    )
    if after is None:
        return Dispatch.STALE
    log.warning("rollout %s/%s failed: %s", message.batch_id, message.rollout_id, error)
    outbox.drain(after, deps, owner=True)
    return Dispatch.THROTTLED


def _cancelled(message: RolloutMessage, deps: LifecycleDeps, options: FileOptions) -> Dispatch:
    cancel_rollout(
        exp_id=message.exp_id,
        batch_id=message.batch_id,
        input_id=message.input_id,
        index=message.index,
        deps=deps,
        policy_version=options.policy_version,
    )
    return Dispatch.CANCELLED


def _invoke(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    attempt_token: str | None,
    *,
    wait_until: float,
    reinvoke: bool,
    booked: Callable[[float], None] | None = None,
    session: str | None = None,
) -> Dispatch:
    """InvokeAgentRuntime for a dispatched attempt (slot held), with bounded retries on throttling. Every invoke
    starts by `deps.invoke_start_by(wait_until)`, so it ends inside the invocation. `attempt_token`: read before
    the dispatch transaction (`dispatch_body`); `booked`: called once the session's start is booked; `session`:
    the session the attempt was dispatched into when not its own (a re-invoke of a warm session)."""
    session_id = session or message.session_id
    payload = _agent_payload(message, deps, options, row_payload, session_id=session_id, attempt_token=attempt_token)
    start_by = deps.invoke_start_by(wait_until)
    new_session = not reinvoke
    for attempt in range(deps.invoke_retries + 1):
        try:
            deps.limits.runtime.invoke(
                session_id, payload, wait_until=start_by, new_session=new_session, on_booked=booked
            )
            if new_session:
                deps.metrics.count(NEW_SESSIONS)
            break
        except (RuntimeStartFailed, RuntimeColdStart) as exc:
            if new_session:
                deps.metrics.count(NEW_SESSIONS)  # the microVM was made: it counts and must be stopped
            failed = (
                _start_failed(message, deps, str(exc), wait_until)
                if isinstance(exc, RuntimeStartFailed)
                else _retry_cold_start(message, deps, options, payload, exc, wait_until=wait_until, session=session_id)
            )
            if failed is not None:
                return failed
            break
        except RuntimeOutcomeUnknown as exc:  # it may be running: never re-sent; the deadline decides
            log.warning("invoke of %s: outcome unknown (%s); the deadline decides", session_id, exc)
            break
        except NoCallBudget:  # no call was made: our own budgets had no slot before the invoke had to start
            return _no_budget(message, deps, new_session=new_session)
        except RuntimeThrottled as exc:
            gave_up = _after_throttle(
                message,
                deps,
                options,
                exc,
                tries=attempt,
                start_by=start_by,
                wait_until=wait_until,
                new_session=new_session,
            )
            if gave_up is not None:
                return gave_up
        except RuntimeRejected as exc:
            if not new_session:
                return _cold_start_failed(message, deps, options, str(exc), wait_until)
            return _rejected(message, deps, str(exc))
    if not deps.ledger.rollouts.mark_invoked(message.ref):
        return _stop_late(message, deps, wait_until, session_id)
    deps.metrics.count(DISPATCHED_METRIC)
    return Dispatch.REINVOKED if reinvoke else Dispatch.INVOKED


def _agent_payload(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    row_payload: dict[str, Any],
    *,
    session_id: str,
    attempt_token: str | None,
) -> dict[str, Any]:
    """The request the agent receives in session `session_id` (its `_rollout.session_id`; `attempt_token` that
    session's)."""
    return build_agent_payload(
        row_payload=row_payload,
        rollout_overrides=message.rollout_overrides,
        message=message,
        options=options,
        config=deps.config,
        results_bucket=deps.settings.results_bucket,
        attempt_token=attempt_token,
        session_id=session_id,
    )


def _no_budget(message: RolloutMessage, deps: LifecycleDeps, *, new_session: bool) -> Dispatch:
    """Our own budgets had no slot before the invoke had to start (no call was made): re-sent fresh. An attempt that
    already has a session stays dispatched (the re-sent message invokes the same session); else it is undone."""
    if not new_session:
        return _requeue(message, deps, Dispatch.REQUEUED_NO_TIME)
    return _undo_and_requeue(message, deps, Dispatch.REQUEUED_LIMIT)


def _after_throttle(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    exc: RuntimeThrottled,
    *,
    tries: int,
    start_by: float,
    wait_until: float,
    new_session: bool,
) -> Dispatch | None:
    """ACR throttled the invoke: back off and return None to try again, or give up (the slot freed) once the
    retries or the time to start are spent."""
    backoff = retry_pause(tries)
    if tries < deps.invoke_retries and deps.clock.monotonic() + backoff <= start_by:
        deps.clock.sleep(backoff)
        return None
    log.warning("ACR kept throttling %s: %s; freeing the slot", message.session_id, exc)
    if not new_session:  # a session exists (cold-started): end the attempt, stop it
        return _cold_start_failed(message, deps, options, str(exc), wait_until)
    return _undo_and_requeue(message, deps, Dispatch.REQUEUED_THROTTLED)


def _undo_and_requeue(message: RolloutMessage, deps: LifecycleDeps, why: Dispatch) -> Dispatch:
    """No session was started: give the slot back (dispatched -> queued) and re-send the message fresh; STALE when
    the rollout moved on meanwhile (cancelled, invoked elsewhere)."""
    if deps.ledger.rollouts.undo_dispatch(message.ref):
        return _requeue(message, deps, why)
    return Dispatch.STALE


def _stop_late(message: RolloutMessage, deps: LifecycleDeps, wait_until: float, session_id: str) -> Dispatch:
    """The rollout was cancelled (or already ended) while its session was invoked: no session may outlive its
    rollout. The transition that ended it may have tried the stop before the session existed (NotFound): this stop
    confirms it. One NotFound is no proof (AgentCore has answered it while the session kept running), and a
    Conflict or a throttle is tried again: `stops.stop_session`, as every other stop."""
    confirmed, _ = stops.stop_session(session_id, deps, max(wait_until, deps.clock.monotonic() + 5))
    if not confirmed:  # the sweeper's outbox scan stops it later
        log.warning("session %s invoked after its rollout ended: its stop is filed in the outbox", session_id)
        deps.ledger.outbox.file_stop(message.ref, session_id)
        return Dispatch.STOPPED_LATE  # its slot, if held, is freed with the confirmed stop
    after = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    if after is not None and session_id in after.held_slots:
        at = deps.now()
        charge = costing.session_charge(deps, after, session_id, confirmed=True, at=at)
        deps.ledger.outbox.free_stopped(after, session_id, spent_usd=charge, at=at)
    return Dispatch.STOPPED_LATE


def _retry_cold_start(
    message: RolloutMessage,
    deps: LifecycleDeps,
    options: FileOptions,
    payload: Mapping[str, Any],
    exc: RuntimeColdStart,
    *,
    wait_until: float,
    session: str,
) -> Dispatch | None:
    """Invoke the cold-started session again (same id, after `cold_start_wait_s`; the budget of ACR throttles is
    not spent) up to `cold_start_retries` times. None once it answered (or may have); else the attempt's end."""
    start_by = deps.invoke_start_by(wait_until)
    cold_starts = 0
    while True:
        cold_starts += 1
        if cold_starts > deps.cold_start_retries or deps.clock.monotonic() + deps.cold_start_wait_s > start_by:
            return _cold_start_failed(message, deps, options, f"{exc} ({cold_starts} tries)", wait_until)
        deps.metrics.count(COLD_START_RETRIED)
        deps.clock.sleep(deps.cold_start_wait_s)
        try:
            deps.limits.runtime.invoke(session, payload, wait_until=start_by, new_session=False)
            return None
        except RuntimeColdStart as again:
            exc = again
        except RuntimeStartFailed as failed:
            return _start_failed(message, deps, str(failed), wait_until)
        except RuntimeOutcomeUnknown:
            return None
        except (RuntimeThrottled, RuntimeRejected) as other:
            return _cold_start_failed(message, deps, options, f"{exc}; then {other}", wait_until)


def _cold_start_failed(
    message: RolloutMessage, deps: LifecycleDeps, options: FileOptions, error: str, wait_until: float
) -> Dispatch:
    """The session kept failing to start: end this attempt through the normal path (a new attempt while attempts
    remain, else Rollout Failed `invoke_rejected`), with its session's slot held until its stop is confirmed."""
    rec = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    if rec is None or rec.state != DISPATCHED or rec.attempt != message.attempt:
        return Dispatch.STALE
    retried, after = end_attempt(
        deps,
        rec,
        options.max_attempts,
        reason=FailureReason.INVOKE_REJECTED,
        error=f"the session did not start (cold start) in any of {rec.attempt} attempt(s): {error}",
    )
    if retried and after is None:
        return Dispatch.STALE
    if after is not None and after.outbox:
        outbox.drain(after, deps, owner=True, wait_until=wait_until)
    return Dispatch.COLD_START_FAILED


def _start_failed(message: RolloutMessage, deps: LifecycleDeps, error: str, wait_until: float) -> Dispatch:
    """The session's agent cannot start (its container exited or never became ready): the rollout fails at once as
    `agent_error` with what the runtime said (local mode: the agent process's output), attempts left or not, as an
    agent's own error result would; the session's slot is held until its stop is confirmed."""
    rec = deps.ledger.rollouts.get_rollout(message.batch_id, message.input_id, message.index)
    if rec is None or rec.state != DISPATCHED or rec.attempt != message.attempt:
        return Dispatch.STALE
    last_line = next((line.strip() for line in reversed(error.splitlines()) if line.strip()), error)
    log.warning("the agent of session %s did not start (agent_error): %s", message.session_id, last_line[:300])
    after = fail_rollout(
        deps,
        rec.ref,
        exp_id=rec.exp_id,
        from_state=DISPATCHED,
        reason=FailureReason.AGENT_ERROR,
        error=f"the agent did not start: {error}",
        outbox=frozenset({OUTBOX_PUBLISH}),
        session_id=rec.session_id,
        hold_slot_until=stops.hold_until(deps, rec),
    )
    if after is None:
        return Dispatch.STALE
    if after.outbox:
        outbox.drain(after, deps, owner=True, wait_until=wait_until)
    return Dispatch.START_FAILED


def _rejected(message: RolloutMessage, deps: LifecycleDeps, error: str) -> Dispatch:
    rec = fail_rollout(
        deps,
        message.ref,
        exp_id=message.exp_id,
        from_state=DISPATCHED,
        reason=FailureReason.INVOKE_REJECTED,
        error=f"InvokeAgentRuntime rejected session {message.session_id}: {error}",
        outbox=frozenset({OUTBOX_PUBLISH}),
        session_started=False,  # refused: no session ran
    )
    if rec is None:
        return Dispatch.STALE
    outbox.drain(rec, deps, owner=True)
    return Dispatch.REJECTED
