"""The batch view (batch item + control item + counter shards) and the typed items parsed at the table boundary."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.details import batch_completion_detail
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.batches import merge_batch_items
from rollout_pipeline.ledger.items import BatchState, BatchView, GroupItem


def _item(sk: str, **attrs: dict[str, str]) -> dict[str, Any]:
    return {keys.PK: {"S": "B#b1"}, keys.SK: {"S": sk}, **attrs}


def _shard(shard: int, **counts: str) -> dict[str, Any]:
    return _item(f"{keys.COUNT_PREFIX}{shard:02d}", **{k: {"N": v} for k, v in counts.items()})


BASE = _item(
    keys.BATCH_SK,
    exp_id={"S": "e"},
    batch_id={"S": "b1"},
    status={"S": "accepted"},
    rollouts_total={"N": "3"},
    created_at={"S": "2026-01-01T00:00:00+00:00"},
)


def test_the_view_sums_counter_shards_exactly() -> None:
    view = merge_batch_items(
        [
            BASE,
            _shard(0, terminal="1", succeeded="1", reward_sum="0.1", reward_sumsq="0.01", reward_count="1"),
            _shard(7, terminal="1", succeeded="1", reward_sum="0.1", reward_sumsq="0.01", reward_count="1"),
            _shard(15, terminal="1", succeeded="1", reward_sum="0.1", reward_sumsq="0.01", reward_count="1"),
        ]
    )
    assert view is not None
    assert view.terminal == 3
    assert view.reward_sum == 0.3  # summed as decimals, as DynamoDB's own ADD does (floats give 0.30...04)
    assert view.failed == 0


def test_the_view_takes_the_cancel_flag_from_the_control_item_and_ignores_other_items() -> None:
    control = _item(keys.CONTROL_SK, status={"S": "cancelled"}, cancelled_at={"S": "2026-01-01T00:01:00+00:00"})
    group = _item(f"{keys.GROUP_PREFIX}q1", terminal={"N": "9"})
    view = merge_batch_items([BASE, control, _shard(3, terminal="2", failed="2", failed_cancelled="2"), group])
    assert view is not None
    assert view.cancelled_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert (view.terminal, view.failed_by_reason) == (2, {"cancelled": 2})
    assert merge_batch_items([control, _shard(0, terminal="1")]) is None, "no batch item: no batch"


def test_counters_on_a_batch_item_written_before_the_shards_still_count() -> None:
    legacy = {**BASE, "terminal": {"N": "2"}, "succeeded": {"N": "2"}}
    batch = merge_batch_items([legacy, _shard(1, terminal="1", failed="1", failed_timeout="1")])
    assert batch is not None
    assert (batch.terminal, batch.succeeded, batch.failed) == (3, 2, 1)
    assert batch.complete
    assert batch.failed_by_reason == {"timeout": 1}


def test_a_batch_view_is_parsed_once_from_the_typed_items() -> None:
    typed = merge_batch_items([BASE, _shard(0, terminal="2")])
    assert typed is not None
    assert typed.status is BatchState.ACCEPTED
    assert typed.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert (typed.rollouts_total, typed.terminal, typed.complete) == (3, 2, False)
    assert batch_completion_detail(typed) is None
    assert BatchView.of({**BASE, "status": {"S": "ingesting"}, "terminal": {"N": "3"}}).complete is False


def test_group_items_parse_payload_and_outcomes() -> None:
    group = GroupItem.of(
        {
            "exp_id": {"S": "e"},
            "batch_id": {"S": "b1"},
            "input_id": {"S": "q1"},
            "line": {"N": "4"},
            "group_size": {"N": "2"},
            "payload": {"S": '{"p": 1}'},
            "overrides": {"S": "{}"},
            "terminal": {"N": "2"},
            "rewards": {"M": {"0": {"N": "0.5"}}},
            "failures": {"M": {"1": {"S": "timeout"}}},
        }
    )
    assert (group.line, group.group_size, group.complete) == (4, 2, True)
    assert group.payload == {"p": 1}
    assert (group.rewards, group.failures) == ({0: 0.5}, {1: FailureReason.TIMEOUT})


def test_a_rollout_record_is_typed_at_the_table_boundary() -> None:
    from rollout_pipeline.ledger.items import RolloutRecord, RolloutState

    rec = RolloutRecord.of(
        {
            "batch_id": {"S": "b1"},
            "input_id": {"S": "i"},
            "index": {"N": "2"},
            "state": {"S": "dispatched"},
            "attempt": {"N": "1"},
            "submitted_at": {"S": "2026-01-01T00:00:00Z"},
            "dispatched_at": {"S": "2026-01-01T00:00:05+00:00"},
        }
    )
    assert rec.state is RolloutState.DISPATCHED
    assert rec.submitted_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert rec.dispatched_at == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert rec.invoked_at is None
    assert rec.finished_at is None
    assert not rec.terminal


def test_a_rollout_summary_reads_whole_and_projected_items() -> None:
    from rollout_pipeline.ledger.items import RolloutState, RolloutSummary

    whole = RolloutSummary.of(
        {
            "state": {"S": "failed"},
            "input_id": {"S": "q1"},
            "index": {"N": "3"},
            "reason": {"S": FailureReason.TIMEOUT.value},
        }
    )
    assert whole == RolloutSummary(RolloutState.FAILED, "q1", 3, None, FailureReason.TIMEOUT.value)
    assert RolloutSummary.of({"state": {"S": "dispatched"}}) == RolloutSummary(RolloutState.DISPATCHED)
    assert RolloutSummary.of({"reward": {"N": "0.5"}, "state": {"S": "succeeded"}}).reward == 0.5


def test_a_rollout_in_a_warm_session_is_priced_from_the_sessions_warm_start() -> None:
    """AgentCore bills the session from its start: a warm session's began at its warm-up, before the dispatch."""
    from rollout_pipeline.ledger.items import RolloutRecord

    item = {
        "batch_id": {"S": "b1"},
        "input_id": {"S": "i"},
        "index": {"N": "0"},
        "state": {"S": "dispatched"},
        "attempt": {"N": "1"},
        "dispatched_at": {"S": "2026-01-01T00:01:00+00:00"},
    }
    cold = RolloutRecord.of(item)
    warm = RolloutRecord.of({**item, "session_warmed_at": {"N": str(datetime(2026, 1, 1, tzinfo=UTC).timestamp())}})
    assert cold.spans[0].started_at == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert warm.spans[0].started_at == datetime(2026, 1, 1, tzinfo=UTC)


