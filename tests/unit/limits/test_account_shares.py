"""The account's one schedule and the experiments' advisory shares, as arithmetic (`quotas.PoolSettings.
start_interval_us`, `limits.shares.fair_shares`, `limits.account`): every sliding second within the budget whatever
the starts' lateness, the reserve free in every second, weighted shares nobody is starved of, and a share that follows
demand."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_pipeline.ledger.pool import AccountView, MemberEntry
from rollout_pipeline.limits import account
from rollout_pipeline.limits.pacing import (
    BACKOFF,
    BACKOFF_HOLD_S,
    PROBE_AFTER_S,
    RETRY_BASE_S,
    RETRY_CAP_S,
    backoff_factor,
    decreased,
    retry_pause,
)
from rollout_pipeline.limits.shares import ACTIVE_LIVE_S, LIVE_S, fair_shares, water_fill
from rollout_pipeline.quotas import START_LATENESS_S, AccountQuotas, PoolSettings

NOW = 1_795_000_000.0


def busiest_second(times: list[float]) -> int:
    """The most starts in any half-open window [t, t + 1) (windows starting at starts suffice)."""
    ordered = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + 1.0:
            j += 1
        best = max(best, j - i)
    return best


@settings(max_examples=200, deadline=None)
@given(
    quota=st.floats(min_value=1.0, max_value=200.0),
    reserve=st.sampled_from([0.0, 0.05, 0.1, 0.25]),
    factor=st.sampled_from([1.0, 0.75, 0.5625, 0.2]),
    lateness=st.lists(st.floats(min_value=0.0, max_value=START_LATENESS_S), min_size=60, max_size=60),
)
def test_every_sliding_second_of_the_account_schedule_stays_within_the_budget(
    quota: float, reserve: float, factor: float, lateness: list[float]
) -> None:
    """Starts booked back to back on the account's schedule, each up to `START_LATENESS_S` late (a later one is
    dropped), never put more than floor(budget x factor) in any sliding second: the budget holds whatever the
    experiments' shares say, and the reserve is free in every second."""
    pool = PoolSettings(AccountQuotas(new_sessions_per_s=quota), reserve=reserve)
    interval_s = pool.start_interval_us(factor) / 1e6
    starts = [i * interval_s + late for i, late in enumerate(lateness)]
    assert busiest_second(starts) <= max(1, math.floor(pool.budget("sessions") * factor + 1e-9))


def test_at_a_small_quota_the_reserve_is_free_in_every_second() -> None:
    """4 new sessions/s with a 10% reserve: 3 in any second (3.6 allowed 4 in some seconds: none left over)."""
    pool = PoolSettings(AccountQuotas(new_sessions_per_s=4.0), reserve=0.1)
    interval_s = pool.start_interval_us() / 1e6
    late_every_other = [i * interval_s + (START_LATENESS_S if i % 2 else 0.0) for i in range(40)]
    assert busiest_second(late_every_other) == 3


def entry(
    name: str, *, weight: float = 1.0, demand: float = math.inf, age_s: float = 0.5, **fields: object
) -> MemberEntry:
    return MemberEntry(name, weight=weight, demand=demand, renewed_at=NOW - age_s, **fields)  # type: ignore[arg-type]


def rates(members: list[MemberEntry], rate: float) -> dict[str, float]:
    return {m.name: fair_shares(m.name, members, rate, 1000.0, NOW)[0] for m in members}


def test_backlogged_experiments_get_their_weighted_share_at_a_small_quota() -> None:
    """Three backlogged experiments of weights 1, 1, 2 on an account of 4 new sessions/s: each gets its weight's part
    of the account's rate, none is starved (the leases gave one of them 0.00 while the others got 0.90 and 1.80)."""
    members = [entry("a"), entry("b"), entry("c", weight=2.0)]
    rate = account.start_rate(AccountView(settings=PoolSettings(AccountQuotas(new_sessions_per_s=4.0))), NOW)
    shares = rates(members, rate)
    assert shares["a"] == shares["b"] > 0
    assert shares["c"] == 2 * shares["a"]
    assert sum(shares.values()) == rate


