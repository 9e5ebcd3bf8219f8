"""The warm pool: sessions started ahead of the next batch, so a GRPO step's rollouts start at once.

Synchronous GRPO submits a whole step at once (128 prompts x 8 = 1,024 rollouts by SageMaker's default); at the
account's 25 new sessions/s its admission alone takes 41 s, each session paying its cold start, while the trainer's
GPUs wait, and during the training phase the session budget sits unused. AgentCore has no warm-pool API; the
public workaround is to start sessions ahead with an invocation of their own and hand them out later (invoking the
same `runtimeSessionId` reaches the same microVM: no new-session charge, no cold start). docs/aws-facts.md.

One manager at a time (the pool item's lease) runs `tick`, from the sweeper (the stack: once a minute, ticking for
most of its invocation while the pool has work) and from local mode's own loop. Each tick:

1. reads the pool (one Query of its partition), the session slots with the admission board (one Query), the pool
   item and the release window (two GetItems);
2. notes whether the experiment has work (rollouts in flight or waiting, a batch in the window) and the newest
   batch's size; halts the pool (every warm session stopped, none started) when it has had none for
   `warm_idle_stop_s` (a later batch resumes it), and keeps it halted after a cancel that left nothing to run or a
   destroy (`halt`);
3. stops what the pool no longer wants: idle sessions beyond the target (the ones kept alive longest ago first),
   sessions whose warm-up or keep-alive is too old to trust (they may have idled out), sessions stuck warming;
   a stop is confirmed as every stop of the pipeline is (`stops.stop_session`: a second NotFound), then the item goes
   and its slot is given back in one transaction;
4. keeps the rest alive: an idle session whose last warm-up is older than half the idle timeout gets the warm-up
   invocation again (data-plane only, the `tps` budget); one that answers NotFound or is rejected is dead: stopped
   and dropped;
5. fills up to the target, only while the capacity seam says the new-session budget would otherwise go unused
   (`WarmCapacity`: nothing waits for a slot and no dispatch took a new session, nor a warm one, for
   `DEMAND_QUIET_S`: a burst of takes runs at the invoke rate, which warm-ups would share), within the
   free session slots of the experiment's share (warm sessions count against `max_sessions` and the account pool's
   grant of active sessions, as a dispatch's slot does): in chunks, each chunk's items and slots written
   in one transaction BEFORE its warm-ups are sent (a crash leaves items the next tick stops), the warm-ups paced by
   the session budget like any new session (a chunk's session starts booked in one write per session budget it
   takes: `limits.pacing.InvokeBlock`), then the chunk marked idle in one transaction.

The target: `warm_sessions`, or with `auto` the newest batch's rollouts (the next step's size), capped by what the
capacity seam lets the experiment hold. A warm session is taken by one dispatch only (`lifecycle.warm`) and, having
run a rollout, is stopped as every session is; the pool never hands a session out twice.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Final, Protocol

from rollout_pipeline import ids
from rollout_pipeline.config import WARM_AUTO, warmup_payload
from rollout_pipeline.contracts import parse_iso
from rollout_pipeline.ledger.release import WindowState
from rollout_pipeline.ledger.warm import ADDED, HALTED
from rollout_pipeline.ledger.warm_items import WarmPoolState, WarmSession, WarmState
from rollout_pipeline.lifecycle import budget, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.warm import STALE_MARGIN_S
from rollout_pipeline.limits.pacing import SESSION_PACE, InvokeBlock
from rollout_pipeline.limits.slots import caps as slot_caps
from rollout_pipeline.metric_names import (
    WARM_KEEPALIVES,
    WARM_POOL_SIZE,
    WARM_STOPPED_UNUSED,
    WARMED,
)
from rollout_pipeline.ports import (
    RuntimeColdStart,
    RuntimeOutcomeUnknown,
    RuntimeRejected,
    RuntimeSessionNotFound,
    RuntimeStartFailed,
    RuntimeThrottled,
)

log = logging.getLogger(__name__)

#: The pool item's lease lasts a tick's budget plus this.
LEASE_MARGIN_S: Final = 30.0
#: No fill while a dispatch took a new session (no warm one idle), or a warm one, within this many seconds.
DEMAND_QUIET_S: Final = 3.0
#: A warm session gets its keep-alive once its last warm-up is older than this share of the idle timeout.
KEEPALIVE_SHARE: Final = 0.5
#: A session still warming this long after its item was written is stopped (its warm-up's outcome was lost).
WARMING_STUCK_S: Final = 120.0
#: Warm-ups in flight at once while filling. A warm-up waits out its session's cold start (~1.3 s, up to ~3.3 s for
#: a container with no ready microVM) and a chunk is marked idle only once all its warm-ups answered, so at 25 new
#: sessions/s about 25 x (1 s of pacing + 3.3 s) ~ 100 must be in flight for the rate, not the threads, to bind
#: (measured, bench_warm: 40 in flight filled at ~8/s).
FILL_THREADS: Final = 100
#: A fill looks again at whether rollouts want the new-session budget (`WarmCapacity.new_sessions_now`) at most this
#: often: its warm-ups in flight go on anyway, so a demand is seen at most this much later (a chunk is ~1 s of
#: warm-ups at 25 new sessions/s).
CAPACITY_RECHECK_S: Final = 1.0
#: Sessions per fill chunk at most (one transaction writes its items and takes their slots).
FILL_CHUNK: Final = 25
#: Slot counters one chunk takes its slots on at most (one item of its transaction each: with `FILL_CHUNK` 25 and
#: the counters' caps as small as 1, the transaction stays within DynamoDB's 100 items).
MAX_CHUNK_COUNTERS: Final = 25
#: A 424 (the session exists, its agent is not up) is retried this many times, this far apart, before the session
#: is stopped.
WARMUP_COLD_RETRIES: Final = 12
WARMUP_COLD_WAIT_S: Final = 0.5
#: Stop calls per warm session before it is forgotten anyway (AgentCore ends an idle session at its idle timeout).
STOP_TRIES: Final = 6
#: Stops in flight at once (paced by the `tps` budget: 1,024 warm sessions stop in seconds, not a minute).
STOP_THREADS: Final = 25
#: Halt reasons (`WarmPoolState.halted`).
HALT_IDLE: Final = "idle"
HALT_CANCELLED: Final = "cancelled"
HALT_DESTROYED: Final = "destroyed"
HALT_STOPPED: Final = "stopped"


class WarmCapacity(Protocol):
    """The seam between the warm pool and the capacity it may use: the experiment's share (`ExperimentCapacity`)."""

    def new_sessions_now(self) -> int:
        """How many new sessions the pool may start now without delaying queued work (0: none)."""
        ...

    def sessions_to_hold(self) -> int:
        """How many active sessions the experiment may hold (warm ones included)."""
        ...


