"""An experiment's lease in the account pool, as one process holds it: renewed about once a second, never per call.

The account's AgentCore quotas are one pool per account and region (`quotas`, `ledger.pool`); every experiment
there holds a lease of each budget (`shares.grant`: its fair share, never more than the others leave free). The
lease reaches the experiment's own schedules, which every call still goes through:

- new sessions (account scope): the schedule `LIMIT/PACE#session` gets the granted spacing and the lease's end
  (`LimitLedger.set_pace_lease`); every reservation checks both in its conditional write, so all the experiment's
  processes together start sessions at the granted rate and none after the lease (a dead or frozen process's
  lease simply ends; a thread that wakes up late drops its start, `pacing.LATENESS_S`);
- data-plane calls: `LIMIT/PACE#tps` the same way, at the calls granted less the new sessions' own share, never
  above the agent's invoke rate less that share; when the calls granted are at least twice the invoke rate, stops
  get `LIMIT/PACE#stop` at the rest (`pacing.STOP_PACE`, leased the same way; stops are not in AgentCore's
  per-agent invoke quota), else they share `tps`;
- active sessions: the slot counters' caps sum to `max_sessions()`, the granted number (at most `max_sessions`).

Renewing costs four or five requests (the pool's read and conditional write, the two schedule writes, a third while
stops have a schedule of their own or to close it, and one read of the schedules unless this process's last
reservations just showed them: `SESSION_VIEW_FRESH_S`, `CALLS_VIEW_FRESH_S`), by
one process at a time, when the lease has less than `RENEW_AHEAD_S` left (a process that finds it renewed by
another adopts it). What an experiment asks (`asks`): with a backlog (its schedule booked ahead, or a rollout of
this process waiting for room) everything it can get; otherwise what it used over the last period with headroom.
A throttle AgentCore answers anyway (`throttled`) lowers the pool's backoff factor at once (one conditional write,
`record_throttle`) and renews; the other experiments' renewals read it within about a second.

The small interface later work plugs into: `pause` (a budget that stops dispatch: the experiment then asks for no
new sessions, and its share flows to the others at their next renewal) and `Grant.spare_sessions_per_s` (what the
experiment is granted and did not use: room for warm sessions).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from rollout_pipeline.config import ExperimentConfig, invoke_rate_cap, new_sessions_cap
from rollout_pipeline.ledger.limits import LimitLedger, PaceView
from rollout_pipeline.ledger.pool import FORGET_AFTER_S, Lease, Member, PoolLedger, PoolState
from rollout_pipeline.limits.pacing import LATENESS_S, STOP_PACE, dedicated_stop_share
from rollout_pipeline.limits.shares import (
    BOOKING_SLACK_S,
    RENEW_AHEAD_S,
    Ask,
    booked_until,
    decreased,
    grant,
    lease_counted,
)
from rollout_pipeline.quotas import Budget, NewSessionScope, PoolSettings

log = logging.getLogger(__name__)

#: The experiment's schedule items: new sessions (account scope) and data-plane calls.
SESSION_PACE: Final = "session"
CALLS_PACE: Final = "tps"
#: A schedule booked this far ahead is saturated: the experiment asks for everything it can get.
BACKLOG_AHEAD_S: Final = 0.25
#: A rollout of this process that found no room in the session budget marks a backlog for this long.
BACKLOG_HOLD_S: Final = 2.0
#: A backlog seen by any renewal keeps the experiment asking for all it can get this long (a renewal by a process
#: that sees none, a completer's, does not drop its share while its dispatchers still wait).
BACKLOG_KEEP_S: Final = 2.0
#: Without a backlog an experiment asks for what it used last period times this, plus `MIN_*` (room to grow).
HEADROOM: Final = 1.5
MIN_SESSIONS_DEMAND: Final = 1.0
MIN_CALLS_DEMAND: Final = 20.0
#: Data-plane calls per new session the calls ask leaves room for (the invoke, a stop, cold-start retries).
CALLS_PER_SESSION: Final = 3.0
#: A grant below this is none: no start is booked under it (its spacing would be hours).
MIN_RATE: Final = 1e-3
#: Attempts of one renewal (each a read and a conditional write of the pool item), with jittered backoff.
RENEW_ATTEMPTS: Final = 12
#: A lease another process renewed this recently is adopted before its schedules carry it (they will at once).
ADOPT_UNCARRIED_S: Final = 1.0
#: A lease with less than this left is renewed by the caller itself (else in the background: `ensure`): a little
#: more than the admission gate's horizon (`admission.ADMIT_AHEAD_S`).
URGENT_S: Final = 2.1
#: The `tps` schedule's rate is never below this (the calls granted less the new sessions' own), so stops go on.
STOP_FLOOR_PER_S: Final = 2.0
#: A renewal uses this process's own views of the schedules instead of reading them (one BatchGetItem) when the
#: new sessions' is at most this old (its `last_start` moves about as fast as time: less than `BOOKING_SLACK_S`) ...
SESSION_VIEW_FRESH_S: Final = 0.25
#: ... and the data-plane calls' at most this old (stops book it near now; 1,000 calls/s rarely binds).
CALLS_VIEW_FRESH_S: Final = 2.0
#: A process renews by force (no lease for a start it needs) at most this often: with nothing granted (others hold
#: the budget until their next renewal) the next force would find the same.
FORCED_RENEW_GAP_S: Final = 0.25


@dataclass(frozen=True)
class Grant:
    """What this experiment may use until `until` (epoch s)."""

    #: New sessions/s: the experiment's in all (account scope), or each endpoint's (endpoint scope).
    sessions_per_s: float
    #: Data-plane calls/s in all (new sessions' invokes included).
    calls_per_s: float
    #: Active sessions (slots) at most.
    active: int
    until: float
    scope: NewSessionScope = "account"
    settings: PoolSettings = field(default_factory=PoolSettings)
    #: New sessions/s it used over the last period (the lease's renewals measure it).
    used_sessions_per_s: float = 0.0
    #: Stops/s on their own leased schedule (`STOP_PACE`); 0: stops share the `tps` schedule.
    stops_per_s: float = 0.0

    @property
    def spare_sessions_per_s(self) -> float:
        """Granted and not used (account scope): what warm sessions could be started from."""
        return max(0.0, self.sessions_per_s - self.used_sessions_per_s) if self.scope == "account" else 0.0


def interval_us(rate: float) -> int:
    """The spacing of a schedule that starts at most `rate` calls in any second (`pacing.Pacer`)."""
    return int((1.0 + LATENESS_S) / rate * 1e6) if rate > MIN_RATE else 3_600_000_000


#: The experiment's leased schedules, read together (one BatchGetItem).
SCHEDULES: Final = (SESSION_PACE, CALLS_PACE, STOP_PACE)


def data_plane_booked(paces: Mapping[str, PaceView]) -> int:
    """Data-plane calls booked so far on the experiment's schedules: `tps` and `stop` (a count that only grows)."""
    return paces[CALLS_PACE].booked + paces[STOP_PACE].booked


