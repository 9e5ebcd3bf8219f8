"""What every ledger module shares: the one error type and the one paginated Query."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class LedgerError(RuntimeError):
    """The ledger could not complete an operation (after retries); the caller lets the message be redelivered."""


def query_items(ddb: Any, request: Mapping[str, Any], *, max_pages: int | None = None) -> Iterator[dict[str, Any]]:
    """The items (typed) of a DynamoDB Query `request`, page after page; at most `max_pages` pages when given."""
    kwargs = dict(request)
    pages = 0
    while max_pages is None or pages < max_pages:
        resp = ddb.query(**kwargs)
        pages += 1
        yield from resp.get("Items") or []
        last = resp.get("LastEvaluatedKey")
        if not last:
            return
        kwargs["ExclusiveStartKey"] = last
