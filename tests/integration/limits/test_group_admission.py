"""Group-ordered admission ACROSS dispatchers: with a backlog and `max_sessions` binding, several dispatcher
processes (each its own `LifecycleDeps`, so its own `SlotGate`) hand free session slots to the waiting rollouts
first in submission order (batch, then the group's line), not to whichever process polls first, so groups are
admitted, and complete, in submission order (docs/lifecycle.md, "Limits").

What decides the order sessions start in is the order their starts are BOOKED (the `session#` schedule, or the
slot counter's transaction), which admission orders. A session's actual start can still come later than its
booking on a starved machine: a thread that wakes more than `LATENESS_S` after its booked start loses it (the rate
limit comes first) and books again behind what was booked meanwhile. So the order checks are on the bookings, which
hold whatever the scheduling; `test_a_rollout_let_through_stays_on_the_board_until_its_start_is_booked` pins the
one race there was (a rollout past the gate but not yet booked was on neither the board nor the schedule)."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.completion import complete_records
from rollout_pipeline.lifecycle.dispatch import dispatch_records
from rollout_pipeline.limits.admission import ADMIT_AHEAD_S, BOARD_SETTLE_S
from rollout_pipeline.limits.pacing import LATENESS_S, LimitedRuntime
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ack,
    batch_view,
    by_type,
    make_deps,
    moto_lock,
    receive_records,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

BATCH = ids.batch_id_for_upload("in", "datasets/groups.jsonl", "v1")
GROUPS = 12
GROUP_SIZE = 4
MAX_SESSIONS = 4
DISPATCHERS = 3


#: The two limits that can bind: the session slots (`max_sessions`), or the new-session RATE with free slots (then
#: the ordered gate admits only what the session budget can start within `limits.ADMIT_AHEAD_S`).
BINDING = {
    "slots": {"max_sessions": MAX_SESSIONS, "tps_limit": 25, "session_rate_limit": 20},
    "session_rate": {"max_sessions": 100, "tps_limit": 25, "session_rate_limit": 4},
}


@pytest.mark.parametrize("binding", list(BINDING))
def test_groups_are_admitted_in_submission_order_across_dispatchers(
    resources: ExperimentResources, fake: FakeAgentRuntime, binding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ids whose text order is NOT the submission order ("g10" < "g2"): the line decides.
    inputs = {f"g{i}": {"i": i} for i in range(GROUPS)}
    lines = {f"g{i}": i for i in range(GROUPS)}
    lock = threading.Lock()
    booked = record_bookings(lock, monkeypatch)

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        return AgentBehaviour(rewards=1.0, delay_s=0.6)

    fake.behaviour = behaviour
    # As ingestion sends them: a group's rollouts are consecutive messages, groups in line order.
    send(resources, seed_batch(resources, batch_id=BATCH, inputs=inputs, group_size=GROUP_SIZE))
    total = GROUPS * GROUP_SIZE
    limits = BINDING[binding]
    stop = threading.Event()
    errors: list[BaseException] = []

    def dispatcher() -> None:  # one Lambda "process": its own deps, so its own SlotGate; no start-up barrier
        deps = make_deps(resources, fake, limits=limits, dispatch_threads=10)
        try:
            while not stop.is_set():
                records = receive_records(resources.rollout_queue_url, visibility=300)
                if not records:
                    time.sleep(0.05)
                    continue
                result = dispatch_records(records, deps, wait_until=time.monotonic() + 60)
                ack(resources.rollout_queue_url, records, result.failures)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def completer() -> None:
        deps = make_deps(resources, fake, limits=limits)
        try:
            while not stop.is_set():
                records = receive_records(resources.completion_queue_url)
                if records:
                    ack(resources.completion_queue_url, records, complete_records(records, deps).failures)
                else:
                    time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=dispatcher) for _ in range(DISPATCHERS)]
    threads += [threading.Thread(target=completer) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300  # bounded; about 15 s on an idle machine
    while time.monotonic() < deadline:
        if batch_view(resources, BATCH).terminal >= total:
            break
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    events = trainer_events(resources)
    assert len({e["rollout_id"] for e in by_type(events, "Rollout Completed")}) == total
    assert fake.max_running <= limits["max_sessions"]
    assert slots_in_flight(resources) == 0
    for name in ("rollout", "completion"):
        assert receive_all(resources.dlq_urls[name]) == []

    # From the first message on (no barrier: dispatchers receive whenever they get to it): a burst's first decision
    # waits `BOARD_SETTLE_S` for every dispatcher's received rollouts to be on the board, so start-up is ordered too.
    # The gate lets through a poll's free slots, or the session budget's room within `ADMIT_AHEAD_S`, whose
    # rollouts then race: `reach` is how many lines later a rollout may start before a group is fully admitted.
    if binding == "slots":
        reach = 2
    else:
        room = math.floor(ADMIT_AHEAD_S * limits["session_rate_limit"] / (1 + LATENESS_S))
        reach = 1 + math.ceil(room / GROUP_SIZE)
    # A group is admitted when its last rollout's start is booked: rank the groups by that and compare with the
    # file (a booking is a rollout's first; one it loses by waking late is booked again, later).
    started = {key: booked.first[key] for key in booked.first}
    assert len(started) == total
    admitted = {g: max(started[(g, i)] for i in range(GROUP_SIZE)) for g in inputs}
    order = sorted(inputs, key=lambda g: admitted[g])
    in_file = sorted(inputs, key=lambda g: lines[g])
    displacement = [abs(rank - in_file.index(g)) for rank, g in enumerate(order)]
    # Tolerance: a group may swap with a neighbour (two rollouts admitted in the same poll), no more.
    assert max(displacement) <= 1, order
    overtaken = [
        (g, h, i) for g in inputs for (h, i), at in started.items() if lines[h] >= lines[g] + reach and at < admitted[g]
    ]
    assert overtaken == [], (order, overtaken)


class Bookings:
    """The first start booked for each rollout's session (its `session#` slot, wall clock), by (input id, index):
    the schedule's order, which no thread's scheduling changes once booked."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], float] = {}


