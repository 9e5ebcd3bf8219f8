"""The account pool over moto: experiments of one account lease their shares of AgentCore's quotas from one pool
item (`ledger.pool`, `limits.pool.CapacityLease`), and their own schedules carry the grant."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.pool import PoolLedger, PoolMissing
from rollout_pipeline.limits.pacing import LATENESS_S, STOP_PACE, LimitedRuntime, Pacer
from rollout_pipeline.limits.pool import CALLS_PACE, SESSION_PACE, CapacityLease, interval_us
from rollout_pipeline.limits.shares import DECREASE, DECREASE_HOLD_S, LEASE_S
from rollout_pipeline.local.resources import ExperimentResources, create_resources
from rollout_pipeline.quotas import DOCUMENTED_INVOKE_RATE_PER_AGENT, AccountQuotas, PoolSettings
from tests.conftest import REGION

pytestmark = pytest.mark.timing


class Wall:
    """A wall clock the test moves (the lease's `wall`): renewals happen when the test says."""

    def __init__(self, now: float = 1_900_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lease_of(resources: ExperimentResources, wall: Wall, **config: Any) -> CapacityLease:
    experiment = resources.config.model_copy(update=config) if config else resources.config
    return CapacityLease(
        PoolLedger.open(resources.pool_table_name, region=REGION),
        Ledger.open(resources.table_name).limits,
        experiment,
        wall=wall,
        sleep=lambda _s: None,
    )


class FakeRuntime:
    """Records the sessions it was asked to stop."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def invoke(self, session_id: str, payload: object) -> None:
        raise AssertionError("no invoke in this test")

    def stop(self, session_id: str) -> None:
        self.stopped.append(session_id)


def second_experiment(name: str) -> ExperimentResources:
    return create_resources(ExperimentConfig(name=name, group_size=2), region=REGION, client=clients.client)


def book_ahead(lease: CapacityLease, wall: Wall, seconds: float, budget: str = SESSION_PACE) -> None:
    """Book a schedule (the new sessions' by default) `seconds` ahead (a backlog): the experiment then asks for all
    it can get of that budget."""
    limits = lease.limits
    for _ in range(200):
        slot = limits.reserve_leased(
            budget, not_before_us=int(wall.now * 1e6), latest_us=int((wall.now + seconds) * 1e6)
        )
        if slot.slot_us is None:
            return


def test_backlogged_experiments_converge_to_weighted_shares(resources: ExperimentResources) -> None:
    wall = Wall()
    b, c = second_experiment("exp-b"), second_experiment("exp-c")
    leases = {
        "a": lease_of(resources, wall),
        "b": lease_of(b, wall),
        "c": lease_of(c, wall, capacity_weight=2.0),
    }
    leases["c"].config = c.config.model_copy(update={"capacity_weight": 2.0})
    for _round in range(4):
        for lease in leases.values():
            lease.note_backlog()
            lease.renew(force=True)
            wall.now += 0.3
    got = {name: lease.grant.sessions_per_s for name, lease in leases.items() if lease.grant}
    budget = PoolSettings(AccountQuotas.defaults(REGION)).budget("sessions")
    assert math.isclose(got["a"], budget / 4, rel_tol=1e-6)
    assert math.isclose(got["b"], budget / 4, rel_tol=1e-6)
    assert math.isclose(got["c"], budget / 2, rel_tol=1e-6)
    pace = leases["c"].limits.pace(SESSION_PACE)  # the schedule carries the grant
    assert pace.interval_us == int((1 + LATENESS_S) / (budget / 2) * 1e6)
    assert pace.lease_until_us == int(leases["c"].grant.until * 1e6)  # type: ignore[union-attr]


def test_no_start_is_booked_past_the_lease(resources: ExperimentResources) -> None:
    wall = Wall()
    lease = lease_of(resources, wall)
    lease.renew()
    limits = lease.limits
    until = lease.grant.until  # type: ignore[union-attr]
    inside = limits.reserve_leased(SESSION_PACE, not_before_us=int(wall.now * 1e6), latest_us=int(until * 1e6))
    assert inside.slot_us is not None
    after = int((until + 1.0) * 1e6)
    refused = limits.reserve_leased(SESSION_PACE, not_before_us=after, latest_us=after + 10_000_000)
    assert refused.slot_us is None
    assert refused.lacks_lease(after)  # renew, then try again


def test_a_block_of_starts_is_one_write_at_the_granted_spacing_within_the_lease(
    resources: ExperimentResources,
) -> None:
    """A completion batch's stops book their `tps` starts together (`reserve_leased(count=...)`): consecutive
    starts at the item's own spacing, in one write; a spacing changed since (a renewal) or a lease that does not
    cover the last start books nothing, and the stops then reserve one at a time."""
    wall = Wall()
    lease = lease_of(resources, wall)
    lease.renew()
    limits = lease.limits
    pace = limits.pace(CALLS_PACE)
    interval, until_us = pace.interval_us, pace.lease_until_us
    now_us = int(wall.now * 1e6)
    writes: list[str] = []
    update = limits.table.update_or_current
    limits.table.update_or_current = (  # type: ignore[method-assign]
        lambda *a, **kw: writes.append(a[1]) or update(*a, **kw)
    )
    block = limits.reserve_leased(
        CALLS_PACE, not_before_us=now_us, latest_us=now_us + 1_000_000, count=5, interval_us=interval
    )
    assert len(writes) == 1
    assert block.slot_us == now_us
    assert (block.pace.tat_us, block.pace.booked) == (now_us + 5 * interval, pace.booked + 5)
    busy = limits.reserve_leased(
        CALLS_PACE, not_before_us=now_us, latest_us=now_us + 1_000_000, count=3, interval_us=interval
    )
    assert busy.slot_us == now_us + 5 * interval  # after the first block, in the same spacing
    assert busy.pace.last_start_us == now_us + 7 * interval
    stale = limits.reserve_leased(
        CALLS_PACE, not_before_us=now_us, latest_us=now_us + 1_000_000, count=3, interval_us=interval + 1
    )
    assert stale.slot_us is None
    near_end = until_us - interval + 1  # room for one start before the lease ends, not for two
    assert (
        limits.reserve_leased(
            CALLS_PACE, not_before_us=near_end, latest_us=near_end, count=2, interval_us=interval
        ).slot_us
        is None
    )
    assert limits.pace(CALLS_PACE).tat_us == now_us + 8 * interval  # nothing booked by the refusals


def test_a_block_on_a_busy_schedule_is_one_write_when_the_caller_says_so_and_a_refusal_reads_nothing(
    resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New sessions booked together (`Pacer.reserve_together`) meet a schedule booked ahead: `busy_first` books
    the block after it in one write (main tried the free case first: two writes), and a refusal is decided from the
    failed write's answer (main read the schedule after two failed writes)."""
    wall = Wall()
    lease = lease_of(resources, wall)
    lease.note_backlog()
    lease.renew(force=True)  # a backlog: all the pool has (starts ~47 ms apart)
    limits = lease.limits
    interval = limits.pace(SESSION_PACE).interval_us
    assert interval < 100_000
    now_us = int(wall.now * 1e6)
    first = limits.reserve_leased(SESSION_PACE, not_before_us=now_us, latest_us=now_us, count=3, interval_us=interval)
    assert first.slot_us == now_us
    calls: list[str] = []
    ddb = limits.table.ddb
    for operation, kind in (("update_item", "write"), ("get_item", "read")):
        original = getattr(ddb, operation)
        monkeypatch.setattr(ddb, operation, lambda *a, _o=original, _k=kind, **kw: calls.append(_k) or _o(*a, **kw))
    busy = limits.reserve_leased(
        SESSION_PACE,
        not_before_us=now_us,
        latest_us=now_us + 1_000_000,
        count=2,
        interval_us=interval,
        busy_first=True,
    )
    assert busy.slot_us == now_us + 3 * interval
    assert calls == ["write"]
    calls.clear()
    respaced = limits.reserve_leased(  # a renewal changed the spacing since: the failed write's answer says so
        SESSION_PACE,
        not_before_us=now_us,
        latest_us=now_us + 1_000_000,
        count=2,
        interval_us=interval + 1,
        busy_first=True,
    )
    assert respaced.slot_us is None
    assert respaced.pace.interval_us == interval
    assert calls == ["write"]


def test_an_idle_experiments_share_flows_to_the_others_and_back(resources: ExperimentResources) -> None:
    wall = Wall()
    a, b = lease_of(resources, wall), lease_of(second_experiment("exp-b"), wall)
    for lease in (a, b):
        lease.note_backlog()
        lease.renew(force=True)
    wall.now += 0.3
    a.note_backlog()
    a.renew(force=True)
    budget = PoolSettings(AccountQuotas.defaults(REGION)).budget("sessions")
    assert math.isclose(a.grant.sessions_per_s, budget / 2)  # type: ignore[union-attr]
    wall.now += LEASE_S + 0.1  # b has no work: it does not renew, its lease ends
    a.note_backlog()
    a.renew(force=True)
    assert math.isclose(a.grant.sessions_per_s, budget)  # type: ignore[union-attr]
    wall.now += 0.5  # b has work again
    b.note_backlog()
    b.renew(force=True)
    first = b.grant.sessions_per_s  # type: ignore[union-attr]
    assert first < budget / 2  # a still holds its bigger grant for now
    wall.now += 0.3
    a.note_backlog()
    a.renew(force=True)  # a shrinks at its own renewal
    assert math.isclose(a.grant.sessions_per_s, budget / 2)  # type: ignore[union-attr]
    wall.now += LEASE_S / 2  # what a had booked under its bigger grant has started (a booked nothing)
    b.note_backlog()
    b.renew(force=True)
    assert math.isclose(b.grant.sessions_per_s, budget / 2)  # type: ignore[union-attr]


def test_a_burst_after_a_light_grant_renews_at_once(resources: ExperimentResources) -> None:
    wall = Wall()
    lease = lease_of(resources, wall)
    light = lease.renew().sessions_per_s  # nothing waits: it asks for little
    budget = PoolSettings(AccountQuotas.defaults(REGION)).budget("sessions")
    assert light < budget / 4
    wall.now += 0.1  # well within the lease: no renewal is due
    lease.note_backlog()  # a rollout finds no room: the first of a burst
    behind = lease._behind
    assert behind is not None, "a background renewal started"
    behind.join(timeout=10)
    assert math.isclose(lease.grant.sessions_per_s, budget)  # type: ignore[union-attr]
    wall.now += 0.1
    lease.note_backlog()  # the same burst: no second renewal
    assert lease._behind is behind


def test_a_throttle_backs_the_pool_off_and_renews(resources: ExperimentResources) -> None:
    wall = Wall()
    lease = lease_of(resources, wall)
    lease.note_backlog()
    lease.renew()
    before = lease.grant.sessions_per_s  # type: ignore[union-attr]
    wall.now += 0.1
    lease.note_backlog()
    lease.throttled("sessions")
    assert math.isclose(lease.grant.sessions_per_s, before * DECREASE, rel_tol=1e-6)  # type: ignore[union-attr]
    state = lease.pool.read()
    assert state.backoff["sessions"].base == DECREASE
    assert state.members[resources.config.name].throttles == 1


def test_a_renewal_by_another_process_is_adopted(resources: ExperimentResources) -> None:
    wall = Wall()
    first, second = lease_of(resources, wall), lease_of(resources, wall)
    first.renew()
    version = first.pool.read().version
    adopted = second.ensure()  # one read of the pool and the schedules; no write
    assert first.pool.read().version == version
    assert adopted.sessions_per_s == first.grant.sessions_per_s  # type: ignore[union-attr]


def test_the_calls_schedule_leaves_the_new_sessions_their_share(resources: ExperimentResources) -> None:
    wall = Wall()
    lease = lease_of(resources, wall, tps_limit=10)
    lease.note_backlog()
    grant = lease.renew()
    assert grant.calls_per_s == 10
    sessions = lease.limits.pace(SESSION_PACE).interval_us
    calls = lease.limits.pace(CALLS_PACE).interval_us
    assert sessions == int((1 + LATENESS_S) / 5 * 1e6)  # half the calls: an invoke and a stop each
    assert calls == int((1 + LATENESS_S) / 5 * 1e6)


def test_the_calls_schedule_keeps_invokes_within_the_agents_invoke_quota(resources: ExperimentResources) -> None:
    """No `tps_limit`: the pool may grant 900 data-plane calls/s, but InvokeAgentRuntime has a quota of its own per
    agent (documented 200/s): the `tps` schedule (invokes into existing sessions, stops) paces at most that less the
    new sessions' share, and `invoke_rate_limit` (a raised quota) moves it."""
    wall = Wall()
    lease = lease_of(resources, wall, tps_limit=None)
    lease.note_backlog()
    lease.renew()
    book_ahead(lease, wall, 0.5, CALLS_PACE)  # the experiment asks for all the calls it can get
    lease.observe(CALLS_PACE, lease.limits.pace(CALLS_PACE))
    grant = lease.renew(force=True)
    assert grant.calls_per_s > 200
    calls = lease.limits.pace(CALLS_PACE).interval_us
    assert calls == int((1 + LATENESS_S) / (DOCUMENTED_INVOKE_RATE_PER_AGENT - grant.sessions_per_s) * 1e6)
    raised = lease_of(resources, wall, tps_limit=None, invoke_rate_limit=400)
    raised.renew(force=True)
    assert raised.limits.pace(CALLS_PACE).interval_us == int((1 + LATENESS_S) / (400 - grant.sessions_per_s) * 1e6)


def test_stops_get_a_leased_schedule_while_the_calls_granted_leave_them_the_invoke_rate(
    resources: ExperimentResources,
) -> None:
    """Stops are not in AgentCore's per-agent invoke quota: while the pool grants at least twice the invoke rate
    (a backlog: up to 900 calls/s), the renewal opens a `stop` schedule at the calls granted less the invoke rate,
    and the experiment's stops take it, not `tps` (which the invokes keep whole). Once the calls granted fall below
    that (the backlog over), the next renewal closes it, and stops share `tps` again."""
    wall = Wall()
    lease = lease_of(resources, wall, tps_limit=None)
    limits = lease.limits
    reserved: list[str] = []
    reserve_leased = limits.reserve_leased

    def counted(budget: str, **kwargs: Any) -> Any:
        reserved.append(budget)
        return reserve_leased(budget, **kwargs)

    def advance(seconds: float) -> None:
        wall.now += max(0.0, seconds)

    lease.note_backlog()
    lease.renew()
    book_ahead(lease, wall, 0.5, CALLS_PACE)  # the experiment asks for all the calls it can get
    lease.observe(CALLS_PACE, limits.pace(CALLS_PACE))
    grant = lease.renew(force=True)
    assert grant.calls_per_s >= 2 * DOCUMENTED_INVOKE_RATE_PER_AGENT
    assert lease.stops_apart()
    stop_pace = limits.pace(STOP_PACE)
    assert stop_pace.interval_us == interval_us(grant.calls_per_s - DOCUMENTED_INVOKE_RATE_PER_AGENT)
    assert stop_pace.lease_until_us == int(grant.until * 1e6)
    limits.reserve_leased = counted  # type: ignore[method-assign]
    runtime = FakeRuntime()

    def pacer(budget: str) -> Pacer:
        return Pacer(limits, budget, 1.0, wall=wall, monotonic=wall, sleep=advance, lease=lease)

    limited = LimitedRuntime(
        runtime,
        pacer(CALLS_PACE),
        [],
        session=pacer(SESSION_PACE),
        lease=lease,
        stops=pacer(STOP_PACE),
        sessions_apart=True,
    )
    limited.stop("s-1", wall.now + 30)
    assert reserved == [STOP_PACE]
    assert runtime.stopped == ["s-1"]

    wall.now += 2.5  # within the lease, the backlog over: the experiment asks for little
    grant = lease.renew(force=True)
    assert grant.calls_per_s < 2 * DOCUMENTED_INVOKE_RATE_PER_AGENT
    assert not lease.stops_apart()
    assert limits.pace(STOP_PACE).lease_until_us <= int(wall.now * 1e6)  # closed, not left to run out
    reserved.clear()
    limited.stop("s-2", wall.now + 30)
    assert reserved == [CALLS_PACE]
    assert runtime.stopped == ["s-1", "s-2"]
    # A process that has not seen the closing renewal yet tries the closed schedule, renews, and goes to `tps`.
    lease.grant = replace(grant, stops_per_s=700.0)
    reserved.clear()
    limited.stop("s-3", wall.now + 30)
    assert reserved[0] == STOP_PACE
    assert reserved[-1] == CALLS_PACE
    assert len(reserved) < 10, reserved  # one wait of `STOP_LEASE_TRY_S` on the closed schedule at most
    assert runtime.stopped == ["s-1", "s-2", "s-3"]
    assert not lease.stops_apart()


def test_active_sessions_are_shared_by_weight_when_they_bind(moto_aws: None) -> None:
    wall = Wall()
    pool = PoolSettings(AccountQuotas(active_sessions=100), reserve=0.0)
    a = create_resources(
        ExperimentConfig(name="exp-a", max_sessions=80), region=REGION, client=clients.client, pool=pool
    )
    b = create_resources(ExperimentConfig(name="exp-b", max_sessions=80), region=REGION, client=clients.client)
    la, lb = lease_of(a, wall), lease_of(b, wall)
    la.renew()
    assert la.max_sessions() == 80  # alone: all it asks
    lb.renew()
    assert lb.max_sessions() == 20  # what a leaves free now
    wall.now += 0.5
    la.renew(force=True)
    assert la.max_sessions() == 50  # a shrinks to its share at its renewal
    wall.now += LEASE_S / 2
    la.renew(force=True)
    lb.renew(force=True)
    assert lb.max_sessions() == 20  # a's processes may hold its old grant until that lease ends ...
    wall.now += LEASE_S / 2
    la.renew(force=True)
    lb.renew(force=True)
    assert lb.max_sessions() == 50  # ... and no longer


def test_experiments_without_the_pool_table_are_told_to_bootstrap(moto_aws: None) -> None:
    pool = PoolLedger.open("rollouts-pool", region=REGION)
    with pytest.raises(PoolMissing, match="rollouts bootstrap"):
        pool.read()


def test_a_renewal_costs_a_few_requests(resources: ExperimentResources) -> None:
    wall = Wall()
    lease = lease_of(resources, wall)
    calls: list[str] = []

    def count(model: Any, **_: Any) -> None:
        calls.append(model.name)

    clients.register_hook("before-parameter-build.dynamodb", count)
    started = time.monotonic()
    lease.renew()
    assert time.monotonic() - started < 30
    assert sorted(calls) == ["BatchGetItem", "GetItem", "UpdateItem", "UpdateItem", "UpdateItem"]


def test_capacity_shows_the_quotas_and_every_experiments_share(resources: ExperimentResources) -> None:
    from rollout_pipeline.sdk import Experiment

    wall = Wall(time.time())
    b = second_experiment("exp-b")
    for lease in (lease_of(resources, wall), lease_of(b, wall, capacity_weight=3.0)):
        lease.config = lease.config.model_copy(update={"capacity_weight": lease.config.capacity_weight})
        lease.note_backlog()
        lease.renew()
    view = Experiment.from_outputs(resources.stack_outputs(), region=REGION).capacity()
    assert view.settings.quotas.new_sessions_per_s == 25.0
    assert [m.name for m in view.members] == ["exp-b", resources.config.name]
    weights = {m.name: m.weight for m in view.members}
    assert weights == {"exp-b": 3.0, resources.config.name: 1.0}
    shares = {m.name: m.share["sessions"] for m in view.members}
    assert math.isclose(shares["exp-b"], 3 * shares[resources.config.name])
    text = "\n".join(view.lines())
    assert "new sessions 25/s per account" in text
    assert "reserve 10%" in text


def count_requests() -> list[str]:
    calls: list[str] = []

    def count(model: Any, **_: Any) -> None:
        calls.append(model.name)

    clients.register_hook("before-parameter-build.dynamodb", count)
    return calls


def test_a_throttle_is_recorded_in_one_write_once_per_overshoot(resources: ExperimentResources) -> None:
    """The lessee AgentCore throttled writes the decrease at once (one conditional UpdateItem, no read first, even
    though the pool moved since its last read); another experiment throttled in the same overshoot finds it done
    (its write fails on the changed backoff and returns it: no second decrease); a later overshoot decreases again."""
    wall = Wall()
    b = second_experiment("exp-b")
    la, lb = lease_of(resources, wall), lease_of(b, wall)
    la.renew()
    lb.renew()
    lb.renew(force=True)  # the pool moved on since la read it
    calls = count_requests()
    assert la.record_throttle("sessions", wall.now) is True
    assert calls == ["UpdateItem"]
    assert la.pool.read().backoff["sessions"].base == DECREASE
    wall.now += 0.2
    assert lb.record_throttle("sessions", wall.now) is False  # the same overshoot: decreased once
    assert la.pool.read().backoff["sessions"].base == DECREASE
    assert lb.stats["backoff_seen"] == 1
    wall.now += DECREASE_HOLD_S
    assert lb.record_throttle("sessions", wall.now) is True  # a later overshoot: its view came with the failure
    assert la.pool.read().backoff["sessions"].base < DECREASE


def test_a_renewal_right_after_a_reservation_reads_no_schedule(resources: ExperimentResources) -> None:
    """A renewal starts from the schedules as the process's last reservation showed them (`Pacer.reserve_at`
    renews after booking): the pool's read and write and the two schedules' leases, no BatchGetItem."""
    wall = Wall(time.time())
    lease = lease_of(resources, wall)
    lease.renew()
    wall.now += LEASE_S - 2.5  # the renewal is due
    lease.observe(SESSION_PACE, lease.limits.pace(SESSION_PACE))  # a reservation's answer
    lease.observe(CALLS_PACE, lease.limits.pace(CALLS_PACE))
    calls = count_requests()
    lease.renew()
    assert sorted(calls) == ["GetItem", "UpdateItem", "UpdateItem", "UpdateItem"]
    wall.now += LEASE_S - 2.5  # due again, and this process saw no schedule since: it reads them
    calls.clear()
    lease.renew()
    assert sorted(calls) == ["BatchGetItem", "GetItem", "UpdateItem", "UpdateItem", "UpdateItem"]


def test_a_leased_block_with_a_long_wait_is_booked_within_the_known_lease(resources: ExperimentResources) -> None:
    """New sessions booked together wait as long as their dispatcher may (a minute): the block's window is cut
    at the lease this process knows, so its write (which checks that the window's last start is within the lease)
    books it instead of refusing every block whose caller may wait past the lease."""
    wall = Wall()
    lease = lease_of(resources, wall)
    lease.note_backlog()
    lease.renew(force=True)
    session = Pacer(lease.limits, SESSION_PACE, 1.0, wall=wall, lease=lease, guess_busy=True)
    session.read_tat()
    assert session.book(3, 60.0)  # main: [] (the window reached a minute past a 4 s lease)
    slots = session.book(3, 60.0)  # the schedule is now busy: after the first block, at the same spacing
    assert len(slots) == 3
    assert slots[-1] <= session.lease_until
