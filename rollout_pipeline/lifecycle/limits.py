"""Global limits shared by every caller in every process: TPS windows for ACR calls, session slots.

TPS: fixed one-second windows `LIMIT/TPS#{epoch second}` in the ledger; one conditional ADD per call. A caller
never starts a call in the last `EDGE_S` of a window, so the call itself happens inside the window that paid for
it (a call that straddles a boundary would otherwise be seen in the next window).
Sessions: the `LIMIT/SESSIONS in_flight` counter, acquired in the dispatch transaction and released in the
transaction that takes the rollout out of `dispatched` (see `ledger.rollouts`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from rollout_pipeline.ledger.rollouts import RolloutLedger
from rollout_pipeline.lifecycle.metrics import THROTTLED, MetricsRecorder
from rollout_pipeline.ports import AgentRuntime, RuntimeThrottled

#: Do not take a token in the last EDGE_S seconds of a one-second window...
EDGE_S: Final = 0.1
#: ...and drop a token (take a new one) if the call would start in the last LATE_S seconds of its window: a call
#: must land in the window that paid for it, or a window could see more than `limit` calls.
LATE_S: Final = 0.05
#: How long a stop waits for a TPS token when the caller gives no deadline.
DEFAULT_STOP_WAIT_S: Final = 15.0


class TpsLimiter:
    """Takes one token per ACR call from the shared one-second windows, waiting for the next window if full."""

    def __init__(
        self,
        ledger: RolloutLedger,
        limit: int,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ledger = ledger
        self.limit = limit
        self._wall = wall
        self._monotonic = monotonic
        self._sleep = sleep
        self._full_until = 0  # a window this process already saw full: do not ask DynamoDB again

    def acquire(self, wait_until: float | None = None) -> int | None:
        """Take a token; wait for later windows until `wait_until` (monotonic). Returns the window (epoch second)
        the token belongs to, or None if none was had in time."""
        while True:
            now = self._wall()
            second = int(now)
            into = now - second
            if into < 1.0 - EDGE_S and second >= self._full_until:
                if self.ledger.try_tps_token(second, self.limit):
                    return second
                self._full_until = second + 1
            pause = (1.0 - into) + random.uniform(0.0, 0.05)
            if wait_until is not None and self._monotonic() + pause > wait_until:
                return None
            self._sleep(pause)

    def still_inside(self, window: int) -> bool:
        """True while a call started now lands in `window` (with LATE_S to spare)."""
        return self._wall() < window + 1.0 - LATE_S


class LimitedRuntime:
    """An `AgentRuntime` whose every invoke and stop first takes a TPS token."""

    def __init__(self, runtime: AgentRuntime, limiter: TpsLimiter, metrics: MetricsRecorder | None = None) -> None:
        self.runtime = runtime
        self.limiter = limiter
        self.metrics = metrics

    def _token(self, wait_until: float | None, what: str) -> None:
        until = wait_until if wait_until is not None else time.monotonic() + DEFAULT_STOP_WAIT_S
        while True:
            window = self.limiter.acquire(until)
            if window is None:
                if self.metrics is not None:
                    self.metrics.count(THROTTLED)
                raise RuntimeThrottled(f"no TPS token for {what} before the wait budget ran out")
            if self.limiter.still_inside(window):
                return
            # Too late in its window (this thread was descheduled): the token is spent, take a fresh one.

    def invoke(self, session_id: str, payload: Mapping[str, Any], wait_until: float | None = None) -> None:
        """InvokeAgentRuntime after taking a TPS token. Raises RuntimeThrottled / RuntimeRejected."""
        self._token(wait_until, "InvokeAgentRuntime")
        self.runtime.invoke(session_id, payload)

    def stop(self, session_id: str, wait_until: float | None = None) -> None:
        """StopRuntimeSession after taking a TPS token (an unknown session counts as stopped)."""
        self._token(wait_until, "StopRuntimeSession")
        self.runtime.stop(session_id)


class SlotGate:
    """Dispatcher threads of one process waiting for a session slot: ONE of them polls the shared counter
    (strongly consistent GetItem, every 0.2-1 s, jittered) and, when it sees free slots, lets that many waiters
    (itself included) try the dispatch transaction; the others sleep. The transaction stays the only arbiter, so
    a waiter let through for nothing just waits again. Saves N-1 polls per process and the herd of transactions
    that N independent pollers would start when one slot frees."""

    def __init__(
        self,
        in_flight: Callable[[], int],
        max_sessions: int,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._in_flight = in_flight
        self.max_sessions = max_sessions
        self._monotonic = monotonic
        self._sleep = sleep
        self._cond = threading.Condition()
        self._tickets = 0
        self._waiting = 0
        self._polling = False
        self.polls = 0

    def wait(self, wait_until: float) -> bool:
        """Block until a slot looks free (True) or `wait_until` (monotonic) passes (False)."""
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._tickets > 0:
                        self._tickets -= 1
                        return True
                    remaining = wait_until - self._monotonic()
                    if remaining <= 0:
                        return False
                    if not self._polling:
                        self._polling = True
                        break
                    self._cond.wait(timeout=min(remaining, 1.0))
            finally:
                self._waiting -= 1
        try:
            return self._poll(wait_until)
        finally:
            with self._cond:
                self._polling = False
                self._cond.notify()  # another waiter takes over the polling

    def _poll(self, wait_until: float) -> bool:
        while True:
            pause = jitter_poll_s()
            if self._monotonic() + pause > wait_until:
                return False
            self._sleep(pause)
            self.polls += 1
            free = self.max_sessions - self._in_flight()
            if free > 0:
                with self._cond:
                    self._tickets = min(free - 1, self._waiting)
                    self._cond.notify_all()
                return True


def jitter_poll_s() -> float:
    """Pause between two polls of the session counter: 0.2-1 s, jittered so waiters do not move in lockstep."""
    return random.uniform(0.2, 1.0)
