"""Stopping sessions: best-effort, bounded, never blocking a recorded result, never leaking a session slot.

A transition that ends an attempt with a live session keeps the attempt's session slot (`held_slots`) and puts the
session in the outbox (`stop`, `stop_sessions`) instead of stopping it first. `finish_stops` then stops each
session through the limiter:

- a confirmed stop frees the slot (`OutboxLedger.free_stopped`, once);
- ResourceNotFound is confirmed only by a second NotFound (AgentCore has answered it while a session kept running);
- a throttled, conflicting or failed stop counts `StopFailed` and is tried again at once, a few times
  (`PROMPT_RETRY_S`, within the caller's wait budget): AgentCore's failed stops are mostly transient, and a
  session left running holds a slot and costs money. Only then does the entry come back later (backoff; at most
  `STOP_TRIES` passes), through the sweeper's outbox scan;
- once `held_until` has passed (the session's `max_lifetime_s` since it was started, plus a minute), AgentCore
  has ended the session anyway: the slot is freed without a stop. Not the idle timeout: a session whose agent
  is still busy (a rollout past its deadline keeps working) is not idle, and lives until its maximum lifetime.

So every slot is freed by a confirmed stop or by the session's maximum lifetime, and nothing waits for a stop but
the slot. A session alive past its attempt's deadline plus `session_grace_s` is a runaway: counted once
(`SessionsOverdue`) and stopped on every pass until a stop is confirmed (`finish_stops`). Each freed slot ADDs its
session's cost to the experiment's spend (`lifecycle.costing`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Final

from rollout_pipeline import ids
from rollout_pipeline.costs import SessionSpan
from rollout_pipeline.ledger.items import RolloutRecord
from rollout_pipeline.lifecycle import costing
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.metric_names import SESSIONS_OVERDUE, STOP_FAILED, STOPS_PENDING
from rollout_pipeline.ports import RuntimeRejected, RuntimeSessionNotFound, RuntimeThrottled

log = logging.getLogger(__name__)

#: Stop calls per outbox entry before it only waits for the session's end (`held_until`).
STOP_TRIES: Final = 6
#: Pauses before the prompt re-tries of a failed stop within one pass (each pass: 1 + len(...) calls at most).
PROMPT_RETRY_S: Final = (0.2, 0.5)
#: Backoff between passes of a failed stop: 2, 4, 8, 16, 32, 60 s.
STOP_BACKOFF_S: Final = 2
STOP_BACKOFF_MAX_S: Final = 60


#: Kept beyond AgentCore's maximum session lifetime before a slot is freed without a confirmed stop.
HOLD_MARGIN_S: Final = 60


def hold_until(deps: LifecycleDeps, rec: RolloutRecord | None = None) -> int:
    """Epoch second until which an ended attempt's slot is held without a confirmed stop: the latest moment its
    session can still run. AgentCore ends a session at `max_lifetime_s` after its start whether it is busy or
    idle (an idle one earlier, at the idle timeout), so: the session's start (`rec.invoked_at`, recorded just
    after the invoke; now when unknown: the session, if any, started before now) + `max_lifetime_s` + a minute."""
    started = rec.invoked_at if rec is not None and rec.invoked_at is not None else deps.now()
    return int(started.timestamp()) + deps.config.max_lifetime_s + HOLD_MARGIN_S


def _own_spans(rec: RolloutRecord) -> dict[str, SessionSpan]:
    """The sessions of `rec` whose id names their attempt (every session but a warm one), by session id."""
    by_attempt = {span.attempt: span for span in rec.spans}
    sessions = rec.stop_sessions | rec.held_slots
    return {sid: by_attempt[n] for sid in sessions if (n := ids.session_attempt(sid)) is not None and n in by_attempt}


def overdue_at(span: SessionSpan | None, deps: LifecycleDeps) -> int | None:
    """When (epoch s) the session of `span` becomes overdue: its attempt's deadline plus `session_grace_s`; None
    when its deadline is unknown."""
    if span is None or span.due_at is None:
        return None
    return int((span.due_at + timedelta(seconds=deps.config.session_grace_s)).timestamp())


def overdue(span: SessionSpan | None, deps: LifecycleDeps, now: datetime) -> bool:
    """Whether the session of `span` (whose stop is pending) is alive past its attempt's deadline plus
    `session_grace_s`: a runaway (its stop failed, or its result came late) the sweeper keeps stopping."""
    at = overdue_at(span, deps)
    return at is not None and now.timestamp() > at


def _past_lifetime(span: SessionSpan | None, deps: LifecycleDeps, now: datetime) -> bool:
    """The session has certainly ended: AgentCore ends every session `max_lifetime_s` after its start."""
    if span is None:
        return False
    return now > span.started_at + timedelta(seconds=deps.config.max_lifetime_s + HOLD_MARGIN_S)


def finish_stops(rec: RolloutRecord, deps: LifecycleDeps, wait_until: float | None = None) -> bool:
    """Stop every session in `rec.stop_sessions` (the caller holds the outbox entry and has done its other
    actions). True when none is left: the entry is cleared by the write that frees the last slot
    (`free_stopped(clear_entry=True)`). Else the entry is re-filed for a later pass, its other actions taken
    out of it in the same write (`note_stop_failed`).

    Each freed session's cost (`costing.session_charge`: to its confirmed stop, or to its bound when the pipeline
    stops waiting for one) is ADDed to the experiment's spend with its slot. The runaway guard: a session alive
    past its attempt's deadline plus `session_grace_s` is counted once (`SessionsOverdue`) and stopped on every
    pass (at most a minute apart) until a stop is confirmed or its maximum lifetime has surely ended it, whatever
    `STOP_TRIES` says."""
    moment = deps.now()
    now = int(moment.timestamp())
    reaped = rec.held_until is not None and now >= rec.held_until
    not_found: list[str] = []
    sessions = sorted(rec.stop_sessions)
    spans = _own_spans(rec)
    late = {sid for sid in sessions if overdue(spans.get(sid), deps, moment)}
    if late - rec.overdue:
        deps.metrics.count(SESSIONS_OVERDUE, len(late - rec.overdue))
    left: list[str] = []
    cleared = False
    for position, session_id in enumerate(sessions):
        confirmed = False
        ended = reaped or _past_lifetime(spans.get(session_id), deps, moment)
        if not ended and (rec.stop_tries < STOP_TRIES or session_id in late):
            confirmed, seen_not_found = _stop(session_id, rec, deps, wait_until)
            if seen_not_found and not confirmed:
                not_found.append(session_id)
        given_up = rec.stop_tries >= STOP_TRIES and session_id not in rec.held_slots and session_id not in late
        if confirmed or ended or given_up:
            last = not left and position == len(sessions) - 1  # nothing else pending: the entry goes too
            at = deps.now()
            charge = costing.session_charge(deps, rec, session_id, confirmed=confirmed, at=at)
            deps.ledger.outbox.free_stopped(
                rec, session_id, clear_entry=last, confirmed=confirmed, spent_usd=charge, at=at
            )
            cleared = last
        else:
            left.append(session_id)
    if not left:
        return cleared or deps.ledger.outbox.clear_outbox(rec) or True
    deps.metrics.sample(STOPS_PENDING, len(left))
    backoff = min(STOP_BACKOFF_S * 2**rec.stop_tries, STOP_BACKOFF_MAX_S)
    if any(sid in late for sid in left):
        next_epoch = now + backoff  # the runaway guard: never only waiting for the session's end
    elif rec.stop_tries + 1 >= STOP_TRIES and rec.held_until is not None:
        # no more calls: AgentCore ends the session by then; unless it becomes overdue first (the runaway guard)
        moments = [due for sid in left if (due := overdue_at(spans.get(sid), deps)) is not None]
        next_epoch = min([rec.held_until, *(moment + 1 for moment in moments)])
    else:
        next_epoch = now + backoff
    # The sweeper drains entries older than `outbox_age_s`: file it so that it is due at `next_epoch`.
    deps.ledger.outbox.note_stop_failed(
        rec,
        next_epoch=next_epoch - int(deps.outbox_age_s),
        not_found=not_found,
        overdue=sorted(late & set(left) - rec.overdue),
    )
    return False


def _stop(session_id: str, rec: RolloutRecord, deps: LifecycleDeps, wait_until: float | None) -> tuple[bool, bool]:
    """One pass of stops of `session_id` for outbox entry `rec` (`stop_session`, its earlier NotFound kept)."""
    return stop_session(
        session_id, deps, wait_until, not_found_before=session_id in rec.stop_not_found, tries=rec.stop_tries + 1
    )


def stop_session(
    session_id: str, deps: LifecycleDeps, wait_until: float | None, *, not_found_before: bool = False, tries: int = 1
) -> tuple[bool, bool]:
    """One pass of stops of `session_id`: the first call and up to `len(PROMPT_RETRY_S)` prompt re-tries while
    the wait budget allows; a NotFound confirms the stop only after an earlier one (`not_found_before` or in this
    pass). Returns (confirmed, answered NotFound at least once)."""
    not_found = not_found_before
    for pause in (0.0, *PROMPT_RETRY_S):
        if pause:
            if wait_until is not None and deps.clock.monotonic() + pause >= wait_until:
                break
            deps.clock.sleep(pause)
        try:
            deps.limits.runtime.stop(session_id, wait_until)
            return True, not_found
        except RuntimeSessionNotFound:
            if not_found:  # a second NotFound, some time after the first: it is gone
                return True, True
            not_found = True
        except (RuntimeThrottled, RuntimeRejected) as exc:
            deps.metrics.count(STOP_FAILED)
            log.info("stop of session %s failed (pass %s): %s", session_id, tries, exc)
    return False, not_found
