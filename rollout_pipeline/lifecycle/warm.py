"""The dispatch side of the warm pool: idle warm sessions on offer through the warm queue (docs/lifecycle.md, "The warm
queue of offers"). A receive is a take; a rollout takes the next offer within its `offer_until`, and its dispatch
transaction takes the session only if its item is still idle."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger.warm import WarmLedger
from rollout_pipeline.ports import MessageQueue

log = logging.getLogger(__name__)

#: After a receive found no offer, this process receives again at most this often; it notes takes on the pool item
#: at most once per `DEMAND_NOTE_S`; an SQS receive returns 10 messages at most; a batch refills `REFILLS` times.
EMPTY_RECHECK_S: Final = 2.0
DEMAND_NOTE_S: Final = 1.0
RECEIVE_MAX: Final = 10
REFILLS: Final = 3


def offer_until(config: ExperimentConfig, warmed_at: float, kept_at: float) -> float:
    """Until when (epoch s) a warm session may be taken: before it is stale, or too old for a rollout."""
    return min(kept_at + config.warm_stale_after_s, warmed_at + config.warm_shelf_life_s)


@dataclass(frozen=True, slots=True)
class WarmOffer:
    """One warm session on offer (a message of the warm queue; `receipt`: its receipt handle once received)."""

    session_id: str
    warmed_at: float
    offer_until: float
    receipt: str = ""

    def body(self) -> str:
        return json.dumps({"session_id": self.session_id, "warmed_at": self.warmed_at, "until": self.offer_until})

    @classmethod
    def of(cls, receipt: str, body: str) -> WarmOffer:
        """A received message (one that is not an offer reads as expired: it is deleted)."""
        try:
            raw = json.loads(body)
            return cls(str(raw["session_id"]), float(raw["warmed_at"]), float(raw["until"]), receipt)
        except (ValueError, KeyError, TypeError):
            return cls("", 0.0, 0.0, receipt)


class WarmOffers:
    """The offers one SQS batch holds, shared by its threads; `close` deletes the spent ones, gives the rest back."""

    def __init__(self, taker: WarmTaker, offers: list[WarmOffer]) -> None:
        self.taker = taker
        self._held = offers
        self._out: dict[str, WarmOffer] = {}
        self._done: list[str] = []
        self._spoilt = 0
        self._refills = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def next(self) -> WarmOffer | None:
        """The next offer within its `offer_until` (expired ones are deleted), or None."""
        with self._lock:
            while True:
                if not self._held and self._spoilt and self._refills < REFILLS:
                    self._refills += 1
                    self._held, self._spoilt = self.taker.receive(self._spoilt), 0
                if not self._held:
                    return None
                offer = self._held.pop(0)
                if offer.offer_until > self.taker.wall():
                    self._out[offer.receipt] = offer
                    return offer
                self._spent(offer, "stale")

    def taken(self, offer: WarmOffer) -> None:
        """The dispatch transaction took its session: the offer is deleted."""
        with self._lock:
            self._out.pop(offer.receipt, None)
            self._done.append(offer.receipt)
            self.taker.count("taken")

    def refused(self, offer: WarmOffer) -> None:
        """The session is no longer idle in the pool: the offer is deleted, another received in its place."""
        with self._lock:
            self._out.pop(offer.receipt, None)
            self._spent(offer, "refused")

    def give_back(self, offer: WarmOffer) -> None:
        """The rollout did not take the session after all (cancelled, already dispatched): the next one may."""
        with self._lock:
            self._out.pop(offer.receipt, None)
            self._held.insert(0, offer)

    def _spent(self, offer: WarmOffer, why: str) -> None:
        self._done.append(offer.receipt)
        self._spoilt += 1
        self.taker.count(why)

    def close(self) -> None:
        with self._lock:
            done, held = self._done, [offer.receipt for offer in [*self._held, *self._out.values()]]
            self._done, self._held, self._out = [], [], {}
        self.taker.settle(done, held)


class WarmTaker:
    """One dispatcher process's access to the warm queue and its notes to the pool. Thread-safe."""

    def __init__(
        self,
        queue: MessageQueue,
        queue_url: str,
        ledger: WarmLedger,
        config: ExperimentConfig,
        *,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
    ) -> None:
        self.queue = queue
        self.queue_url = queue_url
        self.ledger = ledger
        self.enabled = config.warm_pool_on and bool(queue_url)
        self.wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._empty_at: float | None = None
        self._noted: dict[str, float] = {}
        self.counts = {"received": 0, "receives": 0, "taken": 0, "stale": 0, "refused": 0}

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def offers(self, wanted: int) -> WarmOffers:
        """Up to `wanted` offers for an SQS batch (none when the pool is off)."""
        return WarmOffers(self, self.receive(wanted))

    def receive(self, wanted: int) -> list[WarmOffer]:
        """Up to `wanted` offers, received now (a receive that found none is tried once more, then not before
        `EMPTY_RECHECK_S`: a short poll may miss a small queue's messages)."""
        with self._lock:
            quiet = self._empty_at is not None and self._monotonic() - self._empty_at < EMPTY_RECHECK_S
        if not self.enabled or wanted <= 0 or quiet:
            return []
        got: list[WarmOffer] = []
        misses = 0
        for _ in range(math.ceil(wanted / RECEIVE_MAX) + 1):
            try:
                messages = self.queue.receive(self.queue_url, min(RECEIVE_MAX, wanted - len(got)))
            except Exception:  # no offers: new sessions, as without a pool
                log.warning("the warm queue could not be read; dispatching new sessions", exc_info=True)
                break
            self.count("receives")
            got += [WarmOffer.of(receipt, body) for receipt, body in messages]
            misses += not messages
            if len(got) >= wanted or (not messages and (got or misses > 1)):
                break
        with self._lock:
            self._empty_at = None if got else self._monotonic()
            self.counts["received"] += len(got)
        return got

    def settle(self, done: list[str], held: list[str]) -> None:
        """Delete the offers used or stale, give the held ones back (best effort: the visibility timeout else)."""
        try:
            if done:  # only an SQS batch that received offers asks the queue anything (none with the pool off)
                self.queue.delete(self.queue_url, done)
            if held:
                self.queue.release(self.queue_url, held)
        except Exception:
            log.warning("%d warm offer(s) left to their visibility timeout", len(done) + len(held), exc_info=True)

    def note(self, kind: Literal["demand_at", "took_at"]) -> None:
        """Tell the pool (at most once per `DEMAND_NOTE_S`) that a rollout took a new session or a warm one."""
        now = self._monotonic()
        with self._lock:
            if not self.enabled or now - self._noted.get(kind, -math.inf) < DEMAND_NOTE_S:
                return
            self._noted[kind] = now
        try:
            self.ledger.note(kind, self.wall())
        except Exception:
            log.warning("could not note %s on the warm pool", kind, exc_info=True)
