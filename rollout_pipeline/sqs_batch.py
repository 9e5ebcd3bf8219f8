"""The SQS partial-batch runner every queue-fed stage shares: each record handled (concurrently when asked),
a record that raises is logged and reported in `batchItemFailures`, the others are acknowledged.

Ours rather than Powertools' `BatchProcessor`: that one handles records one at a time (or on asyncio), while
dispatch and completion need a thread pool whose workers wait together on the shared session slots and call
budgets; it raises when every record failed (a different response for the same outcome); and the stages are plain
library code that Powertools need not be imported by.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
log = logging.getLogger(__name__)

SqsRecord = Mapping[str, Any]


class PartialBatch(Protocol[T]):
    """What a batch run fills: the outcome per message id, and the failed ids with their error."""

    outcomes: dict[str, T]
    failures: dict[str, str]


@dataclass
class BatchOutcome(Generic[T]):
    outcomes: dict[str, T] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def message_id(record: SqsRecord) -> str:
    return str(record.get("messageId", ""))


def run_partial_batch(
    records: Sequence[SqsRecord],
    handle: Callable[[SqsRecord], T],
    into: PartialBatch[T],
    *,
    workers: int = 1,
    what: str = "message",
    logger: Any = log,
) -> None:
    """Handle every record (on up to `workers` threads; inline for one) and fill `into`: `outcomes[message_id]`
    for a record handled, `failures[message_id]` (the error) for one that raised."""

    def settle(mid: str, call: Callable[[], T]) -> None:
        try:
            into.outcomes[mid] = call()
        except Exception as exc:
            logger.exception("%s %s failed; it will be retried", what, mid)
            into.failures[mid] = f"{type(exc).__name__}: {exc}"

    workers = max(1, min(workers, len(records)))
    if workers == 1:
        for record in records:
            settle(message_id(record), partial(handle, record))
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=what) as pool:
        futures = {message_id(r): pool.submit(handle, r) for r in records}
        for mid, future in futures.items():
            settle(mid, future.result)


def batch_response(failures: Mapping[str, str] | Sequence[str]) -> dict[str, Any]:
    """The partial batch response Lambda's SQS event source reads (`ReportBatchItemFailures`)."""
    return {"batchItemFailures": [{"itemIdentifier": mid} for mid in failures]}
