"""The doubles the tests share, one per idea: the clocks (`ManualClock`, moved by hand; `ShiftedClock`, the system
clock moved forward or standing still where real time must pass too; `ThreadClocks`, one virtual clock per
thread), an object store, a queue that records what is sent to it, the
release window's items and group items, the ledger's board and pace reads, a queue with SQS's delivery semantics,
and a trainer's HTTP seam that fails its first answers (`HttpEndpoint`). Real AWS stand-ins (moto, the fake ACR,
the faithful profile) live in `rollout_pipeline.fakes`; a double only one test needs stays in that test."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from rollout_pipeline.feed.messages import QueuedGroup
from rollout_pipeline.ledger.items import GroupItem
from rollout_pipeline.ledger.pace import ScheduleItem
from rollout_pipeline.ledger.release import PendingGroup, Sending, WindowEntry, WindowState, pending_sk
from rollout_pipeline.ports import MessageQueue, ObjectNotFound, SystemClock
from rollout_pipeline.sdk.delivery import Delivery
from rollout_pipeline.sdk.transport import parse_envelope

EPOCH: Final = datetime.fromtimestamp(0, UTC)


class ManualClock:
    """Time that moves only when told: `clock()`, `time()` and `monotonic()` read it (epoch seconds), `now()` as a UTC
    datetime (a `ports.Clock`), `sleep` advances it (and is logged in `slept`), `advance` moves it unlogged."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class ShiftedClock(SystemClock):
    """The system clock moved forward by `offset` (to pass deadlines without waiting, where real time must also
    pass: threads, moto). `frozen`: its wall time stands still (at its creation, to the second) and moves only by
    `advance`, so the durations a test reads are exactly what it set. `monotonic_offset` moves its monotonic time
    forward (a step that "takes" time). Called, it is epoch seconds (the fake ACR's clock)."""

    def __init__(self, offset_s: float = 0.0, *, frozen: bool = False) -> None:
        self.offset = timedelta(seconds=offset_s)
        self.frozen_at = datetime.now(UTC).replace(microsecond=0) if frozen else None
        self.monotonic_offset = 0.0

    def now(self) -> datetime:
        base = self.frozen_at if self.frozen_at is not None else super().now()
        return base + self.offset

    def monotonic(self) -> float:
        return super().monotonic() + self.monotonic_offset

    def __call__(self) -> float:
        return self.now().timestamp()

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


class ThreadClocks:
    """A virtual wall clock per thread (`wall`, `sleep`: epoch seconds): each starts at `start` and moves only by that
    thread's own `sleep`, so a thread never wakes late, whatever the machine's load."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._local = threading.local()

    def wall(self) -> float:
        return float(getattr(self._local, "now", self.start))

    def sleep(self, seconds: float) -> None:
        self._local.now = self.wall() + max(0.0, seconds)


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

    def get_tail(self, bucket: str, key: str, max_bytes: int) -> bytes:
        if (bucket, key) not in self.objects:
            raise ObjectNotFound(key)
        return self.objects[(bucket, key)][-max_bytes:]

    def head(self, *a: object, **k: object) -> object:
        raise AssertionError("MemoryStore keeps bodies only: use moto for metadata")

    def iter_bytes(self, *a: object, **k: object) -> Iterator[bytes]:
        raise AssertionError("MemoryStore keeps bodies only: use moto for streamed reads")


class RecordingQueue:
    """A `MessageQueue` that records every body sent (parsed, in sending order) and every send call (its thread and
    size); with `inner`, also sends through it, and with `only`, records the sends to that queue URL alone. The
    `fail_on`-th recorded send (or the next one, `fail_next = True`) raises `error` before anything is sent: a sender
    crashing between its ledger write and its messages."""

    def __init__(
        self,
        inner: MessageQueue | None = None,
        only: str | None = None,
        *,
        fail_on: int | None = None,
        error: type[Exception] = ConnectionError,
    ) -> None:
        self.inner = inner
        self.only = only
        self.fail_on = fail_on
        self.error = error
        self.sent: list[dict[str, Any]] = []
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    @property
    def fail_next(self) -> bool:
        return self.fail_on is not None and self.fail_on > len(self.calls)

    @fail_next.setter
    def fail_next(self, value: bool) -> None:
        self.fail_on = len(self.calls) + 1 if value else None

    def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
        recorded = self.only is None or queue_url == self.only
        if recorded:
            with self._lock:
                self.calls.append((threading.current_thread().name, len(bodies)))
                if self.fail_on == len(self.calls):
                    raise self.error(f"send #{len(self.calls)} crashed before sending")
        if self.inner is not None:
            self.inner.send_all(queue_url, bodies, delay_seconds)
        if recorded:
            with self._lock:
                self.sent.extend(json.loads(body) for body in bodies)

    def rollouts(self) -> list[tuple[str, int]]:
        """(input id, index) of every message sent, in order."""
        return [(m["input_id"], m["index"]) for m in self.sent]

    def released(self) -> list[tuple[int, int]]:
        """(line, index) of every first attempt sent, in order."""
        return [(m["line"], m["index"]) for m in self.sent if m["attempt"] == 1]


class MemoryReleaseLedger:
    """`ReleaseLedger`'s interface over dicts: pending items by batch and sort key, one window item (conditional
    on its version, its confirmation on its lease), a movable clock; `stale_once` hands one release an old read."""

    def __init__(self) -> None:
        self.now = 1_000_000
        self.pending: dict[str, dict[str, list[PendingGroup]]] = {}
        self.state = WindowState()
        self.writes = 0
        self.stale_once: WindowState | None = None

    def epoch(self) -> int:
        return self.now

    def read_window(self) -> WindowState:
        if self.stale_once is not None:
            stale, self.stale_once = self.stale_once, None
            return stale
        return self.state

    def put_pending(self, batch_id: str, groups: Sequence[PendingGroup]) -> str:
        ordered = sorted(groups, key=lambda g: g.line)
        self.pending.setdefault(batch_id, {})[pending_sk(ordered[0].line)] = ordered
        return pending_sk(ordered[0].line)

    def next_groups(
        self, batch_id: str, entry: WindowEntry, *, max_groups: int = 1000
    ) -> Iterator[tuple[str, PendingGroup]]:
        given, last = 0, entry.line
        for sk in sorted(self.pending.get(batch_id, {})):
            if sk < entry.chunk:
                continue
            for group in self.pending[batch_id][sk]:
                if group.line > last:
                    last = group.line
                    yield sk, group
                    given += 1
                    if given >= max_groups:
                        return

    def write_window(
        self,
        read: WindowState,
        *,
        entries: Mapping[str, WindowEntry] | None = None,
        removed: Sequence[str] = (),
        sending: Sending = (),
        lease_s: int = 0,
        lease_until: int | None = None,
    ) -> WindowState | None:
        if read.version != self.state.version or read.exists != self.state.exists:
            return None
        if sending and lease_until is None:
            lease_until = self.now + lease_s
        after = {k: v for k, v in self.state.entries.items() if k not in removed} | dict(entries or {})
        self.writes += 1
        self.state = WindowState(read.version + 1, after, sending, (lease_until or 0) if sending else 0, exists=True)
        return self.state

    def confirm(self, written: WindowState) -> bool:
        if self.state.lease_until != written.lease_until:
            return False
        self.state = replace(self.state, version=self.state.version + 1, sending=(), lease_until=0)
        return True


class MemoryGroups:
    """Group items of every batch, as `GroupLedger.read_groups` reads them."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], GroupItem] = {}
        self.reads = 0

    def add(self, batch_id: str, input_id: str, line: int, size: int, submitted_at: datetime = EPOCH) -> QueuedGroup:
        """A group item (payload `{"q": line}`), and the group as ingestion hands it to the feed."""
        self.items[(batch_id, input_id)] = GroupItem("exp", batch_id, input_id, line, size, payload={"q": line})
        return QueuedGroup("exp", batch_id, input_id, line, size, submitted_at, payload={"q": line})

    def read(self, batch_id: str, input_ids: Sequence[str]) -> dict[str, GroupItem]:
        self.reads += 1
        return {i: self.items[(batch_id, i)] for i in input_ids}


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
    """One paced budget's schedule item in memory (its `tat`, epoch microseconds), read as
    `ledger.pace.PaceSchedule.read` reads it (reservations are not modelled)."""

    item_spacing = False

    def __init__(self) -> None:
        self.tat_us = 0
        self.reads = 0

    def read(self) -> ScheduleItem:
        self.reads += 1
        return ScheduleItem({"tat": self.tat_us} if self.tat_us else {})


