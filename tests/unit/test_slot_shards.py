"""Session slots on `keys.SESSION_SHARDS` counters: their caps sum to `max_sessions`, a slot given back on any
counter keeps the sum exact, and no sequence of takes and releases lets more than `max_sessions` slots be held."""

from __future__ import annotations

import random

import pytest

from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.limits import LimitLedger, release_shard, shard_cap
from rollout_pipeline.lifecycle.limits import SlotShards
from rollout_pipeline.local.resources import ExperimentResources


@pytest.mark.parametrize("max_sessions", [1, 5, 16, 17, 200, 2000])
def test_the_counters_caps_sum_to_max_sessions(max_sessions: int) -> None:
    caps = [shard_cap(max_sessions, i) for i in range(keys.SESSION_SHARDS)]
    assert sum(caps) == max_sessions
    assert max(caps) - min(caps) <= 1


def _take(limits: LimitLedger, max_sessions: int, shard: int) -> bool:
    return limits.table.transact([limits.take_slot(max_sessions, shard)], attempts=1) is None


def _release(limits: LimitLedger, holder: str) -> None:
    assert limits.table.transact([limits.release_slot(holder)], attempts=1) is None


def test_takes_and_releases_on_any_counter_never_hold_more_than_max_sessions(resources: ExperimentResources) -> None:
    limits = Ledger.open(resources.table_name).limits
    max_sessions, rng = 20, random.Random(7)
    held: list[str] = []
    for step in range(400):
        if held and rng.random() < 0.45:
            _release(limits, held.pop(rng.randrange(len(held))))  # given back on the holder's counter, not the taker's
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
        counts[release_shard(f"b/q{i}#0@1")] += 1
    assert min(counts) > 0.6 * expected
    assert max(counts) < 1.4 * expected
