"""The admission board: slot waiters of several processes are admitted in one global order, and a process that
stopped publishing (crashed) holds the others back only until its entry is stale."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rollout_pipeline.lifecycle.limits import BOARD_STALE_S, AdmissionBoard, SlotGate


class FakeBoardLedger:
    """The ledger's three board operations, in memory (one shared 'table' for every process)."""

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


def _gate(ledger: Any, in_flight: dict[str, int], name: str, wall: Any = time.time) -> SlotGate:
    board = AdmissionBoard(ledger, name, wall=wall)
    return SlotGate(lambda: in_flight["n"], 2, board=board, sleep=lambda _s: time.sleep(0.02))


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
        time.sleep(0.05)
    time.sleep(0.3)  # every poller has published its waiters
    assert gates["b"].must_queue("k4#0")
    assert not gates["b"].must_queue("k0#0")
    with lock:
        in_flight["n"] = 0  # two slots free: group k1 (process a) gets both
    deadline = time.monotonic() + 5
    while len(admitted) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # a third admission would show up now
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
    time.sleep(0.5)
    assert got == []  # the dead entry ranks first: one free slot is not for us
    shift["s"] = BOARD_STALE_S + 1  # time passes: the entry is stale
    t.join(timeout=5)
    assert got == [True]
