"""The account's one new-session schedule and each experiment's entry in the pool, over moto (`limits.account`,
`limits.shares`, `ledger.pool`): one item bounds every sliding second whatever the experiments do, a throttle backs
off the budget it names, AgentCore's `ServiceQuotaExceededException` lowers the active sessions every share is cut
from, an entry's sessions in flight are always a fresh read of its counters, and the item's size (its write cost)
does not grow with the experiments."""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.pool import MemberEntry, PoolLedger
from rollout_pipeline.ledger.pool_schema import pool_key
from rollout_pipeline.limits.account import CEILING_MARGIN, RENEW_S, THROTTLE_PAUSE_S, AccountSchedule
from rollout_pipeline.limits.facade import Limits
from rollout_pipeline.limits.pacing import BACKOFF, Clocks
from rollout_pipeline.limits.shares import LIVE_S, MIN_SHARE_PER_S
from rollout_pipeline.local.resources import ExperimentResources, create_resources
from rollout_pipeline.ports import RuntimeQuotaExceeded, RuntimeRateExceeded
from rollout_pipeline.quotas import AccountQuotas, PoolSettings
from tests.conftest import wait_for
from tests.doubles import ManualClock, ThreadClocks
from tests.integration.limits.test_limits_pacing import RecordingRuntime, busiest_sliding_window

REGION = "us-east-1"


@pytest.fixture
def pool(resources: ExperimentResources) -> PoolLedger:
    ledger = PoolLedger.open(resources.settings().pool_table_name or "", region=REGION)
    ledger.write_settings(PoolSettings(AccountQuotas(new_sessions_per_s=10.0), reserve=0.1))
    return ledger


def experiment(
    resources: ExperimentResources, name: str, runtime: Any = None, pacing: Clocks | None = None, **settings: Any
) -> Limits:
    """Experiment `name`'s limits through the account pool (its own table, the shared pool table)."""
    config = ExperimentConfig(name=name, **{"tps_limit": 50, "max_sessions": 200, **settings})
    created = create_resources(config, region=REGION, client=clients.client)
    ledger = Ledger.open(created.table_name).limits
    pool = PoolLedger.open(resources.settings().pool_table_name or "", region=REGION)
    return Limits(ledger, config, runtime or RecordingRuntime(), pool=pool, pacing=pacing)


def entry_of(pool: PoolLedger, name: str) -> MemberEntry:
    (entry,) = [m for m in pool.snapshot()[1] if m.name == name]
    return entry


