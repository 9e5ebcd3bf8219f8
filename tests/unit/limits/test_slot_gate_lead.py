"""The slot gate's lead pace: the process whose waiter is next in line on the admission board polls fast, every
other process at the slow pace, and each poll reads the counters and the board in one request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollout_pipeline.limits import admission as limits
from rollout_pipeline.limits.admission import LEAD_POLL_S, AdmissionBoard, BoardEntry, SlotGate
from rollout_pipeline.topology import FUNCTIONS
from tests.doubles import FakeBoardLedger, ManualClock, RoomySession

MAX_SESSIONS = 4


class CountingBoardLedger(FakeBoardLedger):
    """The board's ledger, counting separate board reads (the gate should need none: its poll reads the board)."""

    def __init__(self) -> None:
        super().__init__()
        self.board_reads = 0

    def waiting_board(self) -> list[BoardEntry]:
        self.board_reads += 1
        return super().waiting_board()


def _gate(
    ledger: CountingBoardLedger, clock: ManualClock, in_flight: Callable[[int], int]
) -> tuple[SlotGate, list[int]]:
    """A gate for process "a" whose poll reads `in_flight(poll number)` and the board together."""
    polls: list[int] = []

    def in_flight_and_board() -> tuple[int, list[BoardEntry], dict[str, dict[str, Any]]]:
        polls.append(len(polls) + 1)
        return in_flight(len(polls)), FakeBoardLedger.waiting_board(ledger), {}

    board = AdmissionBoard(ledger, "a", wall=lambda: clock.t)
    gate = SlotGate(
        in_flight_and_board,
        lambda: MAX_SESSIONS,
        RoomySession(),  # type: ignore[arg-type]
        board=board,
        monotonic=lambda: clock.t,
        sleep=clock.sleep,
    )
    return gate, polls


def test_the_process_next_in_line_polls_fast_and_the_others_slowly() -> None:
    ledger, clock = CountingBoardLedger(), ManualClock(1_000.0)
    earlier = [f"k1#{i}" for i in range(limits.LEAD_RANKS)]
    ledger.put_waiting("b", earlier, now_us=int(clock.t * 1e6))  # another process holds the earlier group
    state = {"b_admitted_at": 0}

    def in_flight(poll: int) -> int:
        if poll == 4:  # b's waiters got their slots: they leave the board, and "a" is next in line
            ledger.clear_waiting("b")
            state["b_admitted_at"] = len(clock.slept)
        return MAX_SESSIONS - 1 if poll == 9 else MAX_SESSIONS  # a slot frees at the 9th poll

    gate, polls = _gate(ledger, clock, in_flight)
    assert gate.wait(clock.t + 60, "k2#0")
    assert len(polls) == 9
    behind, leading = clock.slept[: state["b_admitted_at"]], clock.slept[state["b_admitted_at"] :]
    assert behind
    assert all(0.2 <= p <= 1.0 for p in behind)  # not next in line: the slow pace
    assert leading
    assert all(LEAD_POLL_S[0] <= p <= LEAD_POLL_S[1] for p in leading)  # next in line: the lead pace
    assert gate.lead_polls == len(leading)
    assert ledger.board_reads == 0  # every decision used the board read with the counters


def test_without_a_lead_the_gate_keeps_the_slow_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "LEAD_RANKS", 0)
    ledger, clock = CountingBoardLedger(), ManualClock(1_000.0)
    gate, polls = _gate(ledger, clock, lambda poll: MAX_SESSIONS - 1 if poll == 5 else MAX_SESSIONS)
    assert gate.wait(clock.t + 60, "k2#0")
    assert len(polls) == 5
    assert all(0.2 <= p <= 1.0 for p in clock.slept)
    assert gate.lead_polls == 0


def test_a_free_slot_ranked_for_another_process_is_left_to_it() -> None:
    ledger, clock = CountingBoardLedger(), ManualClock(1_000.0)
    state = {"polls": 0}

    def in_flight(poll: int) -> int:
        state["polls"] = poll
        ledger.put_waiting("b", ["k1#0"] if poll < 6 else [], now_us=int(clock.t * 1e6))  # b's heartbeat, then gone
        return MAX_SESSIONS - 1  # one slot free all along: b's until b's waiter leaves the board

    gate, polls = _gate(ledger, clock, in_flight)
    assert gate.wait(clock.t + 60, "k2#0")
    assert len(polls) == 6  # let through only once the earlier key was gone
    assert ledger.board_reads == 0


def test_the_burst_settle_covers_the_dispatchers_batching_window() -> None:
    """A dispatcher Lambda may receive up to its event source's batching window after another received the same
    burst: the settle that lets the first decision see both must last at least that long."""
    assert FUNCTIONS["dispatch"].batching_window_s <= limits.BOARD_SETTLE_S
