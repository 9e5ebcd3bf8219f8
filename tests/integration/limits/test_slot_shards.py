"""Session slots on `keys.SESSION_SHARDS` counters: their caps sum to `max_sessions`, a slot given back on any
counter keeps the sum exact, and no sequence of takes and releases lets more than `max_sessions` slots be held."""

from __future__ import annotations

import random

import pytest

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.experiment import ExperimentLedger
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.limits import LimitLedger, free_shard, shard_cap
from rollout_pipeline.limits.slots import SlotShards
from rollout_pipeline.local.resources import ExperimentResources


@pytest.mark.parametrize("max_sessions", [1, 5, 16, 17, 200, 2000])
def test_the_counters_caps_sum_to_max_sessions(max_sessions: int) -> None:
    caps = [shard_cap(max_sessions, i) for i in range(keys.SESSION_SHARDS)]
    assert sum(caps) == max_sessions
    assert max(caps) - min(caps) <= 1


def _take(limits: LimitLedger, max_sessions: int, shard: int) -> bool:
    return limits.table.transact([limits.take_slot(max_sessions, shard)], attempts=1) is None


def _free(limits: LimitLedger, holder: str) -> None:
    assert limits.table.transact([limits.free_slot(holder)], attempts=1) is None


def test_takes_and_releases_on_any_counter_never_hold_more_than_max_sessions(resources: ExperimentResources) -> None:
    limits = Ledger.open(resources.table_name).limits
    max_sessions, rng = 20, random.Random(7)
    held: list[str] = []
    for step in range(400):
        if held and rng.random() < 0.45:
            _free(limits, held.pop(rng.randrange(len(held))))  # given back on the holder's counter, not the taker's
        elif _take(limits, max_sessions, rng.randrange(keys.SESSION_SHARDS)):
            held.append(f"holder-{step}")
        assert limits.in_flight() == len(held) <= max_sessions
    shards = SlotShards(limits, max_sessions)
    while shards.room() > 0 and shards.in_flight() < max_sessions:  # the view finds every free slot
        shard = shards.choose()
        if _take(limits, max_sessions, shard):
            shards.taken(shard)
        else:
            shards.full(shard)
    assert limits.in_flight() == max_sessions


def test_releases_spread_over_the_counters() -> None:
    counts, expected = [0] * keys.SESSION_SHARDS, 100
    for i in range(expected * keys.SESSION_SHARDS):
        counts[free_shard(f"b/q{i}#0@1")] += 1
    assert min(counts) > 0.6 * expected
    assert max(counts) < 1.4 * expected


def test_one_query_reads_the_counters_and_the_admission_board(resources: ExperimentResources) -> None:
    limits = Ledger.open(resources.table_name).limits
    for shard in (0, 5, 5, 31):
        assert _take(limits, 200, shard)
    limits.put_waiting("proc-a", ["k1#0", "k1#1"], now_us=1_000)
    limits.put_waiting("proc-b", ["k2#0"], now_us=2_000)
    limits.schedule("session#0").reserve(not_before_us=0, latest_us=10, interval_us=5)
    ExperimentLedger(limits.table).set_current_policy_version("v1", "2026-01-01T00:00:00Z")
    queries = []
    query = limits.table.query
    limits.table.query = lambda request, **kw: queries.append(request) or query(request, **kw)  # type: ignore[method-assign]
    view = limits.limits_view()
    counts, board = view.counts, view.board
    assert len(queries) == 1
    assert (list(view.paces), view.policy_version) == (["session#0"], "v1")
    assert counts == limits.slot_counts()
    assert (sum(counts), counts[5]) == (4, 2)
    expected = [("proc-a", 1_000, ["k1#0", "k1#1"]), ("proc-b", 2_000, ["k2#0"])]
    assert sorted(board) == sorted(limits.waiting_board()) == expected
    shards = SlotShards(limits, 200)
    queries.clear()
    in_flight, same_board, paces = shards.in_flight_and_board()  # the gate's poll: the schedules come with them
    assert len(queries) == 1
    assert (in_flight, same_board) == (4, board)
    assert paces == {"session#0": limits.schedule("session#0").read().values}  # nothing of POLICY or LAYOUT
    assert paces["session#0"]["tat"] == 5
    assert shards.room() == 200 - 4
