"""Events built from the ledger, and the outbox: the side effects a transition decided, finished idempotently.
After a terminal rollout's events are published, the feed hears of it (`feed.feed.Feed.after_terminal`: the release
window may have room).

A terminal transition sets `outbox` = {publish, stop} on the rollout item in the same transaction; a timed-out
attempt with attempts left sets {enqueue, stop} (the sessions are in `stop_sessions`, their slots in `held_slots`;
later transitions ADD to these sets, so nothing pending is overwritten). `drain` performs them (send the retry
message, publish the rollout's event and, when they are complete, the group's and the batch's, then stop the
sessions, `lifecycle.stops`) and then clears the entry. Whoever finds an entry may drain it: the completion
redelivery, the sweeper, cancel. Every side effect is idempotent: events carry stable `event_id`s, stopping a
stopped session succeeds, a duplicated retry message is absorbed by the dispatch transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout_pipeline import ids
from rollout_pipeline.contracts import INLINE_RESULT_BYTES, read_result, redact_secrets
from rollout_pipeline.details import batch_completion_detail, group_completion_detail, rollout_event, with_members
from rollout_pipeline.feed.messages import QueuedGroup
from rollout_pipeline.ledger.items import BatchView, GroupItem, RolloutRecord
from rollout_pipeline.ledger.outbox import OUTBOX_ENQUEUE, OUTBOX_PUBLISH, OUTBOX_STOP
from rollout_pipeline.lifecycle import oversample
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.metric_names import NOTIFICATION_LATENCY

# ------------------------------------------------------------------------------------------------------ outbox


def retry(rec: RolloutRecord, deps: LifecycleDeps) -> None:
    """Send the rollout's current (queued) attempt back to the rollout queue, its message rebuilt from its group
    item."""
    group = deps.ledger.groups.read_group(rec.batch_id, rec.input_id)
    if group is None:
        raise LookupError(f"group {rec.batch_id}/{rec.input_id} not found for the retry of {rec.index}")
    queued = QueuedGroup.of_item(
        group, exp_id=rec.exp_id or deps.config.name, submitted_at=rec.submitted_at or deps.now()
    )
    deps.feed.retry(queued, rec.index, rec.attempt)


def _inline_result(rec: RolloutRecord, deps: LifecycleDeps, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The result object to inline into `Rollout Completed`, secret fields redacted (`contracts.redact_secrets`)."""
    found = _read_inline_result(rec, deps, result)
    return None if found is None else redact_secrets(found)


def _read_inline_result(
    rec: RolloutRecord, deps: LifecycleDeps, result: dict[str, Any] | None
) -> dict[str, Any] | None:
    if rec.result_size is None or rec.result_size > INLINE_RESULT_BYTES or not rec.result_uri:
        return None
    if result is not None:
        return result
    try:
        bucket, key = ids.parse_s3_uri(rec.result_uri)
        read = read_result(deps.store, bucket, key, max_bytes=INLINE_RESULT_BYTES)
    except Exception:  # the result is optional in the event; its URI is always there
        return None
    return read.outcome.body


def completion_details(
    rec: RolloutRecord, deps: LifecycleDeps, batch: BatchView | None, group: GroupItem | None = None
) -> list[Any]:
    """`Group Completed` / `Batch Completed` that are due after `rec` became terminal (`batch`: its batch's view,
    read after the terminal transaction; `group`: its group, read after it, strongly consistent; read here when not
    given), each claimed for this rollout so that concurrent last rollouts do not both publish it."""
    details: list[Any] = []
    claimant = ids.rollout_id(rec.input_id, rec.index)
    options = batch.options if batch is not None else None
    if group is None:
        group = deps.ledger.groups.read_group(rec.batch_id, rec.input_id)
    if group is not None:
        group = oversample.settle(group, deps)
        group_detail = group_completion_detail(group, options.policy_version if options else rec.policy_version)
        if group_detail is not None and deps.ledger.groups.claim_group_event(rec.batch_id, rec.input_id, claimant):
            details.append(
                with_members(group_detail, list(deps.ledger.rollouts.iter_rollouts(rec.batch_id, rec.input_id)))
            )
    if batch is not None and batch_completion_detail(batch) is not None:
        claimed = deps.ledger.batches.claim_batch_completed(rec.batch_id, claimant)
        batch_detail = batch_completion_detail(claimed) if claimed is not None else None
        if batch_detail is not None:
            details.append(batch_detail)
    return details