class ExperimentCapacity:
    """`WarmCapacity` over the experiment's share: the session slots (`deps.max_sessions()`: `max_sessions`, or the
    account pool's lease's grant of active sessions, the cap a dispatch's slot is taken under) and the new-session
    budget (the lease's grant, else the standalone session rate x `endpoints` a second), which the pool may spend
    only while no rollout wants it (nothing on the admission board, no dispatch that took a new session in
    the last `DEMAND_QUIET_S`) nor wants the invoke rate its warm-ups would share (no dispatch that took a warm
    session in that time). One read of the pool item and one of the board per call."""

    def __init__(self, deps: LifecycleDeps, wall: Callable[[], float]) -> None:
        self.deps = deps
        self.wall = wall

    def new_sessions_now(self) -> int:
        state = self.deps.ledger.warm.pool()
        if self.wall() - max(state.demand_at, state.took_at) < DEMAND_QUIET_S:
            return 0
        _counts, board = self.deps.ledger.limits.slots_and_board()
        if any(keys for _process, _heartbeat, keys in board):
            return 0
        if budget.paused(self.deps):  # a spent budget starts nothing, warm or cold
            return 0
        return max(1, int(self.deps.limits.new_session_rate()))

    def sessions_to_hold(self) -> int:
        return self.deps.limits.sessions_to_hold()


