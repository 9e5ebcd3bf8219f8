"""One retry policy for DynamoDB transaction conflicts, used by every ledger write that can meet a transaction.

On AWS a plain `PutItem`/`UpdateItem`/`DeleteItem` on an item an in-flight `TransactWriteItems` holds fails with
`TransactionConflictException`, and a transaction overlapping another is cancelled with reason
`TransactionConflict`. botocore retries neither. Both are transient: retry with bounded, jittered exponential
backoff (full jitter), a fixed number of times, then let the caller fail (`LedgerError`: its message is redelivered).
`stats` counts the retries (benchmarks report them per 1,000 rollouts).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

T = TypeVar("T")

#: Attempts of one write (the first included) before the conflict is raised to the caller.
CONFLICT_ATTEMPTS: Final = 8
#: Attempts of one transaction on the experiment's shared items (session counter, batch counters): they meet far
#: more concurrent transactions than a plain write does, and giving up costs a whole visibility timeout.
TRANSACTION_CONFLICT_ATTEMPTS: Final = 14
BACKOFF_BASE_S: Final = 0.01
BACKOFF_CAP_S: Final = 0.5
CONFLICT_EXCEPTION: Final = "TransactionConflictException"

_random = random.Random()


class LedgerError(RuntimeError):
    """The ledger could not complete an operation (after retries, or a write a concurrent one made impossible);
    the caller lets its message be redelivered."""


@dataclass
class RetryStats:
    """Conflict retries taken by this process (plain writes and transactions)."""

    plain: int = 0
    transactions: int = 0

    @property
    def total(self) -> int:
        return self.plain + self.transactions


stats = RetryStats()
_stats_lock = threading.Lock()


def backoff_s(attempt: int) -> float:
    """Delay before retry number `attempt` (0-based): uniform in [0, min(cap, base * 2**attempt)] plus a floor."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt)
    return BACKOFF_BASE_S / 2 + _random.uniform(0, ceiling)


def note_transaction_retry() -> None:
    """Count one retried transaction (callers that classify cancellation reasons themselves)."""
    with _stats_lock:
        stats.transactions += 1


def is_conflict(exc: BaseException) -> bool:
    """True for `TransactionConflictException` from any boto3 client."""
    code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
    return bool(code == CONFLICT_EXCEPTION)


def retry_conflicts(
    call: Callable[..., T],
    /,
    *args: Any,
    attempts: int = CONFLICT_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> T:
    """`call(*args, **kwargs)`, retried on `TransactionConflictException` with jittered backoff."""
    for attempt in range(attempts):
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not is_conflict(exc) or attempt == attempts - 1:
                raise
        with _stats_lock:
            stats.plain += 1
        sleep(backoff_s(attempt))
    raise AssertionError("unreachable")  # pragma: no cover
