"""The warm pool's manager: sessions started ahead of the next batch, so a GRPO step's rollouts start at once. One
manager at a time (the pool item's lease) runs `tick`, from the sweeper and local mode (docs/lifecycle.md, "The warm
pool"): it halts the pool without work, stops the sessions it no longer wants, keeps the idle ones alive and fills
up to the target while nothing else wants the new-session budget, each recorded with its slot before its warm-up."""

from __future__ import annotations

import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Final, TypeVar

from rollout_pipeline import ids, ports
from rollout_pipeline.adapters.clients import MAX_POOL_CONNECTIONS
from rollout_pipeline.config import WARM_AUTO, warmup_payload
from rollout_pipeline.contracts import parse_iso
from rollout_pipeline.ledger.limits import shard_cap
from rollout_pipeline.ledger.release import WindowState
from rollout_pipeline.ledger.warm_items import WarmPoolState, WarmSession, WarmState
from rollout_pipeline.lifecycle import budget, stops
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.warm import WarmOffer, offer_until
from rollout_pipeline.metric_names import WARM_KEEPALIVES, WARM_POOL_SIZE, WARM_STOPPED_UNUSED, WARMED

log = logging.getLogger(__name__)

#: The pool item's lease lasts a tick's budget plus this.
LEASE_MARGIN_S: Final = 30.0
#: No fill while a dispatch took a new session (no warm one on offer), or a warm one, within this many seconds.
DEMAND_QUIET_S: Final = 3.0
#: A session still warming this long after its item was written is stopped (its warm-up's outcome was lost).
WARMING_STUCK_S: Final = 120.0
#: AgentCore calls (warm-ups, keep-alives, stops) a tick has in flight at once: a client's pooled connections.
CALLS_IN_FLIGHT: Final = MAX_POOL_CONNECTIONS
#: A fill asks whether rollouts want the new-session budget (`WarmCapacity.new_sessions_now`) at most this often.
CAPACITY_RECHECK_S: Final = 1.0
#: Sessions per fill chunk (one transaction writes their items and takes their slots).
FILL_CHUNK: Final = 25
#: SQS delays a message at most this long (`DelaySeconds`).
MAX_OFFER_DELAY_S: Final = 900
#: Halt reasons (`WarmPoolState.halted`).
HALT_IDLE: Final = "idle"
HALT_CANCELLED: Final = "cancelled"
HALT_DESTROYED: Final = "destroyed"
HALT_STOPPED: Final = "stopped"
#: Between two ticks of one `run_pool` loop.
TICK_EVERY_S: Final = 5.0