def test_experiments_booking_at_once_keep_every_sliding_second_of_the_account_within_its_budget(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """Three experiments' processes book new sessions on the account's one schedule at once, each thread on a
    virtual clock of its own (it never wakes late): the union of their starts holds at most floor(10 x 0.9) = 9 in
    any sliding second, whatever each asks (the leases' union reached 23-24 against 22.5)."""
    clocks = ThreadClocks(time.time())
    schedules = [AccountSchedule(pool, clocks=Clocks(clocks.wall, time.monotonic, clocks.sleep)) for _ in range(3)]
    starts: list[float] = []
    lock = threading.Lock()

    def book(schedule: AccountSchedule) -> None:
        for _ in range(12):
            assert schedule.pacer.acquire(time.monotonic() + 60)
            with lock:
                starts.append(clocks.wall())

    threads = [threading.Thread(target=book, args=(s,)) for s in schedules for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(starts) == 72
    ordered = sorted(starts)
    assert busiest_sliding_window(starts) <= 9, [round(b - ordered[0], 4) for b in ordered]


def test_a_new_sessions_throttle_backs_off_every_experiment_at_its_next_start(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """One experiment's new session is throttled (someone outside the pipeline uses the account): the account's item
    is spaced wider at once, so the other experiment's next start follows it (the leases scaled a budget larger
    than the grants: throttles went on for 10-15 s)."""
    a, b = AccountSchedule(pool), AccountSchedule(pool)
    b.pacer.reserve(time.monotonic() + 5)
    before = b.pacer.interval_us
    a.throttled()
    a.throttled()  # the same overshoot: one decrease
    assert a.decreases == 1
    b.pacer.reserve(time.monotonic() + 5)  # its next start, no read of its own
    assert b.pacer.interval_us == pool.account().settings.start_interval_us(BACKOFF) > before


def test_a_new_sessions_throttle_pauses_the_accounts_schedule_for_a_moment(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """AgentCore counts new sessions over any sliding second: after a throttle the account's schedule starts nothing
    for `THROTTLE_PAUSE_S`, so that second drains and whoever else uses the account finds room at once (without the
    pause, an outsider above the reserve had 2 of its 116 calls refused in `bench_capacity.py --outside`)."""
    a, b = AccountSchedule(pool), AccountSchedule(pool)
    before = b.pacer.reserve(time.monotonic() + 5)
    a.throttled()
    after = b.pacer.reserve(time.monotonic() + 5)
    assert before is not None
    assert after is not None
    assert after - before >= THROTTLE_PAUSE_S + b.pacer.interval_s * 0.99


def test_a_start_booked_before_the_accounts_backoff_is_left_unused(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """A new session whose start was booked at the old spacing does not start there once the account backs off
    meanwhile (an outsider's surge met up to `ADMIT_AHEAD_S` of such starts, throttled too): it books again, at the
    new spacing. On a virtual clock: the backoff comes while the invoke waits for its start."""
    clocks = ThreadClocks(time.time())
    backed_off: list[float] = []

    def sleep(seconds: float) -> None:
        if not backed_off:  # another rollout's new session was throttled meanwhile
            backed_off.append(clocks.wall())
            limits.account.throttled()  # type: ignore[union-attr]
        clocks.sleep(seconds)

    runtime = RecordingRuntime(clocks.wall)
    limits = experiment(resources, "exp-a", runtime, pacing=Clocks(clocks.wall, time.monotonic, sleep))
    booked: list[float] = []
    limits.runtime.invoke("s-1", {}, time.monotonic() + 30, on_booked=booked.append)
    assert limits.account is not None
    assert limits.account.decreases == 1
    assert len(booked) == 2, booked  # main: one start, used at the old spacing after the backoff
    (invoked,) = [at for at, op, _sid in runtime.calls if op == "invoke"]
    assert invoked >= booked[1] > backed_off[0]


def test_a_throttle_of_a_call_into_a_session_backs_off_only_that_experiments_invokes(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """A warm take or a cold-start retry throttled (AgentCore's per-agent invoke rate) slows that experiment's own
    invokes; the account's new-session schedule, every experiment's, stays as it was."""

    class Throttling(RecordingRuntime):
        def invoke(self, session_id: str, payload: object) -> None:
            raise RuntimeRateExceeded("ThrottlingException: rate exceeded for the agent")

    limits = experiment(resources, "takes", Throttling())
    spacing = pool.account().pace.interval_us
    tps_before = limits.runtime.tps.limit
    with pytest.raises(RuntimeRateExceeded):
        limits.runtime.invoke("warm-session-0000000000000000000000000000", {}, time.monotonic() + 5, new_session=False)
    assert limits.runtime.tps.limit == pytest.approx(tps_before * BACKOFF)
    after = pool.account()
    assert (after.pace.interval_us, after.factor_at) == (spacing, 0.0)


def test_quota_exceeded_lowers_the_accounts_active_sessions_and_every_share_follows(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """AgentCore answers `ServiceQuotaExceededException` ("maxVms") with 128 sessions held although the quota says
    5,000: the account's cap becomes `BACKOFF` x 128, climbing back to `CEILING_MARGIN` x 128 at most, and the
    experiment's share of active sessions follows at its next renewal."""

    class Full(RecordingRuntime):
        def invoke(self, session_id: str, payload: object) -> None:
            raise RuntimeQuotaExceeded("ServiceQuotaExceededException: maxVms")

    limits = experiment(resources, "full", Full(), max_sessions=1000)
    assert limits.membership is not None
    assert limits.account is not None
    ledger = Ledger.open(create_resources(limits.membership.config, region=REGION, client=clients.client).table_name)
    assert ledger.table.transact([ledger.limits.take_slot(1000, i, 32) for i in range(4)]) is None  # 128 held
    limits.heartbeat()
    assert limits.max_sessions() == 1000
    with pytest.raises(RuntimeQuotaExceeded):
        limits.runtime.invoke("new-session-00000000000000000000000000000", {}, time.monotonic() + 5)
    learned = pool.account()
    assert learned.active_cap == math.floor(BACKOFF * 128)
    assert learned.active_ceiling == math.floor(CEILING_MARGIN * 128)  # the climb back stops under the refused level
    limits.heartbeat()
    assert limits.max_sessions() == int(learned.active_cap * 0.9)  # the reserve is left of the learned cap too


def test_an_entrys_sessions_in_flight_are_read_from_the_counters_not_assumed(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """A process that never read the experiment's counters (a completer, the SDK) renews its entry with the sessions
    its counters hold, not 0 (they vanished from the pool during a step's long tail, and another experiment was
    granted them)."""
    limits = experiment(resources, "tail")
    assert limits.membership is not None
    table = Ledger.open(create_resources(limits.membership.config, region=REGION, client=clients.client).table_name)
    assert table.table.transact([table.limits.take_slot(200, 3, 5)]) is None
    limits.membership.renew(force=True)
    (entry,) = [m for m in pool.snapshot()[1] if m.name == "tail"]
    assert entry.in_flight == 5


def test_the_accounts_item_costs_one_write_unit_with_fifty_experiments(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """Fifty experiments have entries in the pool and book starts: the account's schedule item, written at every
    start, stays under 1 KB (one write unit a start; the pool's one item grew ~460 bytes a member)."""
    now = time.time()
    for i in range(50):
        pool.put_member(MemberEntry(f"member-{i:02d}", demand=math.inf, renewed_at=now, in_flight=9), now=now)
    schedule = AccountSchedule(pool)
    schedule.throttled()  # the backoff's attributes too
    for _ in range(5):
        assert schedule.pacer.reserve(time.monotonic() + 10) is not None
    raw = clients.client("dynamodb").get_item(TableName=pool.table.name, Key=pool_key())["Item"]
    assert len(pool.snapshot()[1]) == 50
    assert item_size(raw) < 1024


def item_size(item: dict[str, Any]) -> int:
    """An item's size as DynamoDB counts it (about: names and values in UTF-8, numbers at their digits)."""
    size = 0
    for name, value in item.items():
        ((kind, plain),) = value.items()
        size += len(name.encode()) + (len(plain) // 2 + 2 if kind == "N" else len(json.dumps(plain).encode()))
    return size


def test_limits_use_the_clocks_they_are_given(resources: ExperimentResources, pool: PoolLedger) -> None:
    """The schedules of an experiment run on the pacing clocks given (a bench's dilated clock, a test's virtual
    one), the gate on its own."""
    clocks = ThreadClocks(time.time() + 3600)
    config = ExperimentConfig(name="clocked", tps_limit=50)
    created = create_resources(config, region=REGION, client=clients.client)
    limits = Limits(
        Ledger.open(created.table_name).limits,
        config,
        RecordingRuntime(),
        pool=pool,
        pacing=Clocks(clocks.wall, time.monotonic, clocks.sleep),
    )
    start = limits.runtime.session.reserve(time.monotonic() + 5)
    assert start is not None
    assert start >= clocks.start


def two_sharing_halves(
    resources: ExperimentResources, names: tuple[str, str], clock: ManualClock
) -> tuple[Limits, Limits, float]:
    """Two experiments on `clock`, each renewed once (a first renewal asks for all it can get), so each holds half the
    account's rate; and that rate."""
    first, second = (experiment(resources, name, pacing=Clocks(clock, time.monotonic, clock.sleep)) for name in names)
    for limits in (first, second):
        assert limits.membership is not None
        limits.membership.renew(force=True)
    assert second.account is not None
    assert second.membership is not None
    rate = second.account.rate()
    assert second.membership.share() == pytest.approx(rate / 2, rel=0.01)
    return first, second, rate


def test_an_experiment_with_nothing_left_to_book_gives_its_share_to_the_others_at_their_next_renewal(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """The last rollout in hand of experiment `paused` books its start and no process of it has another waiting (its
    feed stopped): its entry asks for nothing at once, and `busy`'s next renewal, a round later, takes the whole rate
    while `paused`'s entry is still live (the share went only once the entry aged past `LIVE_S`: 3-5 s)."""
    clock = ManualClock(time.time())
    paused, busy, rate = two_sharing_halves(resources, ("paused", "busy"), clock)
    paused.gate.hold(["batch-0001"])[0].leave()  # its start booked: nothing in hand, none waiting on its board
    wait_for(lambda: entry_of(pool, "paused").demand == 0.0, what="the paused experiment to ask for nothing")
    clock.advance(RENEW_S * 1.3 + 0.01)
    busy.membership.note_backlog()  # its rollouts wait for the rate
    assert busy.membership.renew()
    assert busy.membership.share() == pytest.approx(rate, rel=0.01)
    assert clock() - entry_of(pool, "paused").renewed_at < LIVE_S


def test_the_others_renew_at_their_next_start_when_an_experiment_stops_or_starts_asking(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """An experiment stops asking for new sessions (then starts again): the account's item says so, and the other
    experiment's next start, which reads the item anyway, renews its share at once, not a round later (the clock
    moves a tenth of a second at a time: no renewal is due)."""
    clock = ManualClock(time.time())
    pausing, other, rate = two_sharing_halves(resources, ("pausing", "other"), clock)
    clock.advance(0.1)
    pausing.membership.renew(force=True, demand=0.0)  # its last rollout in hand booked its start
    assert other.account.pacer.reserve(time.monotonic() + 5) is not None
    wait_for(lambda: other.membership is not None and other.membership.share() == pytest.approx(rate, rel=0.01))
    clock.advance(0.1)
    pausing.membership.renew(force=True, demand=math.inf)  # its rollouts wait again
    assert other.account.pacer.reserve(time.monotonic() + 5) is not None
    wait_for(lambda: other.membership is not None and other.membership.share() == pytest.approx(rate / 2, rel=0.01))


def test_an_idle_experiment_keeps_its_spacing_and_renews_its_share_at_its_next_start(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """An experiment whose rollouts all booked their starts asks for nothing, but its schedule keeps the spacing its
    next rollouts book at, and the next start renews its share at once, not a round later (a dip in its work cost it
    its share for a round, at a start every 2 s). That renewal asks for all it can get: its rollouts, received and
    not yet at the gate, count (it asked for nothing again, and a dispatcher's rounds of 10 rollouts started 4.4 a
    second where the account had room for 20)."""
    clock = ManualClock(time.time())
    limits = experiment(resources, "dipped", pacing=Clocks(clock, time.monotonic, clock.sleep))
    assert limits.membership is not None
    limits.membership.renew(force=True)
    share = limits.membership.share()
    limits.membership.renew(force=True, demand=0.0)  # its last rollout in hand booked its start
    assert entry_of(pool, "dipped").demand == 0.0
    assert limits.membership.share() == pytest.approx(share)
    held = limits.gate.hold(["batch-0002"])  # the next rollouts, just received
    assert limits.membership.renew()  # as its next start's answer of the schedule renews it (the clock stands still)
    assert math.isinf(entry_of(pool, "dipped").demand)
    assert limits.membership.share() == pytest.approx(share)
    for rollout in held:
        rollout.leave()


def test_a_start_booked_at_the_idle_spacing_holds_back_none_after_it(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """An experiment whose entry lapsed asks for nothing (a start every 2 s) and starts again: once its share is
    renewed, the start it booked at the idle spacing holds back none after it (its rollouts booked starts 2 s apart:
    21 s before it started at its share in two default bench_capacity runs)."""
    clock = ManualClock(time.time())
    limits = experiment(resources, "resumed", pacing=Clocks(clock, time.monotonic, clock.sleep))
    assert limits.membership is not None
    limits.membership.renew(force=True)
    clock.advance(LIVE_S + 1)
    limits.membership.renew(force=True)  # nothing started since: it asks for nothing
    assert limits.membership.share() == pytest.approx(MIN_SHARE_PER_S, rel=0.01)
    session = limits.runtime.session
    first = session.reserve(time.monotonic() + 5, lead_s=0.01)
    assert first is not None
    assert session.tat >= first + 1.0 / MIN_SHARE_PER_S
    limits.membership.renew(force=True, demand=math.inf)  # its rollouts wait for the rate
    assert limits.membership.share() > 5 * MIN_SHARE_PER_S
    second = session.reserve(time.monotonic() + 5, lead_s=0.01)
    assert second is not None
    assert second < first + 1.0 / MIN_SHARE_PER_S


def test_rollouts_waiting_at_the_gate_ask_for_all_the_experiment_can_get(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """A rollout waits at the gate of an experiment whose entry lapsed (it had no work for a while): its renewal asks
    for all it can get (the rate measured since the last renewal, 0, gave it the idle spacing)."""
    clock = ManualClock(time.time())
    limits = experiment(resources, "waiting", pacing=Clocks(clock, time.monotonic, clock.sleep), max_sessions=32)
    assert limits.membership is not None
    ledger = Ledger.open(create_resources(limits.membership.config, region=REGION, client=clients.client).table_name)
    assert ledger.table.transact([ledger.limits.take_slot(32, i) for i in range(32)]) is None  # it stays waiting
    limits.membership.renew(force=True, demand=0.0)
    clock.advance(LIVE_S + 1)
    waiter = threading.Thread(target=limits.gate.wait, args=(time.monotonic() + 30, "batch-0002"), daemon=True)
    waiter.start()
    wait_for(limits.gate.queued, what="a rollout waiting at the gate")
    assert limits.membership.renew(force=True)
    limits.gate.close()
    waiter.join(timeout=30)
    assert math.isinf(entry_of(pool, "waiting").demand)


def test_the_sweepers_renewal_keeps_the_demand_of_a_live_entry(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """The sweeper renews the entry once a minute from a process that never saw the experiment's schedule: while the
    dispatchers renew it, it keeps what they asked (it measured 0 started and set the experiment's share to nothing
    for a round: a backlogged experiment started 0.5 a second, every minute)."""
    clock = ManualClock(time.time())
    dispatcher = experiment(resources, "swept", pacing=Clocks(clock, time.monotonic, clock.sleep))
    sweeper = dispatcher.for_another_process()
    assert dispatcher.membership is not None
    for _ in range(3):
        assert dispatcher.runtime.session.reserve(time.monotonic() + 5) is not None
    clock.advance(RENEW_S)
    assert dispatcher.membership.renew(force=True)
    asked, share = entry_of(pool, "swept").demand, dispatcher.membership.share()
    assert asked > 0
    clock.advance(RENEW_S * 1.5)
    sweeper.heartbeat()
    assert entry_of(pool, "swept").demand == asked
    assert sweeper.membership is not None
    assert sweeper.membership.share() == pytest.approx(share)


def test_a_renewal_stamped_earlier_never_overwrites_a_later_one(
    resources: ExperimentResources, pool: PoolLedger
) -> None:
    """Two processes of an experiment renew at once, one asking for nothing (its last rollout booked its start), the
    other for all it can get a moment earlier: whichever write lands last, the entry is the later renewal's (the
    earlier one overwrote the idle entry, and the others kept its share until it aged past `LIVE_S`)."""
    now = time.time()
    pool.put_member(MemberEntry("racing", demand=0.0, renewed_at=now), now=now)
    pool.put_member(MemberEntry("racing", demand=math.inf, renewed_at=now - 0.05), now=now - 0.05)
    assert entry_of(pool, "racing").demand == 0.0
    pool.put_member(MemberEntry("racing", demand=2.0, renewed_at=now + 1), now=now + 1)
    assert entry_of(pool, "racing").demand == 2.0