def drain(
    rec: RolloutRecord,
    deps: LifecycleDeps,
    *,
    owner: bool = False,
    result: dict[str, Any] | None = None,
    wait_until: float | None = None,
    stops: bool = True,
    on_published: Callable[[GroupItem | None, BatchView | None], None] | None = None,
) -> bool:
    """Perform the rollout's pending side effects, then clear its outbox entry.

    `owner=True`: the caller made the transition that set the entry (it holds the entry's lease). Anyone else
    first claims the entry; if another worker holds it, nothing is done and False is returned.
    Order: the retry message, the events, and only then the stops (`lifecycle.stops`: best-effort, they never
    hold up a result; with `stops=False` they are left for the caller's second pass, `stops.finish_stops`).
    `on_published`: called with the rollout's group and batch once its events are published, before the stops
    (`lifecycle.outbox`: an oversampled group's surplus); if it raises, the entry stays, as for a failed publish.
    A sent retry message is recorded in the entry before the stops; a publish only by the stops' own writes
    (no write of its own), so a crash after the publish and before them publishes again, same `event_id`s.
    Raises (PublishError, AWS errors) when the retry or the events failed: the entry stays (its lease given back)
    and is drained again by a redelivery or the sweeper.
    """
    from rollout_pipeline.lifecycle import stops as stopping

    if not rec.outbox:
        return True
    if not owner and not deps.ledger.outbox.claim_outbox(rec):
        return False
    done: frozenset[str] = frozenset()
    try:
        if OUTBOX_ENQUEUE in rec.outbox and not rec.terminal:  # a rollout that ended meanwhile needs no retry
            retry(rec, deps)
        done = rec.outbox & {OUTBOX_ENQUEUE}
        if OUTBOX_PUBLISH in rec.outbox:
            notified_at = deps.now()
            inline = _inline_result(rec, deps, result)
            group = oversample.claim(rec, deps.ledger.groups.read_group(rec.batch_id, rec.input_id), deps)
            details: list[Any] = [
                rollout_event(rec, notified_at=notified_at, result=inline, prices=deps.prices, group=group)
            ]
            batch = deps.ledger.batches.read_batch(rec.batch_id)
            details.extend(completion_details(rec, deps, batch, group))
            deps.publisher.publish(details)
            deps.feed.after_terminal(batch)  # the release window may have room now
            if on_published is not None:
                on_published(group, batch)
            finished = rec.finished_at
            if finished is not None and rec.result_uri:
                deps.metrics.sample(NOTIFICATION_LATENCY, max(0.0, (notified_at - finished).total_seconds() * 1000))
        done = rec.outbox & {OUTBOX_ENQUEUE, OUTBOX_PUBLISH}
        if OUTBOX_STOP in rec.outbox and rec.stop_sessions:
            if OUTBOX_ENQUEUE in done:  # recorded at once: a retry message sent again could invoke again
                deps.ledger.outbox.outbox_done(rec, done)
            # A publish is recorded by the stops' own write (`finish_stops`: the write that frees the slot, or the
            # failed stop's re-filing), or by `return_outbox` if they raise.
            if stops:
                stopping.finish_stops(rec, deps, wait_until)
            return True
        deps.ledger.outbox.clear_outbox(rec)
    except BaseException:
        deps.ledger.outbox.return_outbox(rec, done)
        raise
    return True
