"""The fake AgentCore under threads: its reads of shared state never race its writers (it is used as
thread-safe by the lifecycle's dispatcher threads and by the benches)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from tests.doubles import ManualClock, MemoryStore

PAYLOAD = {"_rollout": {"exp_id": "e", "input_id": "q", "s3_bucket": "b"}}
#: Sessions left running throughout, so each read iterates long enough for a writer to land inside it.
BACKGROUND_SESSIONS = 300
ROUNDS_PER_WRITER = 2_000
WRITERS = 2


def sid(writer: int, i: int) -> str:
    return f"batch-0123456789ab-{writer}-{i}-0123456789abcdef"


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Switch threads every microsecond instead of every 5 ms, so an unlocked read of a set that another thread
    changes is caught in the act within a bounded loop, not once in a long while."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def unlimited_fake() -> FakeAgentRuntime:
    """A fake with a profile (so active_sessions walks the sessions) and no quota that could refuse a call."""
    profile = AcrProfile(
        new_sessions_per_minute=1e12,
        account_new_sessions_per_s=1e12,
        data_plane_tps=1e12,
        max_active_sessions=10**9,
    )
    return FakeAgentRuntime(MemoryStore(), AgentBehaviour(kind="manual"), profile=profile, clock=ManualClock(1_000.0))


def run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as error:  # reported by the test, not lost in a thread
                errors.append(error)

        return run

    threads = [threading.Thread(target=guarded(target), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a thread did not finish within its bound"
    return errors


def test_active_sessions_reads_safely_while_sessions_start_and_stop(frequent_thread_switches: None) -> None:
    fake = unlimited_fake()
    for i in range(BACKGROUND_SESSIONS):
        fake.invoke(sid(9, i), PAYLOAD)
    writers_done = threading.Event()
    reads: list[int] = []

    def writer(number: int) -> Callable[[], None]:
        def run() -> None:
            for i in range(ROUNDS_PER_WRITER):
                fake.invoke(sid(number, i), PAYLOAD)
                fake.stop(sid(number, i))

        return run

    def writers() -> list[Callable[[], None]]:
        return [writer(number) for number in range(WRITERS)]

    def reader() -> None:
        for _ in range(1_000_000):  # a bound; the writers end it long before
            if writers_done.is_set():
                return
            reads.append(fake.active_sessions())

    def all_writers_then_done() -> None:
        try:
            errors = run_threads(writers())
            if errors:
                raise errors[0]
        finally:
            writers_done.set()

    errors = run_threads([all_writers_then_done, reader])

    assert errors == []
    assert reads, "the reader read while the writers ran"
    assert all(BACKGROUND_SESSIONS <= count <= BACKGROUND_SESSIONS + WRITERS for count in reads)
    assert fake.active_sessions() == BACKGROUND_SESSIONS
    assert len(fake.stops()) == WRITERS * ROUNDS_PER_WRITER
