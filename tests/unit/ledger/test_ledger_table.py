"""The ledger's one table gateway: its TTL rule and its one conflict-retry policy for transactions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_pipeline.ledger import retry
from rollout_pipeline.ledger.retry import LedgerError
from rollout_pipeline.ledger.table import LedgerTable
from tests.doubles import ManualClock


class _Cancelled(Exception):
    def __init__(self, *codes: str) -> None:
        super().__init__("cancelled")
        self.response = {"CancellationReasons": [{"Code": code} for code in codes]}


class _Conflict(Exception):
    pass


class _Exceptions:
    TransactionCanceledException = _Cancelled
    TransactionConflictException = _Conflict


class _Client:
    """Fails `transact_write_items` with the given errors, in order, then commits."""

    exceptions = _Exceptions

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def transact_write_items(self, **_kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {}


def _table(client: _Client) -> LedgerTable:
    return LedgerTable("t", client, sleep=lambda _s: None)


def test_transient_cancellations_and_conflicts_are_retried_then_commit() -> None:
    client = _Client(_Cancelled("None", "TransactionConflict"), _Conflict(), _Cancelled("ThrottlingError", "None"))
    before = retry.stats.transactions
    assert _table(client).transact([{"Put": {}}]) is None
    assert client.calls == 4
    assert retry.stats.transactions - before == 3


def test_a_failed_condition_is_returned_at_once_with_its_reasons() -> None:
    client = _Client(_Cancelled("TransactionConflict", "ConditionalCheckFailed"))
    reasons = _table(client).transact([{"Put": {}}, {"Put": {}}])
    assert reasons == [{"Code": "TransactionConflict"}, {"Code": "ConditionalCheckFailed"}]
    assert client.calls == 1


def test_a_transaction_that_keeps_conflicting_raises_after_the_attempts() -> None:
    client = _Client(*[_Conflict() for _ in range(5)])
    with pytest.raises(LedgerError):
        _table(client).transact([{"Put": {}}], attempts=3)
    assert client.calls == 3


def test_one_ttl_rule_and_the_clock_it_is_given() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    table = LedgerTable("t", object(), ttl_days=2, clock=ManualClock(now.timestamp()))
    assert table.expires_at() == int(now.timestamp()) + 2 * 86_400
    assert table.epoch() == int(now.timestamp())
    assert table.now_iso() == "2026-01-01T00:00:00+00:00"