def test_what_one_does_not_want_goes_to_the_others_and_caps_hold() -> None:
    members = [entry("light", demand=1.0), entry("capped", sessions_cap=3.0), entry("hungry")]
    shares = rates(members, 20.0)
    assert (shares["light"], shares["capped"]) == (1.0, 3.0)
    assert shares["hungry"] == 16.0


def test_an_experiment_that_stopped_renewing_holds_no_rate_but_its_sessions_still_count() -> None:
    """A finished experiment gives its rate up as soon as its entry is older than `LIVE_S` (it kept asking 1/s for
    about 9 s); its sessions in flight count against the account's active sessions until `ACTIVE_LIVE_S`."""
    done = entry("done", age_s=LIVE_S + 0.1, in_flight=40, max_sessions=100)
    busy = entry("busy", max_sessions=100)
    assert rates([done, busy], 20.0) == {"done": 0.0, "busy": 20.0}
    assert fair_shares("busy", [done, busy], 20.0, 100.0, NOW)[1] == 60  # the finished one's 40 sessions count
    gone = entry("done", age_s=ACTIVE_LIVE_S + 1, in_flight=40, max_sessions=100)
    assert fair_shares("busy", [gone, busy], 20.0, 100.0, NOW)[1] == 100


def test_water_fill_is_weighted_max_min_fair_and_work_conserving() -> None:
    shares = water_fill(10.0, {"a": (1.0, 1.0), "b": (1.0, math.inf), "c": (2.0, math.inf)})
    assert shares == {"a": 1.0, "b": 3.0, "c": 6.0}


def test_a_throttle_decreases_the_rate_once_per_overshoot_holds_it_then_climbs_back() -> None:
    lower = decreased(1.0, 0.0, NOW)
    assert lower == BACKOFF
    assert decreased(lower, NOW, NOW + BACKOFF_HOLD_S / 2) is None  # the same overshoot: once
    assert backoff_factor(lower, NOW, NOW + PROBE_AFTER_S) == lower  # held while the outside use goes on
    assert lower < backoff_factor(lower, NOW, NOW + PROBE_AFTER_S + 5) < 1.0
    assert backoff_factor(lower, NOW, NOW + PROBE_AFTER_S + 60) == 1.0


def test_the_learned_active_cap_climbs_back_after_its_pause() -> None:
    view = AccountView(settings=PoolSettings(AccountQuotas(active_sessions=5000)), active_cap=96, active_cap_at=NOW)
    assert account.active_cap(view, NOW + PROBE_AFTER_S) == 96
    assert account.active_cap(view, NOW + PROBE_AFTER_S + 10) == 96 + int(10 / account.RENEW_S)
    assert account.active_cap(AccountView(settings=view.settings), NOW) == 5000  # nothing learned: the quota


def test_the_learned_active_cap_settles_under_the_level_refused() -> None:
    """Refused at 128 sessions, the cap climbs back only to its ceiling (0.95 x 128), not to the quota, so it is not
    refused again each time it climbs (a refusal every ~50 s in a run capped at 128); after an hour it may probe."""
    view = AccountView(
        settings=PoolSettings(AccountQuotas(active_sessions=5000)), active_cap=96, active_ceiling=121, active_cap_at=NOW
    )
    assert account.active_cap(view, NOW + PROBE_AFTER_S + 100) == 121
    assert account.active_cap(view, NOW + account.CEILING_KEEP_S + 1) > 121  # the ceiling lapsed: climbing again


def test_retries_after_a_refusal_use_full_jitter() -> None:
    """A refused call's retry pause is drawn from [0, cap]: the retries of many callers spread out instead of
    arriving together (a storm that live-locked a trainer's sessions at AgentCore's active-session cap)."""
    rng = random.Random(7)
    pauses = [retry_pause(2, rng) for _ in range(2000)]
    cap = min(RETRY_CAP_S, RETRY_BASE_S * 4)
    assert 0.0 <= min(pauses) < 0.05 * cap
    assert 0.95 * cap < max(pauses) <= cap
    assert abs(sum(pauses) / len(pauses) - cap / 2) < 0.05 * cap  # uniform, not a band near the cap
