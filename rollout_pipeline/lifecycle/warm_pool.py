"""The warm pool: sessions started ahead of the next batch, so a GRPO step's rollouts start at once.

AgentCore has no warm-pool API; the public workaround is to start sessions ahead with an invocation of their own and
hand them out later (invoking the same `runtimeSessionId` reaches the same microVM: no new-session charge, no cold
start). docs/aws-facts.md; docs/lifecycle.md, "The warm pool", says what a tick does and why.

One manager at a time (the pool item's lease) runs `tick`, from the sweeper and from local mode's own loop: it reads
the pool, notes the experiment's work (halting the pool after `warm_idle_stop_s` without any), stops the sessions it
no longer wants (past their offer: stale or too old for a rollout; beyond the target; stuck warming), keeps alive
the idle ones whose offer would otherwise end (concurrently, paced by the invoke budget), and fills up to the target
while nothing else wants the new-session budget: each chunk's items and slots written in one transaction BEFORE its
warm-ups are sent, each answered warm-up marked idle and put on offer (`lifecycle.warm`).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Final, TypeVar

from rollout_pipeline import ids
from rollout_pipeline.adapters.clients import MAX_POOL_CONNECTIONS
from rollout_pipeline.config import WARM_AUTO, warmup_payload
from rollout_pipeline.contracts import parse_iso
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import WarmPoolState, WarmSession, WarmState
from rollout_pipeline.ledger.limits import shard_cap
from rollout_pipeline.ledger.release import WindowState
from rollout_pipeline.ledger.warm import ADDED, HALTED
from rollout_pipeline.lifecycle import budget, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.metrics import WARM_KEEPALIVES, WARM_POOL_SIZE, WARM_STOPPED_UNUSED, WARMED
from rollout_pipeline.lifecycle.warm import WarmOffer, offer_until
from rollout_pipeline.limits.pacing import SESSION_PACE, InvokeBlock
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
#: No fill while a dispatch took a new session (no warm one on offer), or a warm one, within this many seconds.
DEMAND_QUIET_S: Final = 3.0
#: A session still warming this long after its item was written is stopped (its warm-up's outcome was lost).
WARMING_STUCK_S: Final = 120.0
#: AgentCore calls (warm-ups, keep-alives, stops) a tick has in flight at once: as many as a client's pooled
#: connections (`adapters.clients`). A warm-up waits out its session's cold start (~1.3 s, up to ~3.3 s) and a chunk
#: is offered once its warm-ups answered, so at 25 new sessions/s about 25 x 4.3 s must be in flight for the rate,
#: not the threads, to bind.
CALLS_IN_FLIGHT: Final = MAX_POOL_CONNECTIONS
#: A fill asks whether rollouts want the new-session budget (`WarmCapacity.new_sessions_now`) at most this often.
CAPACITY_RECHECK_S: Final = 1.0
#: Sessions per fill chunk (one transaction writes their items and takes their slots, on at most as many counters).
FILL_CHUNK: Final = 25
#: Stop calls per warm session before it is forgotten anyway (AgentCore ends an idle session at its idle timeout).
STOP_TRIES: Final = 6
#: SQS delays a message at most this long (`DelaySeconds`): an offer sent after a keep-alive waits for the last one.
MAX_OFFER_DELAY_S: Final = 900
#: Halt reasons (`WarmPoolState.halted`).
HALT_IDLE: Final = "idle"
HALT_CANCELLED: Final = "cancelled"
HALT_DESTROYED: Final = "destroyed"
HALT_STOPPED: Final = "stopped"
#: Between two ticks of one `run_pool` loop.
TICK_EVERY_S: Final = 5.0


class WarmCapacity:
    """What the pool may use of the experiment's limits (a test gives its own): its share of active sessions
    (`sessions_to_hold`, the cap a dispatch's slot is taken under) and of new sessions (`new_sessions_now`), which
    the pool spends only while no rollout wants it (nothing on the admission board, no dispatch that took a new
    session, nor a warm one, in the last `DEMAND_QUIET_S`: a burst of takes runs at the invoke rate, which warm-ups
    would share) and the budget is not spent."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self.deps = deps

    def new_sessions_now(self) -> int:
        """How many new sessions the pool may start a second now (0: none)."""
        state = self.deps.ledger.warm.pool()
        if self.deps.clock.now().timestamp() - max(state.demand_at, state.took_at) < DEMAND_QUIET_S:
            return 0
        _counts, board = self.deps.ledger.limits.slots_and_board()
        if any(keys for _process, _heartbeat, keys in board) or budget.paused(self.deps):
            return 0
        return max(1, int(self.deps.limits.new_session_rate()))

    def sessions_to_hold(self) -> int:
        """How many active sessions the experiment may hold (warm ones included)."""
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


class WarmPool:
    """The manager of one experiment's warm pool (see the module doc)."""

    def __init__(self, deps: LifecycleDeps, capacity: WarmCapacity | None = None, *, owner: str | None = None) -> None:
        self.deps = deps
        self.config = deps.config
        self.capacity = capacity or WarmCapacity(deps)
        self.owner = owner or f"warm-{uuid.uuid4().hex[:12]}"
        #: A fill asks the capacity seam whether it may start new sessions at most this often.
        self.capacity_recheck_s = CAPACITY_RECHECK_S

    def wall(self) -> float:
        return self.deps.clock.now().timestamp()

    @property
    def keepalive_lead_s(self) -> float:
        """A keep-alive is sent this long before a session's offer would end for want of one: halfway, and at most
        as far as SQS can delay the next offer (so the two offers never overlap)."""
        return min(self.config.warm_stale_after_s / 2, MAX_OFFER_DELAY_S)

    def until(self, session: WarmSession) -> float:
        return offer_until(self.config, session.warmed_at, session.kept_at)

    # ----------------------------------------------------------------------------------------------- a tick

    def tick(self, *, budget_s: float = 20.0) -> TickResult:
        """One pass (see the module doc), its waits bounded by `budget_s`. Does nothing when the pool is off (and
        holds nothing) or another manager holds the lease."""
        if not self.config.warm_pool_on and not self.deps.ledger.warm.sessions():
            return TickResult(ran=False)
        wait_until = self.deps.clock.monotonic() + budget_s
        if not self.deps.ledger.warm.take_lease(self.owner, now=self.wall(), lease_s=budget_s + LEASE_MARGIN_S):
            return TickResult(ran=False)
        try:
            return self._tick(wait_until)
        finally:
            self.deps.ledger.warm.end_lease(self.owner)

    def _tick(self, wait_until: float) -> TickResult:
        ledger, now = self.deps.ledger, self.wall()
        counts, board = ledger.limits.slots_and_board()
        state, sessions, window = ledger.warm.pool(), ledger.warm.sessions(), ledger.release.read_window()
        in_flight, newest = sum(counts), _newest_batch(window)
        # The experiment has work: rollouts holding slots (beyond the pool's own), waiting for one, or a batch.
        busy = in_flight > len(sessions) or any(keys for _p, _h, keys in board) or bool(window.entries)
        result = TickResult(halted=self._halted(state, newest, busy, now))
        hold = self.capacity.sessions_to_hold()
        if not result.halted and self.config.warm_pool_on:
            size = self.config.warm_sessions
            if size == WARM_AUTO:  # the newest batch's rollouts: the next step's size
                size = max(state.last_batch_rollouts, newest[1] if newest is not None else 0)
            result.target = max(0, min(int(size), hold))
        idle = [s for s in sessions if s.state is WarmState.IDLE and now < self.until(s)]
        over_share = max(0, in_flight - hold)  # the share shrank: idle warm sessions give it back first
        unwanted = self._unwanted(sessions, idle, min(result.target, len(idle) - over_share), now)
        if unwanted:
            result.stopped += self._stop(unwanted, wait_until, now)
        idle = [s for s in idle if s not in unwanted]
        result.kept_alive, dead = self._keep_alive(idle, now, wait_until)
        if dead:
            result.dropped += self._stop(dead, wait_until, now, dropped=True)
        result.idle = len(idle) - len(dead)
        result.warming = sum(1 for s in sessions if s.state is WarmState.WARMING and s not in unwanted)
        wanted = min(result.target - result.idle - result.warming, hold - in_flight + result.stopped + result.dropped)
        if wanted > 0 and not result.halted:
            result.warmed, result.warmup_failures = self._fill(wanted, wait_until)
            result.idle += result.warmed
        self.deps.metrics.sample(WARM_POOL_SIZE, result.idle)
        return result

    def _halted(
        self, state: WarmPoolState, newest: tuple[str, int, float] | None, busy: bool, now: float
    ) -> str | None:
        """Why the pool keeps no session now (None: it runs), noting the experiment's work on the pool item."""
        warm = self.deps.ledger.warm
        if busy and (now - state.busy_at >= 5.0 or (newest is not None and newest[0] != state.last_batch_id)):
            warm.note_busy(now, last_batch=None if newest is None else (newest[0], newest[1]))
        if state.halted == HALT_DESTROYED:
            return state.halted
        if state.halted is not None:  # resumed by work that came after it: a batch, a rollout wanting a session
            later_batch = newest is not None and newest[2] > state.halted_at
            if later_batch or state.demand_at > state.halted_at or (state.halted == HALT_IDLE and busy):
                warm.resume()
                log.info("warm pool resumes: work came after the halt (%s)", state.halted)
                return None
            return state.halted
        if state.busy_at == 0.0 and not busy:  # the pool's first tick: the experiment starts now
            warm.note_busy(now)
        elif not busy and now - state.busy_at >= self.config.warm_idle_stop_s:
            log.info("warm pool halts: no work for %.0f s (warm_idle_stop_s)", now - state.busy_at)
            warm.halt(HALT_IDLE, now)
            return HALT_IDLE
        return None

    def _unwanted(
        self, sessions: Sequence[WarmSession], idle: Sequence[WarmSession], target: int, now: float
    ) -> list[WarmSession]:
        """Sessions to stop: stopping ones (again), idle ones past their offer (stale or too old), stuck warm-ups,
        and idle ones beyond the target (the oldest first)."""
        out = [s for s in sessions if s.state is WarmState.STOPPING]
        out += [s for s in sessions if s.state is WarmState.IDLE and now >= self.until(s)]
        out += [s for s in sessions if s.state is WarmState.WARMING and now - s.warmed_at > WARMING_STUCK_S]
        out += sorted(idle, key=lambda s: s.warmed_at)[: max(0, len(idle) - target)]
        return list({s.session_id: s for s in out}.values())

    # ------------------------------------------------------------------------------------------------ stops

    def _stop(self, sessions: Sequence[WarmSession], wait_until: float, now: float, *, dropped: bool = False) -> int:
        """Stop `sessions` (state stopping first: no dispatch takes them after), concurrently; forget the confirmed
        ones and the ones AgentCore has ended anyway. Returns how many are gone."""
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

        mine = [s for s in sessions if s.session_id in stopping]  # a dispatch may have taken one meanwhile
        gone = [s for s, confirmed in zip(mine, _concurrently(stop, mine), strict=True) if confirmed]
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

    def halt(self, reason: str, *, stop: bool = True, budget_s: float = 60.0) -> int:
        """Keep no warm session: the pool is halted (`reason`: "cancelled", "destroyed", "stopped"; a later batch
        resumes it, never after "destroyed") and, with `stop`, every warm session is stopped now. Returns how many
        were stopped."""
        self.deps.ledger.warm.halt(reason, self.wall())
        return self.stop_all(budget_s=budget_s) if stop else 0

    # ------------------------------------------------------------------------------------------- keep-alive

    def _keep_alive(self, idle: Sequence[WarmSession], now: float, wait_until: float) -> tuple[int, list[WarmSession]]:
        """The warm-up invocation again, concurrently, for idle sessions whose offer would end within
        `keepalive_lead_s` for want of a keep-alive (not for their age); each answered one offered again. Returns
        how many answered, and the dead ones (NotFound or rejected)."""
        stale_after = self.config.warm_stale_after_s
        due = [s for s in idle if now >= s.kept_at + stale_after - self.keepalive_lead_s]
        due = [s for s in due if s.kept_at + stale_after < s.warmed_at + self.config.warm_shelf_life_s]
        if not due:
            return 0, []

        def keep(session: WarmSession) -> bool | None:
            try:
                self._invoke(session.session_id, wait_until, new_session=False)
                return True
            except (RuntimeRejected, RuntimeSessionNotFound, RuntimeColdStart, RuntimeStartFailed) as exc:
                log.warning("warm session %s failed its keep-alive (%s): dropped", session.session_id, exc)
                return False
            except (RuntimeThrottled, RuntimeOutcomeUnknown) as exc:  # tried again next tick (or goes stale)
                log.info("keep-alive of warm session %s not answered: %s", session.session_id, exc)
                return None

        answers = dict(zip(due, _concurrently(keep, due), strict=True))
        kept_at = self.wall()
        answered = [s.session_id for s in due if answers[s]]
        kept = set(self.deps.ledger.warm.mark(answered, kept_at=kept_at, from_states=(WarmState.IDLE,)))
        self._offer([(s.session_id, s.warmed_at, self.until(s)) for s in due if s.session_id in kept], kept_at)
        self.deps.ledger.warm.add_totals(keepalives=len(kept))
        self.deps.metrics.count(WARM_KEEPALIVES, len(kept))
        return len(kept), [s for s in due if answers[s] is False]

    def _offer(self, sessions: Sequence[tuple[str, float, float]], kept_at: float) -> None:
        """Put sessions (id, start, end of their current offer) on offer, kept alive at `kept_at`: each offer delayed
        until the session's current one ends (0: none), so no two offers of a session are ever on the queue at once.
        A lost send leaves the session unoffered until its next keep-alive."""
        by_delay: dict[int, list[str]] = defaultdict(list)
        now = self.wall()
        for session_id, warmed_at, current_until in sessions:
            offer = WarmOffer(session_id, warmed_at, offer_until(self.config, warmed_at, kept_at))
            by_delay[min(MAX_OFFER_DELAY_S, max(0, math.ceil(current_until - now)))].append(offer.body())
        for delay, bodies in by_delay.items():
            try:
                self.deps.queue.send_all(self.deps.settings.warm_queue_url, bodies, delay_seconds=delay)
            except Exception:
                log.warning("%d warm session(s) could not be put on offer", len(bodies), exc_info=True)

    def _invoke(
        self, session_id: str, wait_until: float, *, new_session: bool, block: InvokeBlock | None = None
    ) -> None:
        payload = warmup_payload(self.config.name, session_id)
        self.deps.limits.runtime.invoke(
            session_id, payload, wait_until=wait_until, new_session=new_session, block=block
        )

    # ------------------------------------------------------------------------------------------------ fill

    def _fill(self, wanted: int, wait_until: float) -> tuple[int, int]:
        """Start up to `wanted` warm sessions while the capacity seam allows: chunks recorded one after another,
        their warm-ups (paced by the session budget) in flight together up to `CALLS_IN_FLIGHT`, the answered ones
        marked idle and put on offer a chunk at a time. Returns how many were warmed and how many warm-ups failed."""
        room = _SlotRoom(self.deps.ledger.limits.slot_counts(), self.capacity.sessions_to_hold())
        flying: dict[Future[bool], str] = {}
        started: dict[str, float] = {}
        ready: list[str] = []
        warmed = failed = allowed = 0
        checked_at, closed = -math.inf, False
        with ThreadPoolExecutor(max_workers=CALLS_IN_FLIGHT, thread_name_prefix="warm-fill") as pool:
            while True:
                left = wanted - warmed - failed - len(flying)
                while not closed and left > 0 and len(flying) + FILL_CHUNK <= CALLS_IN_FLIGHT:
                    if self.deps.clock.monotonic() >= wait_until:
                        closed = True
                        break
                    if self.deps.clock.monotonic() - checked_at >= self.capacity_recheck_s:
                        allowed, checked_at = self.capacity.new_sessions_now(), self.deps.clock.monotonic()
                    room.resize(self.capacity.sessions_to_hold())
                    chunk = self._start_chunk(min(left, allowed, FILL_CHUNK), room) if allowed > 0 else []
                    if not chunk:  # no budget, no room, or halted
                        closed = True
                        break
                    block = InvokeBlock({SESSION_PACE: len(chunk)})
                    started |= dict.fromkeys(chunk, self.wall())
                    flying |= {pool.submit(self._warm_up, sid, wait_until, block): sid for sid in chunk}
                    left -= len(chunk)
                if not flying and not ready:
                    break
                done, _ = wait(list(flying), return_when=FIRST_COMPLETED) if flying else (set(), set())
                answered = {flying.pop(future): future.result() for future in done}
                ready += [sid for sid, ok in answered.items() if ok]
                lost = [sid for sid, ok in answered.items() if not ok]
                warmed, failed = warmed + len(answered) - len(lost), failed + len(lost)
                if len(ready) >= FILL_CHUNK or not flying:
                    ready = self._ready(ready, started, wait_until)
                if lost:
                    warming = [WarmSession(sid, WarmState.WARMING, started[sid], started[sid]) for sid in lost]
                    self._stop(warming, wait_until, self.wall())
                    closed = closed or not warmed  # nothing warms (throttled, the agent cannot start): next tick
        self.deps.ledger.warm.add_totals(warmed=warmed, warmup_failures=failed)
        self.deps.metrics.count(WARMED, warmed)
        return warmed, failed

    def _ready(self, ready: list[str], started: dict[str, float], wait_until: float) -> list[str]:
        """Mark answered warm-ups idle and put them on offer; one whose item was stopped under it (a halt, a cancel,
        a destroy) exists now and nothing else knows of it: stopped here. Returns [] (nothing left to mark)."""
        kept_at = self.wall()
        marked = set(self.deps.ledger.warm.mark(ready, kept_at=kept_at, from_states=(WarmState.WARMING,)))
        self._offer([(sid, started[sid], 0.0) for sid in ready if sid in marked], kept_at)
        for session_id in (sid for sid in ready if sid not in marked):
            confirmed, _ = stops.stop_session(session_id, self.deps, max(wait_until, self.deps.clock.monotonic() + 5))
            if not confirmed:
                log.warning("warm session %s started after the pool stopped it: its stop failed", session_id)
        return []

    def _start_chunk(self, size: int, room: _SlotRoom) -> list[str]:
        """Record `size` new warm sessions (or fewer: what the counters have room for) and take their slots within
        the experiment's share (`room.hold`, as a dispatch takes its slot), on as many counters as it takes (the
        roomiest first), in one transaction, before any warm-up is sent. Returns their ids ([] when none)."""
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

    def _warm_up(self, session_id: str, wait_until: float, block: InvokeBlock) -> bool:
        """The warm-up invocation of a new session, paced as any new session (its start from its chunk's `block`);
        a 424 (its agent is not up yet) is retried on the same session as a dispatch retries it. True once it
        answered."""
        deps = self.deps
        for attempt in range(deps.cold_start_retries + 1):
            try:
                self._invoke(session_id, wait_until, new_session=attempt == 0, block=block if attempt == 0 else None)
                return True
            except RuntimeColdStart:
                if deps.clock.monotonic() + deps.cold_start_wait_s >= wait_until:
                    return False
                deps.clock.sleep(deps.cold_start_wait_s)
            except RuntimeStartFailed as exc:
                log.error("warm-up of %s: the agent cannot start: %s", session_id, str(exc)[-300:])
                return False
            except (RuntimeThrottled, RuntimeRejected, RuntimeOutcomeUnknown) as exc:
                log.info("warm-up of %s not answered: %s", session_id, exc)
                return False
        return False


class _SlotRoom:
    """Free slots per session-slot counter within the sessions the experiment may hold (`hold`: the caps a
    dispatch's slot is taken under), as read at a fill's start less the fill's own takes; `resize` follows a share
    that changed meanwhile."""

    def __init__(self, counts: Sequence[int], hold: int) -> None:
        self.hold = hold
        self.recount(counts)

    def recount(self, counts: Sequence[int]) -> None:
        """The counters as read again."""
        self.rooms = [cap - count for cap, count in zip(_caps(self.hold), counts, strict=True)]

    def resize(self, hold: int) -> None:
        old, new = _caps(self.hold), _caps(hold)
        self.rooms = [room + n - o for room, n, o in zip(self.rooms, new, old, strict=True)]
        self.hold = hold

    def takes(self, size: int) -> dict[int, int]:
        """Up to `size` slots over the counters with room, the roomiest first: how many on each (at most
        `FILL_CHUNK` counters: each one more item of the chunk's transaction)."""
        takes: dict[int, int] = {}
        for shard in sorted(range(len(self.rooms)), key=lambda i: -self.rooms[i])[:FILL_CHUNK]:
            left = size - sum(takes.values())
            if left <= 0 or self.rooms[shard] <= 0:
                break
            takes[shard] = min(left, self.rooms[shard])
        return takes

    def took(self, takes: dict[int, int]) -> None:
        for shard, count in takes.items():
            self.rooms[shard] -= count


def _caps(hold: int) -> list[int]:
    return [shard_cap(hold, shard) for shard in range(keys.SESSION_SHARDS)]


_T = TypeVar("_T")
_R = TypeVar("_R")


def _concurrently(call: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """`call` on each of `items`, up to `CALLS_IN_FLIGHT` at once (their budgets pace them); results in order."""
    if len(items) <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(CALLS_IN_FLIGHT, len(items)), thread_name_prefix="warm-calls") as pool:
        return list(pool.map(call, items))


def _newest_batch(window: WindowState) -> tuple[str, int, float] | None:
    """The newest batch in the window: its id, its rollouts (so far), its creation (epoch s)."""
    ordered = window.in_order()
    if not ordered:
        return None
    batch_id, entry = ordered[-1]
    created = parse_iso(entry.created)
    total = entry.total if entry.total is not None else entry.released
    return batch_id, total, (created.timestamp() if created is not None else 0.0)


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


def run_pool(deps: LifecycleDeps, *, until: float, every_s: float = TICK_EVERY_S) -> list[TickResult]:
    """Tick the warm pool until `until` (monotonic) while it has something to do (a target, or sessions to stop),
    `every_s` apart; one tick when it is off, halted with nothing left, or another manager holds it. The sweeper
    runs this after its sweep: the stack's schedule (once a minute) keeps the pool managed all the time it is on."""
    pool = WarmPool(deps)
    results: list[TickResult] = []
    for _ in range(100_000):
        result = pool.tick(budget_s=max(1.0, until - deps.clock.monotonic()))
        results.append(result)
        active = result.ran and (result.target > 0 or result.idle + result.warming > 0)
        if not active or deps.clock.monotonic() + every_s >= until:
            break
        deps.clock.sleep(every_s)
    return results
