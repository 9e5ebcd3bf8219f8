"""The account pool's table as the pool stack and local mode create it: keys and the write of its settings. Plain data
only (`stacks/pool_stack.py` imports it); the items' reads and writes are `ledger.pool`."""

from __future__ import annotations

from typing import Any, Final

from rollout_pipeline.ledger.attributes import plain_values
from rollout_pipeline.ledger.keys import PK, SK
from rollout_pipeline.ledger.schema import create_table_kwargs
from rollout_pipeline.quotas import PoolSettings

POOL_PK: Final = "POOL"
POOL_SK: Final = "STATE"


def pool_key() -> dict[str, dict[str, str]]:
    """The account's schedule item (settings, schedule, backoff, learned caps)."""
    return {PK: {"S": POOL_PK}, SK: {"S": POOL_SK}}


def member_key(name: str) -> dict[str, dict[str, str]]:
    """Experiment `name`'s entry."""
    return {PK: {"S": POOL_PK}, SK: {"S": f"MEMBER#{name}"}}


def settings_update(table_name: str, settings: PoolSettings) -> dict[str, Any]:
    """The UpdateItem that writes the pool's settings: the schedule's spacing follows them; what was learned under
    the old ones (the backoff, the active-session cap) goes."""
    q = settings.quotas
    return {
        "TableName": table_name,
        "Key": pool_key(),
        "UpdateExpression": "SET new_session_quota = :ns, data_plane_quota = :dp, active_session_quota = :act, "
        "reserve = :reserve, quota_source = :source, interval_us = :iv "
        "REMOVE factor, factor_at, active_cap, active_cap_at, active_ceiling",
        "ExpressionAttributeValues": plain_values(
            {
                ":ns": q.new_sessions_per_s,
                ":dp": q.data_plane_per_s,
                ":act": q.active_sessions,
                ":reserve": settings.reserve,
                ":source": q.source,
                ":iv": settings.start_interval_us(),
            }
        ),
    }


def create_pool_table_kwargs(table_name: str) -> dict[str, Any]:
    """Arguments of DynamoDB CreateTable for the pool table: the ledger's keys, no index (local mode and tests; the
    pool stack mirrors it)."""
    ledger = create_table_kwargs(table_name)
    keys = [{"AttributeName": name, "AttributeType": "S"} for name in (PK, SK)]
    return {**{k: ledger[k] for k in ("TableName", "BillingMode", "KeySchema")}, "AttributeDefinitions": keys}
