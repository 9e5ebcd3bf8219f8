"""Group-ordered admission: when slots free up, the waiting rollouts first in group order get them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from rollout_pipeline.limits.admission import SlotGate
from tests.conftest import wait_for
from tests.doubles import RoomySession

pytestmark = pytest.mark.timing


def _gate(in_flight: Callable[[], int]) -> SlotGate:
    """A gate of one process (no admission board) whose session budget always has room."""
    return SlotGate(
        lambda: (in_flight(), [], {}),
        lambda: 3,
        RoomySession(),  # type: ignore[arg-type]
        sleep=lambda _s: time.sleep(0.05),
    )


def test_freed_slots_go_to_waiters_in_group_order() -> None:
    in_flight = {"n": 3}
    gate = _gate(lambda: in_flight["n"])
    admitted: list[str] = []
    lock = threading.Lock()

    def waiter(name: str, key: str) -> None:
        if gate.wait(time.monotonic() + 10, key):
            with lock:  # an admitted waiter takes its slot, as the ledger's conditional ADD does
                in_flight["n"] += 1
                admitted.append(name)

    # Arrival order is the reverse of group order (later groups' messages came first).
    keys = {"g3#0": "1|b|g3|0", "g2#1": "1|b|g2|1", "g2#0": "1|b|g2|0"}  # admission keys: submission, batch, group
    threads = []
    for name, key in keys.items():
        threads.append(threading.Thread(target=waiter, args=(name, key)))
        threads[-1].start()
        wait_for(lambda key=key: key in gate.queued(), what=f"{name} waiting")  # arrival order as planned
    with lock:
        in_flight["n"] = 1  # two slots free: group g2 goes, together
    wait_for(lambda: len(admitted) >= 2, what="two admissions")
    time.sleep(0.1)  # a third admission would show up now (none may: only two slots are free)
    assert sorted(admitted) == ["g2#0", "g2#1"]
    with lock:
        in_flight["n"] = 2  # one slot frees: g3 goes
    for t in threads:
        t.join(timeout=5)
    assert admitted[-1] == "g3#0"


def test_closing_the_gate_ends_every_wait_as_if_its_deadline_had_passed() -> None:
    """Local mode's Ctrl-C: dispatchers waiting for a slot (for minutes, by their budget) give up now, through their
    "no slot in time" path (the message is re-sent), while the pipeline's AWS is still up."""
    gate = _gate(lambda: 3)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda key=key: results.append(gate.wait(time.monotonic() + 600, key)))
        for key in ("1|b|g1|0", "1|b|g1|1")
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(gate.queued()) == 2, what="two waiters")
    gate.close()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [False, False]
    assert gate.wait(time.monotonic() + 600, "1|b|g2|0") is False  # and any later wait at once