def record_bookings(lock: threading.Lock, monkeypatch: pytest.MonkeyPatch) -> Bookings:
    """Observe (not change) the product: each rollout's first booked start, through `LimitedRuntime.invoke`'s
    `on_booked`."""
    bookings = Bookings()
    original = LimitedRuntime.invoke

    def invoke(self: Any, session_id: str, payload: Any, wait_until: Any = None, **kwargs: Any) -> None:
        rollout = dict(payload.get("_rollout") or {})
        key = (str(rollout.get("input_id")), int(rollout.get("index") or 0))
        downstream = kwargs.pop("on_booked", None)

        def on_booked(start: float) -> None:
            with lock:
                bookings.first.setdefault(key, start)
            if downstream is not None:
                downstream(start)

        original(self, session_id, payload, wait_until, on_booked=on_booked, **kwargs)

    monkeypatch.setattr(LimitedRuntime, "invoke", invoke)
    return bookings


def test_a_rollout_let_through_stays_on_the_board_until_its_start_is_booked(
    resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    """Process A lets g0's rollout through its gate and is then held up (a starved thread, a slow transaction)
    before it books its session start. Process B holds g1's rollout, and the session budget has room for one
    within `ADMIT_AHEAD_S`: B must not take it while A's earlier rollout is unbooked. The rollout stays on the
    board until booked; before that was so, it left the board when it passed the gate, B saw a free budget and
    nobody ahead, and g1 started first however briefly A was held up."""
    limits = {"max_sessions": 100, "tps_limit": 25, "session_rate_limit": 1}  # room for 1 session within 2 s
    messages = seed_batch(resources, batch_id=BATCH, inputs={"g0": {}, "g1": {}}, group_size=1)
    fake.behaviour = lambda _inv: AgentBehaviour(rewards=1.0, delay_s=0.1)
    booked: list[str] = []
    a_may_book, a_reserving = threading.Event(), threading.Event()
    deps_a = make_deps(resources, fake, limits=limits)
    deps_b = make_deps(resources, fake, limits=limits)
    pacer_a = deps_a.limits.runtime.session  # the experiment's share of the account
    reserve_a = pacer_a.reserve

    def held_up(*args: Any, **kwargs: Any) -> float | None:
        a_reserving.set()
        assert a_may_book.wait(60), "never let go"
        return reserve_a(*args, **kwargs)

    pacer_a.reserve = held_up  # type: ignore[method-assign]
    for deps, name in ((deps_a, "a"), (deps_b, "b")):
        invoke = deps.limits.runtime.invoke

        def noting(*args: Any, _invoke: Any = invoke, _name: str = name, **kwargs: Any) -> None:
            downstream = kwargs.pop("on_booked", None)

            def on_booked(start: float) -> None:
                booked.append(_name)
                if downstream is not None:
                    downstream(start)

            _invoke(*args, on_booked=on_booked, **kwargs)

        deps.limits.runtime.invoke = noting  # type: ignore[method-assign]

    def dispatch(deps: Any, records: list[dict[str, Any]]) -> None:
        dispatch_records(records, deps, wait_until=time.monotonic() + 60)

    send(resources, messages[:1])
    records_a = receive_records(resources.rollout_queue_url)
    send(resources, messages[1:])
    records_b = receive_records(resources.rollout_queue_url)
    assert [r["body"] for r in records_a + records_b] == [m.model_dump_json(exclude_none=True) for m in messages]
    a = threading.Thread(target=dispatch, args=(deps_a, records_a))
    a.start()
    assert a_reserving.wait(60), "A's rollout never got past its gate"
    b = threading.Thread(target=dispatch, args=(deps_b, records_b))
    b.start()
    time.sleep(3 * BOARD_SETTLE_S)  # a negative check: B has seen the board many times by now
    assert booked == [], "B booked g1 while g0, let through first, was not booked yet"
    a_may_book.set()
    a.join(60)
    b.join(60)
    # First bookings in order (a thread that wakes too late for its booked start books again: counted once).
    assert list(dict.fromkeys(booked)) == ["a", "b"]
