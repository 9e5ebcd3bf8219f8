"""A stream of its own (`SubscribedStream`) removes its private subscription when it is closed, in the closing
thread; one garbage-collected while open removes it from a thread of its own, never in the thread the collector ran
in (that thread may hold a lock the removal's requests wait for: a local endpoint's request thread did, and the
server deadlocked); what is still open at interpreter exit is closed then."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from rollout_pipeline.sdk import subscription
from rollout_pipeline.sdk.delivery import SeenIds

DEADLINE_S = 10.0


@pytest.fixture
def removals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(subscription name, thread name) for each removal; no AWS call is made."""
    done: list[tuple[str, str]] = []
    made = iter(range(1000))

    def open_subscription(*_args: Any, **_kwargs: Any) -> tuple[str, str]:
        return f"bus-sdk-{next(made)}", "https://sqs.example/queue"

    def close_subscription(_aws: Any, _bus: str, name: str, _url: str) -> None:
        done.append((name, threading.current_thread().name))

    monkeypatch.setattr(subscription, "open_subscription", open_subscription)
    monkeypatch.setattr(subscription, "close_subscription", close_subscription)
    return done


def _stream() -> subscription.SubscribedStream:
    return subscription.SubscribedStream(object(), "bus", {"source": ["x"]}, SeenIds(), timeout=0)  # type: ignore[arg-type]


def test_close_removes_the_subscription_at_once_and_once(removals: list[tuple[str, str]]) -> None:
    stream = _stream()
    stream.close()
    stream.close()
    assert removals == [(stream.subscription[0], threading.current_thread().name)]


def test_a_collected_stream_is_removed_outside_the_collecting_thread(removals: list[tuple[str, str]]) -> None:
    stream = _stream()
    name = stream.subscription[0]
    cycle: dict[str, Any] = {"stream": stream}
    cycle["self"] = cycle  # collected by the cyclic collector, as a stream a loop broke out of may be
    stream.cycle = cycle  # type: ignore[attr-defined]
    del stream, cycle
    gc.collect()
    done = threading.Event()
    for _ in range(int(DEADLINE_S / 0.01)):
        if removals:
            done.set()
            break
        done.wait(0.01)
    assert [n for n, _ in removals] == [name]
    assert removals[0][1] != threading.current_thread().name


def test_streams_still_open_at_exit_are_closed_in_the_exiting_thread(removals: list[tuple[str, str]]) -> None:
    stream = _stream()
    subscription._close_open_streams()
    assert stream.closed
    assert removals == [(stream.subscription[0], threading.current_thread().name)]
