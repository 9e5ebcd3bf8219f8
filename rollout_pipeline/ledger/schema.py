"""The ledger table's key schema and indexes, for local mode and tests (the CDK construct mirrors it)."""

from __future__ import annotations

from typing import Any

from rollout_pipeline.ledger import keys


def create_table_kwargs(table_name: str) -> dict[str, Any]:
    """Arguments of DynamoDB CreateTable for the ledger: on-demand, two sparse GSIs."""

    def gsi(name: str, pk: str, sk: str) -> dict[str, Any]:
        return {
            "IndexName": name,
            "KeySchema": [{"AttributeName": pk, "KeyType": "HASH"}, {"AttributeName": sk, "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"},
        }

    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "KeySchema": [
            {"AttributeName": keys.PK, "KeyType": "HASH"},
            {"AttributeName": keys.SK, "KeyType": "RANGE"},
        ],
        "AttributeDefinitions": [
            {"AttributeName": keys.PK, "AttributeType": "S"},
            {"AttributeName": keys.SK, "AttributeType": "S"},
            {"AttributeName": keys.DEADLINE_PK, "AttributeType": "S"},
            {"AttributeName": keys.DEADLINE_SK, "AttributeType": "N"},
            {"AttributeName": keys.OUTBOX_PK, "AttributeType": "S"},
            {"AttributeName": keys.OUTBOX_SK, "AttributeType": "N"},
        ],
        "GlobalSecondaryIndexes": [
            gsi(keys.DEADLINE_INDEX, keys.DEADLINE_PK, keys.DEADLINE_SK),
            gsi(keys.OUTBOX_INDEX, keys.OUTBOX_PK, keys.OUTBOX_SK),
        ],
    }