class CapacityLease:
    """One process's handle on its experiment's lease in the account pool. Thread-safe: one renewal at a time."""

    def __init__(
        self,
        pool: PoolLedger,
        limits: LimitLedger,
        config: ExperimentConfig,
        *,
        in_flight: Callable[[], int] | None = None,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.limits = limits
        self.config = config
        self._in_flight = in_flight
        self._wall = wall
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self.grant: Grant | None = None
        self.state: PoolState | None = None
        #: A process renews at a jittered point of the lease's last second, so several processes of one experiment
        #: seldom renew together (the second one adopts the first's grant, or its pool write fails and it reads).
        self._renew_ahead = RENEW_AHEAD_S * self._rng.uniform(0.85, 1.15)
        self._backlog_until = 0.0
        #: The grant last written by this process asked for everything it could get (a backlog).
        self._asked_all = False
        self._throttled_at: dict[Budget, float] = {}
        self._throttles = 0
        self._forced_at = -1e18
        self._behind: threading.Thread | None = None
        self._behind_lock = threading.Lock()
        #: The latest view of each schedule this process saw (a reservation's answer, a read) and when (wall s):
        #: a renewal right after a reservation takes its views from here instead of reading them again.
        self._views: dict[str, tuple[PaceView, float]] = {}
        #: Set by a budget that pauses dispatch: the experiment asks for no new sessions.
        self.paused: Callable[[], bool] = lambda: False
        #: What this process's renewals did: written to the pool, adopted (another process had just renewed), forced
        #: (no lease for a start it needed), and pool writes that lost to another writer (read again).
        self.stats: Counter[str] = Counter()

    # ------------------------------------------------------------------------------------------------ views

    def ensure(self) -> Grant:
        """The current grant. When it ends within the renewal margin it is renewed: in the background while it
        still reaches `URGENT_S` ahead (the caller, about to book a start in admission order, does not wait for the
        pool's writes), else before returning. A renewal by another process of the experiment is seen through the
        schedules (`observe`), without reading the pool."""
        current = self.grant
        if current is not None:
            left = current.until - self._wall()
            if left > self._renew_ahead:
                return current
            if left > URGENT_S:
                self._renew_behind()
                return current
        return self.renew()

    def _renew_behind(self, *, force: bool = False) -> None:
        """Start one background renewal unless one runs."""
        with self._behind_lock:
            if self._behind is not None and self._behind.is_alive():
                return
            self._behind = threading.Thread(target=self._renew_quietly, args=(force,), name="pool-lease", daemon=True)
            self._behind.start()

    def _renew_quietly(self, force: bool) -> None:
        try:
            self.renew(force=force)
        except Exception:  # the next caller renews in its own thread (and sees the error)
            log.warning("background renewal of the pool lease failed", exc_info=True)

    def observe(self, budget: str, pace: PaceView) -> None:
        """A schedule read or reservation showed `pace`: a later lease on it (another process renewed) extends this
        process's grant, with the spacing and active sessions the renewal wrote there."""
        seen = self._views.get(budget)
        if seen is None or (pace.lease_version, pace.booked) >= (seen[0].lease_version, seen[0].booked):
            self._views[budget] = (pace, self._wall())
        current = self.grant
        if budget == STOP_PACE and current is not None and pace.lease_until_us / 1e6 <= self._wall():
            if current.stops_per_s > 0:  # closed by a later grant (or never opened): stops share `tps` again
                self.grant = replace(current, stops_per_s=0.0)
            return
        until = pace.lease_until_us / 1e6
        if current is None or until <= current.until or not pace.interval_us:
            return
        if budget == CALLS_PACE:  # the data-plane schedule is leased in either scope: its lease is the grant's
            self.grant = replace(current, until=until, active=pace.active or current.active)
        elif budget == SESSION_PACE:  # one renewal writes both schedules with the same lease
            self.grant = replace(current, until=until, sessions_per_s=(1.0 + LATENESS_S) / (pace.interval_us / 1e6))
        elif budget == STOP_PACE:  # the renewal that extended the lease opened the stops' schedule
            self.grant = replace(current, until=until, stops_per_s=(1.0 + LATENESS_S) / (pace.interval_us / 1e6))

    def max_sessions(self) -> int:
        """Sessions this experiment may hold at once: `max_sessions`, or less when the account's active-session
        budget is shared (the last grant; `max_sessions` before the first)."""
        current = self.grant
        return self.config.max_sessions if current is None else min(self.config.max_sessions, current.active)

    def note_backlog(self) -> None:
        """A rollout of this process is waiting for room in the session budget: ask for everything next time. The
        first one after a grant asked for less (the experiment was idle or light) renews at once in the background,
        so a burst waits for the pool's writes, not for the next renewal."""
        now = self._wall()
        surge = self._backlog_until <= now and self.grant is not None and not self._asked_all
        self._backlog_until = now + BACKLOG_HOLD_S
        if surge:
            self._asked_all = True  # one surge renewal per burst
            self._renew_behind(force=True)

    # -------------------------------------------------------------------------------------------- renewing

    def renew(self, *, force: bool = False) -> Grant:
        """Renew the lease (unless another thread or process just did: adopted). Raises what the pool table raises
        (`ledger.pool.PoolMissing` when the account has no pool)."""
        with self._lock:
            current = self.grant
            now = self._wall()
            if not force and current is not None and current.until - now > self._renew_ahead:
                return current
            if force and current is not None and now - self._forced_at < FORCED_RENEW_GAP_S:
                return current
            if force:
                self._forced_at = now
                self.stats["forced"] += 1
            paces = self._recent_paces(now)
            if paces is None:
                self.stats["schedules_read"] += 1
                paces = self.limits.paces(SCHEDULES)
                for budget, pace in paces.items():
                    self.observe(budget, pace)
            current = self.grant
            if not force and current is not None and current.until - now > self._renew_ahead:
                self.stats["seen"] += 1  # another process renewed: its schedules say so
                return current
            for attempt in range(RENEW_ATTEMPTS):
                state = self.pool.read()
                self.state = state
                now = self._wall()
                adopted = None if force else self._adopt(state, paces, now)
                if adopted is not None:
                    self.stats["adopted"] += 1
                    self.grant = adopted
                    return adopted
                written = self._write(state, paces, now)
                if written is not None:
                    self.stats["written"] += 1
                    self.grant = written
                    return written
                self.stats["lost"] += 1
                self._sleep(self._rng.uniform(0.0, min(0.25, 0.01 * 2**attempt)))  # full jitter: writers spread
                paces = self.limits.paces(SCHEDULES)
            raise RuntimeError(f"the account pool kept changing while {self.config.name} renewed its lease")

    def _recent_paces(self, now: float) -> dict[str, PaceView] | None:
        """The schedules as this process saw them last, if recently enough to renew from (a renewal right after a
        reservation: `Pacer.reserve_at` renews after it books); else None (read them). A view a little old is
        safe: the lease written onto a schedule is conditional on no start booked past what the renewal counted
        (`LimitLedger.set_pace_lease`), and a renewal that finds one reads the schedules again."""
        views = {budget: self._views.get(budget) for budget in SCHEDULES}
        fresh = {SESSION_PACE: SESSION_VIEW_FRESH_S, CALLS_PACE: CALLS_VIEW_FRESH_S, STOP_PACE: CALLS_VIEW_FRESH_S}
        if any(view is None or now - view[1] > fresh[budget] for budget, view in views.items()):
            return None
        return {budget: view[0] for budget, view in views.items() if view is not None}

    def _adopt(self, state: PoolState, paces: Mapping[str, PaceView], now: float) -> Grant | None:
        """The lease another process of this experiment just renewed, if it has enough left and its schedules
        carry it (their `lease_version` reached the entry's), or will any moment (written under a second ago: its
        renewer is writing them; one that died meanwhile leaves them to the next renewal)."""
        me = state.members.get(self.config.name)
        if me is None:
            return None
        if me.lease("calls").until - now <= self._renew_ahead:
            return None
        carried = paces[CALLS_PACE].lease_version >= me.version
        if not carried and now - me.heartbeat > ADOPT_UNCARRIED_S:
            return None
        self._asked_all = now - me.backlog_at < BACKLOG_KEEP_S
        return self._grant_of(state, me)

    def _write(self, state: PoolState, paces: Mapping[str, PaceView], now: float) -> Grant | None:
        """One renewal: the grant computed from `state`, written under its version, then the schedules. None when
        the pool or a schedule moved meanwhile (read again)."""
        name = self.config.name
        me = state.members.get(name)
        scope = state.settings.quotas.new_session_scope
        asks = self.asks(state, me, paces, now)
        leases = grant(state, name, weight=self.config.capacity_weight, asks=asks, now=now)
        elapsed = now - me.counted_at if me is not None and me.counted_at > 0 else 0.0
        used = (paces[SESSION_PACE].booked - me.started) / elapsed if me is not None and elapsed > 0 else 0.0
        member = Member(
            name=name,
            weight=self.config.capacity_weight,
            caps={budget: ask.cap for budget, ask in asks.items()},
            leases=leases,
            heartbeat=now,
            in_flight=self._current_in_flight(me),
            use=max(0.0, used),
            started=paces[SESSION_PACE].booked,
            calls=data_plane_booked(paces),
            counted_at=now,
            throttles=(me.throttles if me is not None else 0) + self._take_throttles(),
            backlog_at=now if self.backlog_seen(paces[SESSION_PACE], now) else (me.backlog_at if me else 0.0),
        )
        if not self.pool.write_member(member, version=state.version, forget=forgotten(state, name, now)):
            self.stats["lost_pool"] += 1
            return None
        self._asked_all = "sessions" not in asks or math.isinf(asks["sessions"].demand)
        version = state.version + 1
        booked = {budget: booked_until(me.lease(budget) if me else Lease(), ask) for budget, ask in asks.items()}
        schedules: list[tuple[str, float, float]] = [(CALLS_PACE, self._tps_rate(leases, state), booked["calls"])]
        if scope == "account":
            schedules.append((SESSION_PACE, self._sessions_rate(leases, state), booked["sessions"]))
        stops = self._stops_rate(leases)
        if stops > 0 or paces[STOP_PACE].lease_until_us / 1e6 > now:  # open it, or close what an older grant opened
            schedules.append((STOP_PACE, stops, booked["calls"]))
        for pace, rate, last_booked in schedules:
            until = leases["sessions" if pace == SESSION_PACE else "calls"].until
            ok = self.limits.set_pace_lease(
                pace,
                interval_us=interval_us(rate),
                lease_until_us=int((until if rate > MIN_RATE else now) * 1e6),
                version=version,
                booked_until_us=int(max(last_booked, now + BOOKING_SLACK_S) * 1e6),
                active=int(leases["active"].rate + 1e-9) if pace == CALLS_PACE else None,
            )
            if not ok and self.limits.pace(pace).lease_version < version:
                self.stats[f"lost_{pace}"] += 1
                return None  # booked beyond what the pool counted: read the schedules and grant again
        written = Member(**{**member.__dict__, "version": version})
        return self._grant_of(state, written)

    def asks(self, state: PoolState, me: Member | None, paces: Mapping[str, PaceView], now: float) -> dict[Budget, Ask]:
        """What this experiment asks of each budget now (see the module doc)."""
        config = self.config
        elapsed = now - me.counted_at if me is not None and me.counted_at > 0 else 0.0

        def rate(counted: int, before: int) -> float:
            return max(0.0, (counted - before) / elapsed) if elapsed > 0 else 0.0

        session_pace, calls_pace, stop_pace = paces[SESSION_PACE], paces[CALLS_PACE], paces[STOP_PACE]
        kept = me is not None and now - me.backlog_at < BACKLOG_KEEP_S  # a renewal of another process saw one
        backlogged = self.backlog_seen(session_pace, now) or kept
        if self.paused():
            sessions_demand = 0.0
        elif backlogged:
            sessions_demand = math.inf
        else:
            used = rate(session_pace.booked, me.started if me is not None else 0)
            sessions_demand = max(MIN_SESSIONS_DEMAND, HEADROOM * used)
        sessions_need = sessions_demand if math.isfinite(sessions_demand) else state.settings.budget("sessions")
        if max(calls_pace.tat_us, stop_pace.tat_us) / 1e6 > now + BACKLOG_AHEAD_S:
            calls_demand = math.inf
        else:
            calls_used = rate(data_plane_booked(paces), me.calls if me is not None else 0)
            calls_demand = max(MIN_CALLS_DEMAND, 2 * calls_used) + CALLS_PER_SESSION * sessions_need
        calls_booked = max(calls_pace.last_start_us, stop_pace.last_start_us) / 1e6
        asks: dict[Budget, Ask] = {
            "calls": Ask(calls_demand, config.tps_limit, booked_until=calls_booked),
            "active": Ask(float(config.max_sessions), float(config.max_sessions)),
        }
        if state.settings.quotas.new_session_scope == "account":
            asks["sessions"] = Ask(sessions_demand, sessions_cap(config), booked_until=session_pace.last_start_us / 1e6)
        return asks

    def backlog_seen(self, session_pace: PaceView, now: float) -> bool:
        """Whether this process sees a backlog of new sessions: a rollout of its own waiting for room, or the
        schedule booked ahead (every start the budget has is taken)."""
        return self._backlog_until > now or session_pace.tat_us / 1e6 > now + BACKLOG_AHEAD_S

    def _tps_rate(self, leases: Mapping[Budget, Lease], state: PoolState) -> float:
        """The `tps` schedule's rate: the calls granted less the new sessions' own (their invokes take no `tps`),
        never above the agent's invoke rate (`config.invoke_rate_cap`: AgentCore's InvokeAgentRuntime quota per
        agent) less the same share, so the experiment's invokes stay within it whatever the pool grants."""
        return max(MIN_RATE, min(leases["calls"].rate, self._invoke_rate) - self._sessions_rate(leases, state))

    def _stops_rate(self, leases: Mapping[Budget, Lease]) -> float:
        """The leased `stop` schedule's rate: the calls granted less the invoke rate when that leaves stops at least
        the invoke rate (`pacing.dedicated_stop_share`), else 0 (stops share `tps`). The `tps` and session schedules
        then take the invoke rate at most (`_tps_rate`): the three sum to the calls granted."""
        calls = (leases.get("calls") or Lease()).rate
        return calls - self._invoke_rate if dedicated_stop_share(calls, self._invoke_rate) else 0.0

    @property
    def _invoke_rate(self) -> float:
        """The agent's InvokeAgentRuntime calls/s at most (`config.invoke_rate_cap`)."""
        return invoke_rate_cap(self.config.invoke_rate_limit, self.config.tps_limit)

    def stops_apart(self) -> bool:
        """Whether stops take their own leased schedule (`STOP_PACE`) by this process's latest grant."""
        current = self.grant
        return current is not None and current.stops_per_s > 0 and current.until > self._wall()

    def _sessions_rate(self, leases: Mapping[Budget, Lease], state: PoolState) -> float:
        """New sessions/s in all: the lease's (account scope) or every endpoint's budget (endpoint scope), at most
        half the calls granted (an invoke and a stop each)."""
        if state.settings.quotas.new_session_scope == "account":
            sessions = leases["sessions"].rate if "sessions" in leases else 0.0
        else:
            sessions = self._endpoint_rate(state.settings) * self.config.endpoints
        return min(sessions, leases["calls"].rate / 2)

    def endpoint_rate(self) -> float:
        """Endpoint scope: each endpoint's own new-session budget (the quota less the reserve, or the cap)."""
        return self._endpoint_rate(self._settings())

    def scope(self) -> NewSessionScope:
        """Whether the account's new-session quota is one pool ("account") or each endpoint's ("endpoint")."""
        return self._settings().quotas.new_session_scope

    def _settings(self) -> PoolSettings:
        current = self.grant
        return current.settings if current is not None else self.ensure().settings

    def _endpoint_rate(self, settings: PoolSettings) -> float:
        budget = settings.budget("sessions")
        cap = self.config.session_rate_limit
        return budget if cap is None else min(budget, cap)

    def _grant_of(self, state: PoolState, me: Member) -> Grant:
        scope = state.settings.quotas.new_session_scope
        sessions = me.lease("sessions").rate if scope == "account" else self._endpoint_rate(state.settings)
        return Grant(
            sessions_per_s=sessions,
            calls_per_s=me.lease("calls").rate,
            active=int(me.lease("active").rate + 1e-9),
            until=me.lease("calls").until,
            scope=scope,
            settings=state.settings,
            used_sessions_per_s=me.use,
            stops_per_s=self._stops_rate(me.leases),
        )

    def _current_in_flight(self, me: Member | None) -> int:
        if self._in_flight is not None:
            try:
                return int(self._in_flight())
            except Exception:  # the counters could not be read now: the last figure stands
                log.warning("could not read the sessions in flight for the pool's heartbeat", exc_info=True)
        return me.in_flight if me is not None else 0

    def _take_throttles(self) -> int:
        taken, self._throttles = self._throttles, 0
        return taken

    # -------------------------------------------------------------------------------------------- backoff

    def throttled(self, budget: Budget) -> None:
        """AgentCore answered a rate exceeded for `budget` ("sessions" or "calls"): lower the pool's factor at once
        (`record_throttle`: once per overshoot, whoever sees it first) and renew, so this experiment slows down
        within its next call and every other lessee at its next renewal."""
        now = self._wall()
        self._throttles += 1
        if now - self._throttled_at.get(budget, 0.0) < 1.0:
            return  # this process already reacted to this overshoot
        self._throttled_at[budget] = now
        try:
            self.record_throttle(budget, now)
            self.renew(force=True)
        except Exception:  # the backoff is best effort: the throttled call is retried through the budgets anyway
            log.warning("could not record AgentCore's throttle in the account pool", exc_info=True)

    def record_throttle(self, budget: Budget, now: float) -> bool:
        """Decrease the pool's factor of `budget` for a throttle at `now`, from the backoff this process last saw
        (no read): one conditional write on that backoff being unchanged. If another lessee changed it meanwhile,
        the failed write returns the item's own and the decrease is decided again from it (nothing to do when it
        is already decreased for this overshoot). True when this call wrote the decrease."""
        known = self.state.backoff.get(budget) if self.state is not None else None
        for _attempt in range(3):
            lower = decreased(known, now)
            if lower is None:
                return False  # decreased under `DECREASE_HOLD_S` ago: this overshoot's decrease is in the pool
            written, current = self.pool.record_backoff(budget, lower, after=known)
            if written:
                self.stats["backoff_written"] += 1
                return True
            self.stats["backoff_seen"] += 1
            known = current
        return False

    def heartbeat(self) -> None:
        """Record this experiment as alive with its sessions in flight (the sweeper, every run): its in-flight
        sessions keep counting against the active-session budget even while nothing renews."""
        self.renew(force=True)


def sessions_cap(config: ExperimentConfig) -> float | None:
    """The most new sessions/s this experiment asks for (`config.new_sessions_cap`)."""
    return new_sessions_cap(config.session_rate_limit, config.tps_limit)


def forgotten(state: PoolState, name: str, now: float) -> tuple[str, ...]:
    """Entries to drop with this write: every lease over and no heartbeat for `FORGET_AFTER_S` (a deleted
    experiment; at most a few per write)."""
    gone = []
    for other, member in state.members.items():
        if other == name or now - member.heartbeat < FORGET_AFTER_S:
            continue
        if all(lease_counted(lease, now) == 0 for lease in member.leases.values()):
            gone.append(other)
    return tuple(sorted(gone)[:5])