@dataclass
class TickResult:
    """What one tick saw and did."""

    ran: bool = True
    target: int = 0
    idle: int = 0
    warming: int = 0
    warmed: int = 0
    warmup_failures: int = 0
    kept_alive: int = 0
    stopped: int = 0
    dropped: int = 0
    halted: str | None = None
    busy: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _View:
    """What a tick read."""

    state: WarmPoolState
    sessions: list[WarmSession]
    in_flight: int
    waiting: bool
    window: WindowState


class WarmPool:
    """The manager of one experiment's warm pool (see the module doc)."""

    def __init__(
        self,
        deps: LifecycleDeps,
        capacity: WarmCapacity | None = None,
        *,
        owner: str | None = None,
    ) -> None:
        self.deps = deps
        self.config = deps.config
        self.capacity = capacity or ExperimentCapacity(deps, self.wall)
        self.owner = owner or f"warm-{uuid.uuid4().hex[:12]}"
        #: A fill asks the capacity seam whether it may start new sessions at most this often (each ask reads the
        #: pool item and the admission board).
        self.capacity_recheck_s = CAPACITY_RECHECK_S
        self._lock = threading.Lock()

    def wall(self) -> float:
        return self.deps.clock.now().timestamp()

    # ----------------------------------------------------------------------------------------------- a tick

    def tick(self, *, budget_s: float = 20.0) -> TickResult:
        """One pass (see the module doc), its waits bounded by `budget_s`. Does nothing when the pool is off or
        another manager holds the lease."""
        result = TickResult()
        if not self.config.warm_pool_on and not self._holds_any():
            result.ran = False
            return result
        wait_until = self.deps.clock.monotonic() + budget_s
        if not self.deps.ledger.warm.take_lease(self.owner, now=self.wall(), lease_s=budget_s + LEASE_MARGIN_S):
            result.ran = False
            return result
        try:
            self._tick(result, wait_until)
        finally:
            self.deps.ledger.warm.end_lease(self.owner)
        return result

    def _holds_any(self) -> bool:
        """Whether warm sessions are left although the pool is off (the setting was lowered): they are stopped."""
        return bool(self.deps.ledger.warm.sessions())

    def _tick(self, result: TickResult, wait_until: float) -> None:
        view = self._read()
        now = self.wall()
        result.busy = busy = self._busy(view)
        halted = self._halted(view, now, busy)
        result.halted = halted
        hold = self.capacity.sessions_to_hold()
        result.target = target = 0 if halted or not self.config.warm_pool_on else self._target(view, hold)
        idle = [s for s in view.sessions if s.state is WarmState.IDLE and self._fresh(s, now)]
        over_share = max(0, view.in_flight - hold)  # the share shrank: idle warm sessions give it back first
        unwanted = self._unwanted(view.sessions, idle, min(target, len(idle) - over_share), now)
        if unwanted:
            result.stopped += self._stop(unwanted, wait_until, now)
        idle = [s for s in idle if s not in unwanted]
        result.kept_alive, dead = self._keep_alive(idle, now, wait_until)
        if dead:
            result.dropped += len(dead)
            self._stop(dead, wait_until, now, dropped=True)
        idle = [s for s in idle if s not in dead]
        warming = [s for s in view.sessions if s.state is WarmState.WARMING and s not in unwanted]
        result.idle, result.warming = len(idle), len(warming)
        room = hold - view.in_flight + result.stopped + result.dropped
        wanted = min(target - len(idle) - len(warming), room)
        if wanted > 0 and not halted:
            result.warmed, result.warmup_failures = self._fill(wanted, wait_until)
            result.idle += result.warmed
        self.deps.metrics.sample(WARM_POOL_SIZE, result.idle)

    # ------------------------------------------------------------------------------------------------ reads

    def _read(self) -> _View:
        ledger = self.deps.ledger
        counts, board = ledger.limits.slots_and_board()
        return _View(
            state=ledger.warm.pool(),
            sessions=ledger.warm.sessions(),
            in_flight=sum(counts),
            waiting=any(keys for _process, _heartbeat, keys in board),
            window=ledger.release.read_window(),
        )

    def _busy(self, view: _View) -> bool:
        """The experiment has work: rollouts holding slots (beyond the pool's own), waiting for one, or a batch in
        the release window."""
        rollouts = view.in_flight - len(view.sessions)
        return rollouts > 0 or view.waiting or bool(view.window.entries)

    def _halted(self, view: _View, now: float, busy: bool) -> str | None:
        """Why the pool keeps no session now (None: it runs), noting the experiment's work on the pool item."""
        state, warm = view.state, self.deps.ledger.warm
        newest = self._newest_batch(view.window)
        if busy and (now - state.busy_at >= 5.0 or (newest is not None and newest[0] != state.last_batch_id)):
            warm.note_busy(now, last_batch=None if newest is None else (newest[0], newest[1]))
        if state.halted == HALT_DESTROYED:
            return state.halted
        if state.halted is not None:
            if self._work_since_halt(state, newest, busy):
                warm.resume()
                log.info("warm pool resumes: work came after the halt (%s)", state.halted)
                return None
            return state.halted
        if state.busy_at == 0.0 and not busy:  # the pool's first tick: the experiment starts now
            warm.note_busy(now)
            return None
        if not busy and now - state.busy_at >= self.config.warm_idle_stop_s:
            log.info("warm pool halts: no work for %.0f s (warm_idle_stop_s)", now - state.busy_at)
            warm.halt(HALT_IDLE, now)
            return HALT_IDLE
        return None

    @staticmethod
    def _work_since_halt(state: WarmPoolState, newest: tuple[str, int, float] | None, busy: bool) -> bool:
        """Work came after the halt: a batch created since, a dispatch that wanted a new session since, or (after
        an idle halt) any work at all."""
        later_batch = newest is not None and newest[2] > state.halted_at
        return later_batch or state.demand_at > state.halted_at or (state.halted == HALT_IDLE and busy)

    @staticmethod
    def _newest_batch(window: WindowState) -> tuple[str, int, float] | None:
        """The newest batch in the window: its id, its rollouts (so far), its creation (epoch s)."""
        ordered = window.in_order()
        if not ordered:
            return None
        batch_id, entry = ordered[-1]
        created = parse_iso(entry.created)
        return (
            batch_id,
            entry.total if entry.total is not None else entry.released,
            (created.timestamp() if created is not None else 0.0),
        )

    def _target(self, view: _View, hold: int) -> int:
        if self.config.warm_sessions == WARM_AUTO:
            newest = self._newest_batch(view.window)
            size = max(view.state.last_batch_rollouts, newest[1] if newest is not None else 0)
            return max(0, min(size, hold))
        return max(0, min(int(self.config.warm_sessions), hold))

    def _fresh(self, session: WarmSession, now: float) -> bool:
        """Kept alive recently enough that it cannot have idled out."""
        return session.kept_at > now - max(1.0, self.config.idle_timeout_s - STALE_MARGIN_S)

    def _unwanted(
        self, sessions: Sequence[WarmSession], idle: Sequence[WarmSession], target: int, now: float
    ) -> list[WarmSession]:
        """Sessions to stop: stopping ones (again), stale ones, stuck warm-ups, and idle ones beyond the target
        (kept alive longest ago first)."""
        out = [s for s in sessions if s.state is WarmState.STOPPING]
        out += [s for s in sessions if s.state is WarmState.IDLE and not self._fresh(s, now)]
        out += [s for s in sessions if s.state is WarmState.WARMING and now - s.warmed_at > WARMING_STUCK_S]
        extra = len(idle) - target
        if extra > 0:
            out += sorted(idle, key=lambda s: s.kept_at)[:extra]
        return list({s.session_id: s for s in out}.values())

    # ------------------------------------------------------------------------------------------------ stops

    def _stop(self, sessions: Sequence[WarmSession], wait_until: float, now: float, *, dropped: bool = False) -> int:
        """Stop `sessions` (state stopping first: no dispatch takes them after); forget the confirmed ones and the
        ones AgentCore has ended anyway. Returns how many are gone."""
        warm = self.deps.ledger.warm
        stopping = set(warm.begin_stop([s.session_id for s in sessions]))

        def stop(session: WarmSession) -> bool:
            reaped = now - session.kept_at > self.config.idle_timeout_s + stops.HOLD_MARGIN_S
            if reaped or session.stop_tries >= STOP_TRIES:
                return True
            confirmed, not_found = stops.stop_session(
                session.session_id, self.deps, wait_until, not_found_before=session.stop_not_found
            )
            if not confirmed:
                warm.note_stop_failed(session.session_id, not_found=not_found)
            return confirmed

        # A dispatch may have taken one meanwhile (not in `stopping`): its rollout runs in it.
        mine = [s for s in sessions if s.session_id in stopping]
        with ThreadPoolExecutor(
            max_workers=max(1, min(STOP_THREADS, len(mine))), thread_name_prefix="warm-stop"
        ) as pool:
            gone = [s for s, confirmed in zip(mine, pool.map(stop, mine), strict=True) if confirmed]
        forgotten = set(warm.forget([s.session_id for s in gone]))
        unused = [s for s in gone if s.session_id in forgotten]
        idle_s = sum(max(0.0, now - s.warmed_at) for s in unused)
        warm.add_totals(stopped_unused=len(unused), unused_idle_s=idle_s, dropped=len(unused) if dropped else 0)
        self.deps.metrics.count(WARM_STOPPED_UNUSED, len(unused))
        return len(unused)

    def stop_all(self, *, budget_s: float = 60.0) -> int:
        """Stop every warm session the pool holds now (a cancel, a destroy, a halt); bounded by `budget_s`.
        Returns how many were stopped. Sessions another manager adds meanwhile are stopped by its next tick (the
        pool is halted before this is called)."""
        wait_until = self.deps.clock.monotonic() + budget_s
        warm = self.deps.ledger.warm
        leased = self._wait_for_lease(self.deps.clock.monotonic() + budget_s / 2)
        stopped = 0
        try:
            for _ in range(20):
                left = warm.sessions()
                if not left or self.deps.clock.monotonic() >= wait_until:
                    break
                stopped += self._stop(left, wait_until, self.wall())
        finally:
            if leased:
                warm.end_lease(self.owner)
        return stopped

    def _wait_for_lease(self, until: float) -> bool:
        """Take the pool's lease, waiting (bounded) for a manager's tick in progress to end: its warm-ups in flight
        are then recorded, and stopped with the rest. False when it could not be had by `until`."""
        while True:
            if self.deps.ledger.warm.take_lease(self.owner, now=self.wall(), lease_s=LEASE_MARGIN_S * 2):
                return True
            if self.deps.clock.monotonic() + 0.5 >= until:
                log.warning("warm pool: a manager still holds the pool; stopping its sessions anyway")
                return False
            self.deps.clock.sleep(0.5)

    # ------------------------------------------------------------------------------------------- keep-alive

    def _keep_alive(self, idle: Sequence[WarmSession], now: float, wait_until: float) -> tuple[int, list[WarmSession]]:
        """The warm-up invocation again for idle sessions kept alive more than `KEEPALIVE_SHARE` of the idle
        timeout ago. Returns how many answered, and the dead ones (NotFound or rejected)."""
        due = [s for s in idle if now - s.kept_at >= self.config.idle_timeout_s * KEEPALIVE_SHARE]
        if not due:
            return 0, []
        answered: list[str] = []
        dead: list[WarmSession] = []
        for session in due:
            try:
                self.deps.limits.runtime.invoke(
                    session.session_id, self._payload(session.session_id), wait_until=wait_until, new_session=False
                )
                answered.append(session.session_id)
            except (RuntimeRejected, RuntimeSessionNotFound, RuntimeColdStart, RuntimeStartFailed) as exc:
                log.warning("warm session %s failed its keep-alive (%s): dropped", session.session_id, exc)
                dead.append(session)
            except (RuntimeThrottled, RuntimeOutcomeUnknown) as exc:  # tried again next tick (or goes stale)
                log.info("keep-alive of warm session %s not answered: %s", session.session_id, exc)
        kept = self.deps.ledger.warm.mark(answered, kept_at=self.wall(), from_states=(WarmState.IDLE,))
        self.deps.ledger.warm.add_totals(keepalives=len(kept))
        self.deps.metrics.count(WARM_KEEPALIVES, len(kept))
        return len(kept), dead

    # ------------------------------------------------------------------------------------------------ fill

    def _fill(self, wanted: int, wait_until: float) -> tuple[int, int]:
        """Start up to `wanted` warm sessions while the capacity seam allows: chunks recorded one after another,
        their warm-ups (paced by the session budget) in flight together up to `FILL_THREADS`, each chunk marked idle
        once all its warm-ups answered. Returns how many were warmed and how many warm-ups failed."""
        fill = _Fill(wanted)
        room = _SlotRoom(self.deps.ledger.limits.slot_counts(), self.capacity.sessions_to_hold())
        allowed, checked_at = 0, -math.inf
        with ThreadPoolExecutor(max_workers=FILL_THREADS, thread_name_prefix="warm-fill") as pool:
            while True:
                while fill.may_start(FILL_CHUNK) and self.deps.clock.monotonic() < wait_until:
                    if self.deps.clock.monotonic() - checked_at >= self.capacity_recheck_s:
                        allowed, checked_at = self.capacity.new_sessions_now(), self.deps.clock.monotonic()
                    room.resize(self.capacity.sessions_to_hold())
                    chunk = self._start_chunk(min(fill.left(), allowed, FILL_CHUNK), room) if allowed > 0 else []
                    if not chunk:  # no budget, no room, or halted
                        fill.closed = True
                        break
                    block = self._block(chunk)
                    fill.started(chunk, [pool.submit(self._warm_up, sid, wait_until, block) for sid in chunk])
                finished = fill.wait()
                if finished is None:
                    break
                ready = [sid for _chunk, chunk_ready, _lost in finished for sid in chunk_ready]
                lost = [sid for _chunk, _ready, chunk_lost in finished for sid in chunk_lost]
                marked = set(self.deps.ledger.warm.mark(ready, kept_at=self.wall(), from_states=(WarmState.WARMING,)))
                self._stop_unrecorded([sid for sid in ready if sid not in marked], wait_until)
                if lost:
                    self._stop(self._as_sessions(lost), wait_until, self.wall())
                    if not ready:
                        fill.closed = True  # nothing warms (throttled, the agent cannot start): the next tick tries
        self.deps.ledger.warm.add_totals(warmed=fill.warmed, warmup_failures=fill.failed)
        self.deps.metrics.count(WARMED, fill.warmed)
        return fill.warmed, fill.failed

    def _stop_unrecorded(self, sessions: Sequence[str], wait_until: float) -> None:
        """Sessions whose warm-up answered after their item was stopped under them (a halt, a cancel, a destroy):
        they exist now, and nothing else knows of them: stopped here."""
        for session_id in sessions:
            confirmed, _ = stops.stop_session(session_id, self.deps, max(wait_until, self.deps.clock.monotonic() + 5))
            if not confirmed:
                log.warning("warm session %s started after the pool stopped it: its stop failed", session_id)

    def _start_chunk(self, size: int, room: _SlotRoom) -> list[str]:
        """Record `size` new warm sessions (or fewer: what the counters have room for) and take their slots within
        the experiment's share (`room.hold`, as a dispatch takes its slot), on as many counters as it takes (the
        roomiest first), in one transaction, before any warm-up is sent. Returns their ids ([] when no counter has
        room)."""
        for _ in range(3):
            takes = room.takes(size)
            if not takes:
                return []
            sessions = [ids.warm_session_id(self.config.name) for _ in range(sum(takes.values()))]
            added = self.deps.ledger.warm.add_warming(
                sessions, max_sessions=room.hold, takes=takes, warmed_at=self.wall()
            )
            if added == ADDED:
                room.took(takes)
                return sessions
            if added == HALTED:
                return []
            room.recount(self.deps.ledger.limits.slot_counts())  # a counter filled meanwhile: read them again
        return []

    def _block(self, chunk: Sequence[str]) -> InvokeBlock:
        """The chunk's warm-ups' session starts, booked in one write per session budget they take (`InvokeBlock`)."""
        return InvokeBlock({SESSION_PACE: len(chunk)})

    def _warm_up(self, session_id: str, wait_until: float, block: InvokeBlock | None = None) -> bool:
        """The warm-up invocation of a new session, paced as any new session (its start from its chunk's `block`);
        a 424 (its agent is not up yet) is retried on the same session. True once it answered."""
        payload = self._payload(session_id)
        try:
            self.deps.limits.runtime.invoke(session_id, payload, wait_until=wait_until, new_session=True, block=block)
            return True
        except RuntimeColdStart:
            pass
        except RuntimeStartFailed as exc:
            log.error("warm-up of %s: the agent cannot start: %s", session_id, str(exc)[-300:])
            return False
        except (RuntimeThrottled, RuntimeRejected, RuntimeOutcomeUnknown) as exc:
            log.info("warm-up of %s not answered: %s", session_id, exc)
            return False
        for _ in range(WARMUP_COLD_RETRIES):
            if self.deps.clock.monotonic() + WARMUP_COLD_WAIT_S >= wait_until:
                return False
            self.deps.clock.sleep(WARMUP_COLD_WAIT_S)
            try:
                self.deps.limits.runtime.invoke(session_id, payload, wait_until=wait_until, new_session=False)
                return True
            except RuntimeColdStart:
                continue
            except Exception as exc:  # any other answer: the session is stopped
                log.info("warm-up of %s failed after its cold start: %s", session_id, exc)
                return False
        return False

    def _payload(self, session_id: str) -> dict[str, object]:
        return warmup_payload(self.config.name, session_id)

    def _as_sessions(self, session_ids: Sequence[str]) -> list[WarmSession]:
        now = self.wall()
        return [WarmSession(sid, WarmState.WARMING, warmed_at=now, kept_at=now) for sid in session_ids]

    # ------------------------------------------------------------------------------------------------ halt

    def halt(self, reason: str, *, stop: bool = True, budget_s: float = 60.0) -> int:
        """Keep no warm session: the pool is halted (`reason`: "cancelled", "destroyed", "stopped"; a later batch
        resumes it, never after "destroyed") and, with `stop`, every warm session is stopped now. Returns how many
        were stopped."""
        self.deps.ledger.warm.halt(reason, self.wall())
        return self.stop_all(budget_s=budget_s) if stop else 0


