"""One clock: every time and TTL the ledger writes comes from the clock it was given (the lifecycle's), and the
rollout transitions are keyed by value (`ids.AttemptRef`)."""

from __future__ import annotations

from datetime import UTC, datetime

from rollout_pipeline import ids
from rollout_pipeline.contracts import FileOptions, RolloutMessage
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import RolloutRecord, RolloutState, Terminal
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH
from rollout_pipeline.ledger.rollouts import DISPATCHED, DispatchStart
from rollout_pipeline.local.resources import ExperimentResources
from tests.doubles import ManualClock
from tests.integration.lifecycle_support import ledger_item, seed_batch

#: Far from the wall clock, so a time taken from anything but the ledger's clock shows.
FIXED = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
TTL_DAYS = 3


def test_the_ledger_stamps_times_and_ttls_with_its_clock(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name, ttl_days=TTL_DAYS, clock=ManualClock(FIXED.timestamp()))
    epoch, ttl = int(FIXED.timestamp()), int(FIXED.timestamp()) + TTL_DAYS * 86_400
    options = FileOptions.defaults(resources.config)
    created = ledger.batches.create_batch(exp_id=resources.config.name, batch_id="b-clock", options=options, source="x")
    assert created is not None
    assert (created.created_at, ledger_item(resources, keys.batch_key("b-clock"))["expires_at"]) == (FIXED, ttl)

    (message, *_) = seed_batch(resources, batch_id="b1", inputs={"q": {"p": 1}}, group_size=1)
    ref = message.ref
    assert (
        ledger.rollouts.begin_dispatch(
            exp_id=message.exp_id,
            batch_id=ref.batch_id,
            input_id=ref.input_id,
            index=ref.index,
            attempt=ref.attempt,
            session_id=message.session_id,
            submitted_at="2026-01-01T00:00:00+00:00",
            deadline=epoch + 60,
            max_sessions=10,
            policy_version=None,
        )
        is DispatchStart.STARTED
    )
    assert ledger.rollouts.mark_invoked(ref)
    dispatched = ledger.rollouts.get_rollout(ref.batch_id, ref.input_id, ref.index)
    assert dispatched is not None
    assert (dispatched.dispatched_at, dispatched.invoked_at, dispatched.ref) == (FIXED, FIXED, ref)

    outcome = Terminal(state=RolloutState.SUCCEEDED, finished_at=datetime(2026, 1, 1, tzinfo=UTC), reward=1.0)
    assert ledger.rollouts.finish(
        ref, exp_id=message.exp_id, from_state=DISPATCHED, outcome=outcome, outbox=frozenset({OUTBOX_PUBLISH})
    )
    item = ledger_item(resources, keys.rollout_key(ref.batch_id, ref.input_id, ref.index))
    assert (item["expires_at"], item[keys.OUTBOX_SK]) == (ttl, epoch), "TTL and outbox time from the ledger's clock"
    assert item["finished_at"] == "2026-01-01T00:00:00+00:00", "the outcome's own time (the result's), a datetime"


def test_one_attempt_ref_from_a_message_a_record_and_a_result_key() -> None:
    sid = ids.session_id("exp-1", "b1", "q", 2, 3)
    message = RolloutMessage(
        exp_id="exp-1", batch_id="b1", input_id="q", index=2, attempt=3, group_size=4, submitted_at=FIXED
    )
    record = RolloutRecord(batch_id="b1", input_id="q", index=2, state=RolloutState.DISPATCHED, attempt=3)
    result = ids.parse_result_key(ids.result_key("exp-1", "q", sid))
    assert message.ref == record.ref == ids.AttemptRef("b1", "q", 2, 3)
    assert isinstance(result, ids.AttemptRef)
    assert (result.batch_id, result.input_id, result.index, result.attempt) == ("b1", "q", 2, 3)
    assert (result.exp_id, result.session_id) == ("exp-1", sid)
