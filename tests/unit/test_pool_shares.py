"""The account pool's arithmetic (`limits.shares`): weighted fair shares that follow demand, and leases
that never over-commit a budget whatever order members renew in."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_pipeline.ledger.pool import Backoff, Lease, Member, PoolState
from rollout_pipeline.limits.pacing import LATE_START_S, LATENESS_S
from rollout_pipeline.limits.shares import (
    DECREASE,
    DECREASE_HOLD_S,
    INCREASE_PER_S,
    LEASE_S,
    PROBE_AFTER_S,
    Ask,
    counted,
    decreased,
    factor,
    fair_shares,
    grant,
    in_use,
    usable,
    water_fill,
)
from rollout_pipeline.quotas import AccountQuotas, PoolSettings

SETTINGS = PoolSettings(AccountQuotas(new_sessions_per_s=25.0, data_plane_per_s=1000.0, active_sessions=5000))
BUDGET = SETTINGS.budget("sessions")  # 22.5


def renew(
    state: PoolState, name: str, demand: float, now: float, *, weight: float = 1.0, booked: float | None = None
) -> PoolState:
    """`name` renews its sessions lease in `state` at `now` (as `CapacityLease._write` does, without DynamoDB)."""
    leases = grant(state, name, weight=weight, asks={"sessions": Ask(demand, booked_until=booked)}, now=now)
    old = state.members.get(name) or Member(name)
    member = replace(old, weight=weight, leases={**old.leases, **leases}, heartbeat=now)
    return replace(state, members={**state.members, name: member}, version=state.version + 1)


def rates(state: PoolState, now: float) -> dict[str, float]:
    return {name: m.lease("sessions").rate for name, m in state.members.items() if m.lease("sessions").until > now}


def test_water_fill_gives_weighted_shares_and_passes_on_what_is_not_wanted() -> None:
    assert water_fill(22.5, {"a": (1, math.inf), "b": (1, math.inf), "c": (2, math.inf)}) == {
        "a": 5.625,
        "b": 5.625,
        "c": 11.25,
    }
    shares = water_fill(22.5, {"a": (1, 2.0), "b": (1, math.inf), "c": (2, math.inf)})
    assert shares["a"] == 2.0
    assert math.isclose(shares["b"], 20.5 / 3)
    assert math.isclose(shares["c"], 2 * 20.5 / 3)
    assert water_fill(22.5, {"a": (1, 3.0), "b": (1, 4.0)}) == {"a": 3.0, "b": 4.0}  # nobody wants the rest


def test_three_backlogged_members_converge_to_their_weighted_shares() -> None:
    state = PoolState(settings=SETTINGS)
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    now = 1000.0
    for _round in range(5):
        for name, weight in weights.items():
            state = renew(state, name, math.inf, now, weight=weight, booked=now)
            now += 0.3
    got = rates(state, now)
    assert math.isclose(got["a"], 5.625, rel_tol=1e-6)
    assert math.isclose(got["b"], 5.625, rel_tol=1e-6)
    assert math.isclose(got["c"], 11.25, rel_tol=1e-6)


def test_an_idle_members_share_goes_to_the_others_and_comes_back() -> None:
    state = PoolState(settings=SETTINGS)
    now = 1000.0
    for name in "ab":
        state = renew(state, name, math.inf, now, booked=now)
    state = renew(state, "a", math.inf, now + 0.5, booked=now + 0.5)
    assert math.isclose(rates(state, now + 0.5)["a"], 11.25)
    # b stops renewing (no work): once its lease ends, a gets everything at its next renewal.
    later = now + LEASE_S + 0.1
    state = renew(state, "a", math.inf, later, booked=later)
    assert math.isclose(rates(state, later)["a"], BUDGET)
    # b has work again: it gets only what is free at once, all of its share once a has renewed and what a had
    # booked under its bigger grant has started.
    back = later + 0.5
    state = renew(state, "b", math.inf, back, booked=None)
    assert rates(state, back)["b"] < 11.25
    state = renew(state, "a", math.inf, back + 0.2, booked=back + 0.2)
    assert math.isclose(rates(state, back + 0.2)["a"], 11.25)  # a shrinks at its own renewal ...
    settled = back + 0.2 + LEASE_S / 2  # ... and once its starts booked under the old grant have passed,
    state = renew(state, "b", math.inf, settled, booked=settled)
    assert math.isclose(rates(state, settled)["b"], 11.25)  # b has its whole share


def test_a_member_without_a_backlog_asks_for_what_it_uses() -> None:
    state = renew(PoolState(settings=SETTINGS), "a", 3.0, 1000.0)
    state = renew(state, "b", math.inf, 1000.1)
    assert rates(state, 1000.1) == {"a": 3.0, "b": BUDGET - 3.0}


def test_caps_bound_a_share_and_the_rest_goes_to_the_others() -> None:
    state = PoolState(settings=SETTINGS)
    leases = grant(state, "a", weight=1.0, asks={"sessions": Ask(math.inf, cap=4.0)}, now=1000.0)
    assert leases["sessions"].rate == 4.0
    state = replace(state, members={"a": Member("a", caps={"sessions": 4.0}, leases=leases, heartbeat=1000.0)})
    assert grant(state, "b", weight=1.0, asks={"sessions": Ask(math.inf)}, now=1000.1)["sessions"].rate == BUDGET - 4.0


def test_the_backoff_lowers_fair_shares_once_per_overshoot_and_climbs_back() -> None:
    first = decreased(None, 100.0)
    assert first is not None
    assert first.base == DECREASE
    assert decreased(first, 100.0 + DECREASE_HOLD_S / 2) is None  # the same overshoot
    assert factor(first, 100.0 + PROBE_AFTER_S) == DECREASE  # no probe while the outside use likely goes on
    assert math.isclose(factor(first, 110.0 + PROBE_AFTER_S), DECREASE + 10 * INCREASE_PER_S)
    assert factor(first, 10_000.0) == 1.0
    state = PoolState(settings=SETTINGS, backoff={"sessions": first})
    assert math.isclose(fair_shares(state, "sessions", 100.0, a=(1.0, math.inf))["a"], BUDGET * DECREASE)


def test_active_sessions_in_flight_count_until_the_heartbeat_is_stale() -> None:
    member = Member("a", leases={"active": Lease(rate=10, until=100.0)}, heartbeat=100.0, in_flight=40)
    assert counted(member, "active", 101.0) == 40  # more in flight than granted (granted before a shrink)
    assert counted(member, "active", 100.0 + 10_000) == 0  # a deleted experiment stops counting


@settings(deadline=None)  # pure arithmetic: a loaded machine only slows it
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.floats(min_value=0.0, max_value=1.5),  # time to this renewal
            st.one_of(st.just(math.inf), st.floats(min_value=0.0, max_value=30.0)),  # demand
            st.sampled_from([1.0, 2.0, 0.5]),  # weight
            st.floats(min_value=0.0, max_value=2.5),  # how far ahead it had booked
            st.booleans(),  # a backoff decrease before it
        ),
        min_size=1,
        max_size=60,
    )
)
def test_grants_in_use_never_exceed_the_budget(steps: list[tuple[str, float, float, float, float, bool]]) -> None:
    """Whatever members renew, in whatever order, with whatever demands, weights, bookings and backoffs: at every
    instant, what all members may be using (`counted`) sums to at most the budget."""
    state = PoolState(settings=SETTINGS)
    now = 1000.0
    for name, gap, demand, weight, ahead, throttle in steps:
        now += gap
        assert in_use(state, "sessions", now) <= BUDGET + 1e-9
        if throttle:
            lower = decreased(state.backoff.get("sessions"), now)
            if lower is not None:
                state = replace(state, backoff={"sessions": lower})
        before = state.members.get(name)
        booked = None if before is None else min(before.lease("sessions").until, now + ahead)
        state = renew(state, name, demand, now, weight=weight, booked=booked)
        assert in_use(state, "sessions", now) <= BUDGET + 1e-9
        for probe in (now + 0.01, now + LEASE_S / 2, now + LEASE_S + 0.01):  # counted only falls as time passes
            assert in_use(state, "sessions", probe) <= BUDGET + 1e-9


def test_a_shrink_counts_the_old_grant_only_until_its_last_booked_start() -> None:
    """Renewing often must not keep an old, bigger grant alive: each earlier grant ends with its own lease or the
    last start booked under it, whichever comes first."""
    state = renew(PoolState(settings=SETTINGS), "a", math.inf, 1000.0, booked=1000.0)
    state = renew(state, "b", math.inf, 1000.1, booked=None)
    now = 1000.2
    for _ in range(10):  # both renew every 0.8 s with their schedules booked 1 s ahead
        state = renew(state, "a", math.inf, now, booked=now + 1.0)
        state = renew(state, "b", math.inf, now + 0.4, booked=now + 1.4)
        now += 0.8
    a = state.members["a"].lease("sessions")
    assert math.isclose(a.rate, BUDGET / 2)
    assert all(math.isclose(rate, BUDGET / 2) for rate, _until in a.held)  # the big grant is gone


@settings(deadline=None)
@given(
    st.lists(st.floats(min_value=0.05, max_value=1.0), min_size=1, max_size=6),
    st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=6, max_size=6),
    st.sampled_from([4.0, 6.0, 25.0]),
    st.integers(min_value=0, max_value=2**31),
)
def test_members_paced_within_the_usable_budget_keep_every_second_within_the_quota(
    parts: list[float], phases: list[float], quota: float, seed: int
) -> None:
    """Members each pacing their own starts evenly (spacing (1 + LATENESS_S) / rate, each start up to LATE_START_S
    late), at rates summing to what `usable` allows: whatever their phases, no sliding second holds more starts
    than the account's quota."""
    import random

    settings = PoolSettings(AccountQuotas(new_sessions_per_s=quota), reserve=0.1)
    parts = parts[: int(quota)]  # no more members than the quota starts in a second (`usable`'s limit)
    n = len(parts)
    members = {f"m{i}": Member(f"m{i}", leases={"sessions": Lease(rate=1.0, until=1e9)}) for i in range(n - 1)}
    state = PoolState(settings=settings, members=members)
    total = usable(state, "sessions", 0.0, besides="me")
    rates = [total * part / sum(parts) for part in parts]
    rng = random.Random(seed)
    starts = []
    for rate, phase in zip(rates, phases, strict=False):
        spacing = (1 + LATENESS_S) / rate
        starts += [phase * spacing + k * spacing + rng.uniform(0, LATE_START_S) for k in range(int(20 * rate) + 1)]
    starts.sort()
    busiest = max(sum(1 for s in starts[i:] if s < start + 1.0) for i, start in enumerate(starts))
    assert busiest <= math.floor(quota)


def test_backoff_state_is_plain_data() -> None:
    assert Backoff() == Backoff(base=1.0, at=0.0)
