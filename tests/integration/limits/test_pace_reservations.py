"""A paced budget's reservation (`ledger.pace.reserve`, GCRA on one item): the slot it gives in each case,
and the writes it costs. Under saturation the schedule is always ahead, so a caller that last saw it ahead tries
the "next free time" write first: one conditional write per reservation instead of a failed one and a second."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_pipeline.ledger import pace
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.limits import LimitLedger
from rollout_pipeline.local.resources import ExperimentResources

pytestmark = pytest.mark.timing

INTERVAL_US = 240_000
NOW_US = 1_800_000_000_000_000


def _counting(ledger: LimitLedger) -> list[str]:
    """Every request the ledger makes from now on: "update" (a conditional write) or "get" (a read)."""
    requests: list[str] = []
    for method, kind in (("update", "update"), ("update_or_current", "update"), ("get", "get")):
        original = getattr(ledger.table, method)

        def counted(*args: Any, _original: Any = original, _kind: str = kind, **kwargs: Any) -> Any:
            requests.append(_kind)
            return _original(*args, **kwargs)

        setattr(ledger.table, method, counted)
    return requests


def _reserve(ledger: LimitLedger, now_us: int, *, busy_first: bool, ahead_us: int = 5_000_000) -> Any:
    """(the start reserved or None, the schedule's `tat` as the write left or found it)."""
    answer = ledger.schedule("session#0").reserve(
        not_before_us=now_us, latest_us=now_us + ahead_us, interval_us=INTERVAL_US, busy_first=busy_first
    )
    return answer.slot_us, pace.PaceView.of(answer.values).tat_us


def test_either_order_gives_the_same_slots(resources: ExperimentResources) -> None:
    for busy_first in (False, True):
        ledger = Ledger.open(resources.table_name).limits
        budget_now = NOW_US + (10_000_000 if busy_first else 0)  # a fresh schedule for each order
        assert _reserve(ledger, budget_now, busy_first=busy_first) == (budget_now, budget_now + INTERVAL_US)
        second = _reserve(ledger, budget_now, busy_first=busy_first)  # busy now: the next free time
        assert second == (budget_now + INTERVAL_US, budget_now + 2 * INTERVAL_US)
        later = budget_now + 3 * INTERVAL_US  # free again at a later time
        assert _reserve(ledger, later, busy_first=busy_first) == (later, later + INTERVAL_US)


def test_a_busy_schedule_costs_one_write_when_expected(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name).limits
    writes = _counting(ledger)
    _reserve(ledger, NOW_US, busy_first=False)  # the schedule now runs ahead of NOW_US
    writes.clear()
    _reserve(ledger, NOW_US, busy_first=False)
    assert len(writes) == 2  # "free at now" fails, then "next free time"
    writes.clear()
    _reserve(ledger, NOW_US, busy_first=True)
    assert len(writes) == 1


def test_a_full_schedule_gives_no_slot_and_says_when_it_frees(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name).limits
    for _ in range(3):
        _reserve(ledger, NOW_US, busy_first=True)
    slot, tat = _reserve(ledger, NOW_US, busy_first=True, ahead_us=INTERVAL_US)
    assert slot is None
    assert tat == NOW_US + 3 * INTERVAL_US


def test_a_full_schedule_costs_one_write_and_no_read(resources: ExperimentResources) -> None:
    """The failed write answers the schedule as it was: no read, and no second write that cannot succeed."""
    ledger = Ledger.open(resources.table_name).limits
    for _ in range(3):
        _reserve(ledger, NOW_US, busy_first=True)
    for busy_first in (True, False):
        requests = _counting(ledger)
        slot, tat = _reserve(ledger, NOW_US, busy_first=busy_first, ahead_us=INTERVAL_US)
        assert (slot, tat) == (None, NOW_US + 3 * INTERVAL_US)
        assert requests == ["update"]
        ledger = Ledger.open(resources.table_name).limits


def test_a_wrong_guess_costs_two_writes_and_no_read(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name).limits
    requests = _counting(ledger)
    assert _reserve(ledger, NOW_US, busy_first=True) == (NOW_US, NOW_US + INTERVAL_US)  # a fresh schedule is free
    assert requests == ["update", "update"]