class RoomySession:
    """A session budget that always has room: `SlotGate`'s `session` where a test is not about the rate."""

    budget = "session"
    interval_s = 0.001

    def claim(self) -> bool:
        return True

    def read_room(self, ahead_s: float, item: Mapping[str, Any] | None = None, *, wanted: int = 1) -> int:
        return 1_000_000

    def promise(self, calls: int) -> None:
        pass

    def next_room_s(self, ahead_s: float, calls: int = 1) -> float:
        return 0.0


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

    def redeliver(self, delivery: Delivery, after_s: int = 0) -> None:
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


@dataclass(frozen=True)
class ReceivedRequest:
    """One request an `HttpEndpoint` answered: what came, and the status it got."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int


class HttpEndpoint:
    """A trainer's HTTP seam on 127.0.0.1 (a context manager): answers `failing_status` to its first
    `fail_first` requests, then `status` (or what `answer(path, body)` says), recording every request."""

    def __init__(
        self,
        *,
        fail_first: int = 0,
        failing_status: int = 503,
        status: int = 200,
        answer: Callable[[str, Any], int] | None = None,
    ) -> None:
        from rollout_pipeline.agent.loopback import JsonRequestHandler, LoopbackServer

        self.fail_first, self.failing_status, self.status, self._answer = fail_first, failing_status, status, answer
        self._lock = threading.Lock()
        self.requests: list[ReceivedRequest] = []
        endpoint = self

        class Handler(JsonRequestHandler):
            def _any(self) -> None:
                raw = self.read_body()
                try:
                    body: Any = json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    body = raw.decode(errors="replace")
                status = endpoint.status_for(self.path, body)
                with endpoint._lock:
                    endpoint.requests.append(
                        ReceivedRequest(self.command, self.path, dict(self.headers.items()), body, status)
                    )
                self.send_json(status, {"status": "ok" if status < 300 else "error"})

            do_POST = do_PUT = do_PATCH = _any

        self._server = LoopbackServer(Handler, thread_name="http-endpoint")

    def status_for(self, path: str, body: Any) -> int:
        with self._lock:
            seen = len(self.requests)
        if seen < self.fail_first:
            return self.failing_status
        return self._answer(path, body) if self._answer is not None else self.status

    @property
    def url(self) -> str:
        return self._server.root_url

    def delivered(self) -> list[ReceivedRequest]:
        """The requests answered with a 2xx."""
        with self._lock:
            return [r for r in self.requests if 200 <= r.status < 300]

    def __enter__(self) -> HttpEndpoint:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
