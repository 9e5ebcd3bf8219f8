"""Which pipeline roles may list which bucket prefix: the one home of the `s3:ListBucket` grants.

On AWS, `GetObject`/`HeadObject` of a missing key answers 404 only when the caller may list the bucket; without
`s3:ListBucket` it answers 403 AccessDenied. The handlers that must tell "gone" from "forbidden" (a deleted
dataset, an expired claim check, a result that was never written) therefore get `s3:ListBucket` on their bucket,
narrowed with an `s3:prefix` condition to the prefix they read. The stack grants exactly these
(`stacks/experiment_stack.py`, checked by `tests/infra/test_iam.py`), and the faithful AWS profile
(`fakes/faithful.py`) answers 403 to every other role, so a missing grant fails a test.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from rollout_pipeline import routing
from rollout_pipeline.ids import CLAIMS_PREFIX

#: Roles of the deployed stack as the faithful profile names them. The trainer (SDK, CLI) runs with the user's
#: own credentials, which can list its experiment's buckets.
INGEST: Final = "ingest"
DISPATCH: Final = "dispatch"
COMPLETION: Final = "completion"
SWEEPER: Final = "sweeper"
TRAINER: Final = "trainer"

BucketKind = Literal["input", "results"]


@dataclass(frozen=True, slots=True)
class ListGrant:
    """`s3:ListBucket` on one of the experiment's buckets with `s3:prefix` starting with `prefix`.

    `prefix` may contain `{exp}` (the experiment name)."""

    bucket: BucketKind
    prefix: str

    def resolve(self, exp: str) -> str:
        return self.prefix.format(exp=exp)


#: What every role of the ledger table may do on its items (the pipeline's functions and the trainer alike): item
#: reads and writes only, no Scan. DynamoDB authorises a TransactWriteItems per contained action, so there is no
#: transaction action to grant (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis-iam.html).
LEDGER_ITEM_ACTIONS: Final = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
)

#: The functions' actions on the account pool's table (`ledger.pool`): its one item read and conditionally updated,
#: under its partition key only (`POOL_LEADING_KEY`); no other item, no delete, no scan.
POOL_ITEM_ACTIONS: Final = ("dynamodb:GetItem", "dynamodb:UpdateItem")
POOL_LEADING_KEY: Final = "POOL"

LIST_GRANTS: Final[Mapping[str, tuple[ListGrant, ...]]] = {
    INGEST: (ListGrant("input", routing.DATASET_PREFIX),),
    DISPATCH: (ListGrant("input", CLAIMS_PREFIX),),
    COMPLETION: (ListGrant("results", "{exp}/"),),
    SWEEPER: (ListGrant("results", "{exp}/"),),
}
