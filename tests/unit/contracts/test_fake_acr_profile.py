"""The realistic fake AgentCore (AcrProfile): quotas, cold starts, unreliable stops, idle sessions, seeding."""

from __future__ import annotations

import contextlib

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ports import RuntimeColdStart, RuntimeRejected, RuntimeSessionNotFound, RuntimeThrottled
from tests.doubles import ManualClock, MemoryStore

PAYLOAD = {"_rollout": {"exp_id": "e", "input_id": "q", "s3_bucket": "b"}}


def sid(i: int) -> str:
    return f"batch-0123456789ab-{i}-1-0123456789abcdef"


def make(clock: ManualClock, **profile: object) -> FakeAgentRuntime:
    return FakeAgentRuntime(MemoryStore(), AgentBehaviour(kind="manual"), profile=AcrProfile(**profile), clock=clock)  # type: ignore[arg-type]


def test_new_session_quota_per_endpoint_and_account() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, new_sessions_per_minute=120, account_new_sessions_per_s=100)  # 2/s per endpoint
    fake.invoke(sid(0), PAYLOAD)
    fake.invoke(sid(1), PAYLOAD)
    with pytest.raises(RuntimeThrottled, match="ThrottlingException"):
        fake.invoke(sid(2), PAYLOAD)  # a third new session within one second of a 2/s quota
    fake.invoke(sid(0), PAYLOAD)  # an existing session: no new-session quota
    clock.t += 0.5
    fake.invoke(sid(3), PAYLOAD)  # the bucket refilled one token
    # Account rate over a sliding window: 3/s across two endpoints.
    fake2 = make(ManualClock(1_000.0), new_sessions_per_minute=6000, account_new_sessions_per_s=3, endpoints=2)
    for i in range(3):
        fake2.invoke(sid(i), PAYLOAD)
    try:
        fake2.invoke(sid(9), PAYLOAD)
        raise AssertionError("account new-session rate not enforced")
    except RuntimeThrottled:
        pass
    assert [c.outcome for c in fake2.invocations()].count("throttled") == 1


def test_endpoints_have_their_own_quota() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, new_sessions_per_minute=60, endpoints=2)  # 1/s per endpoint
    by_endpoint: dict[int, list[str]] = {0: [], 1: []}
    for i in range(40):
        by_endpoint[ids.endpoint_index(sid(i), 2)].append(sid(i))
    fake.invoke(by_endpoint[0][0], PAYLOAD)
    fake.invoke(by_endpoint[1][0], PAYLOAD)  # the other endpoint still has its token
    for endpoint in (0, 1):
        try:
            fake.invoke(by_endpoint[endpoint][1], PAYLOAD)
            raise AssertionError("per-endpoint quota not enforced")
        except RuntimeThrottled:
            pass


def test_data_plane_tps_is_shared_by_invoke_and_stop_over_sliding_windows() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, data_plane_tps=3)
    fake.invoke(sid(0), PAYLOAD)
    clock.t += 0.6
    fake.invoke(sid(1), PAYLOAD)
    fake.stop(sid(0))
    try:
        fake.stop(sid(1))  # 4th call within [t-1, t]: a sliding, not an aligned, window
        raise AssertionError("data-plane TPS not enforced")
    except RuntimeThrottled:
        pass
    clock.t += 0.5  # the first call left the window
    fake.stop(sid(1))


def test_active_sessions_count_until_stopped_or_idle_timeout() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, max_active_sessions=2, idle_timeout_s=60)
    fake.invoke(sid(0), PAYLOAD)
    fake.invoke(sid(1), PAYLOAD)
    fake.finish(sid(0))  # result written, never stopped: still counts
    clock.t += 10
    with pytest.raises(RuntimeThrottled, match="ServiceQuotaExceededException"):
        fake.invoke(sid(2), PAYLOAD)
    clock.t += 51  # sid(0) idle for 61 s: AgentCore reaped it
    fake.invoke(sid(2), PAYLOAD)
    assert sid(0) in fake.reaped
    fake.stop(sid(1))
    fake.invoke(sid(3), PAYLOAD)
    assert fake.max_active == 2


def test_cold_start_424_then_same_session_succeeds() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, cold_start_share=1.0, cold_start_ready_s=2.0)
    try:
        fake.invoke(sid(0), PAYLOAD)
        raise AssertionError("no cold start")
    except RuntimeColdStart:
        pass
    assert sid(0) in fake.running  # the microVM exists anyway
    clock.t += 1
    try:
        fake.invoke(sid(0), PAYLOAD)
        raise AssertionError("ready too early")
    except RuntimeColdStart:
        pass
    clock.t += 1.5
    fake.invoke(sid(0), PAYLOAD)
    assert [c.outcome for c in fake.invocations()] == ["cold_start", "cold_start", "reinvoked"]


def test_unreliable_stops_and_not_found() -> None:
    clock = ManualClock(1_000.0)
    fake = make(clock, stop_failure_share=1.0, seed=3, new_sessions_per_minute=60_000)
    outcomes = set()
    for i in range(12):
        fake.invoke(sid(i), PAYLOAD)
        with contextlib.suppress(RuntimeThrottled, RuntimeSessionNotFound):
            fake.stop(sid(i))
        assert sid(i) in fake.running  # a failed stop leaves it running (NotFound included)
        fake.stop(sid(i))  # the next stop works
        assert sid(i) not in fake.running
        outcomes.add(fake.stops()[-2].outcome)
    assert outcomes == {"not_found_running", "conflict", "throttled"}
    try:
        fake.stop(sid(99))
        raise AssertionError("unknown session must answer NotFound")
    except RuntimeSessionNotFound:
        pass


def test_seeded_faults_repeat() -> None:
    def run() -> list[str]:
        fake = make(
            ManualClock(1_000.0),
            cold_start_share=0.3,
            seed=11,
            new_sessions_per_minute=60_000,
            account_new_sessions_per_s=1000,
        )
        for i in range(30):
            with contextlib.suppress(RuntimeColdStart):
                fake.invoke(sid(i), PAYLOAD)
        return [c.outcome for c in fake.invocations()]

    first = run()
    assert first == run()
    assert 3 <= first.count("cold_start") <= 18


def test_a_session_ends_at_its_maximum_lifetime_busy_or_idle() -> None:
    """AgentCore's `maxLifetime`: a session ends that long after its start, whatever it does: a rollout still running
    in it never writes its result, an invoke of it answers as an ended session, a stop as an unknown one."""
    clock = ManualClock(1_000.0)
    fake = make(clock, max_lifetime_s=60)
    fake.invoke(sid(0), PAYLOAD)  # a rollout, still running at its session's end
    fake.invoke(sid(1), {"_rollout": {"warmup": {"exp_id": "e", "session_id": sid(1)}}})  # a warm session, idle
    clock.t += 59.0
    fake.invoke(sid(1), {"_rollout": {"warmup": {"exp_id": "e", "session_id": sid(1)}}})  # kept alive: no younger
    assert fake.active_sessions() == 2
    clock.t += 1.0
    assert fake.active_sessions() == 0
    assert (fake.lifetime_ends, fake.lifetime_ends_busy) == ({sid(0), sid(1)}, {sid(0)})
    assert fake._write(sid(0), AgentBehaviour()) is None  # the agent's write (as its timer makes it) never lands
    assert not fake.written
    with pytest.raises(RuntimeRejected, match="not running"):
        fake.invoke(sid(1), PAYLOAD)
    with pytest.raises(RuntimeSessionNotFound):
        fake.stop(sid(0))