class _SlotRoom:
    """Free slots per session-slot counter within the sessions the experiment may hold (`hold`: the account pool's
    grant of active sessions, at most `max_sessions`, the caps dispatch's `SlotShards` uses), as read at a fill's
    start less the fill's own takes; `resize` follows a grant that changed meanwhile."""

    def __init__(self, counts: Sequence[int], hold: int) -> None:
        self.hold = hold
        self.rooms = [cap - count for cap, count in zip(slot_caps(hold), counts, strict=True)]

    def resize(self, hold: int) -> None:
        if hold != self.hold:
            old, new = slot_caps(self.hold), slot_caps(hold)
            self.rooms = [room + n - o for room, n, o in zip(self.rooms, new, old, strict=True)]
            self.hold = hold

    def recount(self, counts: Sequence[int]) -> None:
        """The counters as read again."""
        self.rooms = [cap - count for cap, count in zip(slot_caps(self.hold), counts, strict=True)]

    def takes(self, size: int) -> dict[int, int]:
        """Up to `size` slots over the counters with room, the roomiest first: how many on each. At most
        `MAX_CHUNK_COUNTERS` counters (each one more item of the chunk's transaction)."""
        takes: dict[int, int] = {}
        for shard in sorted(range(len(self.rooms)), key=lambda i: -self.rooms[i])[:MAX_CHUNK_COUNTERS]:
            left = size - sum(takes.values())
            if left <= 0 or self.rooms[shard] <= 0:
                break
            takes[shard] = min(left, self.rooms[shard])
        return takes

    def took(self, takes: dict[int, int]) -> None:
        for shard, count in takes.items():
            self.rooms[shard] -= count