def test_the_attempt_a_warm_session_ran_is_told_from_the_rollout_item() -> None:
    """A warm session's id names no attempt: the current attempt when it is the current session, else the earlier
    attempt whose session is neither stopped nor its own (a warm attempt retried in a new session)."""
    from rollout_pipeline import ids
    from rollout_pipeline.ledger.items import RolloutRecord

    warm = ids.warm_session_id("exp", "0123abcd")
    item = {
        "exp_id": {"S": "exp"},
        "batch_id": {"S": "b1"},
        "input_id": {"S": "i"},
        "index": {"N": "0"},
        "state": {"S": "succeeded"},
        "attempt": {"N": "1"},
        "session_id": {"S": warm},
        "dispatched_at": {"S": "2026-01-01T00:01:00+00:00"},
    }
    assert RolloutRecord.of(item).attempt_of(warm) == 1
    own_2 = ids.session_id("exp", "b1", "i", 0, 2)
    retried = {
        **item,
        "state": {"S": "dispatched"},
        "attempt": {"N": "2"},
        "session_id": {"S": own_2},
        "s1_start": {"S": "2026-01-01T00:01:00+00:00"},
        "stop_sessions": {"SS": [warm]},
    }
    rec = RolloutRecord.of(retried)
    assert (rec.attempt_of(warm), rec.attempt_of(own_2)) == (1, 2)
    assert RolloutRecord.of({**retried, "s1_stop": {"N": "1767225700000"}}).attempt_of(warm) is None