class WarmCapacity:
    """What the pool may use of the experiment's limits (a test gives its own): its share of active sessions, and of
    new sessions while nothing wants them and the budget is not spent."""

    def __init__(self, deps: LifecycleDeps) -> None:
        self.deps = deps

    def new_sessions_now(self) -> int:
        """New sessions the pool may start a second now (0: none)."""
        state = self.deps.ledger.warm.pool()
        if self.deps.clock.now().timestamp() - max(state.demand_at, state.took_at) < DEMAND_QUIET_S:
            return 0
        board = self.deps.ledger.limits.limits_view().board
        if any(keys for _process, _heartbeat, keys in board) or budget.paused(self.deps):
            return 0
        return max(1, int(self.deps.limits.new_session_rate()))

    def sessions_to_hold(self) -> int:
        """Active sessions the experiment may hold, warm ones included."""
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
    """The manager of one experiment's warm pool."""

    def __init__(self, deps: LifecycleDeps, capacity: WarmCapacity | None = None, *, owner: str | None = None) -> None:
        self.deps = deps
        self.config = deps.config
        self.capacity = capacity or WarmCapacity(deps)
        self.owner = owner or f"warm-{uuid.uuid4().hex[:12]}"
        self.capacity_recheck_s = CAPACITY_RECHECK_S

    def wall(self) -> float:
        return self.deps.clock.now().timestamp()

    def until(self, session: WarmSession) -> float:
        return offer_until(self.config, session.warmed_at, session.kept_at)

    def tick(self, *, budget_s: float = 20.0) -> TickResult:
        """One pass within `budget_s`; none when the pool is off and empty, or leased."""
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
        view = ledger.limits.limits_view()
        counts, board = view.counts, view.board
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
        """Stopping ones (again), idle ones past their offer, stuck warm-ups, idle ones beyond the target."""
        out = [s for s in sessions if s.state is WarmState.STOPPING]
        out += [s for s in sessions if s.state is WarmState.IDLE and now >= self.until(s)]
        out += [s for s in sessions if s.state is WarmState.WARMING and now - s.warmed_at > WARMING_STUCK_S]
        out += sorted(idle, key=lambda s: s.warmed_at)[: max(0, len(idle) - target)]
        return list({s.session_id: s for s in out}.values())

    def _stop(self, sessions: Sequence[WarmSession], wait_until: float, now: float, *, dropped: bool = False) -> int:
        """Stop `sessions` concurrently and forget the ones stopped or ended anyway. Returns how many are gone."""
        warm = self.deps.ledger.warm
        stopping = set(warm.begin_stop([s.session_id for s in sessions]))

        def stop(session: WarmSession) -> bool:  # an unconfirmed stop is tried again next tick
            idle, age = now - session.kept_at, now - session.warmed_at
            if max(idle - self.config.idle_timeout_s, age - self.config.max_lifetime_s) > stops.HOLD_MARGIN_S:
                return True  # AgentCore has ended it
            return stops.stop_session(session.session_id, self.deps, wait_until)[0]

        mine = [s for s in sessions if s.session_id in stopping]  # a dispatch may have taken one meanwhile
        gone = [s for s, confirmed in zip(mine, _concurrently(stop, mine), strict=True) if confirmed]
        forgotten = set(warm.forget([s.session_id for s in gone]))
        unused = [s for s in gone if s.session_id in forgotten]
        idle_s = sum(max(0.0, now - s.warmed_at) for s in unused)
        warm.add_totals(stopped_unused=len(unused), unused_idle_s=idle_s, dropped=len(unused) if dropped else 0)
        self.deps.metrics.count(WARM_STOPPED_UNUSED, len(unused))
        return len(unused)

    def stop_all(self, *, budget_s: float = 60.0) -> int:
        """Stop every warm session now, within `budget_s`. Returns how many were stopped."""
        wait_until = self.deps.clock.monotonic() + budget_s
        stopped = 0
        for _ in range(20):
            left = self.deps.ledger.warm.sessions()
            if not left or self.deps.clock.monotonic() >= wait_until:
                break
            stopped += self._stop(left, wait_until, self.wall())
        return stopped

    def halt(self, reason: str, *, stop: bool = True, budget_s: float = 60.0) -> int:
        """Keep no warm session for `reason` (every one stopped now with `stop`). Returns how many were stopped."""
        self.deps.ledger.warm.halt(reason, self.wall())
        return self.stop_all(budget_s=budget_s) if stop else 0

    def _keep_alive(self, idle: Sequence[WarmSession], now: float, wait_until: float) -> tuple[int, list[WarmSession]]:
        """Keep alive the idle sessions whose offer goes stale soon. Returns how many answered, and the dead ones."""
        stale_after = self.config.warm_stale_after_s
        lead_s = min(stale_after / 2, MAX_OFFER_DELAY_S)  # halfway to stale, at most SQS's longest delay
        due = [s for s in idle if now >= s.kept_at + stale_after - lead_s]
        due = [s for s in due if s.kept_at + stale_after < s.warmed_at + self.config.warm_shelf_life_s]
        if not due:
            return 0, []

        def keep(session: WarmSession) -> bool | None:
            try:
                self._invoke(session.session_id, wait_until, new_session=False)
                return True
            except (ports.RuntimeRejected, ports.RuntimeColdStart, ports.RuntimeStartFailed) as exc:
                log.warning("warm session %s failed its keep-alive (%s): dropped", session.session_id, exc)
                return False
            except (ports.RuntimeThrottled, ports.RuntimeOutcomeUnknown) as exc:  # next tick (or goes stale)
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
        """Offer sessions (id, start, end of their current offer), each delayed until its current offer ends."""
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

    def _invoke(self, session_id: str, wait_until: float, *, new_session: bool) -> None:
        payload = warmup_payload(self.config.name, session_id)
        self.deps.limits.runtime.invoke(session_id, payload, wait_until=wait_until, new_session=new_session)

    def _fill(self, wanted: int, wait_until: float) -> tuple[int, int]:
        """Start up to `wanted` warm sessions while the capacity allows. Returns (warmed, warm-ups failed)."""
        counts = self.deps.ledger.limits.slot_counts()  # as read, plus the fill's own takes
        warmed = failed = allowed = 0
        checked_at, closed = -math.inf, False
        running: dict[Future[tuple[int, int]], int] = {}
        with ThreadPoolExecutor(max_workers=CALLS_IN_FLIGHT // FILL_CHUNK, thread_name_prefix="warm-fill") as pool:
            while True:
                while not closed and len(running) < CALLS_IN_FLIGHT // FILL_CHUNK:
                    if self.deps.clock.monotonic() - checked_at >= self.capacity_recheck_s:
                        allowed, checked_at = self.capacity.new_sessions_now(), self.deps.clock.monotonic()
                    size = min(wanted - warmed - failed - sum(running.values()), allowed, FILL_CHUNK)
                    in_time = self.deps.clock.monotonic() < wait_until
                    chunk = self._start_chunk(size, counts, self.capacity.sessions_to_hold()) if in_time else []
                    closed = not chunk  # no budget, no room, no time, or halted
                    if chunk:
                        running[pool.submit(self._warm_chunk, chunk, wait_until)] = len(chunk)
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for ready, lost in (future.result() for future in done if running.pop(future)):
                    warmed, failed = warmed + ready, failed + lost
                    closed = closed or not ready  # nothing warms (throttled, the agent cannot start): next tick
        self.deps.ledger.warm.add_totals(warmed=warmed, warmup_failures=failed)
        self.deps.metrics.count(WARMED, warmed)
        return warmed, failed

    def _warm_chunk(self, chunk: list[str], wait_until: float) -> tuple[int, int]:
        """A recorded chunk's warm-ups; the answered ones offered, the others stopped. Returns (warmed, failed)."""
        started = self.wall()
        self.deps.limits.runtime.session.expect(len(chunk))  # their starts, booked in one write
        answered = _concurrently(lambda sid: self._warm_up(sid, wait_until), chunk)
        ready = [sid for sid, ok in zip(chunk, answered, strict=True) if ok]
        kept_at = self.wall()
        marked = set(self.deps.ledger.warm.mark(ready, kept_at=kept_at, from_states=(WarmState.WARMING,)))
        self._offer([(sid, started, 0.0) for sid in ready if sid in marked], kept_at)
        for session_id in (sid for sid in ready if sid not in marked):
            confirmed, _ = stops.stop_session(session_id, self.deps, max(wait_until, self.deps.clock.monotonic() + 5))
            if not confirmed:
                log.warning("warm session %s started after the pool stopped it: its stop failed", session_id)
        lost = [WarmSession(sid, WarmState.WARMING, started, started) for sid in chunk if sid not in ready]
        if lost:
            self._stop(lost, wait_until, self.wall())
        return len(ready), len(lost)

    def _start_chunk(self, size: int, counts: list[int], hold: int) -> list[str]:
        """Record up to `size` new warm sessions with their slots (one transaction) before any warm-up. Their ids."""
        takes = _slot_takes(counts, size, hold)
        sessions = [ids.warm_session_id(self.config.name) for _ in range(sum(takes.values()))]
        if not sessions:
            return []
        if not self.deps.ledger.warm.add_warming(sessions, max_sessions=hold, takes=takes, warmed_at=self.wall()):
            return []  # a counter filled meanwhile (the next tick reads them again), or the pool halted
        for shard, count in takes.items():
            counts[shard] += count
        return sessions

    def _warm_up(self, session_id: str, wait_until: float) -> bool:
        """A new session's warm-up, paced as any new session; a 424 retried as a dispatch retries it. True: answered."""
        deps = self.deps
        for attempt in range(deps.cold_start_retries + 1):
            try:
                self._invoke(session_id, wait_until, new_session=attempt == 0)
                return True
            except ports.RuntimeColdStart:
                if deps.clock.monotonic() + deps.cold_start_wait_s >= wait_until:
                    return False
                deps.clock.sleep(deps.cold_start_wait_s)
            except ports.RuntimeStartFailed as exc:
                log.error("warm-up of %s: the agent cannot start: %s", session_id, str(exc)[-300:])
                return False
            except (ports.RuntimeThrottled, ports.RuntimeRejected, ports.RuntimeOutcomeUnknown) as exc:
                log.info("warm-up of %s not answered: %s", session_id, exc)
                return False
        return False


def _slot_takes(counts: Sequence[int], size: int, hold: int) -> dict[int, int]:
    """Up to `size` slots within `hold`'s caps on the counters `counts`, by counter: the roomiest `FILL_CHUNK` first."""
    rooms = {shard: shard_cap(hold, shard) - count for shard, count in enumerate(counts)}
    takes: dict[int, int] = {}
    for shard in sorted(rooms, key=lambda i: -rooms[i])[:FILL_CHUNK]:
        left = size - sum(takes.values())
        if left <= 0 or rooms[shard] <= 0:
            break
        takes[shard] = min(left, rooms[shard])
    return takes


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
    """After a cancel of `cancelled_batch` with no other batch left, halt the pool. Returns how many were stopped."""
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
    """Tick the pool `every_s` until `until` (monotonic) while it has something to do; once when it has not."""
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