class _Fill:
    """The chunks of one fill: how many are wanted, the warm-ups in flight by chunk, and what came of them."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.chunks = 0
        self.closed = False
        self.warmed = 0
        self.failed = 0
        self._flying: dict[Future[bool], tuple[int, str]] = {}
        self._chunks: dict[int, tuple[list[str], dict[str, bool]]] = {}

    def left(self) -> int:
        return self.wanted - self.warmed - self.failed - len(self._flying)

    def may_start(self, chunk_size: int) -> bool:
        return not self.closed and self.left() > 0 and len(self._flying) + chunk_size <= FILL_THREADS

    def started(self, chunk: list[str], futures: list[Future[bool]]) -> None:
        number = self.chunks
        self.chunks += 1
        self._chunks[number] = (chunk, {})
        for sid, future in zip(chunk, futures, strict=True):
            self._flying[future] = (number, sid)

    def wait(self) -> list[tuple[list[str], list[str], list[str]]] | None:
        """Wait for warm-ups until chunks are complete: each (its sessions, the ready ones, the lost ones); None
        when nothing is in flight."""
        if not self._flying:
            return None
        while True:
            done, _pending = wait(list(self._flying), return_when=FIRST_COMPLETED)
            for future in done:
                number, sid = self._flying.pop(future)
                self._chunks[number][1][sid] = bool(future.result())
            complete = [n for n, (chunk, outcomes) in self._chunks.items() if len(outcomes) == len(chunk)]
            if complete:
                return [self._report(n) for n in sorted(complete)]

    def _report(self, number: int) -> tuple[list[str], list[str], list[str]]:
        chunk, outcomes = self._chunks.pop(number)
        ready = [sid for sid in chunk if outcomes[sid]]
        self.warmed += len(ready)
        self.failed += len(chunk) - len(ready)
        return chunk, ready, [sid for sid in chunk if not outcomes[sid]]


def halt_if_nothing_runs(deps: LifecycleDeps, cancelled_batch: str) -> int:
    """After batch `cancelled_batch` was cancelled: when no other batch that is not cancelled is left in the
    release window (nothing else will run: the experiment is cancelled), halt the pool and stop every warm session
    now. Returns how many were stopped."""
    if not deps.config.warm_pool_on and not deps.ledger.warm.sessions():
        return 0
    for batch_id in deps.ledger.release.read_window().entries:
        if batch_id == cancelled_batch:
            continue
        view = deps.ledger.batches.read_batch(batch_id)
        if view is not None and not view.cancelled:
            return 0
    return WarmPool(deps).halt(HALT_CANCELLED)


#: Between two ticks of one `run_pool` loop.
TICK_EVERY_S: Final = 5.0


def run_pool(deps: LifecycleDeps, *, until: float, every_s: float = TICK_EVERY_S) -> list[TickResult]:
    """Tick the warm pool until `until` (monotonic) while it has something to do (a target, or sessions to stop),
    `every_s` apart; one tick when it is off, halted with nothing left, or another manager holds it. The sweeper
    runs this after its sweep: the stack's schedule (once a minute) keeps the pool managed all the time it is on."""
    pool = WarmPool(deps)
    results: list[TickResult] = []
    for _ in range(100_000):
        left = until - deps.clock.monotonic()
        result = pool.tick(budget_s=max(1.0, left))
        results.append(result)
        active = result.ran and (result.target > 0 or result.idle + result.warming > 0)
        if not active or deps.clock.monotonic() + every_s >= until:
            break
        deps.clock.sleep(every_s)
    return results
