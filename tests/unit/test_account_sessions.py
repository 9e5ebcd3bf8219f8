"""The `ActiveSessionsNearQuota` alarm's figure: every live experiment's sessions on the account pool against the
account's active-session quota (one experiment's sessions against the account's quota said nothing of the others)."""

from __future__ import annotations

from datetime import UTC, datetime

from rollout_pipeline.ledger.pool import Member, PoolState
from rollout_pipeline.lifecycle.sweeper import LIVE_MEMBER_S, account_sessions_percent
from rollout_pipeline.quotas import AccountQuotas, PoolSettings

NOW = datetime(2026, 11, 24, tzinfo=UTC)


def test_every_live_experiment_counts_against_the_accounts_quota() -> None:
    now = NOW.timestamp()
    state = PoolState(
        settings=PoolSettings(quotas=AccountQuotas(active_sessions=1000)),
        members={
            "a": Member("a", heartbeat=now - 10, in_flight=300),
            "b": Member("b", heartbeat=now - 70, in_flight=500),
            "gone": Member("gone", heartbeat=now - LIVE_MEMBER_S - 1, in_flight=900),  # left without leaving
        },
    )
    assert account_sessions_percent(state, NOW) == 80.0


def test_an_empty_pool_holds_no_session() -> None:
    assert account_sessions_percent(PoolState(), NOW) == 0.0
