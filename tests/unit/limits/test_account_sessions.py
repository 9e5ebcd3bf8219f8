"""The `ActiveSessionsNearQuota` alarm's figure: every live experiment's sessions on the account pool against the
account's active-session quota (one experiment's sessions against the account's quota said nothing of the others)."""

from __future__ import annotations

from rollout_pipeline.ledger.pool import MemberEntry
from rollout_pipeline.limits.shares import ACTIVE_LIVE_S, account_sessions_percent

NOW = 1_795_000_000.0


def test_every_live_experiment_counts_against_the_accounts_quota() -> None:
    members = [
        MemberEntry("a", renewed_at=NOW - 10, in_flight=300),
        MemberEntry("b", renewed_at=NOW - 70, in_flight=500),
        MemberEntry("gone", renewed_at=NOW - ACTIVE_LIVE_S - 1, in_flight=900),  # left without leaving
    ]
    assert account_sessions_percent(members, 1000, NOW) == 80.0


def test_an_empty_pool_holds_no_session() -> None:
    assert account_sessions_percent([], 1000, NOW) == 0.0
