"""In-memory doubles the unit tests share: a clock moved by hand, an object store, the ledger's board and pace
reads, and a queue with SQS's delivery semantics. Real AWS stand-ins (moto, the fake ACR, the faithful profile)
live in `rollout_pipeline.fakes`; a double only one test needs stays in that test."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rollout_pipeline.ports import ObjectNotFound
from rollout_pipeline.sdk.delivery import Delivery
from rollout_pipeline.sdk.transport import parse_envelope


class ManualClock:
    """Time that moves only when told: `clock()` or `clock.time()` read it, `sleep` advances it (and is logged)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(seconds, 0.0)


class MemoryStore:
    """An `ObjectStore` in memory, by (bucket, key): writes keep the body, reads are ranged the way S3's are (up to
    `max_bytes` + 1 bytes, with the full size)."""

    def __init__(self, objects: Mapping[tuple[str, str], bytes] | None = None) -> None:
        self.objects: dict[tuple[str, str], bytes] = dict(objects or {})

    def put_bytes(
        self,
        bucket: str,
        key: str,
        body: bytes,
        content_type: str = "application/json",
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        self.objects[(bucket, key)] = body
        return None

    def get_bytes(self, bucket: str, key: str, max_bytes: int) -> tuple[bytes, int]:
        if (bucket, key) not in self.objects:
            raise ObjectNotFound(key)
        body = self.objects[(bucket, key)]
        return body[: max_bytes + 1], len(body)

    def head(self, *a: object, **k: object) -> object:
        raise AssertionError("MemoryStore keeps bodies only: use moto for metadata")

    def iter_bytes(self, *a: object, **k: object) -> Iterator[bytes]:
        raise AssertionError("MemoryStore keeps bodies only: use moto for streamed reads")


class FakeBoardLedger:
    """The ledger's three admission-board operations, in memory (one shared 'table' for every process)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[int, list[str]]] = {}
        self.lock = threading.Lock()

    def put_waiting(self, process: str, waiting: Sequence[str], *, now_us: int) -> None:
        with self.lock:
            self.items[process] = (now_us, list(waiting))

    def clear_waiting(self, process: str) -> None:
        with self.lock:
            self.items.pop(process, None)

    def waiting_board(self) -> list[tuple[str, int, list[str]]]:
        with self.lock:
            return [(p, at, list(keys)) for p, (at, keys) in self.items.items()]


class FakeSchedules:
    """The ledger's `pace_tat` read, in memory (the schedule of each paced budget, epoch microseconds)."""

    def __init__(self) -> None:
        self.tat_us: dict[str, int] = {}
        self.reads = 0

    def pace_tat(self, budget: str) -> int:
        self.reads += 1
        return self.tat_us.get(budget, 0)


class MemoryEventQueue:
    """The trainer queue in memory, with SQS's delivery semantics (at-least-once, visibility, receive counts)."""

    def __init__(self, bodies: list[str]) -> None:
        self.messages: dict[int, dict[str, Any]] = {
            i: {"body": b, "visible": True, "receives": 0} for i, b in enumerate(bodies)
        }
        self.receipts = 0
        self.handles: dict[str, int] = {}
        self.deleted: list[int] = []

    def receive(self, wait_s: float, max_messages: int = 10) -> list[Delivery]:
        out: list[Delivery] = []
        for mid, msg in self.messages.items():
            if msg["visible"] and len(out) < max_messages:
                msg["visible"] = False
                msg["receives"] += 1
                self.receipts += 1
                handle = f"h{self.receipts}"
                self.handles[handle] = mid
                out.append(Delivery(handle, parse_envelope(msg["body"])[1], f"m{mid}"))
        return out

    def delete(self, delivery: Delivery) -> None:
        if not delivery.receipt:  # not from this queue (rebuilt from the ledger), as `QueueReader` ignores it
            return
        mid = self.handles[delivery.receipt]
        if mid in self.messages:
            del self.messages[mid]
            self.deleted.append(mid)

    def release(self, delivery: Delivery, after_s: int = 0) -> None:
        if not delivery.receipt:
            return
        mid = self.handles[delivery.receipt]
        if mid in self.messages:
            self.messages[mid]["visible"] = after_s == 0
            self.messages[mid]["hidden_for"] = after_s

    def timeout_all(self) -> None:
        """The visibility timeout runs out for every in-flight message."""
        for msg in self.messages.values():
            msg["visible"] = True
