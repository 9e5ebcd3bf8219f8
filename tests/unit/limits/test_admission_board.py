"""The admission board: slot waiters of several processes are admitted in one global order, and a process that
stopped publishing (crashed) holds the others back only until its entry is stale."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rollout_pipeline.limits.admission import (
    BOARD_READ_S,
    BOARD_SETTLE_S,
    BOARD_STALE_S,
    AdmissionBoard,
    SlotGate,
)
from tests.conftest import wait_for
from tests.doubles import FakeBoardLedger, RoomySession

pytestmark = pytest.mark.timing


def _gate(
    ledger: Any, in_flight: dict[str, int], name: str, wall: Any = time.time, max_sessions: int = 2, **clocks: Any
) -> SlotGate:
    """Process `name`'s gate: each poll reads the counters (`in_flight`) and the board together, as in production."""
    return SlotGate(
        lambda: (in_flight["n"], ledger.waiting_board(), {}),
        lambda: max_sessions,
        RoomySession(),  # type: ignore[arg-type]
        board=AdmissionBoard(ledger, name, wall=wall),
        **({"sleep": lambda _s: time.sleep(0.02)} | clocks),
    )


def test_free_slots_go_to_the_lowest_keys_of_every_process() -> None:
    ledger = FakeBoardLedger()
    in_flight = {"n": 2}
    gates = {"a": _gate(ledger, in_flight, "a"), "b": _gate(ledger, in_flight, "b")}
    admitted: list[str] = []
    lock = threading.Lock()

    def waiter(gate: str, key: str) -> None:
        if gates[gate].wait(time.monotonic() + 10, key):
            with lock:
                in_flight["n"] += 1
                admitted.append(key)

    # Process b holds the later group, process a the earlier one; b's waiters arrive first.
    plan = [("b", "k3#0"), ("b", "k3#1"), ("a", "k1#0"), ("a", "k1#1")]
    threads = [threading.Thread(target=waiter, args=p) for p in plan]
    for t in threads:
        t.start()
    wait_for(  # every process has published its waiters
        lambda: sorted(k for _p, _at, keys in ledger.waiting_board() for k in keys) == sorted(k for _g, k in plan),
        what="both processes' waiters on the board",
    )
    assert gates["b"].must_queue("k4#0")
    assert not gates["b"].must_queue("k0#0")
    with lock:
        in_flight["n"] = 0  # two slots free: group k1 (process a) gets both
    wait_for(lambda: len(admitted) >= 2, what="two admissions")
    time.sleep(0.2)  # a third admission would show up now (none may: only two slots are free)
    assert sorted(admitted) == ["k1#0", "k1#1"]
    with lock:
        in_flight["n"] = 0
    for t in threads:
        t.join(timeout=10)
    assert sorted(admitted[2:]) == ["k3#0", "k3#1"]
    assert ledger.items == {}  # each process left the board with its last waiter


def test_a_crashed_process_blocks_the_others_only_until_its_entry_is_stale() -> None:
    ledger = FakeBoardLedger()
    ledger.put_waiting("dead", ["k0#0"], now_us=int(time.time() * 1e6))  # never refreshed again
    in_flight = {"n": 1}  # one slot free (max_sessions 2)
    shift = {"s": 0.0}
    gate = _gate(ledger, in_flight, "live", wall=lambda: time.time() + shift["s"])
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(gate.wait(time.monotonic() + 10, "k5#0")))
    t.start()
    wait_for(lambda: gate.polls >= 3, what="three polls")  # each saw the free slot and the dead entry ranked first
    assert got == []  # the dead entry ranks first: one free slot is not for us
    shift["s"] = BOARD_STALE_S + 1  # time passes: the entry is stale
    t.join(timeout=5)
    assert got == [True]


def test_a_burst_is_on_the_board_from_receipt_and_its_first_decision_waits_for_the_others() -> None:
    """Start-up: dispatchers that receive one burst at about the same time put what they received on the board at
    once, and none lets anything through for `BOARD_SETTLE_S`, so the first decisions rank every one of them."""
    ledger = FakeBoardLedger()
    clock = {"t": 100.0}
    wall = {"t": time.time()}

    def gate(name: str) -> SlotGate:
        return _gate(ledger, {"n": 0}, name, lambda: wall["t"], 10, monotonic=lambda: clock["t"], sleep=lambda _s: None)

    early, late = gate("early"), gate("late")
    late_holds = late.hold(["k5#0", "k5#1"])  # the later group's dispatcher received first
    assert [k for _p, _at, keys in ledger.waiting_board() for k in keys] == ["k5#0", "k5#1"]
    assert late.must_queue("k5#0")  # settling: nothing goes through yet, even with every slot free
    early_holds = early.hold(["k1#0"])
    assert early.must_queue("k1#0")
    clock["t"] += BOARD_SETTLE_S  # settled: the earlier group goes first, the later one waits for it
    assert not early.must_queue("k1#0")
    assert late.must_queue("k5#0")
    for held in early_holds:
        held.leave()  # past the gate: off the board
    wall["t"] += BOARD_READ_S  # the late dispatcher's cached view of the board expires
    assert not late.must_queue("k5#0")
    for held in late_holds:
        held.leave()
        held.leave()  # idempotent
    assert ledger.items == {}
    # A process that kept rollouts in hand (gaps under BOARD_STALE_S) does not settle again; one idle longer does.
    clock["t"] += 1.0
    again = late.hold(["k7#0"])
    assert not late.must_queue("k7#0")
    again[0].leave()
    clock["t"] += BOARD_STALE_S + 0.1
    after_idle = late.hold(["k8#0"])
    assert late.must_queue("k8#0")
    after_idle[0].leave()
